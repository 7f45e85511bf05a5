"""The LLM stages' one shape (:class:`LLMStage`) and its
plumbing: what its outputs are made from, the LLM session, its stats."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import os
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

from negsynth.aio import run_sync
from negsynth.data.shards import list_shards
from negsynth.errors import UserError
from negsynth.llm.client import ClientStats, LLMClient, LLMResult
from negsynth.llm.errors import LLMFatalError
from negsynth.llm.session import CacheOpenError, open_client
from negsynth.pipeline.context import Budget, SharedBudget, StageContext
from negsynth.pipeline.manifest import begin_outputs, begin_staging
from negsynth.pipeline.runner import Outcome, RunReport, ShardedRunner, WorkItem, storage_error, storing
from negsynth.pipeline.stage import Stage, Summary, entry_of, finish_overwrite
from negsynth.pipeline.tally import Tally
from negsynth.prompts import reask_template, templates_fingerprint
from negsynth.schemas.config import LLMConfig
from negsynth.schemas.config_io import config_hash
from negsynth.schemas.records import Reject


# ---------------------------------------------------------------------------- what outputs are made from
def llm_fingerprint(cfg: LLMConfig) -> dict[str, Any]:
    """The LLM settings that shape outputs (part of a stage's config hash); no key, no URL."""
    return cfg.model_dump(
        mode="json",
        include={"model", "temperature", "top_p", "max_tokens", "seed", "structured_output", "max_attempts", "extra_body"},
    )


def llm_parts(ctx: StageContext, name: str, prompts: str, section: Any) -> dict[str, Any]:
    """What an LLM stage's config hash holds: its section, the LLM settings and its prompt files
    (those starting with ``prompts``, and the shared system and re-ask ones)."""
    return {name: section, "llm": llm_fingerprint(ctx.cfg.llm), "prompts": templates_fingerprint(prompts, "system", "reask")}


def inputs_fingerprint(run_dir: Path, stage: str) -> str:
    """Names and sizes of a stage's finished shards: changes when its outputs change."""
    h = hashlib.sha256()
    for p in list_shards(Path(run_dir) / stage):
        h.update(p.name.encode())
        h.update(str(p.stat().st_size).encode())
    return h.hexdigest()[:16]


def item_entry(ctx: StageContext, digest: str, **extra: Any) -> dict[str, Any]:
    """The manifest entry of an item stage: its hash, shard size and ranks, then ``extra``."""
    return {"config_hash": digest, "shard_size": ctx.cfg.pipeline.shard_size, "num_shards": ctx.world_size, **extra}


# ---------------------------------------------------------------------------- the session
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
    """``[llm]`` as the client uses it: the embedded fleet's servers as its ``endpoints``."""
    from negsynth.llm.server import fleet_llm_config

    return fleet_llm_config(ctx.cfg.llm, ctx.base_url)


def stage_concurrency(ctx: StageContext, n_items: int) -> int:
    """Items in flight: the endpoints' concurrency online; every item in batch mode."""
    return max(1, n_items) if ctx.mode == "batch" else llm_config(ctx).total_concurrency


@asynccontextmanager
async def llm_session(
    ctx: StageContext,
    *,
    stage: str,
    folder: Callable[[], Path] | None = None,
    gate: Callable[[ClientStats], str | None],
    begin: Callable[[], None] | None = None,
    commit_window: float = 0.0,
):
    """A ready :class:`LLMClient` with the run dir's request cache, rate limiter and budget ``gate``.
    Key, endpoint and cache are checked before ``begin()`` begins the stage's outputs. In batch
    mode requests go through the Batch API (state in ``folder()/_batch``); otherwise cached answers
    may share commits over ``commit_window`` seconds."""
    url = endpoint(ctx)
    cfg = llm_config(ctx)
    if ctx.mode == "batch" and not cfg.cache:
        raise UserError("--mode batch needs the request cache (llm.cache = true): batch results are delivered through it")
    if ctx.mode == "batch" and cfg.endpoints:
        raise UserError("--mode batch sends through one Batch API: set llm.base_url instead of llm.endpoints, or drop --mode batch")
    cache_path = ctx.run_dir / "cache" / "llm.sqlite" if cfg.cache else None

    def batch(client: LLMClient) -> Any:
        from negsynth.llm.batch import BatchTransport

        state_dir = (folder() if folder else ctx.run_dir / stage) / "_batch"
        if ctx.world_size > 1:  # each rank keeps its own batch jobs
            state_dir = state_dir / f"worker-{ctx.rank:05d}-of-{ctx.world_size:05d}"
        # $NEGSYNTH_BATCH_POLL_S overrides llm.batch_poll_s
        poll = float(os.environ.get("NEGSYNTH_BATCH_POLL_S") or ctx.cfg.llm.batch_poll_s)
        return BatchTransport(client, state_dir, poll_s=poll, completion_window=ctx.cfg.llm.batch_completion_window)

    try:
        async with open_client(
            cfg,
            base_url=url,
            cache_path=cache_path,
            commit_window=0.0 if ctx.mode == "batch" else commit_window,
            rate_ledger=ctx.rate_ledger,
            gate=gate,
            ledger=ctx.budget if isinstance(ctx.budget, SharedBudget) else None,  # --executor ray: one budget for every rank
            on_wait=ctx.reporter.waiting,
            prepare=begin,
            transport=batch if ctx.mode == "batch" else None,
            stage=stage,
        ) as client:
            yield client
    except LLMFatalError as e:
        raise UserError(str(e)) from None
    except CacheOpenError as e:  # the disk refused, or the cache is unreadable
        if isinstance(e.cause, OSError):
            raise storage_error(e.cause, e.path) from None
        raise UserError(
            f"{e.path}: the request cache is unreadable ({e.cause}); move it away (its answers are then requested again) or restore it"
        ) from None


def budget_gate(cfg: LLMConfig, budget: Budget) -> Callable[[ClientStats], str | None]:
    """``budget``, checked on a client's counters (what its session sent)."""

    def check(st: ClientStats) -> str | None:
        tokens = st.prompt_tokens + st.completion_tokens
        return budget.exceeded(st.requests, tokens, cost_usd(cfg, st.prompt_tokens, st.completion_tokens))

    return check


# ---------------------------------------------------------------------------- stats
def all_failed_the_same_way(stage: str, rep: RunReport, client: LLMClient | None, *, fixed: int = 0) -> None:
    """Fail the stage (not leave its items pending) when every item failed for one reason that is a
    setting to fix, as ``llm.max_consecutive_failures`` does for a larger stage; ``fixed``: valid
    records that needed no request."""
    from negsynth.llm.errors import FATAL_KINDS, outage_message

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
        if client.limiter is not None:
            stats["this_run"]["rate_limiter"] = client.limiter.as_dict()
        if client.transport is not None:  # the Batch API's
            stats["this_run"]["batch"] = client.transport.as_dict()
        if client.router is not None:  # requests per endpoint URL (never a key)
            stats["this_run"].update(client.router.as_dict())
    stats["mode"] = ctx.mode
    b = ctx.budget
    stats["budget"] = b.limits()
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
    rows = [("valid", str(stats["valid"])), ("rejected", str(stats["rejected"]))]
    rows += [(f"  rejected: {reason}", str(n)) for reason, n in stats["rejects_by_reason"].items()]
    rows.append(("tokens in / out", f"{stats['tokens']['prompt']} / {stats['tokens']['completion']}"))
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
        rows += [(f"  pending: {reason}", str(n)) for reason, n in stats.get("pending_by_reason", {}).items()]
    rows.append(("wall time", f"{stats['wall_time_s']:.1f} s"))
    if stats.get("stopped_by"):
        rows.append(("stopped by budget", stats["stopped_by"]))
    return rows


# ---------------------------------------------------------------------------- the shape
class LLMStage(Stage):
    """A stage whose items are answered by the LLM, one JSON answer per request. Subclass, set
    ``name``, ``summary``, ``config`` and ``prompts`` (its prompt files' prefix), supply :meth:`plan`,
    :meth:`messages`, :meth:`schema`, :meth:`parse` and :meth:`record`; ``STAGE = MyStage()``. Its
    methods run on a copy bound to the run (:meth:`bind`): ``self.ctx``, ``self.cfg`` (its section),
    ``self.out``. Every request goes through :meth:`ask`."""

    prompts: ClassVar[str]
    split = "ranks"
    #: the answer's name in the re-asks ("example", "queries", ...)
    output_name: ClassVar[str] = "output"
    #: the sampling temperature of its requests (None: ``llm.temperature``)
    temperature: ClassVar[float | None] = None

    ctx: StageContext
    cfg: Any
    out: Path
    pool: Any

    def bind(self, ctx: StageContext) -> LLMStage:
        job = copy.copy(self)
        job.ctx, job.cfg, job.out, job.pool = ctx, self.section(ctx.cfg), ctx.run_dir / self.name, None
        return job

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the run's one worker thread: CPU work on the event loop would hold
        arriving answers unread past ``llm.timeout`` (then paid again). One thread: a fast
        tokenizer must not be used by two threads at once."""
        if self.pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"negsynth-{self.name}")
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def uses_llm(self, cfg: Any) -> bool:
        return True

    # ------------------------------------------------------------------ what a stage supplies
    def check(self) -> None:
        """Refuse a config this stage cannot run, with a one-line ``UserError``."""

    def plan(self) -> list[WorkItem]:
        """Its work items (the same config and inputs give the same items)."""
        raise NotImplementedError

    def before(self, items: list[WorkItem]) -> None:
        """Work on the planned items before any is processed (regenerate's mining)."""

    def messages(self, item: WorkItem) -> list[dict[str, str]]:
        raise NotImplementedError

    def schema(self, item: WorkItem) -> dict[str, Any] | None:
        return None

    def parse(self, item: WorkItem, answer: Any) -> Any:
        """The value of a parsed JSON answer, or raise ``ValidationFailure(reason, detail)``."""
        raise NotImplementedError

    def record(self, item: WorkItem, value: Any, result: LLMResult) -> dict[str, Any]:
        raise NotImplementedError

    def reject(self, item: WorkItem, result: LLMResult) -> dict[str, Any]:
        """The reject of an item whose answers all failed."""
        rej = Reject(
            id=item.id,
            stage=self.name,
            reason=result.reason or "unknown",
            detail=result.detail,
            raw=result.raw,
            input=item.payload,
            usage=result.usage,
        )
        return rej.model_dump(mode="json")

    def sample_index(self, item: WorkItem) -> int:
        """Which sample of the same request this item is (part of the request's cache key)."""
        return int(item.payload.get("k", 0))

    async def ask(self, client: LLMClient, item: WorkItem) -> LLMResult:
        """The item's answer: its value, or why every attempt failed (``reason``, ``detail``, ``raw``)."""
        return await client.structured(
            self.messages(item),
            validate=lambda answer: self.parse(item, answer),
            schema=self.schema(item),
            name=self.output_name,
            sample_index=self.sample_index(item),
            temperature=self.temperature,
            reask_template=reask_template(),
        )

    async def process(self, client: LLMClient | None, item: WorkItem) -> Outcome:
        """The item's record, or its reject."""
        res = await self.ask(client, item)
        if res.value is None:
            return Outcome(reject=self.reject(item, res))
        return Outcome(record=self.record(item, res.value, res))

    def verdict(self, rep: RunReport, rows: list[tuple[str, dict]]) -> str | None:
        """A ``whole`` stage's judgment of all its rows once every item is done: None, or why it failed."""
        return None

    def fixed(self) -> int:
        """How many of its valid records need no request."""
        return 0

    def extra_stats(self) -> dict[str, Any] | None:
        """Stage-specific keys of ``stats.json`` (called once every item is done)."""
        return None

    def estimate_items(self, tally: Tally) -> list[WorkItem]:
        """The items ``negsynth estimate`` counts (stand-ins where the inputs do not exist yet)."""
        return self.plan()

    def made_from(self, ctx: StageContext) -> str | dict[str, Any]:
        """Its section, the LLM settings, its prompt files and its inputs' shards, with the shard layout."""
        parts = llm_parts(ctx, self.name, self.prompts, self.section(ctx.cfg))
        ins = [inputs_fingerprint(ctx.run_dir, s) for s in self.inputs(ctx.cfg)]
        if ins:
            parts["inputs"] = ins[0] if len(ins) == 1 else ins
        return item_entry(ctx, config_hash(parts))

    def report(self, stats: dict) -> list[Summary]:
        return [Summary(self.name, summary_rows(stats))]

    # ------------------------------------------------------------------ what the base does
    def plan_run(self, ctx: StageContext) -> tuple[LLMStage, list[WorkItem], dict[str, Any]]:
        """A copy bound to the run, its items (after :meth:`before`) and what they are made from."""
        job = self.bind(ctx)
        job.check()
        items = job.plan()
        job.before(items)
        return job, items, {**entry_of(self.made_from(ctx)), "items": len(items)}

    def run(self, ctx: StageContext) -> dict:
        job, items, entry = self.plan_run(ctx)
        rep, client = run_sync(job.run_items(items, entry))
        stats = llm_stats(ctx, self.name, rep, client, job.extra_stats())
        if job.out != ctx.run_dir / self.name and ctx.world_size == 1:  # an --overwrite (ranks leave it to the driver)
            finish_overwrite(ctx, self.name, job.out, stats)
        return stats

    async def run_items(self, items: list[WorkItem], entry: dict[str, Any]) -> tuple[RunReport, LLMClient | None]:
        """Every item of this rank's shards through :meth:`process`; the report and the client
        (None when no session was opened: a finished stage needs no server, key or cache)."""
        ctx = self.ctx

        def runner(concurrency: int = 1, **kw: Any) -> ShardedRunner:
            verdict = self.verdict if self.split == "whole" else None
            return ShardedRunner(ctx, self.name, self.out, concurrency=concurrency, verdict=verdict, **kw)

        finished = not ctx.overwrite and not runner().has_work(len(items))
        if finished or not self.uses_llm(ctx.cfg):  # or items that need no LLM (mined negatives): the same shards, no session
            if not finished:
                self.begin(entry)
            return await runner().run(items, lambda it: self.process(None, it)), None
        gate = budget_gate(ctx.cfg.llm, ctx.budget)
        # answers may share the cache's commits over 50 ms (a re-ask flushes first)
        async with llm_session(
            ctx, stage=self.name, folder=lambda: self.out, begin=lambda: self.begin(entry), gate=gate, commit_window=0.05
        ) as client:
            run = runner(stage_concurrency(ctx, len(items)), budget_check=lambda: gate(client.stats), again=client.again)
            rep = await run.run(items, lambda it: self.process(client, it))
            if client.outage is not None and rep.pending and not (rep.outage or rep.failed):
                # the breaker tripped on the last items in flight: still an outage
                if client.outage_fatal:
                    rep.failed = f"{self.name}: {client.outage}"
                else:
                    rep.outage = client.outage
            all_failed_the_same_way(self.name, rep, client, fixed=self.fixed())
            return rep, client

    def begin(self, entry: dict[str, Any]) -> None:
        """Once every check passed, before the first write: note in ``RUN_DIR/<stage>`` what its
        outputs are made from; an ``--overwrite`` writes to a staging folder, swapped in at the end."""
        ctx, d = self.ctx, self.ctx.run_dir / self.name
        if ctx.overwrite:
            with storing(ctx.run_dir):
                self.out = begin_staging(ctx.run_dir, self.name, entry)
            return
        with storing(d):
            d.mkdir(parents=True, exist_ok=True)
            begin_outputs(d, entry)

    def prepare(self, ctx: StageContext) -> None:
        """``--executor ray``: the plan, :meth:`before` and the ``--overwrite`` staging folder, once
        in the driver before the ranks start."""
        _, _, entry = self.plan_run(ctx)
        if ctx.overwrite:
            begin_staging(ctx.run_dir, self.name, entry)

    def estimate(self, ctx: StageContext, tally: Tally) -> None:
        """One request per item, with the messages the run sends."""
        job = self.bind(ctx)
        for it in job.estimate_items(tally):
            tally.request(job.messages(it))
