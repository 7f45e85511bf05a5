"""benchmarks/decoder_sts.py: a results file made with other settings is refused, not mixed in."""

import json
from pathlib import Path

import pytest
from helpers import load_benchmark


def load_script():
    return load_benchmark("decoder_sts")


def write_results(out: Path, **args) -> None:
    out.mkdir(parents=True)
    saved = {"model": "smollm2", "rows": "512", "batch_size": "16", "steps": "-1", "max_length": "64", "eval_suite": "quick", **args}
    (out / "results.json").write_text(json.dumps({"args": saved, "results": []}))


def test_results_of_other_settings_are_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-data"))
    out = tmp_path / "runs"
    write_results(out)
    with pytest.raises(SystemExit, match=r"holds arms run with --steps -1; use another --out"):
        load_script().main(["--out", str(out), "--rows", "512", "--eval-suite", "quick", "--steps", "10"])


def test_results_of_the_same_settings_are_resumed(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-data"))
    out = tmp_path / "runs"
    write_results(out)
    # past the settings check, the next stop is the missing evaluation data
    with pytest.raises(SystemExit, match="no evaluation data"):
        load_script().main(["--out", str(out), "--rows", "512", "--eval-suite", "quick"])


def test_a_file_from_before_model_and_steps_were_recorded_counts_as_smollm2_one_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-data"))
    out = tmp_path / "runs"
    out.mkdir()
    old = {"rows": "512", "batch_size": "16", "max_length": "64", "eval_suite": "quick"}
    (out / "results.json").write_text(json.dumps({"args": old, "results": []}))
    with pytest.raises(SystemExit, match=r"--model smollm2"):
        load_script().main(["--out", str(out), "--rows", "512", "--eval-suite", "quick", "--model", "/models/other"])
