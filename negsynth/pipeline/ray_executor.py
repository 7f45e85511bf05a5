"""``--executor ray``: a stage's work on Ray workers (``pip install 'negsynth[ray]'``).

Two ways, chosen by the :class:`~negsynth.pipeline.stage.Stage` and its config
(:func:`embeds_in_driver`): an LLM stage (``shardable``) runs as shard workers; a stage whose
heavy work is embedding (``embeds``: score; regenerate with mined negatives; corpus with its
index) runs in the driver and its encoding is spread over Ray actors (:func:`ray_embedding`:
score's embedder as a :class:`RayEmbedder`, mining's ``SentenceTransformer`` as a
:class:`RaySentenceModel`). A shard stage that mines first (regenerate with ``--mine``) mines
once in the driver that way (``Stage.prepare``), then its shard workers read the result.

**Shard workers.** The same deterministic split as ``--shard-index k --num-shards n`` on n machines, scheduled by
Ray instead of by hand: worker k is one Ray task running :func:`~negsynth.pipeline.stage.run_stage`
with ``shard_index = k``; when all are done the driver merges their stats (``negsynth merge``).
So the union of the shards equals a one-process run byte for byte, a task that dies is retried
by Ray (``max_retries``) and resumes from its ``.partial`` shards and the request cache, and
nothing new decides what is written. The stats say where each worker ran (``ray_nodes``: the
Ray node id of each worker's last try; for score, where each embedding actor last answered).

- The run dir must be on a filesystem every Ray node sees (one node: any local folder).
- Limits stay global: each of the n workers gets ``1/n`` of ``llm.max_concurrency`` (rounded
  up; its connections are its own); ``llm.rpm`` / ``llm.tpm`` are one pair of buckets for every
  worker, in a :class:`~negsynth.llm.ratelimit.RateLedger` actor (no static split: a worker alone
  on the queue gets the whole rate; a 429 any worker gets empties them for all).
- Budgets (``--max-requests`` / ``--max-tokens`` / ``--max-cost``) are one budget for the whole
  invocation, not split: a :class:`BudgetLedger` actor holds the counts, every worker's client
  counts a request on it before sending (so together they never overshoot ``--max-requests``) and
  adds each answer's tokens. Once a limit is reached no worker sends a new request; the requests
  in flight finish, finished work is written and the stage stops with ``stopped_by`` (exit 3), as
  in one process. A worker Ray retries keeps what its first try counted (a request may then be
  counted but unanswered: the budget can end early, never late).
- ``llm.endpoints`` travels with the config: every worker spreads its requests over the same
  servers, with ``1/n`` of each endpoint's ``max_concurrency`` (rounded up), and takes a dead
  one out on its own.
- ``llm.base_url = "embedded"`` starts one fleet of servers (:mod:`negsynth.llm.fleet`) in the
  driver on one node, and one on **every node** of a cluster of several
  (:mod:`negsynth.pipeline.ray_fleets`); every worker spreads its requests over all of them.
- The API key is read by each worker from its own environment (``llm.api_key_env``, and each
  endpoint's ``api_key_env``), never shipped in the task's arguments.

**Embedding workers** (the stages that run here, their encoding on Ray actors) are
:mod:`negsynth.pipeline.ray_embed`; getting Ray itself is :mod:`negsynth.pipeline.ray_connect`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from negsynth.errors import NegsynthError, UserError
from negsynth.pipeline.context import Budget, SharedBudget, StageContext
from negsynth.pipeline.llm_stage import merge_stage
from negsynth.pipeline.lock import token as lock_token
from negsynth.pipeline.progress import Reporter
from negsynth.pipeline.ray_connect import connect, import_ray
from negsynth.pipeline.ray_connect import ray_address as ray_address
from negsynth.pipeline.ray_embed import RayEmbedder as RayEmbedder
from negsynth.pipeline.ray_embed import RaySentenceModel as RaySentenceModel
from negsynth.pipeline.ray_embed import encode_batches_part as encode_batches_part
from negsynth.pipeline.ray_embed import ray_embedding
from negsynth.pipeline.stage import (
    Stage,
    check_inputs,
    manifest_entry,
    print_report,
    run_stage,
    stage_endpoint,
    unfinished,
    up_to_date,
)
from negsynth.schemas.config import RunConfig, run_config_class


def worker_config(cfg: RunConfig, n: int) -> RunConfig:
    """``cfg`` with the global LLM limits divided among ``n`` workers."""
    llm = cfg.llm
    update: dict[str, Any] = {"max_concurrency": max(1, math.ceil(llm.max_concurrency / n))}
    if llm.endpoints:  # every worker sends to every endpoint: each gets 1/n of each one's slots
        update["endpoints"] = [
            e.model_copy(update={"max_concurrency": max(1, math.ceil(llm.endpoint_concurrency(e) / n))}) for e in llm.endpoints
        ]
    return cfg.model_copy(update={"llm": llm.model_copy(update=update)})


class BudgetLedger:
    """The counts of one invocation's budget, shared by its Ray workers (a Ray actor: it runs its
    calls one at a time, so :meth:`reserve`'s check and count can never interleave with another
    worker's)."""

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


def _worker(
    stage: Stage,
    cfg_json: dict,
    run_dir: str,
    k: int,
    n: int,
    base_url: str | None,
    overwrite: bool,
    mode: str,
    limits: tuple[int | None, int | None, float | None] = (None, None, None),
    ledger: Any = None,
    rate_ledger: Any = None,
    under: str | None = None,
) -> dict:
    """One Ray task: shard worker ``k`` of ``n`` of ``stage`` (the Stage object travels with the
    task, so this layer needs no registry of the method's stages). With ``ledger`` (a
    :class:`BudgetLedger` actor) its requests count against the invocation's one budget; with
    ``rate_ledger`` (a :class:`~negsynth.llm.ratelimit.RateLedger` actor) against one RPM / TPM.
    ``under``: the lock token of the driver when it holds the run dir (``negsynth run``), so the
    worker runs under it instead of refusing (:func:`negsynth.pipeline.lock.hold`)."""
    cfg = run_config_class().model_validate(cfg_json)
    ctx = StageContext(
        cfg=cfg,
        run_dir=Path(run_dir),
        overwrite=overwrite,
        shard_index=k,
        num_shards=n,
        budget=SharedBudget(*limits, ledger=ledger) if ledger is not None else Budget(),
        reporter=Reporter(quiet=True),
        mode=mode,
        base_url=base_url,
        rate_ledger=rate_ledger,
    )
    return {**run_stage(stage, ctx, under=under), "ray_node": import_ray().get_runtime_context().get_node_id()}


def embeds_in_driver(stage: Stage, cfg: RunConfig) -> bool:
    """Whether ``--executor ray`` runs ``stage`` in this process with its embedding on Ray workers
    (:func:`ray_embedding`): it embeds under ``cfg`` (``Stage.embeds``) and does not split into
    LLM shard workers (it is not ``shardable``, or calls no LLM under ``cfg``: regenerate with
    ``negatives = "mined"``, whose one heavy part is the mining)."""
    return stage.embeds_with(cfg) and not (stage.shardable and stage.needs_llm(cfg))


# ---------------------------------------------------------------------------- shard workers
def _split_up_to_date(stage: Stage, ctx: StageContext, workers: int) -> dict | None:
    """The stage's recorded stats when it is finished from the same config and inputs, split
    among ``workers`` shard workers as this run would split it or made in one process (the
    same bytes either way), else None: then workers are launched."""
    for n in dict.fromkeys((workers, 1)):
        probe = dataclasses.replace(ctx, shard_index=0, num_shards=n)  # the fingerprint the workers compute
        stats = up_to_date(stage, ctx, manifest_entry(stage, probe))
        if stats is not None:
            return stats
    return None


def run_on_ray(
    stage: Stage,
    ctx: StageContext,
    *,
    workers: int,
    address: str | None = None,
    max_retries: int = 3,
    start_llm: Callable[[], str | None] | None = None,
) -> dict:
    """Run ``stage`` on ``workers`` Ray workers; returns its stats (merged, for shard workers).

    A ``shardable`` stage runs as ``workers`` Ray tasks, merged by the driver (a stage already
    up to date is reused: no worker starts, nothing is sent); an ``embeds`` stage runs here with
    its embedding on ``workers`` actors (:func:`ray_embedding`). The stage's summary is printed
    as in one process.

    The workers use ``ctx.base_url`` when the driver already has an endpoint, else
    ``start_llm()`` (``negsynth run``: the run's one embedded server, started on first use), else
    an embedded server started here for the stage. When this process holds the run dir
    (``negsynth run``), its lock token goes to the workers, so they run under it."""
    if workers < 1:
        raise UserError(f"--workers {workers}: must be >= 1")
    if embeds_in_driver(stage, ctx.cfg):
        return _run_embedding_in_driver(stage, ctx, workers=workers, address=address)
    if not stage.shardable:
        raise UserError(f"--executor ray: {stage.name} neither splits into shard workers nor embeds; run it without --executor")
    _refuse_manual_split(ctx)
    ray = import_ray()
    check_inputs(stage, ctx)
    reused = _split_up_to_date(stage, ctx, workers)
    if reused is not None:
        print_report(stage, ctx, reused)
        return reused
    embedded = _prepare_on_ray(stage, ctx, workers=workers, address=address)
    parts, used = _run_shard_workers(
        ray, stage, ctx, workers=workers, address=ray_address(address), max_retries=max_retries, start_llm=start_llm
    )
    return _merge_shard_workers(stage, ctx, parts, workers=workers, extra={**_budget_stats(ctx.budget, used), **_embedded(embedded)})


def _refuse_manual_split(ctx: StageContext) -> None:
    """``--shard-index`` / ``--num-shards`` split by hand; Ray splits the work itself."""
    if ctx.num_shards != 1:
        raise UserError("--executor ray splits the work itself: drop --shard-index/--num-shards (use --workers)")


def _run_embedding_in_driver(stage: Stage, ctx: StageContext, *, workers: int, address: str | None) -> dict:
    """The stage here, as in one process, with its embedding on ``workers`` Ray actors
    (:func:`ray_embedding`); the stats say where each actor last answered (``ray_nodes``)."""
    _refuse_manual_split(ctx)
    nodes: list[str] = []
    with ray_embedding(ctx, workers=workers, address=address, nodes=nodes), cluster_endpoint(stage, ctx, address):
        stats = run_stage(stage, ctx)
    return {**stats, "executor": "ray", "workers": workers, "ray_nodes": nodes}


def _prepare_on_ray(stage: Stage, ctx: StageContext, *, workers: int, address: str | None) -> list[str]:
    """Run the stage's ``prepare`` (regenerate's mining) once here, its embedding on Ray workers,
    before the shard workers start; returns where each embedding worker last answered."""
    embedded: list[str] = []
    if stage.prepare is not None and stage.embeds_with(ctx.cfg) and not ctx.overwrite:
        # once here, its embedding on Ray workers; the shard workers read the result from the
        # stage's cache (an --overwrite builds beside the old outputs: each worker does it then)
        with ray_embedding(ctx, workers=workers, address=address, nodes=embedded):
            stage.prepare(ctx)
    return embedded


def _limits(b: Budget) -> tuple[int | None, int | None, float | None]:
    """The invocation's ``--max-*`` budget, as each shard worker gets it."""
    return (b.max_requests, b.max_tokens, b.max_cost)


def _run_shard_workers(
    ray, stage: Stage, ctx: StageContext, *, workers: int, address: str, max_retries: int, start_llm: Callable[[], str | None] | None
) -> tuple[list[dict], dict[str, Any] | None]:
    """The ``workers`` shard workers as Ray tasks, with the LLM endpoint they share and the
    actors holding the one budget and rate limit; returns each worker's stats and the budget
    used (None without a ``--max-*``)."""
    cfg_json = worker_config(ctx.cfg, workers).model_dump(mode="json")
    under = lock_token(ctx.run_dir)  # None unless this process holds the run dir
    with (
        cluster_endpoint(stage, ctx, address) as fleets,
        stage_endpoint(stage, ctx, None if fleets else start_llm, in_process=False) as url,
    ):
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        task = ray.remote(max_retries=max_retries)(_worker)
        ctx.reporter.info(f"{stage.name}: {workers} Ray task(s) on {ray.cluster_resources().get('CPU', 0):.0f} CPU(s)")
        ledger, rates = _start_ledgers(ray, ctx)
        run_dir, limits = str(ctx.run_dir.resolve()), _limits(ctx.budget)
        refs = [
            task.remote(stage, cfg_json, run_dir, k, workers, url or ctx.base_url, ctx.overwrite, ctx.mode, limits, ledger, rates, under)
            for k in range(workers)
        ]
        try:
            return _wait_for_workers(ray, refs, ledger, stage, max_retries=max_retries)
        finally:
            for actor in (ledger, rates):
                if actor is not None:
                    ray.kill(actor)


def _start_ledgers(ray, ctx: StageContext) -> tuple[Any, Any]:
    """The actors every shard worker shares (no CPU of their own): a :class:`BudgetLedger` when a
    ``--max-*`` is set (one budget for every worker) and a
    :class:`~negsynth.llm.ratelimit.RateLedger` when ``llm.rpm`` / ``llm.tpm`` is (one RPM / TPM
    for every worker); None for either when it is not."""
    ledger = rates = None
    if any(v is not None for v in _limits(ctx.budget)):  # one budget for every worker (no CPU of its own)
        price = ctx.cfg.llm.price
        ledger = ray.remote(num_cpus=0)(BudgetLedger).remote(ctx.budget, price.input_per_mtok, price.output_per_mtok)
    if ctx.cfg.llm.rpm is not None or ctx.cfg.llm.tpm is not None:  # one RPM / TPM for every worker
        from negsynth.llm.ratelimit import RateLedger

        rates = ray.remote(num_cpus=0)(RateLedger).remote(ctx.cfg.llm.rpm, ctx.cfg.llm.tpm)
    return ledger, rates


def _wait_for_workers(ray, refs: list, ledger: Any, stage: Stage, *, max_retries: int) -> tuple[list[dict], dict[str, Any] | None]:
    """Each worker's stats and the budget used, once all are done; a worker's negsynth error is
    raised as itself, and a worker Ray gave up on (or a lost cluster) as one line."""
    try:
        # Ray's driver prints its own notes (a task failed and is retried, a node died) on
        # stdout: while waiting, they go to stderr, so --json's stdout stays one document
        with contextlib.redirect_stdout(sys.stderr):
            parts = ray.get(refs)
        used = ray.get(ledger.used.remote()) if ledger is not None else None
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, NegsynthError):
            raise cause from None
        raise
    except ray.exceptions.RayError as e:  # a worker died more often than Ray retries it, or the cluster went away
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"{stage.name}: a Ray worker failed after {max_retries} retries ({first}); finished shards are kept, rerun the same command to resume"
        ) from None
    return parts, used


def _budget_stats(b: Budget, used: dict[str, Any] | None) -> dict:
    """``budget`` in the stats: the one budget every worker shared and what they used of it."""
    if used is None:
        return {}
    return {
        "budget": {
            "max_requests": b.max_requests,
            "max_tokens": b.max_tokens,
            "max_cost": b.max_cost,
            "scope": SharedBudget.scope,
            "used": used,
        }
    }


def _merge_shard_workers(stage: Stage, ctx: StageContext, parts: list[dict], *, workers: int, extra: dict) -> dict:
    """The stage's stats from its workers': merged (and its summary printed) when every worker
    finished, else the stats of the one that says most about why the stage stopped; with how it
    ran, where each worker ran (``ray_nodes``) and ``extra`` (the shared budget, the embedding
    nodes)."""
    nodes = [p.pop("ray_node", None) for p in parts]  # where each worker (its last try) ran
    # a failure or an outage says more than a budget stop (and exits with its own code)
    bad = next((p for p in parts if unfinished(p) and not p.get("stopped_by")), None) or next((p for p in parts if unfinished(p)), None)
    if bad is not None:
        if bad.get("stopped_by"):  # every worker's items done and written, not only this one's
            bad = {**bad, **{k: sum(int(p.get(k) or 0) for p in parts) for k in ("items", "valid", "rejected")}}
        return {**bad, "executor": "ray", "workers": workers, "ray_nodes": nodes, **extra}
    merged = merge_stage(ctx.run_dir, stage.name)
    print_report(stage, ctx, merged)
    return {**merged, "executor": "ray", "workers": workers, "ray_nodes": nodes, **extra}


@contextlib.contextmanager
def cluster_endpoint(stage: Stage, ctx: StageContext, address: str | None) -> Iterator[str | None]:
    """On a Ray cluster of several nodes, the embedded LLM as one fleet per node
    (:func:`negsynth.pipeline.ray_fleets.node_fleets`), set as ``ctx.base_url`` for the block and
    yielded; else None and nothing changes (one node: the driver's fleet, as in one process). A new
    local Ray node (no ``--address`` / ``$RAY_ADDRESS``) is one node: nothing is asked of Ray, and
    a stage already finished starts no server."""
    from negsynth.pipeline import ray_fleets

    if not ray_fleets.wanted(stage, ctx) or ray_address(address) == "local" or up_to_date(stage, ctx, manifest_entry(stage, ctx)):
        yield None
        return
    with ray_fleets.node_fleets(stage, ctx, connect(address)) as url:
        before, ctx.base_url = ctx.base_url, url or ctx.base_url
        try:
            yield url
        finally:
            ctx.base_url = before


def _embedded(nodes: list[str]) -> dict:
    """``embedding_nodes``: where each embedding worker of the stage's ``prepare`` last answered."""
    return {"embedding_nodes": nodes} if nodes else {}
