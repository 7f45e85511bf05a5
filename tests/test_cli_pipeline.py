"""brainstorm + generate end to end through the CLI against a real-socket fake server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid, valid_answer
from helpers import write_run_config
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import read_stage

runner = CliRunner()


def write_config(tmp: Path, base_url: str) -> Path:
    return write_run_config(tmp, base_url, pipeline={"shard_size": 7}, generate={"examples": 20, "min_per_type": 2})


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_brainstorm_and_generate_write_shards_stats_manifest(tmp_path):
    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        rd = tmp_path / "run"
        r = invoke("brainstorm", "-c", str(cfg), "-d", str(rd), "--quiet")
        assert r.exit_code == 0, r.output
        tasks = list(read_stage(rd / "brainstorm"))
        types = {t["task_type"] for t in tasks}
        assert types == {"short-long", "long-short", "long-long", "short-short", "sts"}
        r = invoke("generate", "-c", str(cfg), "-d", str(rd), "--json")
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout)
        assert stats["valid"] == 20 and stats["rejected"] == 0
        shards = sorted((rd / "generate").glob("shard-*.jsonl"))
        assert [p.name for p in shards] == ["shard-00000.jsonl", "shard-00001.jsonl", "shard-00002.jsonl"]
        rows = list(read_stage(rd / "generate"))
        assert len(rows) == 20 and len({r["id"] for r in rows}) == 20
        assert {r["task_type"] for r in rows} == types
        assert all(len(r["negatives"]) == 4 for r in rows)
        assert not list((rd / "generate").glob("*.partial"))
        man = json.loads((rd / "manifest.json").read_text())
        assert man["stages"]["generate"]["shard_size"] == 7
        n_sent = len(srv.requests)

        # rerun: nothing left to do, no request sent
        r = invoke("generate", "-c", str(cfg), "-d", str(rd), "--quiet")
        assert r.exit_code == 0
        assert len(srv.requests) == n_sent

        # overwrite: every request served from the cache, identical records
        before = (rd / "generate" / "shard-00001.jsonl").read_bytes()
        r = invoke("generate", "-c", str(cfg), "-d", str(rd), "--quiet", "--overwrite")
        assert r.exit_code == 0
        assert len(srv.requests) == n_sent
        assert (rd / "generate" / "shard-00001.jsonl").read_bytes() == before


def sts_always_bad(req, n):
    """STS answers always repeat a negative (every STS item is re-asked, then rejected); the rest are valid."""
    if any('"S1"' in m["content"] for m in req["messages"] if m["role"] == "user"):
        return Reply(content='{"S1": "a b", "S2": "c d", "negatives": ["x y", "x y", "z w", "q r"]}')
    return Reply(content=valid_answer(req, n))


def brainstorm_then_generate(tmp_path, responder) -> tuple[Path, dict, list[dict]]:
    with FakeOpenAI(responder) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        rd = tmp_path / "run"
        assert invoke("brainstorm", "-c", str(cfg), "-d", str(rd), "-q").exit_code == 0
        r = invoke("generate", "-c", str(cfg), "-d", str(rd), "--json")
        assert r.exit_code == 0, r.output
        return rd, json.loads(r.stdout), list(srv.requests)


def test_invalid_answers_are_reasked_then_rejected_with_reason(tmp_path):
    rd, stats, requests = brainstorm_then_generate(tmp_path, sts_always_bad)
    n_sts = stats["planned_per_type"]["sts"]
    assert stats["rejects_by_reason"] == {"duplicate_negatives": n_sts}
    rejects = list(read_stage(rd / "generate" / "rejects"))
    assert len(rejects) == n_sts
    assert all(r["reason"] == "duplicate_negatives" and '"x y", "x y"' in r["raw"] for r in rejects)
    # each STS item was asked max_attempts (3) times, and the re-ask showed the error
    reasks = [q for q in requests if q["messages"][-1]["content"].startswith("Your answer was rejected")]
    assert len(reasks) == 2 * n_sts
    assert "negatives 1 and 2 are the same" in reasks[0]["messages"][-1]["content"]
    assert stats["valid"] + stats["rejected"] == 20


def test_the_reask_turn_is_the_reask_prompt_template(tmp_path, monkeypatch):
    """The re-ask text is package data (prompts/templates/reask.txt), not a string in the client:
    what the template says is what the model is told."""
    from negsynth import prompts

    assert prompts.reask_template() == "Your answer was rejected: ${detail}\nReturn a corrected JSON object only."
    monkeypatch.setattr(
        prompts,
        "load_template",
        lambda name, real=prompts.load_template: "Bad answer (${detail}); try again." if name == "reask" else real(name),
    )
    _, stats, requests = brainstorm_then_generate(tmp_path, sts_always_bad)
    reasks = [q["messages"][-1]["content"] for q in requests if '"x y", "x y"' in q["messages"][-2]["content"]]  # after the bad answer
    assert len(reasks) == 2 * stats["planned_per_type"]["sts"]
    assert all(t.startswith("Bad answer (") and t.endswith("); try again.") for t in reasks)
    assert "negatives 1 and 2 are the same" in reasks[0]


def test_changed_config_is_refused_without_overwrite(tmp_path):
    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        rd = tmp_path / "run"
        invoke("brainstorm", "-c", str(cfg), "-d", str(rd), "-q")
        invoke("generate", "-c", str(cfg), "-d", str(rd), "-q")
        r = invoke("generate", "-c", str(cfg), "-d", str(rd), "-q", "--set", "generate.seed=5")
        assert r.exit_code == 2
        assert "different config" in r.stderr and "--overwrite" in r.stderr
        r = invoke("generate", "-c", str(cfg), "-d", str(rd), "-q", "--set", "pipeline.shard_size=3")
        assert r.exit_code == 2


def test_a_finished_stage_is_reused_by_the_contract_not_rerun(tmp_path, monkeypatch):
    """run_stage decides "up to date" for every stage: a rerun of finished brainstorm/generate
    sends no request and never enters the stage's loop, still prints its summary, and leaves its
    stats.json (written by run_stage) as it was; a changed config is still refused."""
    from negsynth.pipeline import LLMStage

    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        rd = tmp_path / "run"
        assert invoke("brainstorm", "-c", str(cfg), "-d", str(rd), "-q").exit_code == 0
        assert invoke("generate", "-c", str(cfg), "-d", str(rd), "-q").exit_code == 0
        stamps = {p: p.stat().st_mtime_ns for p in (rd / "brainstorm" / "stats.json", rd / "generate" / "stats.json")}
        n_req = len(srv.requests)
        # the one loop every LLM stage runs its items through, where brainstorm and generate find it
        loop = lambda *a, **k: (_ for _ in ()).throw(AssertionError("the loop ran"))  # noqa: E731
        monkeypatch.setattr(LLMStage, "run", loop)
        r = invoke("run", "-c", str(cfg), "-d", str(rd), "--stages", "brainstorm,generate")
        assert r.exit_code == 0, r.output
        assert "brainstorm: up to date" in r.stderr and "generate: up to date" in r.stderr
        assert "valid" in r.output and "requests sent" not in r.output  # the summary, without the last run's requests
        r = invoke("generate", "-c", str(cfg), "-d", str(rd), "--json")
        assert r.exit_code == 0 and json.loads(r.stdout)["reused"] is True
        assert len(srv.requests) == n_req and {p: p.stat().st_mtime_ns for p in stamps} == stamps
        monkeypatch.undo()  # the loop refuses a changed config
        r = invoke("generate", "-c", str(cfg), "-d", str(rd), "-q", "--set", "generate.seed=5")
        assert r.exit_code == 2 and "different config" in r.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--set", "llm.temprature=1"], "unknown key 'temprature'"),
        (["--set", "llm.max_concurrency=0"], "max_concurrency"),
        (["--set", "llm.base_url=ftp://x"], "base_url"),
        (
            ["--set", "llm.api_key_env=NEGSYNTH_TEST_MISSING_KEY", "--set", "llm.base_url=http://127.0.0.1:9/v1"],
            "NEGSYNTH_TEST_MISSING_KEY",
        ),
        (["--set", "llm.base_url=http://127.0.0.1:9/v1"], "cannot reach llm.base_url"),
        (["--set", "brainstorm.task_types=['bitext']"], "unknown task type 'bitext'"),
        (["--set", "nokey"], "expected KEY=VALUE"),
    ],
)
def test_bad_config_fails_in_one_line(tmp_path, args, needle):
    r = runner.invoke(app, ["brainstorm", "-d", str(tmp_path / "r"), *args])
    assert r.exit_code == 2
    assert needle in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_every_table_of_the_run_file_defaults_to_its_own_defaults():
    """A table within a table (each section, llm.price, the mining settings, ...) defaults to its
    own defaults, a fresh one per config: an empty run file is a full config, and editing one
    config never edits another."""
    from pydantic import BaseModel

    from negsynth.schemas.config import RunConfig

    a, b = RunConfig(), RunConfig()
    tables = [(a, b, RunConfig)]
    while tables:
        x, y, model = tables.pop()
        for name, field in model.model_fields.items():
            if isinstance(getattr(x, name), BaseModel):
                assert getattr(x, name) == field.annotation() and getattr(x, name) is not getattr(y, name), name
                tables.append((getattr(x, name), getattr(y, name), field.annotation))


def test_missing_config_file_and_bad_toml(tmp_path):
    r = runner.invoke(app, ["brainstorm", "-c", str(tmp_path / "nope.toml"), "-d", str(tmp_path / "r")])
    assert r.exit_code == 2 and "config file not found" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[llm\nmodel = 1\n")
    r = runner.invoke(app, ["brainstorm", "-c", str(bad), "-d", str(tmp_path / "r")])
    assert r.exit_code == 2 and "invalid TOML" in r.stderr and str(bad) in r.stderr


def test_generate_without_brainstorm_says_what_to_run(tmp_path):
    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        r = runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(tmp_path / "r")])
        assert r.exit_code == 2 and "run `negsynth brainstorm` first" in r.stderr


def test_missing_inputs_are_reported_before_the_embedded_server_starts(tmp_path, monkeypatch):
    """The stage contract checks a stage's inputs first: no LLM server is started (or paid) for a
    stage that cannot run, from the stage command or from ``negsynth run``."""
    from negsynth.llm import server

    started = []
    monkeypatch.setattr(
        server.EmbeddedServer, "start", lambda self: started.append(1) or (_ for _ in ()).throw(AssertionError("server started"))
    )
    cfg = write_run_config(tmp_path, "embedded")
    for args in (["generate"], ["run", "--stages", "generate,score"]):
        r = runner.invoke(app, [*args, "-c", str(cfg), "-d", str(tmp_path / "r")])
        assert r.exit_code == 2 and "run `negsynth brainstorm` first" in r.stderr, r.output
    r = runner.invoke(app, ["curriculum", "-c", str(cfg), "-d", str(tmp_path / "r")])
    assert r.exit_code == 2 and "run `negsynth score` first" in r.stderr
    assert started == []


def test_every_stage_command_takes_the_shared_options():
    """One options type, declared once: every stage command has it; the LLM stages add workers,
    mode and budgets; the method's order is the default pipeline's."""
    import typer.main

    from negsynth.schemas.config import RunConfig
    from negsynth.stages import METHOD

    group = typer.main.get_command(app)
    opts = {name: {o for p in cmd.params if p.param_type_name == "option" for o in p.opts} for name, cmd in group.commands.items()}
    shared = {"--config", "--run-dir", "--set", "--quiet", "--json", "--verbose"}
    for stage in METHOD:
        assert shared <= opts[stage.name], stage.name
        llm_flags = {"--max-requests", "--max-tokens", "--max-cost", "--mode", "--executor", "--workers"}
        assert (llm_flags <= opts[stage.name]) == (stage.name in ("brainstorm", "generate", "regenerate", "corpus", "heldout")), stage.name
    assert {"--max-requests", "--overwrite", "--executor"} <= opts["run"] and "--mode" not in opts["run"]
    assert "--overwrite" not in opts["evaluate"]
    default = RunConfig().pipeline.stages
    assert [s.name for s in METHOD if s.name in default] == default


def test_every_stage_is_declared_by_its_own_module():
    """A stage is a typed object: its module's ``STAGE`` is an instance of a class of that module
    (no strings resolved at run time), and its config class is the run file's section of the same
    name."""
    import importlib

    import negsynth
    from negsynth.stages import METHOD

    cfg = negsynth.load_config()
    for stage in METHOD:
        mod = importlib.import_module(f"negsynth.stages.{stage.name}")
        assert mod.STAGE is stage and type(stage).__module__.startswith(mod.__name__), stage.name
        assert type(getattr(cfg, stage.name)) is stage.config, stage.name


def test_run_stops_after_a_budget_stop_with_exit_3(tmp_path):
    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        rd = tmp_path / "run"
        r = runner.invoke(app, ["run", "-c", str(cfg), "-d", str(rd), "-q", "--max-requests", "12"])
        assert r.exit_code == 3, r.output
        assert "stopped by budget" in r.stderr
        assert not (rd / "score").exists()  # nothing downstream ran on partial data
        r = runner.invoke(app, ["run", "-c", str(cfg), "-d", str(rd), "-q", "--stages", "brainstorm,generate"])
        assert r.exit_code == 0, r.output
        assert len(list(read_stage(rd / "generate"))) == 20


def test_run_budget_covers_the_whole_run_not_each_stage(tmp_path):
    """--max-requests N on `negsynth run`: brainstorm's requests count against the same N, so
    generate gets what is left and the server sees N requests in all (not N per stage)."""
    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        rd = tmp_path / "run"
        r = runner.invoke(app, ["run", "-c", str(cfg), "-d", str(rd), "-q", "--json", "--max-requests", "12"])
        assert r.exit_code == 3, r.output
        assert len(srv.requests) == 12
    stats = json.loads((rd / "generate" / "stats.json").read_text()) if (rd / "generate" / "stats.json").exists() else None
    brainstorm = json.loads((rd / "brainstorm" / "stats.json").read_text())
    used = brainstorm["this_run"]["requests"]
    assert 0 < used < 12
    if stats is not None:
        assert stats["budget"]["spent_by_earlier_stages"]["requests"] == used


def test_run_json_of_a_failed_stage_carries_every_stage_under_stages(tmp_path):
    """`negsynth run --json` when a stage fails: exit 2, stdout is the failed stage's stats with
    every stage's stats under "stages" (what the real-SmolLM2 test reads on its tolerated failure)."""

    def responder(req, n):  # brainstorm answers; every generate answer is unusable
        content = req["messages"][-1]["content"]
        return always_valid(req, n) if content.startswith("Brainstorm") else Reply(content="not json at all")

    with FakeOpenAI(responder) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        rd = tmp_path / "run"
        r = runner.invoke(app, ["run", "-c", str(cfg), "-d", str(rd), "-q", "--json", "--stages", "brainstorm,generate"])
    assert r.exit_code == 2, r.output
    out = json.loads(r.stdout)
    assert set(out["stages"]) == {"brainstorm", "generate"} and out["stage"] == "generate"
    assert "answers but never validly" in out["stages"]["generate"]["failed"]
