"""Stage 1 — brainstorm: the LLM invents embedding tasks per task type.

In:  config ``[brainstorm]`` (types, how many tasks per type), ``[llm]``.
Out: ``RUN_DIR/brainstorm/shard-00000.jsonl`` — :class:`~negsynth.schemas.records.Task` records
     (deduplicated on normalised text), plus the fixed STS task; rejects (invalid, duplicate or
     copied-from-the-example tasks, failed requests) in ``rejects/`` with reason and raw output.

Per type it asks for lists of ``tasks_per_request`` tasks, in rounds, until ``tasks_per_type``
distinct tasks are in hand or ``max_requests_per_type`` lists were asked. Each list request has
its own sample index, so the request cache makes a rerun free and identical.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from negsynth.data.shards import atomic_write_json, write_jsonl
from negsynth.llm.client import LLMClient
from negsynth.pipeline.config_io import config_hash
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.llm_stage import all_failed_the_same_way, llm_stage_parts, run_single_shard_stage, summary_rows
from negsynth.pipeline.runner import PENDING, RunReport, failure_message
from negsynth.pipeline.stage import Stage, Summary
from negsynth.prompts import load_example, load_template, reask_template, render
from negsynth.schemas.config import BrainstormConfig
from negsynth.schemas.outputs import TaskListOut, task_list_schema
from negsynth.schemas.records import STS_TASK, Reject, Task
from negsynth.stages.common import schema_failure, short_id
from negsynth.validators import check_task, normalize

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


def _validate_list(obj: Any) -> list[str]:
    try:
        out = TaskListOut.model_validate(obj)
    except ValidationError as e:
        raise schema_failure(e) from None
    return out.tasks


def fingerprint(ctx: StageContext) -> str:
    """The hash of what the tasks are made from: settings, LLM, prompts, and whether the fixed STS task is added."""
    return config_hash({**llm_stage_parts(ctx, "brainstorm", "brainstorm_"), "sts": ctx.cfg.generate.ratio.get("sts", 0) > 0})


@dataclass
class TypeOutcome:
    """What one task type gave: its distinct tasks (in the order found), its rejects (failed list
    requests and refused tasks) and the usage of its list requests (``list_requests`` included)."""

    tasks: list[Task] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    usage: Counter = field(default_factory=Counter)


async def brainstorm_type(ctx: StageContext, client: LLMClient, tt: str) -> TypeOutcome:
    """Ask for lists of tasks of type ``tt``, in rounds, until ``tasks_per_type`` distinct ones are
    in hand or ``max_requests_per_type`` lists were asked; the answers of a round decide the next."""
    bc = ctx.cfg.brainstorm
    out = TypeOutcome()
    example = {normalize(x) for x in load_example(f"brainstorm_{tt}")["output"]["tasks"]}
    seen: set[str] = set()
    asked = 0
    while len(out.tasks) < bc.tasks_per_type and asked < bc.max_requests_per_type:
        need = bc.tasks_per_type - len(out.tasks)
        batch = min(max(1, math.ceil(need / bc.tasks_per_request)), bc.max_requests_per_type - asked)
        idx = list(range(asked, asked + batch))
        asked += batch
        msgs = build_messages(tt, bc.tasks_per_request)
        results = await asyncio.gather(
            *(
                client.structured(
                    msgs,
                    validate=_validate_list,
                    schema=task_list_schema(bc.tasks_per_request, max_chars=bc.max_task_chars),
                    name="task_list",
                    sample_index=i,
                    temperature=bc.temperature,
                    reask_template=reask_template(),
                )
                for i in idx
            ),
            return_exceptions=True,  # a budget stop lets the requests in flight finish (and be cached)
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        out.usage["list_requests"] += len(idx)
        for i, res in zip(idx, results, strict=True):
            out.usage.update(res.usage.model_dump())
            if res.value is None:
                out.rejects.append(
                    Reject(
                        id=short_id("req", tt, i),
                        stage=NAME,
                        reason=res.reason or "unknown",
                        detail=res.detail,
                        raw=res.raw,
                        input={"task_type": tt, "sample_index": i},
                        usage=res.usage,
                    )
                )
                continue
            for pos, text in enumerate(res.value):
                tid = short_id("task", tt, i, pos)
                v = check_task(text if isinstance(text, str) else "", min_chars=bc.min_task_chars, max_chars=bc.max_task_chars)
                norm = normalize(text) if isinstance(text, str) else ""
                reason, detail = v.reason, v.detail
                if v.keep and norm in example:
                    reason, detail = "copied_example", "the task repeats the worked example"
                elif v.keep and norm in seen:
                    reason, detail = "duplicate_task", "the task repeats an earlier one"
                if reason:
                    out.rejects.append(
                        Reject(
                            id=tid,
                            stage=NAME,
                            reason=reason,
                            detail=detail,
                            raw=str(text),
                            input={"task_type": tt, "sample_index": i, "position": pos},
                        )
                    )
                    continue
                seen.add(norm)
                out.tasks.append(Task(id=tid, task_type=tt, task=" ".join(text.split()), model=ctx.cfg.llm.model))
    return out


async def _brainstorm(ctx: StageContext, client: LLMClient) -> tuple[list[Task], list[Reject], RunReport]:
    """Every task type at once (:func:`brainstorm_type`); the tasks in type order then by id, the
    fixed STS task last, the rejects by id."""
    bc = ctx.cfg.brainstorm
    rep = RunReport(stage=NAME)
    tasks: list[Task] = []
    rejects: list[Reject] = []

    with ctx.reporter.progress("brainstorm", len(bc.task_types)) as bar:

        async def run_type(tt: str) -> None:
            out = await brainstorm_type(ctx, client, tt)
            tasks.extend(out.tasks)
            rejects.extend(out.rejects)
            rep.usage.update(out.usage)
            bar.update(advance=1, valid=len(tasks), rejected=len(rejects))

        done = await asyncio.gather(*(run_type(t) for t in bc.task_types), return_exceptions=True)
        for r in done:
            if isinstance(r, BaseException):
                raise r
    order = {t: i for i, t in enumerate(bc.task_types)}
    tasks.sort(key=lambda t: (order[t.task_type], t.id))
    if ctx.cfg.generate.ratio.get("sts", 0) > 0:
        tasks.append(Task(id="task-sts-fixed", task_type="sts", task=STS_TASK, model="fixed"))
    rejects.sort(key=lambda r: r.id)
    return tasks, rejects, rep


def run(ctx: StageContext) -> dict:
    """Run brainstorm and return its stats (``run_stage`` writes them to ``brainstorm/stats.json``).

    Its answers depend on each other (a type is asked again until enough distinct tasks are in
    hand), so its loop writes its one shard itself, inside the shared LLM-stage shape."""
    return run_single_shard_stage(ctx, STAGE, lambda client: _write(ctx, client))


async def _write(ctx: StageContext, client: LLMClient) -> tuple[RunReport, dict | None]:
    """Brainstorm, then write the tasks and rejects unless a request is pending or the stage failed."""
    tasks, rejects, rep = await _brainstorm(ctx, client)
    # a list request that failed at the transport level is not the model's fault: write
    # nothing, so that a rerun asks again (its answered requests come from the cache)
    failed_requests = [r for r in rejects if r.reason.startswith(PENDING)]
    if failed_requests:
        rep.pending = len(failed_requests)
        rep.pending_reasons = Counter(r.reason for r in failed_requests)
        list_rejects = [r for r in rejects if "position" not in (r.input or {})]
        if len(failed_requests) == len(list_rejects) and not any(t.model != "fixed" for t in tasks):
            all_failed_the_same_way(NAME, rep, client)  # every list request failed alike
        return rep, None
    # the verdict: one line when no list request gave a usable task, or too many were refused
    verdict = RunReport(stage=NAME)
    verdict.items = int(rep.usage.get("list_requests", 0))
    verdict.valid = sum(1 for t in tasks if t.model != "fixed")
    verdict.reasons = Counter(r.reason for r in rejects if "position" not in (r.input or {}))
    for r in rejects:
        verdict.details.setdefault(r.reason, r.detail[:160])
    rep.failed = failure_message(NAME, verdict, ctx) if verdict.items else None
    if rep.failed:
        return rep, None
    d = ctx.stage_dir(NAME)  # a staging folder beside the old outputs under --overwrite
    write_jsonl(d / "rejects" / "shard-00000.jsonl", [r.model_dump(mode="json") for r in rejects])
    write_jsonl(d / "shard-00000.jsonl", [t.model_dump(mode="json") for t in tasks])
    rep.items = len(tasks) + len(rejects)
    rep.valid = len(tasks)
    rep.rejected = len(rejects)
    rep.reasons = Counter(r.reason for r in rejects)
    rep.shards_done = 1
    atomic_write_json(d / "_shards" / "00000.json", {"items": rep.items, "valid": rep.valid, "rejected": rep.rejected})
    return rep, {"tasks_per_type": dict(Counter(t.task_type for t in tasks))}


def report(stats: dict) -> list[Summary]:
    rows = summary_rows(stats)
    if stats.get("tasks_per_type"):
        rows.insert(1, ("tasks per type", ", ".join(f"{k}={v}" for k, v in stats["tasks_per_type"].items())))
    return [Summary("brainstorm", rows)]


STAGE = Stage(
    NAME,
    "embedding tasks per task type",
    run,
    config=BrainstormConfig,
    fingerprint=fingerprint,
    report=report,
    llm=True,
    staged=True,
    done_files=("stats.json", "shard-00000.jsonl"),
)
