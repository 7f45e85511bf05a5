"""The package API (``negsynth.load_config`` / ``run`` / ``training_data`` / ``sample_corpus`` / ``evaluate_model``):
bad input is one line before any stage runs; the sample corpus ships with the package."""

from __future__ import annotations

import json

import pytest

import negsynth
from negsynth.errors import UserError


def test_the_sample_corpus_is_fifty_distinct_documents_with_id_title_text():
    docs = [json.loads(line) for line in negsynth.sample_corpus().read_text(encoding="utf-8").splitlines()]
    assert len(docs) == 50 and all(set(d) == {"id", "title", "text"} for d in docs)
    assert len({d["text"] for d in docs}) == 50 and len({d["id"] for d in docs}) == 50


@pytest.mark.parametrize(
    ("documents", "needle"),
    [
        (["a fine document", ""], "documents[1]: expected a non-empty string"),
        ([{"title": "no text"}], "documents[0]: expected a non-empty string or a dict with a 'text' string"),
        ([], "documents: empty"),
        ("no/such/corpus.jsonl", "no such corpus file or folder"),
    ],
)
def test_training_data_refuses_bad_documents_in_one_line_before_any_stage(tmp_path, documents, needle):
    with pytest.raises(UserError) as e:
        negsynth.training_data(documents, tmp_path / "run")
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run" / "corpus").exists()


def test_run_takes_a_config_object_with_overrides_on_top(tmp_path, monkeypatch):
    seen = {}

    def fake_pipeline(cfg, run_dir, **kw):
        seen["cfg"], seen["stages"] = cfg, kw.get("stages")
        return {}

    monkeypatch.setattr("negsynth.stages.run_pipeline", fake_pipeline)
    cfg = negsynth.load_config(None, ["train.lr=1e-4"])
    assert negsynth.run(cfg, tmp_path, stages=["train"], overrides=["train.epochs=2"]) == {}
    assert seen["cfg"].train.lr == 1e-4 and seen["cfg"].train.epochs == 2 and seen["stages"] == ["train"]
    assert cfg.train.epochs == 1  # the caller's config is left as it was


def test_evaluate_model_scores_a_model_as_the_evaluate_command_with_per_query_figures(tmp_path, minilm):
    """``negsynth.evaluate_model``: a BEIR folder of one's own as a retrieval task, each query's
    nDCG@10 kept (what a paired test needs), the aliases resolved by ``model_path``."""
    from helpers import write_beir

    from negsynth.evaluate import retrieval_task

    assert negsynth.model_path("default") == minilm and negsynth.model_path("some/hub-name") == "some/hub-name"
    task = retrieval_task("tiny", write_beir(tmp_path / "tiny", qrels="a\td1\nb\td2\nc\td3\n"))
    rep = negsynth.evaluate_model("default", [task], suite="full", overrides=["embedder.device=cpu"], per_query=True)
    per_query = rep["tasks"]["tiny"]["per_query"]
    assert sorted(per_query) == ["a", "b", "c"] and rep["tasks"]["tiny"]["main_score"] == pytest.approx(sum(per_query.values()) / 3)
    assert min(per_query.values()) > 0.5  # each query finds its own document near the top
    with pytest.raises(UserError, match="no such folder") as e:
        negsynth.evaluate_model(str(tmp_path / "no" / "model"), [task])
    assert "\n" not in str(e.value)
