"""evaluate.engine = "mteb": MTEB's tasks and evaluators over local files, beside negsynth's own."""

from __future__ import annotations

import json
import random
import sys
import zlib

import numpy as np
import pytest
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.embed.base import Embedder
from negsynth.evaluate import evaluate

mteb = pytest.importorskip("mteb", reason="mteb not installed (pip install 'negsynth[eval]')")

WORDS = [f"w{i}" for i in range(400)]


class GaussBOW(Embedder):
    """A text is the sum of fixed random vectors of its words: continuous scores, so no ties
    that two correct rankers could break differently."""

    name = "gauss-bow"

    @property
    def dim(self) -> int:
        return 64

    def _encode(self, texts, *, batch_size, show_progress):
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.split():
                out[i] += np.random.default_rng(zlib.crc32(w.encode())).standard_normal(64)
        return out


def write_sts(root, n=40, seed=0):
    rng = random.Random(seed)
    rows = ["sentence1\tsentence2\tscore"]
    for _ in range(n):
        a = rng.sample(WORDS, 8)
        keep = rng.randint(0, 7)  # never identical: float32 and float64 cosines break a tie at 1.0 differently
        b = a[:keep] + rng.sample(WORDS, 8 - keep)
        rows.append(f"{' '.join(a)}\t{' '.join(b)}\t{keep * 5 / 8 + rng.random() * 0.3:.3f}")
    (root / "stsb").mkdir(parents=True)
    (root / "stsb" / "test.tsv").write_text("\n".join(rows) + "\n")


def write_beir(root, n_docs=60, n_queries=12, seed=0):
    rng = random.Random(seed)
    d = root / "scifact"
    d.mkdir(parents=True)
    docs = {f"d{i}": rng.sample(WORDS, 12) for i in range(n_docs)}
    with open(d / "corpus.jsonl", "w") as f:
        for k, w in docs.items():
            f.write(json.dumps({"_id": k, "title": w[0], "text": " ".join(w[1:])}) + "\n")
    qrels = ["query-id\tcorpus-id\tscore"]
    with open(d / "queries.jsonl", "w") as f:
        for q in range(n_queries):
            rel = rng.sample(sorted(docs), 2)
            words = rng.sample(docs[rel[0]], 4) + rng.sample(docs[rel[1]], 2) + rng.sample(WORDS, 3)
            f.write(json.dumps({"_id": f"q{q}", "text": " ".join(words)}) + "\n")
            qrels += [f"q{q}\t{rel[0]}\t1", f"q{q}\t{rel[1]}\t1"]
    (d / "qrels.tsv").write_text("\n".join(qrels) + "\n")


@pytest.mark.parametrize("instruct", [False, True], ids=["plain", "instructed-queries"])
def test_mteb_engine_scores_local_files_like_negsynths_evaluator(tmp_path, instruct):
    """One scoring question, two code paths: mteb's evaluators on the local files give the same
    Spearman and nDCG@10 as negsynth's (any negsynth embedder, through the mteb encoder wrapper,
    queries with their task instruction when the embedder uses them); mteb's own result files
    are written beside the report."""
    data = tmp_path / "data"
    write_sts(data)
    write_beir(data)

    def emb():
        e = GaussBOW()
        e.instruct_queries = instruct
        return e

    ours = evaluate(emb(), suite="full", data_dir=data, tasks="STSBenchmark,SciFact", progress=False)
    rep = evaluate(
        emb(), suite="full", data_dir=data, tasks="STSBenchmark,SciFact", progress=False, engine="mteb", out=tmp_path / "ev" / "report.json"
    )
    for name in ("STSBenchmark", "SciFact"):
        assert rep["tasks"][name]["engine"] == "mteb" and rep["tasks"][name]["source"].startswith(str(data))
        assert rep["tasks"][name]["main_score"] == pytest.approx(ours["tasks"][name]["main_score"], abs=1e-4), name
    assert rep["tasks"]["SciFact"]["n"] == 12 and rep["tasks"]["STSBenchmark"]["n"] == 40
    assert 0.2 < rep["tasks"]["SciFact"]["main_score"] < 1.0  # not a degenerate ranking
    saved = json.loads((tmp_path / "ev" / "mteb" / "SciFact.json").read_text())
    assert saved["task_name"] == "SciFact" and saved["scores"]["test"][0]["ndcg_at_10"] == pytest.approx(
        rep["tasks"]["SciFact"]["main_score"]
    )


def write_pairs(root, n=60, seed=0):
    rng = random.Random(seed)
    rows = ["text1\ttext2\tlabel"]
    for _ in range(n):
        a = rng.sample(WORDS, 8)
        keep = rng.randint(0, 7)
        b = a[:keep] + rng.sample(WORDS, 8 - keep)
        rows.append(f"{' '.join(a)}\t{' '.join(b)}\t{int(keep + rng.random() * 3 > 5)}")
    (root / "twitter_semeval2015").mkdir(parents=True)
    (root / "twitter_semeval2015" / "test.tsv").write_text("\n".join(rows) + "\n")


def test_mteb_engine_scores_local_pair_classification_like_negsynth(tmp_path):
    """TwitterSemEval2015 (an MTEB pair-classification task) from the local TSV: mteb's main score
    is the best AP over its similarity functions, negsynth's the AP of cosine; on unit vectors
    mteb's cosine AP is negsynth's."""
    data = tmp_path / "data"
    write_pairs(data)
    ours = evaluate(GaussBOW(), suite="full", data_dir=data, tasks="TwitterSemEval2015", progress=False)
    rep = evaluate(
        GaussBOW(), suite="full", data_dir=data, tasks="TwitterSemEval2015", progress=False, engine="mteb", out=tmp_path / "ev" / "r.json"
    )
    t = rep["tasks"]["TwitterSemEval2015"]
    assert t["engine"] == "mteb" and t["source"].startswith(str(data)) and t["n"] == 60
    saved = json.loads((tmp_path / "ev" / "mteb" / "TwitterSemEval2015.json").read_text())["scores"]["test"][0]
    assert saved["cosine_ap"] == pytest.approx(ours["tasks"]["TwitterSemEval2015"]["main_score"], abs=1e-4)
    assert t["main_score"] == pytest.approx(saved["max_ap"]) and t["main_score"] >= saved["cosine_ap"] - 1e-9


def test_mteb_engine_keeps_negsynths_evaluator_for_sets_mteb_does_not_list(tmp_path):
    data = tmp_path / "data"
    write_sts(data)
    (data / "stsb" / "dev.tsv").write_text((data / "stsb" / "test.tsv").read_text())
    rep = evaluate(GaussBOW(), suite="full", data_dir=data, tasks="STSBenchmark,STSBenchmark-dev", progress=False, engine="mteb")
    assert rep["tasks"]["STSBenchmark"]["engine"] == "mteb"
    assert "engine" not in rep["tasks"]["STSBenchmark-dev"]  # a dev split: not an MTEB task
    assert rep["engine"] == "mteb" and any("mteb" in n for n in rep["notes"])


def test_mteb_engine_errors_are_one_line(tmp_path, monkeypatch):
    data = tmp_path / "data"
    write_sts(data)
    runner = CliRunner()
    args = ["evaluate", "-d", str(tmp_path / "r"), "--model", "default", "--baseline", "", "--data-dir", str(data), "--engine", "mteb"]
    r = runner.invoke(app, [*args, "--tasks", "NoSuchTaskAnywhere"])
    assert r.exit_code == 2 and "'NoSuchTaskAnywhere' is not an MTEB task" in r.stderr and r.stderr.count("\n") == 1, r.output
    monkeypatch.setitem(sys.modules, "mteb", None)  # as if not installed
    r = runner.invoke(app, [*args, "--tasks", "STSBenchmark"])
    assert r.exit_code == 2 and "pip install 'negsynth[eval]'" in r.stderr and r.stderr.count("\n") == 1, r.output
