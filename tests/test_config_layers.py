"""One set of defaults: a user's run file is layered over the built-in one, so what ``negsynth
config`` prints is what a file that does not mention a key gets."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.schemas.config_io import load_config


def printed(*args: str) -> dict:
    r = CliRunner().invoke(app, ["config", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_a_minimal_user_file_trains_with_the_values_negsynth_config_prints(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('[llm]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "x"\n')
    shown = printed()["train"]
    got = load_config(f).train.model_dump(mode="json", exclude_none=True)
    assert got == shown
    # the values a user TOML used to get from the pydantic fields instead (batch 64 x accum 8, 512 tokens)
    assert (got["batch_size"], got["grad_accum"], got["max_length"]) != (64, 8, 512)
    assert printed("-c", str(f))["train"] == shown
    assert printed("-c", str(f))["curriculum"] == printed()["curriculum"]


def test_a_user_key_wins_and_a_named_recipe_still_fills_what_the_user_left_unset(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text("[train]\nlr = 1e-4\n[generate]\nexamples = 5\n")
    cfg = load_config(f)
    assert cfg.train.lr == 1e-4 and cfg.generate.examples == 5
    assert cfg.generate.num_words == load_config().generate.num_words  # the rest of [generate] is the built-in one
    bellm = tmp_path / "bellm.toml"
    bellm.write_text('[train]\nrecipe = "bellm"\nmodel = "smollm2"\n')
    tc = load_config(bellm).train
    assert (tc.lr, tc.pooling, tc.lora.enabled) == (2e-4, "last", True)  # not the built-in lr 2e-5 / mean pooling
    assert tc.batch_size == load_config().train.batch_size


def test_config_with_a_file_marks_the_keys_the_file_set(tmp_path):
    f = tmp_path / "mine.toml"
    default_batch = load_config().train.batch_size
    f.write_text(f'[train]\nlr = 1e-4\nbatch_size = {default_batch}\n[[corpus.inputs]]\npath = "docs.jsonl"\n')
    r = CliRunner().invoke(app, ["config", "-c", str(f), "--set", "train.epochs=2"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    mark = f"# {f}"
    assert f"lr = 0.0001  {mark}" in lines
    assert f"batch_size = {default_batch}  {mark} (= default)" in lines
    assert "epochs = 2.0  # --set" in lines
    assert f"inputs = [  {mark}" in lines  # an array of tables: its key
    assert "grad_accum = 1" in lines  # inherited: no mark
    import tomllib

    assert tomllib.loads(r.stdout)["train"]["lr"] == 1e-4  # still TOML a user can save and pass back
