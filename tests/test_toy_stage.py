"""Adding an LLM stage is one module and one line of ``negsynth.stages.METHOD``.

The toy stage below is the whole of such a module (its messages inline; a packaged stage keeps
them in prompt files named by its ``prompts`` prefix): an ``LLMStage`` subclass declaring its
name, config section and inputs, and its plan, messages, validator and record. With only the
``METHOD`` line added (here: the module attribute patched), ``negsynth run``, ``negsynth
estimate`` and ``negsynth inspect`` know it, it has its command (``negsynth toy``) and its
``[toy]`` section of the run file (``--set toy.topics=...``), it resumes without a second request
and keeps its rejects with their reasons, as every LLM stage does.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from fake_openai import FakeOpenAI, Reply
from helpers import write_run_config
from typer.testing import CliRunner

from negsynth.cli import app

TOY_MODULE = '''
"""A toy stage: one short fact per planned topic."""
from negsynth import pipeline
from negsynth.llm.client import ValidationFailure
from negsynth.pipeline import WorkItem
from negsynth.schemas.section import Section


class ToyConfig(Section):
    topics: list[str] = ["tides", "bees", "glass", "salt"]


class Toy(pipeline.LLMStage):
    name = "toy"
    summary = "one fact per topic"
    config = ToyConfig
    prompts = "toy_"
    output_name = "fact"

    def plan(self):
        return [WorkItem(i, f"toy-{i}", {"topic": t, "k": 0}) for i, t in enumerate(self.cfg.topics)]

    def messages(self, item):
        return [{"role": "user", "content": "Topic: " + item.payload["topic"] + ". Return one JSON object with a fact."}]

    def schema(self, item):
        return {"type": "object", "properties": {"fact": {"type": "string"}}, "required": ["fact"]}

    def parse(self, item, answer):
        fact = answer.get("fact") if isinstance(answer, dict) else None
        if not isinstance(fact, str) or item.payload["topic"] not in fact:
            raise ValidationFailure("off_topic", f"the fact must name {item.payload['topic']}")
        return fact

    def record(self, item, value, result):
        return {"id": item.id, "topic": item.payload["topic"], "fact": value, "usage": result.usage.model_dump()}


STAGE = Toy()
'''


def answer(req: dict, n: int) -> Reply:
    topic = req["messages"][0]["content"].split(".")[0].removeprefix("Topic: ")
    if topic == "salt":  # never on topic: re-asked, then kept as a reject with its reason
        return Reply(json.dumps({"fact": "the sea is wide"}))
    return Reply(json.dumps({"fact": f"{topic} are older than they look"}))


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy module importable, and the one line: its STAGE appended to METHOD."""
    import importlib
    import sys

    import negsynth.schemas.config
    import negsynth.stages

    # the sections stages register when declared: the toy's goes with the test
    monkeypatch.setattr(negsynth.schemas.config, "STAGE_SECTIONS", {})
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "toy_stage.py").write_text(textwrap.dedent(TOY_MODULE))
    monkeypatch.syspath_prepend(str(folder))
    mod = importlib.import_module("toy_stage")
    monkeypatch.setattr(negsynth.stages, "METHOD", (*negsynth.stages.METHOD, mod.STAGE))
    yield mod
    sys.modules.pop("toy_stage", None)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_a_toy_llm_stage_is_run_estimated_resumed_and_inspected_with_no_other_edit(toy, tmp_path):
    with FakeOpenAI(answer) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, llm={"max_attempts": 2})
        rd = tmp_path / "run"
        est = invoke("estimate", "-c", cfg, "-d", rd, "--stages", "toy", "--json")
        assert est.exit_code == 0, est.output
        toy_est = json.loads(est.stdout)["stages"]["toy"]
        assert toy_est["requests"] == 4 and toy_est["prompt_tokens"] > 0
        r = invoke("run", "-c", cfg, "-d", rd, "--stages", "toy", "--json")
        assert r.exit_code == 0, r.output
        assert len(srv.requests) == 3 + 2  # three facts at once, salt asked twice
        again = invoke("run", "-c", cfg, "-d", rd, "--stages", "toy", "--json")
        assert again.exit_code == 0 and len(srv.requests) == 5  # finished: reused, nothing sent
    rows = [json.loads(line) for p in sorted((rd / "toy").glob("shard-*.jsonl")) for line in p.read_text().splitlines()]
    assert sorted(r["topic"] for r in rows) == ["bees", "glass", "tides"]
    rejects = [json.loads(line) for p in (rd / "toy" / "rejects").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert [(r["input"]["topic"], r["reason"]) for r in rejects] == [("salt", "off_topic")]
    stats = json.loads((rd / "toy" / "stats.json").read_text())
    assert stats["valid"] == 3 and stats["rejected"] == 1
    manifest = json.loads((rd / "manifest.json").read_text())
    assert manifest["stages"]["toy"]["items"] == 4
    ins = invoke("inspect", rd, "--json")
    assert ins.exit_code == 0, ins.output
    assert "toy" in json.loads(ins.stdout)["stages"]


def test_a_toy_stage_has_its_command_and_its_section_of_the_run_file(toy, tmp_path):
    with FakeOpenAI(answer) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, llm={"max_attempts": 2}, toy={"topics": ["tides", "bees"]})
        rd = tmp_path / "run"
        assert "Stage toy: one fact per topic" in invoke("toy", "--help").output
        r = invoke("toy", "-c", cfg, "-d", rd, "--set", "toy.topics=['glass']", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["valid"] == 1 and len(srv.requests) == 1  # --set over the file's [toy]
        rows = [json.loads(line) for p in sorted((rd / "toy").glob("shard-*.jsonl")) for line in p.read_text().splitlines()]
        assert [r["topic"] for r in rows] == ["glass"]
        bad = invoke("toy", "-c", cfg, "-d", tmp_path / "other", "--set", "toy.topcs=['x']")
        assert bad.exit_code != 0 and "[toy] unknown key 'topcs' (allowed: topics)" in bad.output
        typo = invoke("toy", "-c", cfg, "-d", tmp_path / "other", "--set", "toi.topics=['x']")
        assert typo.exit_code != 0 and "unknown key 'toi'" in typo.output and "toy" in typo.output


def test_a_stage_gone_from_method_takes_its_command_and_section_with_it():
    from negsynth.cli import app
    from negsynth.schemas.config import RunConfig, run_config_class

    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert "toy" not in names and {"brainstorm", "score", "run"} <= names
    assert run_config_class() is RunConfig  # the method's own run files validate and hash as before
