"""``benchmarks/corpus_recipe.py``: every arm is a run file negsynth accepts, and the
cross-encoder arms need the model named (one line, before anything runs)."""

from __future__ import annotations

import pytest
import tomli_w
from helpers import load_benchmark

from negsynth import load_config


def test_every_pipeline_arm_is_a_valid_run_file(tmp_path):
    mod = load_benchmark("corpus_recipe")
    args = mod.build_parser().parse_args([])
    for name, spec in mod.ARMS.items():
        if spec is None or spec.get("stock"):
            continue
        if name in mod.NEEDS_TEACHER_MODEL:
            spec = {**spec, "teacher_model": "some/cross-encoder"}
        path = tmp_path / f"{name}.toml"
        path.write_text(tomli_w.dumps(mod.pipeline_toml(tmp_path / "corpus", spec, args, 0)))
        cfg = load_config(path)
        assert cfg.corpus.teacher == spec.get("teacher", "none"), name
        if name in mod.NEEDS_TEACHER_MODEL:
            assert cfg.corpus.teacher_model == "some/cross-encoder"


def test_the_cross_encoder_arms_need_a_model(tmp_path, capsys):
    mod = load_benchmark("corpus_recipe")
    assert {"mined-ce-mse", "mined-ce-kl", "mined-ce-k1"} <= set(mod.NEEDS_TEACHER_MODEL)
    with pytest.raises(SystemExit):
        mod.main(["--arms", "base,mined-ce-mse", "--out", str(tmp_path / "out")])
    assert "name the cross-encoder with --teacher-model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
