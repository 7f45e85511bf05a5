"""Stage 1 — brainstorm: the LLM invents embedding tasks per task type.

In:  ``[brainstorm]``, ``[llm]``.
Out: ``RUN_DIR/brainstorm/shard-00000.jsonl`` — deduplicated :class:`~negsynth.schemas.records.Task`
     records (types in config order, by id within a type), the fixed STS task last; ``rejects/``.

A type is one item: lists of ``tasks_per_request`` tasks are asked in rounds until ``tasks_per_type``
distinct tasks are in hand or ``max_requests_per_type`` lists were asked.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from negsynth import pipeline
from negsynth.data.shards import iter_jsonl
from negsynth.data.text import text_key
from negsynth.llm.client import LLMClient
from negsynth.pipeline import Outcome, RunReport, StageContext, Summary, Tally, WorkItem, config_hash
from negsynth.prompts import load_example, load_template, render
from negsynth.schemas.config import BrainstormConfig
from negsynth.schemas.outputs import TaskListOut, task_list_schema
from negsynth.schemas.records import STS_TASK, Reject, Task
from negsynth.stages.common import schema_failure, short_id
from negsynth.validators import check_text

NAME = "brainstorm"


def build_messages(task_type: str, n: int, *, few_shot: bool = True) -> list[dict[str, str]]:
    """System prompt, an optional worked example turn, and the brainstorm prompt for ``task_type``."""
    msgs = [{"role": "system", "content": load_template("system").strip()}]
    prompt = render(f"brainstorm_{task_type}", n=n)
    if few_shot:
        ex = load_example(f"brainstorm_{task_type}")
        msgs.append({"role": "user", "content": render(f"brainstorm_{task_type}", n=len(ex["output"]["tasks"]))})
        msgs.append({"role": "assistant", "content": json.dumps(ex["output"], ensure_ascii=False)})
    msgs.append({"role": "user", "content": prompt})
    return msgs


@dataclass
class TypeOutcome:
    """What one task type gave: its distinct tasks, its rejects and its list requests' usage."""

    tasks: list[Task] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    usage: Counter = field(default_factory=Counter)


class Brainstorm(pipeline.LLMStage):
    """Embedding tasks per task type; the fixed STS task last. All or nothing: one shard."""

    name = NAME
    summary = "embedding tasks per task type"
    config = BrainstormConfig
    prompts = "brainstorm_"
    output_name = "task_list"
    records = Task
    split = "whole"

    def bind(self, ctx: StageContext) -> Brainstorm:
        job = super().bind(ctx)
        job.temperature = job.cfg.temperature
        return job

    def sts(self) -> bool:
        """Whether generate makes STS examples (its fixed task is then brainstorm's last item)."""
        return self.ctx.cfg.generate.ratio.get("sts", 0) > 0

    def plan(self) -> list[WorkItem]:
        types = list(self.cfg.task_types)
        items = [WorkItem(index=i, id=tt, payload={"task_type": tt}) for i, tt in enumerate(types)]
        if self.sts():
            items.append(WorkItem(index=len(types), id="sts-fixed", payload={"fixed": "sts"}))
        return items

    def messages(self, item: WorkItem) -> list[dict[str, str]]:
        return build_messages(item.payload["task_type"], self.cfg.tasks_per_request)

    def schema(self, item: WorkItem) -> dict[str, Any]:
        return task_list_schema(self.cfg.tasks_per_request, max_chars=self.cfg.max_task_chars)

    def parse(self, item: WorkItem, answer: Any) -> list[str]:
        try:
            return TaskListOut.model_validate(answer).tasks
        except ValidationError as e:
            raise schema_failure(e) from None

    async def process(self, client: LLMClient | None, it: WorkItem) -> Outcome:
        """One task type's tasks and rejects as one outcome; the fixed STS task needs no request."""
        if it.payload.get("fixed") == "sts":
            return Outcome(record=Task(id="task-sts-fixed", task_type="sts", task=STS_TASK, model="fixed").model_dump(mode="json"))
        out = await self.rounds(client, it.payload["task_type"])
        return Outcome(
            records=[t.model_dump(mode="json") for t in sorted(out.tasks, key=lambda t: t.id)],
            rejects=[r.model_dump(mode="json") for r in sorted(out.rejects, key=lambda r: r.id)],
            usage=dict(out.usage),
        )

    async def rounds(self, client: LLMClient, tt: str) -> TypeOutcome:
        """Ask for lists of tasks of type ``tt`` in rounds; the answers of a round decide the next."""
        bc = self.cfg
        out = TypeOutcome()
        example = {text_key(x) for x in load_example(f"brainstorm_{tt}")["output"]["tasks"]}
        seen: set[str] = set()
        asked = 0
        while len(out.tasks) < bc.tasks_per_type and asked < bc.max_requests_per_type:
            if asked and client.cache is not None:
                client.cache.flush()  # the answers this round depends on are on disk before it leaves
            need = bc.tasks_per_type - len(out.tasks)
            batch = min(max(1, math.ceil(need / bc.tasks_per_request)), bc.max_requests_per_type - asked)
            idx = list(range(asked, asked + batch))
            asked += batch
            # a budget stop lets the requests in flight finish (and be cached) before it is raised
            results = await asyncio.gather(
                *(self.ask(client, WorkItem(i, f"{tt}-{i}", {"task_type": tt, "k": i})) for i in idx), return_exceptions=True
            )
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            out.usage["list_requests"] += len(idx)
            for i, res in zip(idx, results, strict=True):
                out.usage.update(res.usage.model_dump())
                if res.value is None:
                    input_ = {"task_type": tt, "sample_index": i}
                    out.rejects.append(
                        Reject(
                            id=short_id("req", tt, i),
                            stage=NAME,
                            reason=res.reason or "unknown",
                            detail=res.detail,
                            raw=res.raw,
                            input=input_,
                            usage=res.usage,
                        )
                    )
                    continue
                for pos, text in enumerate(res.value):
                    self.take(out, tt, i, pos, text, example, seen)
        return out

    def take(self, out: TypeOutcome, tt: str, i: int, pos: int, text: Any, example: set[str], seen: set[str]) -> None:
        """Task ``pos`` of list ``i``: kept, or a reject with its reason (invalid, a copy of the worked example, a repeat)."""
        bc = self.cfg
        tid = short_id("task", tt, i, pos)
        v = check_text("task", text, min_chars=bc.min_task_chars, max_chars=bc.max_task_chars)
        norm = text_key(text) if isinstance(text, str) else ""
        reason, detail = v.reason, v.detail
        if v.keep and norm in example:
            reason, detail = "copied_example", "the task repeats the worked example"
        elif v.keep and norm in seen:
            reason, detail = "duplicate_task", "the task repeats an earlier one"
        if reason:
            input_ = {"task_type": tt, "sample_index": i, "position": pos}
            out.rejects.append(Reject(id=tid, stage=NAME, reason=reason, detail=detail, raw=str(text), input=input_))
            return
        seen.add(norm)
        out.tasks.append(Task(id=tid, task_type=tt, task=" ".join(text.split()), model=self.ctx.cfg.llm.model))

    def verdict(self, rep: RunReport, rows: list[tuple[str, dict]]) -> str | None:
        """One line when no list request gave a usable task, or too many were refused: judged by its
        list requests, not by its tasks."""
        rejects = sorted((r for kind, r in rows if kind == "rej"), key=lambda r: r["id"])
        verdict = RunReport(stage=NAME)
        verdict.items = int(rep.usage.get("list_requests", 0))
        verdict.valid = sum(1 for kind, r in rows if kind == "ok" and r.get("model") != "fixed")
        verdict.reasons = Counter(r["reason"] for r in rejects if "position" not in (r.get("input") or {}))
        for r in rejects:
            verdict.details.setdefault(r["reason"], str(r.get("detail") or "")[:160])
        return pipeline.failure_message(NAME, verdict, self.ctx, self.out) if verdict.items else None

    def fixed(self) -> int:
        return int(self.sts())

    def extra_stats(self) -> dict:
        shard = self.out / "shard-00000.jsonl"  # a staging folder beside the old outputs under --overwrite
        if not shard.exists():
            return {}
        return {"tasks_per_type": dict(Counter(t["task_type"] for t in iter_jsonl(shard)))}

    def made_from(self, ctx: StageContext) -> str:
        """Its settings, LLM and prompts, and whether the fixed STS task is added."""
        parts = pipeline.llm_parts(ctx, NAME, "brainstorm_", ctx.cfg.brainstorm)
        return config_hash({**parts, "sts": ctx.cfg.generate.ratio.get("sts", 0) > 0})

    def estimate(self, ctx: StageContext, tally: Tally) -> None:
        """One list request per ``tasks_per_request`` tasks wanted, per task type."""
        bc = ctx.cfg.brainstorm
        for tt in bc.task_types:
            n = min(max(1, math.ceil(bc.tasks_per_type / bc.tasks_per_request)), bc.max_requests_per_type)
            tally.request(build_messages(tt, bc.tasks_per_request), n=n)
        tally.note("one list request per tasks_per_request tasks wanted (the first round; more only if lists come back short)")

    def report(self, stats: dict) -> list[Summary]:
        rows = pipeline.summary_rows(stats)
        if stats.get("tasks_per_type"):
            rows.insert(1, ("tasks per type", ", ".join(f"{k}={v}" for k, v in stats["tasks_per_type"].items())))
        return [Summary("brainstorm", rows)]


STAGE = Brainstorm()
