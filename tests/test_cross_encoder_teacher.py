"""A user's cross-encoder as the teacher (``corpus.teacher = "cross-encoder"``,
``regenerate.teacher = "cross-encoder"``, ``teacher_model`` = its name or folder): it scores the
document (or positive) and each mined negative, its scores are the example's teacher fields and
distillation label, cached per model, and a missing or wrong model is one line."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeOpenAI, Reply
from helpers import write_run_config
from test_corpus import DOCS, invoke, write_corpus

from negsynth.data.shards import read_stage
from negsynth.errors import UserError
from negsynth.schemas.config import CorpusConfig, RegenerateConfig


@pytest.fixture(scope="module")
def tiny_ce(minilm, tmp_path_factory):
    """A one-label CrossEncoder on MiniLM's weights with a seeded head, saved as a folder: not a
    good ranker, but a real model whose scores the test can recompute."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    ce = CrossEncoder(minilm, num_labels=1, device="cpu")
    out = tmp_path_factory.mktemp("ce") / "tiny-ce"
    ce.save(str(out))
    return str(out)


def test_the_scorer_gives_the_models_scores_and_caches_them(tiny_ce, tmp_path):
    from sentence_transformers import CrossEncoder

    from negsynth.embed.cross_encoder import CrossEncoderScorer

    texts = [x for _, _, x in DOCS[:3]]
    ref = CrossEncoder(tiny_ce, device="cpu").predict([("why do tides happen", t) for t in texts])
    sc = CrossEncoderScorer(tiny_ce, cache=tmp_path / "ce.sqlite", device="cpu")
    got = sc.scores("why do tides happen", texts)
    assert got == pytest.approx([float(x) for x in ref], abs=1e-5)
    assert len(set(round(x, 4) for x in got)) == 3  # a real score per text, not a constant

    def boom(*a, **k):
        raise AssertionError("a cached score was computed again")

    again = CrossEncoderScorer(tiny_ce, cache=tmp_path / "ce.sqlite", device="cpu")
    again.model.predict = boom
    assert again.scores("why do tides happen", texts) == got


def test_a_wrong_model_or_a_missing_one_is_one_line(tmp_path):
    from negsynth.embed.cross_encoder import CrossEncoderScorer

    with pytest.raises(UserError, match=r"^regenerate.teacher_model = '.*nowhere': not a sentence-transformers CrossEncoder") as e:
        CrossEncoderScorer(str(tmp_path / "nowhere"), setting="regenerate.teacher_model")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r'needs teacher_model = "<a sentence-transformers CrossEncoder'):
        CorpusConfig(teacher="cross-encoder")
    with pytest.raises(ValueError, match=r'teacher_model is read by teacher = "cross-encoder" only'):
        RegenerateConfig(teacher_model="x", negatives="mined")
    # set, it is part of the config's hash; unset, an older run dir's hash is unchanged
    assert "teacher_model" not in CorpusConfig().hash_dump()
    assert (
        CorpusConfig(teacher="cross-encoder", teacher_model="a").hash_dump()
        != CorpusConfig(teacher="cross-encoder", teacher_model="b").hash_dump()
    )


def test_the_corpus_stage_takes_the_cross_encoders_scores_as_its_teacher(tmp_path, tiny_ce):
    from sentence_transformers import CrossEncoder

    folder = write_corpus(tmp_path)

    def responder(req, n):
        return Reply(json.dumps({"queries": [f"what is known about case {n}?"]}))

    with FakeOpenAI(responder) as srv:
        corpus = {
            "teacher": "cross-encoder",
            "teacher_model": tiny_ce,
            "teacher_k": 0,
            "mining": {"relative_margin": 0.0},
        }
        cfg = write_run_config(tmp_path, srv.base_url, corpus=corpus)
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
        assert r.exit_code == 0, r.output
    recs = list(read_stage(tmp_path / "run" / "corpus"))
    assert recs
    ce = CrossEncoder(tiny_ce, device="cpu")
    for rec in recs:
        meta = rec["meta"]
        texts = [rec["positive"], *rec["negatives"]]
        want = [float(x) for x in ce.predict([(rec["query"], t) for t in texts])]
        assert meta["teacher_label"] == pytest.approx(want, abs=1e-4)
        assert meta["teacher_rank"] == 1 + sum(x > meta["teacher_label"][0] for x in meta["teacher_label"][1:])
    assert (tmp_path / "run" / "cache" / "cross_encoder.sqlite").is_file()


def test_regenerate_relabels_with_the_cross_encoder(tmp_path, tiny_ce):
    """``regenerate.teacher = "cross-encoder"``: the positive and the kept negatives carry the
    model's scores, and no kept negative scores at or above the positive (RLHN's rule)."""
    from sentence_transformers import CrossEncoder
    from test_regenerate import _beir_topics, config

    _beir_topics(tmp_path / "beir")
    body = f'[regenerate]\nnegatives = "mined"\nmine = 40\nteacher = "cross-encoder"\nteacher_model = {json.dumps(tiny_ce)}\n'
    cfg = config(tmp_path, "http://127.0.0.1:9/v1", body)  # nothing listens there: the teacher is in-process
    r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "-i", tmp_path / "beir", "--json")
    assert r.exit_code == 0, r.output
    recs = list(read_stage(tmp_path / "run" / "regenerate"))
    assert len(recs) == 3 and json.loads(r.stdout)["teacher"]["kind"] == "cross-encoder"
    ce = CrossEncoder(tiny_ce, device="cpu")
    for x in recs:
        label = x["meta"]["teacher_label"]
        want = [float(s) for s in ce.predict([(x["query"], t) for t in [x["positive"], *x["negatives"]]])]
        assert label == pytest.approx(want, abs=1e-4)
        assert len(x["negatives"]) == 4 and all(s < label[0] for s in label[1:])


def test_a_teacher_model_that_does_not_resolve_stops_the_stage_before_any_llm_request(tmp_path):
    folder = write_corpus(tmp_path)
    with FakeOpenAI(lambda r, n: Reply(json.dumps({"queries": ["a query about the document?"]}))) as srv:
        corpus = {"teacher": "cross-encoder", "teacher_model": str(tmp_path / "no-such-model")}
        cfg = write_run_config(tmp_path, srv.base_url, corpus=corpus)
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder)
        assert r.exit_code != 0
        assert "corpus.teacher_model = " in r.output and "not a sentence-transformers CrossEncoder name or folder" in r.output
        assert "Traceback" not in r.output
        assert srv.requests == []  # nothing paid for
