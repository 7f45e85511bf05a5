"""Adding an example-making LLM stage is one module and one line of ``negsynth.stages.METHOD``.

The toy stage below is the whole of such a module (its messages inline; a packaged stage keeps
them in prompt files named by its ``prompts`` prefix): an ``LLMStage`` subclass declaring its
name, config section and that its records are examples, and its plan, messages, schema, parse
and record. With only the ``METHOD`` line added (here: the module attribute patched), ``negsynth
run``, ``negsynth estimate`` and ``negsynth inspect`` know it, it has its command (``negsynth
toy``) and its ``[toy]`` section of the run file (``--set toy.topics=...``), it resumes without a
second request and keeps its rejects with their reasons, as every LLM stage does; and its
examples go through ``score``, ``curriculum`` and ``export`` as generate's do.
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
"""A toy stage: one example (query, positive, 4 negatives) per planned topic."""
from negsynth import pipeline
from negsynth.llm.errors import ValidationFailure
from negsynth.pipeline import WorkItem
from negsynth.schemas.records import Example
from negsynth.schemas.section import Section


class ToyConfig(Section):
    topics: list[str] = ["tides", "bees", "glass", "salt"]


class Toy(pipeline.LLMStage):
    name = "toy"
    summary = "one example per topic"
    config = ToyConfig
    prompts = "toy_"
    output_name = "example"
    records = Example

    def plan(self):
        return [WorkItem(i, f"toy-{i}", {"topic": t}) for i, t in enumerate(self.cfg.topics)]

    def messages(self, item):
        return [{"role": "user", "content": "Topic: " + item.payload["topic"] + ". Return a query, a positive and 4 negatives."}]

    def schema(self, item):
        return {"type": "object", "required": ["query", "positive", "negatives"]}

    def parse(self, item, answer):
        if item.payload["topic"] not in answer.get("positive", ""):
            raise ValidationFailure("off_topic", f"the positive must name {item.payload['topic']}")
        return answer

    def record(self, item, value, result):
        ex = Example(id=item.id, task="find a fact about a topic", task_type="short-long", model=self.ctx.cfg.llm.model,
                     query=value["query"], positive=value["positive"], negatives=value["negatives"], usage=result.usage)
        return ex.model_dump(mode="json", exclude={"score"})


STAGE = Toy()
'''

#: sentences unrelated to any topic: each example's negatives, distinct across examples
UNRELATED = [
    "Rye bread needs a long, slow rise in a warm kitchen.",
    "The rules of chess let a pawn move two squares on its first turn.",
    "Tax forms are due at the end of the fiscal year.",
    "A violin is tuned in fifths from the lowest string.",
    "Marathon runners eat pasta the night before a race.",
    "The train to the coast leaves every hour on weekdays.",
    "Oil paint takes weeks to dry on a thick canvas.",
    "A good tent keeps out the rain with a fly sheet.",
    "Spreadsheets sort rows by the values in one column.",
    "The museum closes early on public holidays.",
    "Knitting a scarf takes about three balls of wool.",
    "Chess clocks limit the time each player can think.",
    "Bicycle tyres lose pressure slowly over a month.",
    "The library lends films as well as books.",
    "A sourdough starter is fed with flour and water.",
    "Ferries are cancelled when the wind is too strong.",
]
TOPICS = ["tides", "bees", "glass", "salt", "sand", "ice", "coal", "wool", "iron", "clay"]


def answer(req: dict, n: int) -> Reply:
    topic = req["messages"][0]["content"].split(".")[0].removeprefix("Topic: ")
    i = TOPICS.index(topic)
    negatives = [f"{UNRELATED[(4 * i + j) % len(UNRELATED)]} (note {i})" for j in range(4)]
    if topic == "salt":  # never on topic: re-asked, then kept as a reject with its reason
        return Reply(json.dumps({"query": "what is the sea?", "positive": "the sea is wide", "negatives": negatives}))
    positive = f"The {topic} we see today took thousands of years to form, as the {topic} record shows."
    return Reply(json.dumps({"query": f"how old are the {topic}?", "positive": positive, "negatives": negatives}))


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy module importable, and the one line: its STAGE appended to METHOD."""
    import importlib
    import sys

    import negsynth.stages

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
        assert len(srv.requests) == 3 + 2  # three examples at once, salt asked twice
        again = invoke("run", "-c", cfg, "-d", rd, "--stages", "toy", "--json")
        assert again.exit_code == 0 and len(srv.requests) == 5  # finished: reused, nothing sent
    rows = [json.loads(line) for p in sorted((rd / "toy").glob("shard-*.jsonl")) for line in p.read_text().splitlines()]
    assert sorted(r["query"] for r in rows) == ["how old are the bees?", "how old are the glass?", "how old are the tides?"]
    rejects = [json.loads(line) for p in (rd / "toy" / "rejects").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert [(r["input"]["topic"], r["reason"]) for r in rejects] == [("salt", "off_topic")]
    stats = json.loads((rd / "toy" / "stats.json").read_text())
    assert stats["valid"] == 3 and stats["rejected"] == 1
    manifest = json.loads((rd / "manifest.json").read_text())
    assert manifest["stages"]["toy"]["items"] == 4
    ins = invoke("inspect", rd, "--json")
    assert ins.exit_code == 0, ins.output
    assert "toy" in json.loads(ins.stdout)["stages"]


def test_a_toy_stages_examples_are_scored_ordered_and_exported_with_no_other_edit(toy, tmp_path, minilm, monkeypatch):
    """score reads every example-making stage of the method (``score.inputs = "auto"``), so the
    toy's examples are scored, put in curriculum order and exported, the dataset card naming the
    stage that made them."""
    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))
    with FakeOpenAI(answer) as srv:
        topics = [t for t in TOPICS if t != "salt"]  # enough examples for batches of 2 in each curriculum phase
        cfg = write_run_config(tmp_path, srv.base_url, llm={"max_attempts": 2}, curriculum={"batch_size": 2}, toy={"topics": topics})
        rd = tmp_path / "run"
        r = invoke("run", "-c", cfg, "-d", rd, "--stages", "toy,score,curriculum", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["score"]["inputs"][0]["stage"] == "toy" and out["score"]["input_examples"] == 9
    assert out["curriculum"]["examples"] == out["score"]["kept"] > 0
    r = invoke("export", "-d", rd, "-o", tmp_path / "out", "--only", "dataset", "--json")
    assert r.exit_code == 0, r.output
    card = (tmp_path / "out" / "dataset" / "README.md").read_text()
    assert "The stage `toy` made its examples" in card


def test_a_toy_stage_has_its_command_and_its_section_of_the_run_file(toy, tmp_path):
    with FakeOpenAI(answer) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, llm={"max_attempts": 2}, toy={"topics": ["tides", "bees"]})
        rd = tmp_path / "run"
        shown = invoke("toy", "--help").output
        assert "Stage toy: one example per topic" in shown and "--name" not in shown  # the shared options only
        r = invoke("toy", "-c", cfg, "-d", rd, "--set", "toy.topics=['glass']", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["valid"] == 1 and len(srv.requests) == 1  # --set over the file's [toy]
        rows = [json.loads(line) for p in sorted((rd / "toy").glob("shard-*.jsonl")) for line in p.read_text().splitlines()]
        assert [r["query"] for r in rows] == ["how old are the glass?"]
        bad = invoke("toy", "-c", cfg, "-d", tmp_path / "other", "--set", "toy.topcs=['x']")
        assert bad.exit_code != 0 and "[toy] unknown key 'topcs' (allowed: topics)" in bad.output
        typo = invoke("toy", "-c", cfg, "-d", tmp_path / "other", "--set", "toi.topics=['x']")
        assert typo.exit_code != 0 and "unknown key 'toi'" in typo.output and "toy" in typo.output


def test_a_stage_gone_from_method_takes_its_command_and_section_with_it():
    from negsynth.cli import app
    from negsynth.schemas.config import RunConfig, run_config_class
    from negsynth.stages import sections

    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert "toy" not in names and {"brainstorm", "score", "run"} <= names
    # the method's own sections only: RunConfig's and those its stages bring (none of toy's)
    assert set(run_config_class(sections()).model_fields) == set(RunConfig.model_fields) | {s for s, _ in sections()}
    assert "toy" not in run_config_class(sections()).model_fields
