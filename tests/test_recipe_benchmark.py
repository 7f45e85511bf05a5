"""benchmarks/scifact_recipe.py: results of arms run in parallel processes are all kept; too few
LLM-graded examples are refused in one line."""

import argparse
import json
import multiprocessing
from pathlib import Path

from helpers import load_benchmark


def load_script():
    return load_benchmark("scifact_recipe")


def _save(args):
    path, arm, seed = args
    mod = load_script()
    for k in range(5):  # several writes each, interleaved with the other processes'
        mod.save_result(Path(path), {"arm": arm, "seed": seed, "scores": {"SciFact": 0.5 + k / 100}}, argparse.Namespace(out=path))


def test_parallel_processes_keep_each_others_results(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"args": {}, "results": [{"arm": "base", "seed": 0, "scores": {"SciFact": 0.64}}]}))
    jobs = [(str(path), "ns-pipeline", s) for s in (0, 1, 2)] + [(str(path), "st-mined-4", 0)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_save, jobs)
    got = {(r["arm"], r["seed"]): r["scores"]["SciFact"] for r in json.loads(path.read_text())["results"]}
    # every arm once (a rerun replaces its own entry), nobody's result lost
    assert got == {("base", 0): 0.64, ("ns-pipeline", 0): 0.54, ("ns-pipeline", 1): 0.54, ("ns-pipeline", 2): 0.54, ("st-mined-4", 0): 0.54}


def test_too_few_llm_examples_are_refused_before_training(tmp_path, monkeypatch):
    import pytest

    from negsynth.data.shards import write_jsonl

    data = tmp_path / "data" / "scifact"
    (data / "train").mkdir(parents=True)
    (data / "train" / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n")
    run = tmp_path / "llm"
    ex = [{"id": f"e{i}", "task": "t", "task_type": "short-long", "query": f"q{i}", "positive": f"p{i}",
           "negatives": [f"n{i}{k}" for k in range(4)], "source": "scifact"} for i in range(40)]  # fmt: skip
    write_jsonl(run / "score" / "shard-00000.jsonl", ex)
    with pytest.raises(SystemExit, match=r"has 40 scored examples with 4 negatives, 1 batch\(es\) of 32.*need >= 4"):
        load_script().main(["--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "data"), "--arms", "ns-llm-curriculum", "--llm-run", str(run)])
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written
