"""The command line a new user meets first: one way to name the run dir, train's own flags,
messages that name real flags, inspect's words for mined negatives, tables not cut in a pipe."""

from __future__ import annotations

import json

import pytest
from helpers import scored_example
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import atomic_write_json, write_jsonl

runner = CliRunner()


def scored_run(tmp_path, *, mined: bool):
    d = tmp_path / "run"
    rows = []
    for i in range(4):
        ex = scored_example(i, tau=0.4, mono=False)
        ex["model"] = "mined:default:corpus" if mined else "gpt-test"
        rows.append(ex)
    write_jsonl(d / "score" / "shard-00000.jsonl", rows)
    atomic_write_json(d / "score" / "stats.json", {"embedder": "fake"})
    return d


def test_inspect_takes_the_run_dir_as_d_like_every_command_and_its_path_still(tmp_path):
    d = scored_run(tmp_path, mined=False)
    by_flag = runner.invoke(app, ["inspect", "-d", str(d), "--json"])
    by_long = runner.invoke(app, ["inspect", "--run-dir", str(d), "--json"])
    by_path = runner.invoke(app, ["inspect", str(d), "--json"])
    assert by_flag.exit_code == by_long.exit_code == by_path.exit_code == 0, by_flag.output
    assert json.loads(by_flag.stdout)["score"] == json.loads(by_path.stdout)["score"] == json.loads(by_long.stdout)["score"]
    r = runner.invoke(app, ["inspect"])
    assert r.exit_code == 2 and "-d RUN_DIR" in r.output and r.output.strip().count("\n") == 0
    r = runner.invoke(app, ["inspect", str(d), "-d", str(tmp_path)])
    assert r.exit_code == 2 and "pass one" in r.output


@pytest.mark.parametrize("cmd", ["export", "estimate", "evaluate", "train", "run", "score", "curriculum", "inspect"])
def test_every_command_that_reads_a_run_dir_takes_d(cmd):
    r = runner.invoke(app, [cmd, "--help"], terminal_width=200)
    assert r.exit_code == 0 and "--run-dir" in r.output and "-d" in r.output, r.output


def test_train_flags_reach_the_train_config(tmp_path, monkeypatch):
    """--model --epochs --lr are train.model / train.epochs / train.lr, as --set would give them."""
    seen = {}

    def fake_run(name, opts, extra_sets=None):
        seen["cfg"] = opts.context(extra_sets).cfg
        return {}

    monkeypatch.setattr("negsynth.cli.stages._run", fake_run)
    r = runner.invoke(app, ["train", "-d", str(tmp_path / "r"), "--model", "minilm", "--epochs", "3", "--lr", "5e-5"])
    assert r.exit_code == 0, r.output
    tc = seen["cfg"].train
    assert (tc.model, tc.epochs, tc.lr) == ("minilm", 3.0, 5e-5)
    # the user's own --set comes after the flags, and a flag not given leaves the config alone
    r = runner.invoke(app, ["train", "-d", str(tmp_path / "r"), "--lr", "5e-5", "--set", "train.lr=1e-3"])
    assert r.exit_code == 0 and seen["cfg"].train.lr == 1e-3 and seen["cfg"].train.model == "default"


def test_flag_values_with_quotes_and_backslashes_reach_the_config_as_typed(tmp_path, monkeypatch):
    """A flag becomes a --set assignment serialised as TOML: a value holding a double quote, a
    backslash or a single quote arrives whole, not cut at a quote or unescaped."""
    from negsynth.cli import config_sets, embedder_overrides
    from negsynth.schemas.config_io import apply_override

    odd = 'C:\\models\\my "best" model\'s\\'
    data: dict = {}
    for s in config_sets("evaluate", model=odd, tasks=[odd, "sts"]) + embedder_overrides(f"st:{odd}"):
        apply_override(data, s)
    assert data["evaluate"] == {"model": odd, "tasks": [odd, "sts"]}
    assert data["embedder"] == {"kind": "sentence-transformers", "model": odd}

    seen = {}

    def fake_run(name, opts, extra_sets=None):
        seen[name] = opts.context(extra_sets).cfg
        return {}

    monkeypatch.setattr("negsynth.cli.stages._run", fake_run)
    r = runner.invoke(app, ["score", "-d", str(tmp_path / "r"), "--embedder", f"decoder:{odd}"])
    assert r.exit_code == 0, r.output
    assert (seen["score"].embedder.kind, seen["score"].embedder.model) == ("decoder", odd)


@pytest.mark.parametrize("stage", ["corpus", "regenerate"])
def test_estimate_without_inputs_names_the_ways_estimate_takes_them(tmp_path, stage):
    r = runner.invoke(app, ["estimate", "-d", str(tmp_path / "r"), "--stages", stage])
    assert r.exit_code == 2
    line = r.output.strip()
    assert "\n" not in line and ("--input PATH" in line) == (stage == "corpus")
    assert f"[[{stage}.inputs]]" in line and f"--set '{stage}.inputs=" in line
    # the --set it suggests is one estimate takes
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": f"document number {i} about things"}) + "\n" for i in range(8))
    )  # more than mining needs
    if stage == "corpus":
        r = runner.invoke(
            app,
            ["estimate", "-d", str(tmp_path / "r"), "--stages", "corpus", "--latency", "5", "--set", f'corpus.inputs=[{{path="{docs}"}}]'],
        )
        assert r.exit_code == 0, r.output
        # --input, as `negsynth corpus -i` takes it: the corpus stage is what is estimated, and its held-out set
        # (none of 8 documents, and the estimate says why)
        by_flag = runner.invoke(app, ["estimate", "-d", str(tmp_path / "r"), "-i", str(docs), "--latency", "5", "--json"])
        assert by_flag.exit_code == 0, by_flag.output
        est = json.loads(by_flag.stdout)["stages"]
        assert list(est) == ["corpus", "heldout"] and est["corpus"]["requests"] == 8 and est["heldout"]["requests"] == 0
        assert any("too few to set aside a held-out set" in b for b in est["heldout"]["basis"])


def test_inspect_calls_mined_levels_rank_bands_and_claims_no_llm_order(tmp_path):
    for mined in (False, True):
        d = scored_run(tmp_path / str(mined), mined=mined)
        r = runner.invoke(app, ["inspect", "-d", str(d), "--sample", "1"])
        assert r.exit_code == 0, r.output
        page = tmp_path / f"{mined}.html"
        assert runner.invoke(app, ["inspect", "-d", str(d), "--html", str(page)]).exit_code == 0
        html = page.read_text()
        if mined:
            assert "rank band" in r.output and "band 1" in r.output
            assert "LLM level" not in r.output and "Kendall" not in r.output and "tau" not in r.output
            assert "per rank band" in html and "LLM level" not in html and "Kendall" not in html
        else:
            assert "score per LLM level" in r.output and "Kendall tau" in r.output
            assert "per LLM level" in html and "Kendall" in html


def test_tables_are_not_cut_at_80_columns_in_a_pipe(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    d = scored_run(tmp_path, mined=False)
    long_type = "a-task-type-with-a-name-long-enough-to-need-more-than-eighty-columns-in-a-table"
    rows = [scored_example(i, tt=long_type) for i in range(2)]
    write_jsonl(d / "score" / "shard-00001.jsonl", rows)
    r = runner.invoke(app, ["inspect", "-d", str(d)])
    assert r.exit_code == 0, r.output
    assert long_type in r.output  # whole, not folded or cut with an ellipsis
    assert max(len(line) for line in r.output.splitlines()) > 80
