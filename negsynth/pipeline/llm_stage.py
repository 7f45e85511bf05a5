"""The one shape of an LLM stage, and its plumbing: endpoint, client, cache, budgets, stats.

Every LLM stage (brainstorm, generate, regenerate, corpus) supplies only what it knows, to
:func:`run_item_stage`: the items it plans, ``process(client, item) -> Outcome`` and its extra
stats. An item may give one record or reject (an example) or several (brainstorm: one task type,
asked in rounds until enough distinct tasks are in hand, gives its tasks and rejects at once); a
stage whose outputs are all or nothing (brainstorm) keeps them in one shard and judges them with
its own verdict. The rest is done here, once, the same for all of them: the manifest entry from
the fingerprint ``run_stage`` computed (and checked against the manifest, before the loop), the
LLM session (key, endpoint and cache checked before anything is written, then the entry noted
or the ``--overwrite`` staging begun), the resumable shards (:class:`ShardedRunner`), the
concurrency, budgets and outage handling, the stats and the swap of an ``--overwrite``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from negsynth.aio import run_sync
from negsynth.errors import UserError
from negsynth.llm.client import ClientStats, LLMClient, LLMFatalError
from negsynth.llm.session import CacheOpenError, open_client
from negsynth.pipeline.context import SharedBudget, StageContext
from negsynth.pipeline.manifest import begin_outputs, begin_staging, swap_in
from negsynth.pipeline.runner import Outcome, RunReport, ShardedRunner, WorkItem, storage_error
from negsynth.pipeline.stage import Stage
from negsynth.prompts import templates_fingerprint
from negsynth.schemas.config import LLMConfig


def llm_fingerprint(cfg: LLMConfig) -> dict[str, Any]:
    """The LLM settings that shape outputs (part of a stage's config hash); no key, no URL."""
    return cfg.model_dump(
        mode="json",
        include={"model", "temperature", "top_p", "max_tokens", "seed", "structured_output", "max_attempts", "extra_body"},
    )


def llm_stage_parts(ctx: StageContext, name: str, prompts: str, section: Any = None) -> dict[str, Any]:
    """What every LLM stage's config hash holds: its own section of the run file (``section``, by
    default ``cfg.<name>``), the LLM settings and its prompt templates (those starting with
    ``prompts``, and the shared system and re-ask ones)."""
    return {
        name: getattr(ctx.cfg, name) if section is None else section,
        "llm": llm_fingerprint(ctx.cfg.llm),
        "prompts": templates_fingerprint(prompts, "system", "reask"),
    }


def cost_usd(cfg: LLMConfig, prompt_tokens: int, completion_tokens: int) -> float:
    return (prompt_tokens * cfg.price.input_per_mtok + completion_tokens * cfg.price.output_per_mtok) / 1e6


def endpoint(ctx: StageContext) -> str:
    url = ctx.base_url or ctx.cfg.llm.base_url
    if url == "embedded":
        raise UserError(
            "llm.base_url is 'embedded' but no server is running: use `negsynth run`, or start `negsynth serve` and pass --set llm.base_url=http://127.0.0.1:8765/v1"
        )
    return url


def llm_config(ctx: StageContext) -> LLMConfig:
    """``[llm]`` as the stage's client uses it: with the embedded fleet's servers as its
    ``endpoints`` when the run started several (:func:`~negsynth.llm.fleet.fleet_llm_config`)."""
    from negsynth.llm.fleet import fleet_llm_config

    return fleet_llm_config(ctx.cfg.llm, ctx.base_url)


def stage_concurrency(ctx: StageContext, n_items: int) -> int:
    """Items in flight: ``llm.max_concurrency`` online (with ``llm.endpoints`` or the embedded
    fleet, their concurrencies summed); every item in batch mode (a batch holds them all)."""
    return max(1, n_items) if ctx.mode == "batch" else llm_config(ctx).total_concurrency


def prepare_outputs(ctx: StageContext, stage: str, entry: dict[str, Any]) -> None:
    """Called once every check passed (inputs, key, endpoint, cache), before the first write.

    A plain run notes in ``RUN_DIR/<stage>`` what its outputs are made from and writes there (the
    manifest records the entry once the stage finished); an ``--overwrite`` writes into a staging
    folder beside it, swapped in by :func:`finish_stage`.
    """
    d = ctx.run_dir / stage
    if ctx.overwrite:
        try:
            ctx.outputs[stage] = begin_staging(ctx.run_dir, stage, entry)
        except OSError as e:
            raise storage_error(e, ctx.run_dir) from None
        return
    for sub in (d, d / "rejects", d / "_shards"):
        if sub.is_dir() and not os.access(sub, os.W_OK | os.X_OK):
            raise UserError(f"{sub}: not writable; fix its permissions (chmod u+w) or use another --run-dir")
    try:
        d.mkdir(parents=True, exist_ok=True)
        begin_outputs(d, entry)
    except OSError as e:
        raise storage_error(e, d) from None


def finish_stage(ctx: StageContext, stage: str, rep: RunReport, client: LLMClient | None, extra: dict | None = None) -> dict:
    """The stage's stats (``run_stage`` writes them); an --overwrite that finished swaps its
    outputs in (else the old ones stay; the ranks of a split leave that to the driver, which
    sums their stats)."""
    stats = llm_stats(ctx, stage, rep, client, extra)
    staged = ctx.outputs.get(stage)
    if staged is not None and ctx.overwrite and rep.finished and ctx.world_size == 1:
        try:
            swap_in(ctx.run_dir, stage, staged)
        except OSError as e:
            raise storage_error(e, ctx.run_dir / stage) from None
        del ctx.outputs[stage]
    elif staged is not None:
        stats["overwrite_pending"] = f"the previous outputs in {ctx.run_dir / stage} are kept; the new ones wait in {staged}"
    return stats


def cache_error(e: CacheOpenError) -> UserError:
    """The one line for a request cache that would not open: unreadable, or the disk refused."""
    if isinstance(e.cause, OSError):
        return storage_error(e.cause, e.path)
    return UserError(
        f"{e.path}: the request cache is unreadable ({e.cause}); move it away (its answers are then requested again) or restore it"
    )


@asynccontextmanager
async def llm_session(
    ctx: StageContext,
    *,
    check: bool = True,
    stage: str | None = None,
    entry: dict[str, Any] | None = None,
    gate: Callable[[ClientStats], str | None] | None = None,
    commit_window: float = 0.0,
):
    """Yield a ready :class:`LLMClient` with the run dir's request cache, rate limiter and budget
    gate (``gate``, else :func:`budget_gate`), built whole by :func:`~negsynth.llm.open_client`.

    Every check that can fail (key, endpoint, cache) runs before anything is written; then, with
    ``entry``, :func:`prepare_outputs` notes the entry in the stage folder or starts the --overwrite
    staging (the manifest records it once the stage finished).
    With ``ctx.mode == "batch"`` its requests go through the OpenAI Batch API
    (:class:`~negsynth.llm.batch.BatchTransport`, state in ``RUN_DIR/<stage>/_batch``); otherwise
    the cache's answers may share commits over ``commit_window`` seconds.
    """
    url = endpoint(ctx)
    cfg = llm_config(ctx)
    if ctx.mode == "batch" and not cfg.cache:
        raise UserError("--mode batch needs the request cache (llm.cache = true): batch results are delivered through it")
    if ctx.mode == "batch" and cfg.endpoints:
        raise UserError("--mode batch sends through one Batch API: set llm.base_url instead of llm.endpoints, or drop --mode batch")
    cache_path = ctx.run_dir / "cache" / "llm.sqlite" if cfg.cache else None
    try:
        # key, cache and endpoint checked in the llm layer, before anything of the stage is written
        async with open_client(
            cfg,
            base_url=url,
            cache_path=cache_path,
            commit_window=0.0 if ctx.mode == "batch" else commit_window,
            rate_ledger=ctx.rate_ledger,
            gate=gate or budget_gate(ctx),
            ledger=ctx.budget if isinstance(ctx.budget, SharedBudget) else None,  # --executor ray: one budget for every worker
            on_wait=ctx.reporter.waiting,
            check=check,
            prepare=(lambda: prepare_outputs(ctx, stage, entry)) if entry is not None and stage is not None else None,
            transport=batch_transport(ctx, stage) if ctx.mode == "batch" else None,
            stage=stage,
        ) as client:
            yield client
    except LLMFatalError as e:
        raise UserError(str(e)) from None
    except CacheOpenError as e:
        raise cache_error(e) from None


def batch_transport(ctx: StageContext, stage: str | None) -> Callable[[LLMClient], Any]:
    """``--mode batch``: the Batch API transport of a stage's client, its state in ``<stage>/_batch``
    (built once the session's checks passed and the stage's outputs begun: the staging folder of
    an --overwrite is known then)."""

    def make(client: LLMClient) -> Any:
        from negsynth.llm.batch import BatchTransport

        state_dir = ctx.stage_dir(stage or "llm") / "_batch"
        if ctx.world_size > 1:  # each rank keeps its own batch jobs
            state_dir = state_dir / f"worker-{ctx.rank:05d}-of-{ctx.world_size:05d}"
        return BatchTransport(
            client,
            state_dir,
            poll_s=ctx.batch_poll_s if ctx.batch_poll_s is not None else ctx.cfg.llm.batch_poll_s,
            completion_window=ctx.cfg.llm.batch_completion_window,
        )

    return make


def budget_gate(ctx: StageContext) -> Callable[[ClientStats], str | None]:
    """The run's budget, checked on a client's counters (what this session sent)."""
    cfg = ctx.cfg.llm

    def check(st: ClientStats) -> str | None:
        tokens = st.prompt_tokens + st.completion_tokens
        return ctx.budget.exceeded(st.requests, tokens, cost_usd(cfg, st.prompt_tokens, st.completion_tokens))

    return check


def item_stage_fingerprint(ctx: StageContext, digest: str, **extra: Any) -> dict[str, Any]:
    """The fingerprint of an item stage (the manifest entry :func:`stage_entry` makes of it): the
    hash of what its outputs are made from, the shard size and worker count they were cut by (a
    relaunch that changes any of the three is refused), then the stage's ``extra`` keys."""
    return {"config_hash": digest, "shard_size": ctx.cfg.pipeline.shard_size, "num_shards": ctx.world_size, **extra}


def stage_entry(ctx: StageContext, stage: Stage, n_items: int | None = None) -> dict[str, Any]:
    """The manifest entry an LLM stage records: its fingerprint (computed once, by ``run_stage``;
    here only when the stage's ``run`` is called on its own) and, for an item stage, the number of
    items."""
    fp = ctx.made_from if ctx.made_from is not None else stage.fingerprint(ctx)
    entry = dict(fp) if isinstance(fp, dict) else {"config_hash": fp, "shard_size": None, "num_shards": 1}
    if n_items is not None:
        entry["items"] = n_items
    return entry


Process = Callable[[LLMClient | None, WorkItem], Awaitable[Outcome]]
#: a stage's own verdict on all of its rows once every item is done: None, or why it failed
Verdict = Callable[[RunReport, list[tuple[str, dict]]], "str | None"]


def run_item_stage(
    ctx: StageContext,
    stage: Stage,
    items: list[WorkItem],
    process: Process,
    *,
    llm: bool = True,
    extra: Callable[[], dict] | dict | None = None,
    one_shard: bool = False,
    verdict: Verdict | None = None,
    fixed: int = 0,
) -> dict:
    """Run an item stage: ``process(client, item) -> Outcome`` over ``items`` into the stage's
    resumable shards (:func:`run_items`), then its stats with ``extra`` (a dict, or a function
    called once the items are done); returns the stats (``run_stage`` writes them). With ``llm``
    False the items need no LLM (mined negatives): the same shards, resume and stats, no session.

    A stage whose outputs are all or nothing (brainstorm) passes ``one_shard`` (every item in one
    shard, not split into workers), its ``verdict`` (see :class:`ShardedRunner`; the shard is
    finished only when it passes) and ``fixed``, how many of its valid records need no request
    (brainstorm's fixed STS task: they do not hide that every request failed alike)."""
    entry = stage_entry(ctx, stage, len(items))
    rep, client = run_items(ctx, stage.name, items, process, entry=entry, llm=llm, one_shard=one_shard, verdict=verdict, fixed=fixed)
    return finish_stage(ctx, stage.name, rep, client, extra() if callable(extra) else extra)


def run_items(
    ctx: StageContext,
    stage: str,
    items: list[WorkItem],
    process: Process,
    *,
    entry: dict[str, Any],
    llm: bool = True,
    one_shard: bool = False,
    verdict: Verdict | None = None,
    fixed: int = 0,
) -> tuple[RunReport, LLMClient | None]:
    """Run ``process(client, item) -> Outcome`` over ``items`` into the stage's resumable shards,
    with the stage's LLM session, concurrency and budget; returns the report and the client.

    The manifest was checked by ``run_stage`` (nothing is written before every check passed). A
    relaunch of a finished stage needs no server, key or cache: it only re-reads the shards'
    stats."""

    def runner(concurrency: int = 1, **kw: Any) -> ShardedRunner:
        return ShardedRunner(ctx, stage, concurrency=concurrency, one_shard=one_shard, verdict=verdict, **kw)

    async def finished(it: WorkItem) -> Outcome:  # pragma: no cover - every shard is finished
        raise AssertionError(it)

    async def main() -> tuple[RunReport, LLMClient | None]:
        if not ctx.overwrite and not runner().has_work(len(items)):
            return await runner().run(items, finished, description=stage), None
        if not llm:  # the items need no LLM (mined negatives): the same shards, resume and stats, no session
            prepare_outputs(ctx, stage, entry)
            return await runner().run(items, lambda it: process(None, it), description=stage), None
        # the runner writes an item to its partial shard as soon as its last answer is in (a
        # re-ask flushes first): answers may share the cache's commits over 50 ms, not one loop pass
        gate = budget_gate(ctx)
        async with llm_session(ctx, stage=stage, entry=entry, gate=gate, commit_window=0.05) as client:
            run = runner(stage_concurrency(ctx, len(items)), budget_check=lambda: gate(client.stats), again=client.again)
            rep = await run.run(items, lambda it: process(client, it), description=stage)
            if client.outage is not None and rep.pending and not (rep.outage or rep.failed):
                # the breaker tripped while the last items were already in flight: every item was
                # tried, but this is still an outage (the same message as a stop mid-run)
                if client.outage_fatal:
                    rep.failed = f"{stage}: {client.outage}"
                else:
                    rep.outage = client.outage
            all_failed_the_same_way(stage, rep, client, fixed=fixed)
            return rep, client

    return run_sync(main())


def all_failed_the_same_way(stage: str, rep: RunReport, client: LLMClient | None, *, fixed: int = 0) -> None:
    """Every item of a stage too small to trip ``llm.max_consecutive_failures`` failed for one
    reason that is a setting to fix (the server answers, but not with chat completions): the
    stage fails naming it (exit 2), as a larger one does, instead of leaving the items pending.
    ``fixed`` valid records need no request (brainstorm's fixed STS task): they do not count."""
    from negsynth.llm.client import FATAL_KINDS, outage_message

    if client is None or rep.failed or rep.outage or not rep.pending or rep.valid > fixed or rep.rejected:
        return
    kinds = set(rep.pending_reasons)
    if len(kinds) != 1 or next(iter(kinds)) not in FATAL_KINDS:
        return
    rep.failed = f"{stage}: " + outage_message(client.base_url, client.cfg, rep.pending, rep.pending_reasons, client.last_failure)


def report_stats(stage: str, rep: RunReport) -> dict[str, Any]:
    """The counts every stats.json carries, from a :class:`RunReport`."""
    u = rep.usage
    return {
        "stage": stage,
        "items": rep.items,
        "valid": rep.valid,
        "rejected": rep.rejected,
        "rejects_by_reason": dict(sorted(rep.reasons.items(), key=lambda kv: -kv[1])),
        "shards_done": rep.shards_done,
        "shards_total": rep.shards_total,
        "complete": rep.complete,
        "stopped_by": rep.stopped_by,
        # items whose requests failed at the transport level (not the model's fault): not
        # rejected, their shards stay unfinished, a rerun retries them
        "pending": rep.pending,
        "pending_by_reason": dict(rep.pending_reasons),
        "outage": rep.outage,
        "failed": rep.failed,
        "tokens": {"prompt": u.get("prompt_tokens", 0), "completion": u.get("completion_tokens", 0)},
        "attempts": u.get("attempts", 0),
        "wall_time_s": round(rep.wall_time_s, 3),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def llm_stats(ctx: StageContext, stage: str, rep: RunReport, client: LLMClient | None, extra: dict | None = None) -> dict:
    """The stats of an LLM stage: its counts, tokens, cost, this run's requests and budget."""
    cfg = ctx.cfg.llm
    stats = report_stats(stage, rep)
    u = rep.usage
    stats["estimated_cost_usd"] = round(cost_usd(cfg, u.get("prompt_tokens", 0), u.get("completion_tokens", 0)), 6)
    stats.update(model=cfg.model, shard_index=ctx.rank, num_shards=ctx.world_size)
    if client is None:  # a relaunch of a finished stage sent nothing
        stats["this_run"] = {**ClientStats().as_dict(), "cost_usd": 0.0}
    else:
        stats["this_run"] = client.stats.as_dict()
        stats["this_run"]["cost_usd"] = round(cost_usd(cfg, client.stats.prompt_tokens, client.stats.completion_tokens), 6)
        if client.limiter is not None and hasattr(client.limiter, "as_dict"):
            stats["this_run"]["rate_limiter"] = client.limiter.as_dict()
        if client.transport is not None and hasattr(client.transport, "as_dict"):
            stats["this_run"]["batch"] = client.transport.as_dict()
        if client.router is not None:  # requests per endpoint URL (never a key)
            stats["this_run"].update(client.router.as_dict())
    stats["mode"] = ctx.mode
    b = ctx.budget
    stats["budget"] = {"max_requests": b.max_requests, "max_tokens": b.max_tokens, "max_cost": b.max_cost, "scope": b.scope}
    if b.spent_requests or b.spent_tokens:  # negsynth run: what its earlier stages took from the same budget
        stats["budget"]["spent_by_earlier_stages"] = {
            "requests": b.spent_requests,
            "tokens": b.spent_tokens,
            "cost_usd": round(b.spent_cost, 6),
        }
    if extra:
        stats.update(extra)
    return stats


def summary_rows(stats: dict) -> list[tuple[str, str]]:
    rows = [
        ("valid", str(stats["valid"])),
        ("rejected", str(stats["rejected"])),
    ]
    for reason, n in stats["rejects_by_reason"].items():
        rows.append((f"  rejected: {reason}", str(n)))
    rows += [
        ("tokens in / out", f"{stats['tokens']['prompt']} / {stats['tokens']['completion']}"),
    ]
    if "estimated_cost_usd" in stats:  # stats merged from workers that did not all record it have none
        rows.append(("estimated cost", f"${stats['estimated_cost_usd']:.4f}"))
    tr = None if stats.get("reused") else stats.get("this_run")  # a reused stage sent nothing
    if tr:
        rows.append(("requests sent / cache hits", f"{tr['requests']} / {tr['cache_hits']}"))
        rows.append(("re-asks", str(tr["reasks"])))
        if tr["transport_retries"]:
            rows.append(("transport retries", ", ".join(f"{k}={v}" for k, v in tr["transport_retries"].items())))
    if stats.get("pending"):
        rows.append(("pending (transport failures, retried by a rerun)", str(stats["pending"])))
        for reason, n in stats.get("pending_by_reason", {}).items():
            rows.append((f"  pending: {reason}", str(n)))
    rows.append(("wall time", f"{stats['wall_time_s']:.1f} s"))
    if stats.get("stopped_by"):
        rows.append(("stopped by budget", stats["stopped_by"]))
    return rows
