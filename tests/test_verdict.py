"""The verdict on the team's own documents: the rule on constructed per-query ranks (better,
worse, no measurable change, a regression on general sets), and the evaluate stage giving it
after corpus and heldout (its summary, ``--json``, verdict.json), or no verdict where a held-out
document was trained on; the exported model card carries its line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from fake_openai import FakeOpenAI
from helpers import write_run_config
from test_corpus import answer, invoke, write_big_corpus

from negsynth.evaluate.own_corpus import corpus_vectors, general_sets, own_corpus, per_query, ranks_of, verdict


def _own(base, tuned):
    return own_corpus(base, tuned, [f"q{i}" for i in range(len(base))])


def test_ranks_and_per_query_scores():
    docs = np.eye(4, dtype=np.float32)
    queries = np.array([[1, 0, 0, 0], [0.9, 0.1, 0, 0], [0, 0, 0, 1]], dtype=np.float32)
    assert ranks_of(queries, docs, [0, 1, 2]).tolist() == [1, 2, 4]  # documents 0 and 1 tie with 2 (0): counted above it
    s = per_query(np.array([1, 3, 11, 150]))
    assert s["ndcg@10"].tolist() == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert s["recall@10"].tolist() == [1, 1, 0, 0] and s["recall@100"].tolist() == [1, 1, 1, 0]


def test_better_worse_and_no_measurable_change():
    rng = np.random.default_rng(0)
    base = rng.integers(2, 40, size=100)
    better = np.maximum(1, base - 10)  # the document found higher on every query
    v = verdict(_own(base, better), general_sets(None, "no evaluation data"))
    assert v["verdict"] == "better" and v["line"].startswith("verdict: better on your documents: nDCG@10 +")
    assert "100 held-out queries" in v["line"] and v["line"].endswith("general sets not evaluated (no evaluation data)")
    assert v["own_corpus"]["metrics"]["ndcg@10"]["ci_low"] > 0 and len(v["own_corpus"]["per_query"]) == 100
    assert verdict(_own(better, base), general_sets(None))["verdict"] == "worse"
    # half the queries up, half down by the same amount: no measurable change
    swap = rng.permutation(np.repeat([1, 2], 50))
    v = verdict(_own(swap, 3 - swap), general_sets(None))
    assert v["verdict"] == "no measurable change" and v["line"].startswith("verdict: no measurable change on your documents")


def test_a_regression_on_general_sets_is_named():
    base = np.full(60, 20)
    better = np.full(60, 3)
    better[::7] = 20  # not every query: an interval with width
    ok = {"average": {"delta": -0.004}, "categories": {"STS": {"delta": -0.01}, "Clust": {"delta": 0.02}}}
    v = verdict(_own(base, better), general_sets(ok))
    assert v["verdict"] == "better" and not v["regression_on_general_sets"] and v["line"].endswith("general sets -0.40 (no regression)")
    drop = {"average": {"delta": -0.005}, "categories": {"STS": {"delta": 0.0}, "Clust": {"delta": -0.031}}}
    v = verdict(_own(base, better), general_sets(drop))
    assert v["verdict"] == "better" and v["regression_on_general_sets"]
    assert v["line"].startswith("verdict: better on your documents, worse on general sets (Clust -3.10): nDCG@10 +")
    assert verdict(None, general_sets(None), "too few documents")["line"] == "no verdict: too few documents"


def test_document_vectors_are_kept_per_model_and_corpus(tmp_path):
    class Emb:
        dim, calls = 2, 0

        def identity(self):
            return {"model": "x"}

        def encode_documents(self, texts):
            Emb.calls += 1
            return np.ones((len(texts), 2), dtype=np.float32)

    batches = lambda: iter([["a", "b"], ["c"]])  # noqa: E731
    first = corpus_vectors(Emb(), batches, 3, {"files": 1}, tmp_path)
    again = corpus_vectors(Emb(), batches, 3, {"files": 1}, tmp_path)
    assert first.shape == again.shape == (3, 2) and Emb.calls == 2  # the second read them back
    corpus_vectors(Emb(), batches, 3, {"files": 2}, tmp_path)  # another corpus: embedded
    assert Emb.calls == 4


def _run(tmp_path, folder, stages, **sections):
    """``negsynth run`` of ``stages`` on the corpus ``folder``; evaluate with no general sets and
    the base model as the tuned one (the same ranks: no measurable change)."""
    (tmp_path / "no-data").mkdir(exist_ok=True)
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        cfg = write_run_config(
            tmp_path,
            srv.base_url,
            corpus={"inputs": [{"path": str(folder)}], "mining": {"relative_margin": 0.0}},
            pipeline={"stages": stages},
            evaluate={"data_dir": str(tmp_path / "no-data"), "model": sections.pop("model")},
            **sections,
        )
        r = invoke("run", "-c", cfg, "-d", tmp_path / "run", "--json")
        assert r.exit_code == 0, r.output
    return cfg, r


def test_evaluate_gives_the_verdict_after_corpus_and_heldout(tmp_path, minilm):
    folder = write_big_corpus(tmp_path, 40)
    cfg, r = _run(tmp_path, folder, ["corpus", "heldout", "evaluate"], heldout={"min_queries": 3, "share": 0.2}, model=minilm)
    assert "verdict: no measurable change on your documents: nDCG@10 +0.00" in r.output
    v = json.loads((tmp_path / "run" / "evaluate" / "verdict.json").read_text())
    assert v["verdict"] == "no measurable change" and v["own_corpus"]["queries"] == 8
    assert (
        v["general_sets"] == {"ran": False, "reason": v["general_sets"]["reason"]} and "no-data" in v["general_sets"]["reason"]
    )  # its sets are not there
    stats = json.loads((tmp_path / "run" / "evaluate" / "stats.json").read_text())
    assert stats["verdict"]["own_corpus"]["per_query"] == v["own_corpus"]["per_query"]  # --json carries every figure
    corpus_docs = {
        json.loads(x)["meta"]["doc_id"] for p in (tmp_path / "run" / "corpus").glob("shard-*.jsonl") for x in p.read_text().splitlines()
    }
    held_docs = {json.loads(x)["doc_id"] for p in (tmp_path / "run" / "heldout").glob("shard-*.jsonl") for x in p.read_text().splitlines()}
    assert len(held_docs) == 8 and not corpus_docs & held_docs and len(corpus_docs) == 32  # the sample less the held-out documents
    r = invoke("evaluate", "-c", cfg, "-d", tmp_path / "run", "--model", minilm, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout[r.stdout.index("{") :])["verdict"]["line"] == v["line"]
    # inspect, its HTML page and the exported model card say it too
    r = invoke("inspect", "-d", tmp_path / "run")
    assert r.exit_code == 0 and v["line"] in r.output.replace("\n", "") and "8 of 40 documents held out" in r.output
    from negsynth.export.model import export_model
    from negsynth.report_html import write_html

    assert v["line"] in write_html(tmp_path / "run", tmp_path / "page.html").read_text()
    shutil.copytree(minilm, tmp_path / "run" / "train" / "final")  # a trained model stands in
    assert export_model(tmp_path / "run", tmp_path / "out")["verdict"] == v["line"]
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"**{v['line']}**" in card and "| ndcg@10 |" in card


def test_no_verdict_where_a_held_out_document_was_trained_on(tmp_path, minilm):
    folder = write_big_corpus(tmp_path, 40)
    _run(tmp_path, folder, ["corpus"], heldout={"queries": 0}, model=minilm)  # a run dir made before held-out sets: every document sampled
    _, r = _run(tmp_path, folder, ["heldout", "evaluate"], heldout={"min_queries": 3, "share": 0.2}, model=minilm)
    v = json.loads((tmp_path / "run" / "evaluate" / "verdict.json").read_text())
    assert v["verdict"] == "none" and v["line"].startswith("no verdict: 8 of 8 held-out documents are positives of training examples")
    assert "no verdict: 8 of 8" in r.output
