"""Mining at corpus scale: the FAISS switch of negsynth.embed.mining."""

from __future__ import annotations

import logging
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")

from negsynth.embed.mining import FAISS_THRESHOLD, mine_negatives, resolve_use_faiss  # noqa: E402


def test_threshold_decides_and_missing_faiss_falls_back_with_one_line(monkeypatch, caplog):
    assert FAISS_THRESHOLD == 100_000
    assert resolve_use_faiss(False, 10**9) is False
    assert resolve_use_faiss(None, 99_999) is False
    assert resolve_use_faiss(None, 10**6, None) is False  # threshold None = never
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError
    with caplog.at_level(logging.WARNING, logger="negsynth.embed.mining"):
        assert resolve_use_faiss(None, 200_000) is False
        assert resolve_use_faiss(True, 10) is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("faiss is not installed" in m and "negsynth[scale]" in m for m in lines)


def test_faiss_and_exact_mining_agree(monkeypatch):
    pytest.importorskip("faiss")
    from sentence_transformers import SentenceTransformer

    from negsynth.resources import MissingResource, minilm_path

    try:
        model = SentenceTransformer(str(minilm_path()), device="cpu")
    except MissingResource as e:
        pytest.skip(str(e))
    model.max_seq_length = 32
    topics = "heart lung liver kidney brain bone skin blood muscle nerve eye ear tooth gut spleen".split()
    corpus = [f"the {t} {kind} in adults" for t in topics for kind in ("disease", "function", "anatomy", "surgery")]
    queries = {"a": "how does the heart pump blood", "b": "what does the liver filter"}
    pos = {"a": ["the heart function in adults"], "b": ["the liver function in adults"]}
    calls = []
    import sentence_transformers.util as stu

    real = stu.mine_hard_negatives

    def spy(*a, **kw):
        calls.append(kw["use_faiss"])
        return real(*a, **kw)

    monkeypatch.setattr(stu, "mine_hard_negatives", spy)
    exact = mine_negatives(model, queries, pos, corpus, 5, faiss_threshold=None)
    with_faiss = mine_negatives(model, queries, pos, corpus, 5, faiss_threshold=len(corpus))  # corpus >= threshold
    assert calls == [False, True]
    assert with_faiss.keys() == exact.keys()
    for k in exact:
        assert with_faiss[k]["negatives"] == exact[k]["negatives"]
        assert with_faiss[k]["scores"] == pytest.approx(exact[k]["scores"], abs=1e-4)
