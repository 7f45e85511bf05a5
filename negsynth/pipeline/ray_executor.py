"""``--executor ray`` (``pip install 'negsynth[ray]'``; docs/scale.md §2–4): a stage that splits runs
as ``workers`` Ray tasks, each ``stage.run(ctx)`` with its rank, sharing one budget and one RPM /
TPM (actors); the driver sums their stats. A stage that embeds runs in the driver with its encoding
on Ray actors (:mod:`negsynth.pipeline.ray_embed`).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from negsynth.errors import UserError
from negsynth.pipeline.context import Budget, SharedBudget, StageContext
from negsynth.pipeline.manifest import staging_dir
from negsynth.pipeline.progress import Reporter
from negsynth.pipeline.ray_connect import connect, first_line, import_ray, raise_cause, ray_address
from negsynth.pipeline.ray_embed import ray_embedding
from negsynth.pipeline.stage import Stage, finish_overwrite, splits
from negsynth.schemas.config import RunConfig, run_config_class


def worker_config(cfg: RunConfig, n: int) -> RunConfig:
    """``cfg`` with the global LLM limits divided among ``n`` ranks."""
    llm = cfg.llm
    update: dict[str, Any] = {"max_concurrency": max(1, math.ceil(llm.max_concurrency / n))}
    if llm.endpoints:  # every rank sends to every endpoint: each gets 1/n of each one's slots
        update["endpoints"] = [
            e.model_copy(update={"max_concurrency": max(1, math.ceil(llm.endpoint_concurrency(e) / n))}) for e in llm.endpoints
        ]
    return cfg.model_copy(update={"llm": llm.model_copy(update=update)})


class BudgetLedger:
    """The counts of one invocation's budget, shared by its ranks (an actor: its calls never interleave)."""

    def __init__(self, budget: Budget, input_per_mtok: float, output_per_mtok: float):
        self.budget = budget
        self.price = (input_per_mtok, output_per_mtok)
        self.requests = self.prompt_tokens = self.completion_tokens = 0

    def cost(self) -> float:
        return (self.prompt_tokens * self.price[0] + self.completion_tokens * self.price[1]) / 1e6

    def reserve(self) -> str | None:
        """Count one request, or say which limit is reached (then nothing is counted)."""
        why = self.budget.exceeded(self.requests, self.prompt_tokens + self.completion_tokens, self.cost())
        if why is None:
            self.requests += 1
        return why

    def unreserve(self) -> None:
        self.requests -= 1  # a refused connection sent nothing: not a request

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def used(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "tokens": self.prompt_tokens + self.completion_tokens,
            "cost_usd": round(self.cost(), 6),
        }


def _rank(
    stage: Stage,
    cfg: tuple[dict, tuple],
    run_dir: str,
    rank: int,
    world_size: int,
    base_url: str | None,
    overwrite: bool,
    mode: str,
    limits: tuple[int | None, int | None, float | None] = (None, None, None),
    ledger: Any = None,
    rate_ledger: Any = None,
) -> dict:
    """One Ray task: rank ``rank`` of ``stage`` (``cfg``: the run config's JSON and the sections of
    stages RunConfig does not list)."""
    ctx = StageContext(
        cfg=run_config_class(cfg[1]).model_validate(cfg[0]),
        run_dir=Path(run_dir),
        overwrite=overwrite,
        rank=rank,
        world_size=world_size,
        budget=SharedBudget(*limits, ledger=ledger) if ledger is not None else Budget(),
        reporter=Reporter(quiet=True),
        mode=mode,
        base_url=base_url,
        rate_ledger=rate_ledger,
    )
    return {**stage.run(ctx), "ray_node": import_ray().get_runtime_context().get_node_id()}


def embeds_in_driver(stage: Stage, cfg: RunConfig) -> bool:
    """Whether ``--executor ray`` runs ``stage`` here with its embedding on Ray workers."""
    return stage.embeds(cfg) and not splits(stage, cfg)


@contextlib.contextmanager
def around(stage: Stage, ctx: StageContext, *, workers: int, address: str | None) -> Iterator[tuple[StageContext, dict]]:
    """What a stage runs inside under ``--executor ray`` (its embedding on Ray actors, one embedded
    fleet per node); yields its context and what to add to its stats."""
    if workers < 1:  # checked here, before any stage runs on Ray (ranks or embedding workers)
        raise UserError(f"--workers {workers}: must be >= 1")
    with contextlib.ExitStack() as stack:
        extra: dict[str, Any] = {}
        if embeds_in_driver(stage, ctx.cfg):
            nodes: list[str] = []  # filled when the actors stop: where each last answered
            ctx = stack.enter_context(ray_embedding(ctx, workers=workers, address=address, nodes=nodes))
            extra = {"executor": "ray", "workers": workers, "ray_nodes": nodes}
        yield stack.enter_context(cluster_endpoint(stage, ctx, address)), extra


def run_ranks(stage: Stage, ctx: StageContext, *, workers: int, address: str | None, max_retries: int = 3) -> dict:
    """The stage as ``workers`` Ray ranks (when it splits; else here), their stats summed; a finished
    ``--overwrite`` swapped in."""
    if not splits(stage, ctx.cfg):
        return stage.run(ctx)
    ray = connect(address)
    embedded: list[str] = []
    # once here, before the ranks: the mining (its embedding on the workers), the --overwrite staging
    near = ray_embedding(ctx, workers=workers, address=address, nodes=embedded) if stage.embeds(ctx.cfg) else contextlib.nullcontext(ctx)
    with near as here:
        stage.prepare(here)
    task = ray.remote(max_retries=max_retries)(_rank)
    ctx.reporter.info(f"{stage.name}: {workers} Ray task(s) on {ray.cluster_resources().get('CPU', 0):.0f} CPU(s)")
    cfg_json = worker_config(ctx.cfg, workers).model_dump(mode="json")
    sections = tuple((n, f.annotation) for n, f in type(ctx.cfg).model_fields.items() if n not in RunConfig.model_fields)
    ledger, rates = _start_ledgers(ray, ctx)
    limits = (ctx.budget.max_requests, ctx.budget.max_tokens, ctx.budget.max_cost)
    run_dir = str(ctx.run_dir.resolve())
    refs = [
        task.remote(stage, (cfg_json, sections), run_dir, k, workers, ctx.base_url, ctx.overwrite, ctx.mode, limits, ledger, rates)
        for k in range(workers)
    ]
    try:
        parts, used = _wait_for_ranks(ray, refs, ledger, stage, max_retries=max_retries)
    finally:
        for actor in (ledger, rates):
            if actor is not None:
                ray.kill(actor)
    stats = {**merge(parts), "executor": "ray", "workers": workers}
    if used is not None:  # the one budget every rank shared, and what they used of it
        stats["budget"] = {**ctx.budget.limits(), "scope": SharedBudget.scope, "used": used}
    if embedded:
        stats["embedding_nodes"] = embedded
    staged = staging_dir(ctx.run_dir, stage.name)
    if ctx.overwrite and staged.is_dir():
        finish_overwrite(ctx, stage.name, staged, stats)
    return stats


def merge(parts: list[dict]) -> dict:
    """One stats dict from the ranks': counts summed, the first reason any rank stopped, the rest as
    rank 0 has it."""
    out = dict(parts[0])
    for k in ("items", "valid", "rejected", "shards_done", "shards_total", "pending", "attempts"):
        out[k] = sum(int(p.get(k) or 0) for p in parts)
    for k in ("rejects_by_reason", "pending_by_reason", "tokens"):
        total = sum((Counter(p.get(k) or {}) for p in parts), Counter())
        out[k] = dict(total.most_common()) if k != "tokens" else {"prompt": total["prompt"], "completion": total["completion"]}
    for k in ("stopped_by", "outage", "failed"):
        out[k] = next((p[k] for p in parts if p.get(k)), None)
    out["complete"] = all(p.get("complete") for p in parts)
    out["wall_time_s"] = max(float(p.get("wall_time_s") or 0.0) for p in parts)
    if all(isinstance(p.get("estimated_cost_usd"), (int, float)) for p in parts):
        out["estimated_cost_usd"] = round(sum(p["estimated_cost_usd"] for p in parts), 6)
    this_run: dict[str, Any] = {}
    for p in parts:
        for k, v in (p.get("this_run") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                this_run[k] = this_run.get(k, 0) + v
            elif isinstance(v, dict) and k != "rate_limiter":
                acc = this_run.setdefault(k, {})
                for kk, vv in v.items():
                    acc[kk] = acc.get(kk, 0) + vv
            elif k == "rate_limiter":
                this_run[k] = v
    out["this_run"] = this_run
    out.update(num_shards=len(parts), ray_nodes=[p.get("ray_node") for p in parts])
    for k in ("ray_node", "shard_index", "overwrite_pending"):  # each rank's own; the driver says whether an overwrite waits
        out.pop(k, None)
    return out


def _start_ledgers(ray, ctx: StageContext) -> tuple[Any, Any]:
    """The actors every rank shares: a :class:`BudgetLedger` when a ``--max-*`` is set, a
    :class:`~negsynth.llm.ratelimit.RateLedger` when ``llm.rpm`` / ``llm.tpm`` is; else None."""
    ledger = rates = None
    b = ctx.budget
    if any(v is not None for v in (b.max_requests, b.max_tokens, b.max_cost)):
        price = ctx.cfg.llm.price
        ledger = ray.remote(num_cpus=0)(BudgetLedger).remote(b, price.input_per_mtok, price.output_per_mtok)
    if ctx.cfg.llm.rpm is not None or ctx.cfg.llm.tpm is not None:
        from negsynth.llm.ratelimit import RateLedger

        rates = ray.remote(num_cpus=0)(RateLedger).remote(ctx.cfg.llm.rpm, ctx.cfg.llm.tpm)
    return ledger, rates


def _wait_for_ranks(ray, refs: list, ledger: Any, stage: Stage, *, max_retries: int) -> tuple[list[dict], dict[str, Any] | None]:
    """Each rank's stats and the budget used; a rank's error as itself, a lost rank as one line."""
    try:
        # Ray's driver prints its notes on stdout: to stderr, so --json's stdout stays one document
        with contextlib.redirect_stdout(sys.stderr):
            parts = ray.get(refs)
        used = ray.get(ledger.used.remote()) if ledger is not None else None
    except ray.exceptions.RayTaskError as e:
        raise_cause(e)
    except ray.exceptions.RayError as e:  # a rank died more often than Ray retries it, or the cluster went away
        raise UserError(
            f"{stage.name}: a Ray worker failed after {max_retries} retries ({first_line(e)}); finished shards are kept, rerun the same command to resume"
        ) from None
    return parts, used


@contextlib.contextmanager
def cluster_endpoint(stage: Stage, ctx: StageContext, address: str | None) -> Iterator[StageContext]:
    """On a Ray cluster of several nodes, ``ctx`` with the embedded LLM as one fleet per node; else
    ``ctx`` (a new local node asks nothing of Ray)."""
    from negsynth.pipeline import ray_fleets

    if not ray_fleets.wanted(stage, ctx) or ray_address(address) == "local":
        yield ctx
        return
    with ray_fleets.node_fleets(stage, ctx, connect(address)) as url:
        yield replace(ctx, base_url=url) if url else ctx
