"""score -> curriculum -> train -> evaluate through the CLI on examples made by the fake LLM.

Real MiniLM, a handful of steps, and a tiny hand-made STS set as the benchmark folder, so the
whole chain runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, always_valid
from helpers import STS_ROWS, write_sts12
from test_cli_pipeline import invoke, runner, write_config

from negsynth.cli import app

pytest.importorskip("sentence_transformers")


@pytest.fixture
def run_dir_with_examples(tmp_path):
    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        rd = tmp_path / "run"
        assert invoke("brainstorm", "-c", str(cfg), "-d", str(rd), "-q").exit_code == 0
        assert invoke("generate", "-c", str(cfg), "-d", str(rd), "-q", "--set", "generate.examples=32").exit_code == 0
    return rd, write_sts12(tmp_path / "data")


def plumbing_options(rd) -> list[str]:
    """The run dir and settings every stage command here gets: score annotates and does not dedup
    (the fake LLM's texts are arbitrary and alike; these are plumbing checks), small mixed batches."""
    return [
        "-d",
        str(rd),
        "--set",
        "train.batch_size=4",
        "--set",
        "curriculum.homogeneous_batches=false",
        "--set",
        "score.policy=annotate",
        "--set",
        "score.dedup=false",
    ]


def test_score_curriculum_train_evaluate(run_dir_with_examples):
    rd, data = run_dir_with_examples
    common = plumbing_options(rd)
    r = runner.invoke(app, ["score", *common, "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["curriculum", *common, "--json"])
    assert r.exit_code == 0, r.output
    cur = json.loads(r.stdout)
    # 32 examples, 4 disjoint phase groups of 8 = 2 full batches of 4 each
    assert cur["rows"] == 32 and cur["batch_size"] == 4
    assert len(cur["rows_per_phase"]) == 4 and set(cur["rows_per_phase"].values()) == {8}
    import datasets

    ds = datasets.load_from_disk(str(rd / "curriculum" / "dataset"))
    assert ds["level"][0] == 4 and ds["level"][-1] == 1  # easiest first, hardest last
    assert ds["phase"] == sorted(ds["phase"])
    r = runner.invoke(app, ["train", *common, "--set", "train.max_length=32", "--set", "train.grad_accum=1", "--json", "-q"])
    assert r.exit_code == 0, r.output
    tr = json.loads(r.stdout[r.stdout.index("{") :])
    assert tr["steps"] == 8 and (rd / "train" / "final" / "modules.json").exists()
    r = runner.invoke(app, ["evaluate", *common, "--data-dir", str(data), "--tasks", "STS12", "--json", "-q"])
    assert r.exit_code == 0, r.output
    ev = json.loads(r.stdout[r.stdout.index("{") :])
    assert ev["model"].endswith("final") and ev["baseline"] == "default"
    rep = json.loads((rd / "evaluate" / "report.json").read_text())
    base = json.loads((rd / "evaluate" / "baseline.json").read_text())
    assert set(rep["tasks"]) == {"STS12"} and rep["tasks"]["STS12"]["n"] == len(STS_ROWS)
    assert base["tasks"]["STS12"]["main_score"] > 0.5  # MiniLM ranks these obvious pairs well
    # relaunch policy "rebuild": unchanged config and inputs -> reused as they are; changed -> rebuilt
    # without --overwrite (derived data), and the stage downstream of it follows
    train_args = ["train", *common, "--set", "train.max_length=32", "--set", "train.grad_accum=1", "--json", "-q"]
    stamps = {p: p.stat().st_mtime_ns for p in (rd / "curriculum" / "stats.json", rd / "train" / "stats.json")}
    assert runner.invoke(app, ["curriculum", *common, "-q"]).exit_code == 0 and runner.invoke(app, train_args).exit_code == 0
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    r = runner.invoke(app, ["curriculum", *common, "--schedule", "tuple", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["schedule"] == "tuple" and datasets.load_from_disk(str(rd / "curriculum" / "dataset"))["level"][0] == 0
    r = runner.invoke(app, train_args)
    assert r.exit_code == 0, r.output
    assert (rd / "train" / "stats.json").stat().st_mtime_ns != stamps[rd / "train" / "stats.json"]


def test_evaluate_without_data_says_so(tmp_path):
    r = runner.invoke(app, ["evaluate", "-d", str(tmp_path / "r"), "--data-dir", str(tmp_path / "nothing"), "--baseline", "", "--json"])
    # nothing evaluated: one line naming the way to get data, and a failing exit code
    assert r.exit_code == 2, r.output
    assert "no evaluation data" in r.stderr and "NEGSYNTH_DATA_DIR" in r.stderr and r.stderr.count("\n") == 1


def test_evaluate_options_arrive_as_typed_even_with_quotes(tmp_path):
    """--data-dir and --tasks become evaluate.* overrides: a quote in a path is part of the path."""
    data = tmp_path / 'it\'s "data"'
    r = runner.invoke(app, ["evaluate", "-d", str(tmp_path / "r"), "--data-dir", str(data), "--baseline", "", "--json"])
    assert r.exit_code == 2, r.output
    assert f"no evaluation data at {data};" in r.stderr
    r = runner.invoke(app, ["evaluate", "-d", str(tmp_path / "r"), "--data-dir", str(data), "--tasks", "STS12, it's", "--engine", "x"])
    assert r.exit_code == 2 and "[evaluate] engine" in r.stderr and "'x'" in r.stderr, r.output


def test_config_sets_writes_toml_literals():
    from negsynth.cli import config_sets
    from negsynth.schemas.config_io import load_config

    sets = config_sets("evaluate", suite=None, tasks=["STS12", "a'b"], data_dir=Path("/x/it's"), cache=False, backend="torch")
    cfg = load_config(None, sets)
    assert (cfg.evaluate.tasks, cfg.evaluate.data_dir, cfg.evaluate.cache, cfg.evaluate.suite) == (
        ["STS12", "a'b"],
        "/x/it's",
        False,
        "quick",
    )


def test_evaluate_without_data_says_so_with_transformers_progress_bars_on(tmp_path):
    """transformers reads HF_HUB_DISABLE_PROGRESS_BARS when first imported: imported before the
    CLI sets it (another test, a notebook), its "Loading weights" bar reached stderr."""
    from transformers.utils import logging as tl

    was = tl.is_progress_bar_enabled()
    tl.enable_progress_bar()
    try:
        test_evaluate_without_data_says_so(tmp_path)
        assert tl.is_progress_bar_enabled()  # negsynth quiets its own loading only, then restores the setting
    finally:
        if not was:
            tl.disable_progress_bar()


def test_curriculum_without_score_says_what_to_run(tmp_path):
    r = runner.invoke(app, ["curriculum", "-d", str(tmp_path / "r")])
    assert r.exit_code == 2 and "run `negsynth score` first" in r.stderr


def test_train_on_a_zero_row_curriculum_says_so_in_one_line(tmp_path):
    import datasets

    rd = tmp_path / "run"
    cur = rd / "curriculum"
    datasets.Dataset.from_dict({"anchor": [], "positive": [], "negative": []}).save_to_disk(str(cur / "dataset"))
    (cur / "stats.json").write_text(json.dumps({"stage": "curriculum", "rows": 0}))
    r = runner.invoke(app, ["train", "-d", str(rd)])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(cur) in r.stderr and "0 rows" in r.stderr and "negsynth curriculum" in r.stderr, r.stderr


def test_evaluate_with_a_missing_model_fails_in_one_line(tmp_path):
    r = runner.invoke(app, ["evaluate", "-d", str(tmp_path / "r"), "--model", str(tmp_path / "nope"), "--baseline", ""])
    assert r.exit_code == 2 and "nope" in r.stderr and "--model" in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_unknown_schedule_is_refused_before_reading_anything(tmp_path):
    r = runner.invoke(app, ["curriculum", "-d", str(tmp_path / "r"), "--schedule", "backwards"])
    assert r.exit_code == 2 and "unknown schedule 'backwards'" in r.stderr and "tuple:K" in r.stderr


def test_tuple_schedule_trains_on_every_negative(run_dir_with_examples):
    rd, _ = run_dir_with_examples
    common = plumbing_options(rd)
    assert runner.invoke(app, ["score", *common, "-q"]).exit_code == 0
    r = runner.invoke(app, ["curriculum", *common, "--schedule", "tuple", "--json"])
    assert r.exit_code == 0, r.output
    cur = json.loads(r.stdout)
    assert cur["schedule"] == "tuple" and cur["rows"] == 32 and cur["rows_per_phase"] == {"1": 32}  # one pass, one phase
    import datasets

    ds = datasets.load_from_disk(str(rd / "curriculum" / "dataset"))
    assert [c for c in ds.column_names if c.startswith("negative")] == ["negative_1", "negative_2", "negative_3", "negative_4"]
    r = runner.invoke(app, ["train", *common, "--set", "train.max_length=32", "--set", "train.grad_accum=1", "--json", "-q"])
    assert r.exit_code == 0, r.output
    tr = json.loads(r.stdout[r.stdout.index("{") :])
    assert tr["steps"] == 8 and tr["rows"] == 32
