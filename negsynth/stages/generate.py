"""Stage 2 — generate: one example per work item with 4 negatives ordered hardest -> easiest.

In:  ``RUN_DIR/brainstorm`` tasks; ``[generate]``, ``[llm]``.
Out: ``RUN_DIR/generate/shard-XXXXX.jsonl`` — :class:`~negsynth.schemas.records.Example` records; ``rejects/``.

Item ``k`` of a type uses the type's tasks in a seed-shuffled cycle and draws its E5 attributes
from a generator seeded by ``(seed, type, k)``: the same config makes the same requests.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from functools import cache, partial
from typing import Any

from pydantic import ValidationError

from negsynth import pipeline
from negsynth.data.text import text_key
from negsynth.errors import UserError
from negsynth.llm.errors import ValidationFailure
from negsynth.pipeline import StageContext, Tally, WorkItem
from negsynth.prompts import load_example, load_examples, load_template, render
from negsynth.schemas.config import GenerateConfig
from negsynth.schemas.outputs import OUTPUTS, output_schema
from negsynth.schemas.records import STS_TASK, TASK_TYPES, Example, Task
from negsynth.stages.common import read_stage_records, schema_failure, short_id
from negsynth.validators import check_example

NAME = "generate"

# E5 placeholder value sets (spec §1.4)
QUERY_TYPES = ["extremely long-tail", "long-tail", "common"]
QUERY_LENGTHS = ["less than 5 words", "5 to 15 words", "at least 10 words"]
CLARITY = ["clear", "understandable with some effort", "ambiguous"]
DIFFICULTY = ["high school", "college", "PhD"]
STS_DIFFICULTY = ["elementary school", "high school", "college"]
STS_UNITS = ["sentence", "phrase", "passage"]
STS_HIGH = [4, 4.5, 5]
MAJOR_LANGUAGES = [
    "Chinese",
    "Spanish",
    "French",
    "German",
    "Japanese",
    "Russian",
    "Portuguese",
    "Italian",
    "Korean",
    "Arabic",
    "Hindi",
    "Dutch",
    "Turkish",
]
MINOR_LANGUAGES = ["Polish", "Swedish", "Vietnamese", "Indonesian", "Thai", "Greek", "Czech", "Hebrew", "Danish", "Finnish"]


def allocate(cfg: GenerateConfig) -> dict[str, int]:
    """Split ``cfg.examples`` over task types: ``min_per_type`` each, the rest by ratio (largest remainder)."""
    types = [t for t in TASK_TYPES if cfg.ratio.get(t, 0) > 0]
    base = {t: min(cfg.min_per_type, cfg.examples) for t in types}
    while sum(base.values()) > cfg.examples:  # fewer examples than floors: trim the rarest types
        t = min((t for t in types if base[t] > 0), key=lambda t: cfg.ratio[t])
        base[t] -= 1
    rest = cfg.examples - sum(base.values())
    total = sum(cfg.ratio[t] for t in types)
    exact = {t: rest * cfg.ratio[t] / total for t in types}
    out = {t: base[t] + int(exact[t]) for t in types}
    left = cfg.examples - sum(out.values())
    for t in sorted(types, key=lambda t: (-(exact[t] - int(exact[t])), TASK_TYPES.index(t)))[:left]:
        out[t] += 1
    return out


def _language(rng: random.Random, mode: str) -> str:
    if mode == "english":
        return "English"
    x = rng.random()
    if x < 0.431:
        return "English"
    if x < 0.431 + 0.029 * len(MAJOR_LANGUAGES):
        return rng.choice(MAJOR_LANGUAGES)
    return rng.choice(MINOR_LANGUAGES)


def sample_attributes(task_type: str, rng: random.Random, cfg: GenerateConfig) -> dict[str, Any]:
    """The E5-style attributes a prompt of ``task_type`` needs, drawn from ``rng``."""
    lang = _language(rng, cfg.languages)
    if task_type == "short-long":
        return {
            "query_type": rng.choice(QUERY_TYPES),
            "query_length": rng.choice(QUERY_LENGTHS),
            "clarity": rng.choice(CLARITY),
            "num_words": rng.choice(cfg.num_words),
            "language": lang,
            "difficulty": rng.choice(DIFFICULTY),
        }
    if task_type == "long-short":
        return {
            "clarity": rng.choice(CLARITY),
            "num_words": rng.choice(cfg.num_words),
            "language": lang,
            "difficulty": rng.choice(DIFFICULTY),
        }
    if task_type == "short-short":
        return {"language": lang}
    if task_type == "long-long":
        return {"num_words": rng.choice(cfg.num_words), "language": lang, "difficulty": rng.choice(DIFFICULTY)}
    if task_type == "sts":
        return {
            "unit": rng.choice(STS_UNITS),
            "high_score": rng.choice(STS_HIGH),
            "language": lang,
            "difficulty": rng.choice(STS_DIFFICULTY),
        }
    raise UserError(f"unknown task type {task_type!r}; choose from {', '.join(TASK_TYPES)}")


def render_prompt(task_type: str, task: str, attributes: dict[str, Any]) -> str:
    if task_type == "sts":
        return render("generate_sts", **attributes)
    return render(f"generate_{task_type}", task=task, **attributes)


def build_messages(task_type: str, task: str, attributes: dict[str, Any], *, few_shot: bool = True, shot: int = 0) -> list[dict[str, str]]:
    """System prompt, an optional worked-example turn (number ``shot`` of the type's pool), the prompt."""
    msgs = [_system_turn()]
    if few_shot:
        msgs.extend(_worked_turns(task_type, shot))
    msgs.append({"role": "user", "content": render_prompt(task_type, task, attributes)})
    return msgs


@cache
def _system_turn() -> dict[str, str]:
    return {"role": "system", "content": load_template("system").strip()}


@cache
def _worked_turns(task_type: str, shot: int) -> tuple[dict[str, str], dict[str, str]]:
    """The worked example's prompt and answer, rendered once per (type, shot) (shared, never mutated)."""
    pool = load_examples(f"generate_{task_type}")
    ex = pool[shot % len(pool)]
    return (
        {"role": "user", "content": render_prompt(task_type, ex["task"], ex["attributes"])},
        {"role": "assistant", "content": json.dumps(ex["output"], ensure_ascii=False)},
    )


def make_validator(task_type: str, cfg: GenerateConfig):
    """``validate(obj) -> (query, positive, negatives)``, raising ValidationFailure. With ``few_shot``
    a query or positive of any worked example of the type (not only the one shown) is a copy."""
    model, qk, pk, nk = OUTPUTS[task_type]
    pool = load_examples(f"generate_{task_type}")
    copied = {text_key(ex["output"][k]) for ex in pool for k in (qk, pk)}

    def validate(obj: Any) -> tuple[str, str, list[str]]:
        try:
            out = model.model_validate(obj)
        except ValidationError as e:
            raise schema_failure(e) from None
        q, p, negs = getattr(out, qk), getattr(out, pk), list(getattr(out, nk))
        if cfg.few_shot and isinstance(q, str) and (text_key(q) in copied or text_key(p) in copied):
            raise ValidationFailure(
                "copied_example", "you copied the earlier example; write a NEW example about the task in my last message"
            )
        v = check_example(q, p, negs, min_chars=cfg.min_chars, max_chars=cfg.max_chars)
        if not v.keep:
            detail = v.detail.replace("'negatives'", f"'{nk}'")
            raise ValidationFailure(v.reason, detail)
        return q.strip(), p.strip(), [n.strip() for n in negs]

    return validate


def load_tasks(ctx: StageContext) -> dict[str, list[Task]]:
    by_type: dict[str, list[Task]] = defaultdict(list)
    for row in read_stage_records(ctx.run_dir, "brainstorm", hint="run `negsynth brainstorm` first"):
        try:
            t = Task.model_validate(row)
        except ValidationError as e:
            raise UserError(
                f"{ctx.run_dir / 'brainstorm'}: a task record is malformed ({e.errors()[0]['loc']}); rerun brainstorm with --overwrite"
            ) from None
        by_type[t.task_type].append(t)
    if not by_type:
        raise UserError(f"{ctx.run_dir / 'brainstorm'}: the finished shards hold no tasks; rerun `negsynth brainstorm --overwrite`")
    return by_type


def plan_items(ctx: StageContext, tasks: dict[str, list[Task]]) -> list[WorkItem]:
    """The work items: type by type, ``k`` = 0..count-1."""
    cfg = ctx.cfg.generate
    items: list[WorkItem] = []
    for tt, n in allocate(cfg).items():
        pool = sorted(tasks.get(tt, []), key=lambda t: t.id)
        if not pool:
            ctx.reporter.warn(f"no {tt} tasks from brainstorm; its {n} examples are skipped (check brainstorm/rejects)")
            continue
        random.Random(f"{cfg.seed}:{tt}:order").shuffle(pool)
        for k in range(n):
            task = pool[k % len(pool)]
            attrs = sample_attributes(tt, random.Random(f"{cfg.seed}:{tt}:{k}"), cfg)
            iid = short_id("ex", cfg.seed, tt, k, task.id)
            payload = {"task_id": task.id, "task": task.task, "task_type": tt, "attributes": attrs, "k": k}
            if cfg.few_shot:
                payload["shot"] = random.Random(f"{cfg.seed}:{tt}:{k}:shot").randrange(len(load_examples(f"generate_{tt}")))
            items.append(WorkItem(len(items), iid, payload))
    return items


def type_parts(cfg: GenerateConfig, task_type: str) -> tuple[Any, dict[str, Any]]:
    """The validator and output schema of a task type."""
    return make_validator(task_type, cfg), output_schema(task_type, max_query=cfg.max_query_chars, max_doc=cfg.max_doc_chars)


def worked_example_tasks(cfg: GenerateConfig) -> dict[str, list[Task]]:
    """The brainstorm prompts' worked-example tasks, per type: ``estimate``'s stand-ins before brainstorm ran."""
    tasks = {
        tt: [
            Task(id=f"example-{tt}-{i}", task_type=tt, task=t, model="example")
            for i, t in enumerate(load_example(f"brainstorm_{tt}")["output"]["tasks"])
        ]
        for tt in cfg.ratio
        if tt != "sts"
    }
    tasks["sts"] = [Task(id="task-sts-fixed", task_type="sts", task=STS_TASK, model="fixed")]
    return tasks


class Generate(pipeline.LLMStage):
    """One example (query, positive, 4 negatives hardest -> easiest) per planned item."""

    name = NAME
    summary = "examples with 4 graded negatives"
    config = GenerateConfig
    prompts = "generate_"
    output_name = "example"
    records = Example

    def bind(self, ctx: StageContext) -> Generate:
        job = super().bind(ctx)
        job.per_type = cache(partial(type_parts, job.cfg))  # built once per task type, not per item
        return job

    def inputs(self, cfg: Any) -> tuple[str, ...]:
        return ("brainstorm",)

    def check(self) -> None:
        if self.cfg.examples == 0:
            raise UserError("generate.examples = 0: nothing to generate; set generate.examples to the number of examples wanted")

    def plan(self) -> list[WorkItem]:
        items = plan_items(self.ctx, load_tasks(self.ctx))
        if not items:
            raise UserError(
                f"{self.ctx.run_dir / 'brainstorm'}: no tasks for any task type in generate.ratio; rerun brainstorm or fix generate.ratio"
            )
        return items

    def messages(self, item: WorkItem) -> list[dict[str, str]]:
        p = item.payload
        return build_messages(p["task_type"], p["task"], p["attributes"], few_shot=self.cfg.few_shot, shot=p.get("shot", 0))

    def schema(self, item: WorkItem) -> dict[str, Any]:
        return self.per_type(item.payload["task_type"])[1]

    def parse(self, item: WorkItem, answer: Any) -> Any:
        return self.per_type(item.payload["task_type"])[0](answer)

    def record(self, item: WorkItem, value: Any, result: Any) -> dict[str, Any]:
        p = item.payload
        q, pos, negs = value
        ex = Example(
            id=item.id,
            task_id=p["task_id"],
            task=p["task"],
            task_type=p["task_type"],
            attributes=p["attributes"],
            query=q,
            positive=pos,
            negatives=negs,
            model=self.ctx.cfg.llm.model,
            usage=result.usage,
            meta={"failed_attempts": result.reasons} if result.reasons else {},
        )
        return ex.model_dump(mode="json", exclude={"score"})

    def made_from(self, ctx: StageContext) -> dict[str, Any]:
        return {**super().made_from(ctx), "seed": self.section(ctx.cfg).seed}

    def extra_stats(self) -> dict[str, Any]:
        return {"planned_per_type": allocate(self.cfg)}

    def estimate_items(self, tally: Tally) -> list[WorkItem]:
        """Over brainstorm's tasks or, before brainstorm ran, its worked-example tasks."""
        if list((self.ctx.run_dir / "brainstorm").glob("shard-*.jsonl")):
            tasks = load_tasks(self.ctx)
            tally.note("tasks from RUN_DIR/brainstorm")
        else:
            tasks = worked_example_tasks(self.cfg)
            tally.note("brainstorm has not run: its worked-example tasks stand in for the tasks")
        return plan_items(self.ctx, tasks)


STAGE = Generate()
