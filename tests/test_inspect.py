"""inspect: summaries, filters, samples, errors, plots, 100k rows, and the CLI."""

from __future__ import annotations

import json

import pytest
from helpers import scored_example as scored

from negsynth.data.shards import ShardError, atomic_write_json, write_jsonl
from negsynth.errors import UserError
from negsynth.inspect import inspect_path, write_plots


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    write_jsonl(d / "brainstorm" / "shard-00000.jsonl", [{"id": f"t{i}", "task_type": "short-long", "task": "x"} for i in range(3)])
    gen = [{k: v for k, v in scored(i).items() if k != "score"} for i in range(4)]
    write_jsonl(d / "generate" / "shard-00000.jsonl", gen)
    write_jsonl(
        d / "generate" / "rejects" / "shard-00000.jsonl",
        [{"id": "r1", "reason": "schema"}, {"id": "r2", "reason": "schema"}, {"id": "r3", "reason": "too_long"}],
    )
    atomic_write_json(
        d / "generate" / "stats.json", {"tokens": {"prompt": 1000, "completion": 250}, "estimated_cost_usd": 0.0125, "wall_time_s": 3.5}
    )
    rows = [
        scored(0),
        scored(1, fn=(True, False, False, False), cos=(0.95, 0.7, 0.6, 0.5), mono=True),
        scored(2, tt="sts", cos=(0.6, 0.7, 0.2, 0.05), easy=(False, False, False, True), mono=False, tau=2 / 3),
        # reordered: the negative written first is the LLM's level 2
        scored(3, tt="sts", cos=(0.9, 0.8, 0.3, 0.2), order=[1, 0, 2, 3], fn=(True, False, False, False), mono=False, tau=2 / 3),
    ]
    write_jsonl(d / "score" / "shard-00000.jsonl", rows[:2])
    write_jsonl(d / "score" / "shard-00001.jsonl", rows[2:])
    atomic_write_json(d / "score" / "stats.json", {"embedder": "fake", "wall_time_s": 1.0})
    return d


def test_summary_counts_rejects_tokens_and_levels(run_dir):
    rep = inspect_path(run_dir)
    assert list(rep["stages"]) == ["brainstorm", "generate", "score"]
    g = rep["stages"]["generate"]
    assert g["records"] == 4 and g["rejected"] == 3 and g["rejects_by_reason"] == {"schema": 2, "too_long": 1}
    assert g["tokens"] == {"prompt": 1000, "completion": 250} and g["estimated_cost_usd"] == 0.0125
    assert rep["task_types"]["score"] == {"short-long": 2, "sts": 2}
    sc = rep["score"]
    assert sc["examples"] == 4 and sc["cos_pos"]["mean"] == 0.9
    lv = {x["level"]: x for x in sc["levels"]}
    # example 3 was reordered: its cos 0.9 belongs to LLM level 2 and 0.8 to level 1
    assert lv[1]["mean"] == pytest.approx((0.8 + 0.95 + 0.6 + 0.8) / 4)
    assert lv[2]["mean"] == pytest.approx((0.7 + 0.7 + 0.7 + 0.9) / 4)
    assert lv[2]["false_negative_rate"] == 0.25 and lv[1]["false_negative_rate"] == 0.25  # ex-3's flag sits on its level-2 negative
    assert lv[4]["too_easy_rate"] == 0.25
    assert sc["monotonic_pct"] == 50.0
    assert sc["false_negative_rate_by_task_type"] == {"short-long": 0.125, "sts": 0.125}


def test_filters_and_samples(run_dir):
    rep = inspect_path(run_dir, flag="false_negative", sample=5)
    assert {s["id"] for s in rep["samples"]} == {"ex-1", "ex-3"} and rep["selection"]["matching"] == 2
    rep = inspect_path(run_dir, flag="false_negative", level=2, sample=5)
    assert [s["id"] for s in rep["samples"]] == ["ex-3"]
    rep = inspect_path(run_dir, flag="too_easy", sample=5)
    assert [s["id"] for s in rep["samples"]] == ["ex-2"]
    rep = inspect_path(run_dir, flag="non_monotonic", task_type="sts", sample=5)
    assert [s["id"] for s in rep["samples"]] == ["ex-2", "ex-3"]
    rep = inspect_path(run_dir, task_type="short-long", level=3)
    assert rep["score"]["examples"] == 2 and [x["level"] for x in rep["score"]["levels"]] == [3]
    # a sample carries the full record (texts read only for the picked lines)
    assert rep["samples"] == [] and inspect_path(run_dir, sample=1, seed=3)["samples"][0]["query"].startswith("query ")


def test_a_shard_and_a_stage_folder(run_dir):
    rep = inspect_path(run_dir / "score" / "shard-00001.jsonl", sample=2)
    assert rep["stages"]["score"]["records"] == 2 and rep["score"]["examples"] == 2
    assert [s["id"] for s in rep["samples"]] == ["ex-2", "ex-3"]
    rep = inspect_path(run_dir / "generate", sample=1)
    assert rep["score"] is None and rep["stages"]["generate"]["rejected"] == 3 and len(rep["samples"]) == 1


def test_empty_dir_says_so(tmp_path):
    with pytest.raises(UserError, match=r"empty directory — no shard-\*.jsonl found"):
        inspect_path(tmp_path)
    with pytest.raises(UserError, match="no such file or directory"):
        inspect_path(tmp_path / "missing")


def test_corrupted_shard_names_file_and_line(run_dir):
    p = run_dir / "score" / "shard-00001.jsonl"
    lines = p.read_text().splitlines()
    p.write_text(lines[0] + "\n" + lines[1][:40] + "\n")
    with pytest.raises(ShardError, match=r"score/shard-00001.jsonl:2: not valid JSON"):
        inspect_path(run_dir)


def test_flag_without_scores_is_a_user_error(run_dir):
    with pytest.raises(UserError, match="run `negsynth score` first"):
        inspect_path(run_dir / "generate", flag="false_negative")


def test_100k_rows_fast(tmp_path):
    # a 100k-row scored shard (~60 MB of JSON), written with plain string formatting
    d = tmp_path / "big" / "score"
    d.mkdir(parents=True)
    text = "lorem ipsum dolor sit amet " * 8
    head = '{"id":"ex-%d","task":"t","task_type":"%s","query":"%s","positive":"%s","negatives":["%s","%s","%s","%s"],'
    tail = '"score":{"embedder":"f","cos_pos":0.9,"cos_neg":[0.%d,0.7,0.6,0.5],"kendall_tau":1.0,"monotonic":true,"false_negative":[%s,false,false,false],"too_easy":[false,false,false,false],"policy":"annotate","llm_order":null}}\n'
    tts = ("short-long", "sts", "long-short")
    with open(d / "shard-00000.jsonl", "w") as f:
        for i in range(100_000):
            f.write(
                head % (i, tts[i % 3], text, text, text, text, text, text)
                + tail % (8 if i % 10 else 95, "true" if i % 10 == 0 else "false")
            )
    rep = inspect_path(tmp_path / "big", sample=2, flag="false_negative")
    assert rep["stages"]["score"]["records"] == 100_000
    assert rep["task_types"]["score"] == {"short-long": 33334, "sts": 33333, "long-short": 33333}
    assert rep["score"]["examples"] == 10_000 and rep["score"]["levels"][0]["false_negative_rate"] == 1.0
    assert all(int(s["id"].split("-")[1]) % 10 == 0 for s in rep["samples"]) and len(rep["samples"]) == 2
    # its speed is benchmarks/inspect_scale.py's to measure (a time bound here failed under load)


def test_plots_written(run_dir, tmp_path):
    out = write_plots(run_dir, tmp_path / "plots")
    names = sorted(p.name for p in out)
    assert names == ["cos_by_level.png", "flags_by_level.png", "kendall_tau.png", "task_type_mix.png"]
    for p in out:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_cli_inspect(run_dir, tmp_path):
    from typer.testing import CliRunner

    from negsynth.cli import app

    r = CliRunner().invoke(app, ["inspect", str(run_dir), "--sample", "1", "--flag", "false_negative"], terminal_width=160)
    assert r.exit_code == 0, r.output
    assert "score per LLM level" in r.output and "FALSE NEG" in r.output and "schema" in r.output
    r = CliRunner().invoke(app, ["inspect", str(run_dir), "--json", "--plots", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["score"]["examples"] == 4 and len(rep["plots"]) == 4
    r = CliRunner().invoke(app, ["inspect", str(tmp_path / "nothing-here")])
    assert r.exit_code == 2 and "no such file or directory" in r.output
    r = CliRunner().invoke(app, ["inspect", str(run_dir), "--flag", "wrong"])
    assert r.exit_code == 2 and "choose from false_negative" in r.output


def test_a_sample_shows_the_teachers_scores_beside_its_texts():
    """An example with the teacher's scores (corpus.teacher) shows them in a ``teacher`` column, each
    beside its own text after score's reorder; one without has no such column."""
    from rich.console import Console

    from negsynth.inspect.render import _sample_panel

    ex = scored(3, cos=(0.9, 0.8, 0.3, 0.2), order=[1, 0, 2, 3])
    ex["meta"] = {"teacher_label": [1.875, 1.25, 1.125, 0.5, 0.25]}  # [positive, negatives as written before score]

    def shown(e) -> str:
        console = Console(record=True, width=200)
        console.print(_sample_panel(e, None))
        return console.export_text()

    text = shown(ex)
    assert "teacher" in text and "1.875" in text
    rows = [" ".join(ln.strip("│ ").split()[:4]) for ln in text.splitlines() if "level" in ln]
    assert rows[:2] == ["level 2 0.900 1.125", "level 1 0.800 1.250"]  # the first text written is the LLM's level 2
    assert "teacher" not in shown(scored(0))
