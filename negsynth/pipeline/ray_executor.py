"""``--executor ray`` (``pip install 'negsynth[ray]'``; docs/scale.md §2–4): a stage that splits
runs as ``workers`` ranks (:func:`run_ranks`), each a Ray task running ``stage.run(ctx)`` with
``ctx.rank = k``, the path a local run takes as rank 0 of 1, so the shards are the same and a task
Ray retries resumes. The driver holds the run dir, sums the ranks' stats and swaps an
``--overwrite`` in; each rank gets ``1/n`` of the LLM concurrency, and one actor each holds the
budget (:class:`BudgetLedger`) and the RPM / TPM. A stage whose heavy work is embedding runs in the
driver with that embedding on Ray actors (:mod:`negsynth.pipeline.ray_embed`); on a cluster of
several nodes the embedded LLM is one fleet per node (:mod:`negsynth.pipeline.ray_fleets`).
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
from negsynth.pipeline.ray_connect import connect, import_ray, raise_cause, ray_address
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
    """The counts of one invocation's budget, shared by its Ray ranks (a Ray actor: it runs its
    calls one at a time, so :meth:`reserve`'s check and count can never interleave with another
    rank's)."""

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
    """One Ray task: rank ``rank`` of ``world_size`` of ``stage`` (``cfg``: the run config's JSON
    and the sections of stages RunConfig does not list); ``ledger`` and ``rate_ledger``: the actors
    holding the invocation's one budget and one RPM / TPM."""
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
    """Whether ``--executor ray`` runs ``stage`` in this process with its embedding on Ray workers
    (:func:`ray_embedding`): it embeds under ``cfg`` (``Stage.embeds``) and does not split into
    LLM ranks (:func:`~negsynth.pipeline.stage.splits`: regenerate with ``negatives = "mined"``
    calls no LLM, its one heavy part is the mining)."""
    return stage.embeds(cfg) and not splits(stage, cfg)


@contextlib.contextmanager
def around(stage: Stage, ctx: StageContext, *, workers: int, address: str | None) -> Iterator[tuple[StageContext, dict]]:
    """What a stage runs inside under ``--executor ray``: its embedding on ``workers`` Ray actors
    when it embeds in the driver (:func:`ray_embedding`), one embedded fleet per node on a cluster
    of several (:func:`cluster_endpoint`); yields the context it runs with and what to add to its
    stats."""
    if workers < 1:
        raise UserError(f"--workers {workers}: must be >= 1")
    with contextlib.ExitStack() as stack:
        extra: dict[str, Any] = {}
        if embeds_in_driver(stage, ctx.cfg):
            nodes: list[str] = []  # filled when the actors stop: where each last answered
            ctx = stack.enter_context(ray_embedding(ctx, workers=workers, address=address, nodes=nodes))
            extra = {"executor": "ray", "workers": workers, "ray_nodes": nodes}
        yield stack.enter_context(cluster_endpoint(stage, ctx, address)), extra


def run_ranks(stage: Stage, ctx: StageContext, *, workers: int, address: str | None, max_retries: int = 3) -> dict:
    """The stage as ``workers`` Ray ranks (when it splits under the config; else its loop here),
    then their stats summed: the stage's stats. An ``--overwrite`` that finished is swapped in here."""
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
    stats = {**merge(parts), "executor": "ray", "workers": workers, **_budget_stats(ctx.budget, used)}
    if embedded:
        stats["embedding_nodes"] = embedded
    staged = staging_dir(ctx.run_dir, stage.name)
    if ctx.overwrite and staged.is_dir():
        finish_overwrite(ctx, stage.name, staged, stats)
    return stats


def merge(parts: list[dict]) -> dict:
    """One stats dict from the ranks': counts, tokens and requests summed, the first reason any
    rank stopped, and what each shares (the model, the stage's own stats of its plan) as rank 0
    has it."""
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
    """The actors every rank shares (no CPU of their own): a :class:`BudgetLedger` when a
    ``--max-*`` is set (one budget for every rank) and a
    :class:`~negsynth.llm.ratelimit.RateLedger` when ``llm.rpm`` / ``llm.tpm`` is (one RPM / TPM
    for every rank); None for either when it is not."""
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
    """Each rank's stats and the budget used, once all are done; a rank's negsynth error is
    raised as itself, and a rank Ray gave up on (or a lost cluster) as one line."""
    try:
        # Ray's driver prints its own notes (a task failed and is retried, a node died) on
        # stdout: while waiting, they go to stderr, so --json's stdout stays one document
        with contextlib.redirect_stdout(sys.stderr):
            parts = ray.get(refs)
        used = ray.get(ledger.used.remote()) if ledger is not None else None
    except ray.exceptions.RayTaskError as e:
        raise_cause(e)
    except ray.exceptions.RayError as e:  # a rank died more often than Ray retries it, or the cluster went away
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"{stage.name}: a Ray worker failed after {max_retries} retries ({first}); finished shards are kept, rerun the same command to resume"
        ) from None
    return parts, used


def _budget_stats(b: Budget, used: dict[str, Any] | None) -> dict:
    """``budget`` in the stats: the one budget every rank shared and what they used of it."""
    if used is None:
        return {}
    return {"budget": {**b.limits(), "scope": SharedBudget.scope, "used": used}}


@contextlib.contextmanager
def cluster_endpoint(stage: Stage, ctx: StageContext, address: str | None) -> Iterator[StageContext]:
    """On a Ray cluster of several nodes, ``ctx`` with the embedded LLM as one fleet per node
    (:func:`negsynth.pipeline.ray_fleets.node_fleets`) for the block; else ``ctx`` as it is (one
    node: the driver's fleet, as in one process). A new local Ray node (no ``--address`` /
    ``$RAY_ADDRESS``) is one node: nothing is asked of Ray."""
    from negsynth.pipeline import ray_fleets

    if not ray_fleets.wanted(stage, ctx) or ray_address(address) == "local":
        yield ctx
        return
    with ray_fleets.node_fleets(stage, ctx, connect(address)) as url:
        yield replace(ctx, base_url=url) if url else ctx
