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


def test_pipeline_arms_are_valid_run_files_that_differ_only_where_they_say(tmp_path):
    from negsynth.pipeline.config_io import load_config

    mod = load_script()
    args = argparse.Namespace(steps=28, batch_size=32, lr=2e-5, max_length=128)
    cfgs = {}
    for arm, extra in mod.PIPELINE_ARMS.items():
        assert arm in mod.ALL_ARMS
        toml = tmp_path / f"{arm}.toml"
        toml.write_text(mod.pipeline_toml(tmp_path / "data", args, 1, extra))
        cfgs[arm] = load_config(toml)
    base = cfgs["ns-pipeline"]
    assert base.regenerate.negatives == "mined" and base.train.grad_accum == 1 and base.curriculum.total_steps == 28 and base.train.seed == 1
    assert base.score.dedup_labelled == "exact" and cfgs["ns-pipeline-neardedup"].score.dedup_labelled == "near"
    assert base.regenerate.mining.range_max is None and cfgs["ns-pipeline-wide"].regenerate.mining.range_max == 340
    for arm, cfg in cfgs.items():
        changed = {k for k in ("regenerate", "score", "curriculum", "train") if getattr(cfg, k) != getattr(base, k)}
        assert changed <= {"ns-pipeline": set(), "ns-pipeline-neardedup": {"score"}, "ns-pipeline-wide": {"regenerate"}, "ns-pipeline-noeasy": {"score"}}[arm], (arm, changed)
    assert cfgs["ns-pipeline-noeasy"].score.easy_margin == 0.1 and base.score.easy_margin is None


def test_default_invocation_is_the_headline_and_all_means_every_arm():
    import pytest

    mod = load_script()
    args = mod.build_parser().parse_args([])
    # the default run is the headline (an hour or so on 2 cores): base, the stock recipe, negsynth's default
    assert mod.select_arms(args.arms) == ["base", "st-mined-4", "ns-pipeline"] and args.seeds == [0]
    assert mod.select_arms("all") == list(mod.ALL_ARMS) and mod.select_arms(" st-inbatch , base ") == ["st-inbatch", "base"]
    with pytest.raises(SystemExit, match=r"unknown arm\(s\) \['st-mined-9'\]"):
        mod.select_arms("base,st-mined-9")
    mod.build_parser().format_help()  # the docstring epilog renders (a stray % would raise here)


def test_bad_seeds_and_empty_arms_stop_in_one_line(capsys):
    import pytest

    mod = load_script()
    assert mod.build_parser().parse_args(["--seeds", "0, 1,2"]).seeds == [0, 1, 2]
    for bad, says in (("zero", "'zero': expected comma-separated integers"), (",", "no seed given")):
        with pytest.raises(SystemExit) as e:
            mod.build_parser().parse_args(["--seeds", bad])
        last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse: usage line, then one error line
        assert e.value.code == 2 and last.endswith(f"argument --seeds: {says}, e.g. 0,1,2" if bad == "zero" else f"argument --seeds: {says}; e.g. --seeds 0")
    with pytest.raises(SystemExit, match=r"unknown arm\(s\) ' , '"):
        mod.select_arms(" , ")
