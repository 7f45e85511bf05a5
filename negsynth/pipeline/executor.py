"""Where stages run (``--executor local | ray``), and :func:`run_stage` / :func:`run_stages`. Each
worker gets its rank and the world size and runs ``stage.run(ctx)``: :class:`LocalExecutor` is rank
0 of 1, :class:`RayExecutor` runs ``workers`` ranks (:mod:`negsynth.pipeline.ray_executor`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from rich.markup import escape

from negsynth.data.shards import atomic_write_json
from negsynth.errors import UserError
from negsynth.pipeline.context import Budget, StageContext
from negsynth.pipeline.embedded import llm_endpoint
from negsynth.pipeline.llm_stage import LLMStage
from negsynth.pipeline.lock import hold
from negsynth.pipeline.manifest import staging_dir
from negsynth.pipeline.progress import Reporter
from negsynth.pipeline.runner import storing
from negsynth.pipeline.stage import (
    Stage,
    check_inputs,
    check_manifest_entry,
    check_writable,
    entry_of,
    record_finished,
    splits,
    unfinished,
    up_to_date,
)
from negsynth.schemas.config import RunConfig


def split_stages(method: Sequence[Stage], cfg: RunConfig) -> tuple[str, ...]:
    """The stages ``--executor ray`` spreads over its workers: those that split or embed."""
    return tuple(s.name for s in method if splits(s, cfg) or s.embeds(cfg))


class LocalExecutor:
    """Every stage in this process: rank 0 of 1."""

    def check(self, stage: Stage, cfg: RunConfig) -> None:
        pass

    def world_size(self, stage: Stage, cfg: RunConfig) -> int:
        return 1

    def in_process(self, stage: Stage | None = None, cfg: RunConfig | None = None) -> bool:
        """Whether every request to the embedded LLM comes from this process (its prefix may be pinned)."""
        return True

    @contextmanager
    def around(self, stage: Stage, ctx: StageContext) -> Iterator[tuple[StageContext, dict]]:
        """The context the stage runs with, and what to add to its stats."""
        yield ctx, {}

    def run(self, stage: Stage, ctx: StageContext) -> dict:
        return stage.run(ctx)


class RayExecutor(LocalExecutor):
    """Ranks and embedding on ``workers`` Ray workers (``address``: a cluster to join)."""

    def __init__(self, workers: int, address: str | None = None, *, method: Sequence[Stage] = ()):
        self.workers = workers
        self.address = address
        self.method = method

    def check(self, stage: Stage, cfg: RunConfig) -> None:
        if stage.name not in split_stages([stage], cfg):
            split = split_stages(self.method, cfg)
            hint = f" (it splits: {', '.join(split)})" if split else ""
            raise UserError(f"--executor ray: {stage.name} does not split into Ray workers; run it without --executor{hint}")

    def world_size(self, stage: Stage, cfg: RunConfig) -> int:
        return self.workers if splits(stage, cfg) else 1

    def in_process(self, stage: Stage | None = None, cfg: RunConfig | None = None) -> bool:
        """Without a stage (the server a whole run shares): no."""
        return stage is not None and self.world_size(stage, cfg) == 1

    @contextmanager
    def around(self, stage: Stage, ctx: StageContext) -> Iterator[tuple[StageContext, dict]]:
        """A stage's encoding on the Ray workers and, on a cluster, one embedded fleet per node."""
        from negsynth.pipeline.ray_executor import around

        with around(stage, ctx, workers=self.workers, address=self.address) as done:
            yield done

    def run(self, stage: Stage, ctx: StageContext) -> dict:
        """A stage that splits as ``workers`` ranks, its stats summed; any other here."""
        from negsynth.pipeline.ray_executor import run_ranks

        return run_ranks(stage, ctx, workers=self.workers, address=self.address)


def executor_for(kind: str, *, workers: int = 1, address: str | None = None, method: Sequence[Stage] = ()) -> LocalExecutor:
    """The executor ``--executor`` names (``method``: the stages, named when one does not split)."""
    if kind == "local":
        return LocalExecutor()
    if kind == "ray":
        return RayExecutor(workers, address, method=method)
    raise UserError(f"--executor {kind!r}: choose local or ray")


# ---------------------------------------------------------------------------- running a stage
def run_stage(
    stage: Stage, ctx: StageContext, *, executor: LocalExecutor | None = None, start_llm: Callable[[], str] | None = None
) -> dict:
    """Run one stage on ``executor`` while holding the run dir: inputs checked first, finished work
    of the same config and inputs reused, outputs of another config refused unless ``--overwrite``,
    the embedded LLM around it (``start_llm``: the run's shared server), its stats written to
    ``RUN_DIR/<stage>/stats.json`` and returned, the manifest updated, its summary printed."""
    executor = executor or LocalExecutor()
    with hold(ctx.run_dir, warn=ctx.reporter.warn):
        ctx = replace(ctx, rank=0, world_size=executor.world_size(stage, ctx.cfg))
        check_inputs(stage, ctx)
        entry = entry_of(stage.made_from(ctx))
        stats, ctx = up_to_date(stage, ctx, entry)
        if stats is None:
            check_writable(ctx.run_dir / stage.name)
            if entry is not None:
                check_manifest_entry(stage, ctx, entry, begin=not isinstance(stage, LLMStage))
            with executor.around(stage, ctx) as (ctx, extra), stage_endpoint(stage, ctx, start_llm, executor) as ctx:
                stats = executor.run(stage, ctx)
            stats = {**stats, **extra}
            write_stats(stage, ctx, stats)
            record_finished(stage, ctx, entry, stats)
        print_report(stage, ctx, stats)
        return stats


def write_stats(stage: Stage, ctx: StageContext, stats: dict) -> None:
    folder = staging_dir(ctx.run_dir, stage.name) if stats.get("overwrite_pending") else ctx.run_dir / stage.name
    with storing(folder / "stats.json"):
        atomic_write_json(folder / "stats.json", stats)


def print_report(stage: Stage, ctx: StageContext, stats: dict) -> None:
    if stats.get("skipped"):
        return
    for t in stage.report(stats):
        ctx.reporter.table(t.title, t.rows, t.header)


@contextmanager
def stage_endpoint(stage: Stage, ctx: StageContext, start_llm: Callable[[], str] | None, executor: LocalExecutor) -> Iterator[StageContext]:
    """``ctx`` with where a stage's requests go: the caller's endpoint, the run's shared embedded
    server (``start_llm``), an embedded server for the block, or the configured URL."""
    needed = stage.uses_llm(ctx.cfg) and ctx.base_url is None
    if needed and start_llm is not None:
        ctx, needed = replace(ctx, base_url=start_llm()), False
    with llm_endpoint(ctx.cfg, ctx.run_dir, ctx.reporter, needed=needed, in_process=executor.in_process(stage, ctx.cfg)) as url:
        yield replace(ctx, base_url=url) if url else ctx


def run_stages(
    stages: Sequence[Stage],
    cfg: RunConfig,
    run_dir: str | Path,
    *,
    reporter: Reporter | None = None,
    overwrite: bool = False,
    budget: Budget | None = None,
    executor: LocalExecutor | None = None,
    verify: bool = False,
) -> dict[str, dict]:
    """Run ``stages`` in order with :func:`run_stage`; each stage's stats. One embedded server and
    one budget serve the whole run; a stage that stops early ends it."""
    run_dir = Path(run_dir)
    reporter = reporter or Reporter()
    executor = executor or LocalExecutor()
    llm_idx = [i for i, s in enumerate(stages) if s.uses_llm(cfg)]
    budget = budget or Budget()
    out: dict[str, dict] = {}
    with hold(run_dir, warn=reporter.warn), ExitStack() as stack:
        base_url: str | None = None

        def start_llm() -> str:  # on first use: a run whose LLM stages are all up to date starts none
            nonlocal base_url
            if base_url is None:
                base_url = stack.enter_context(llm_endpoint(cfg, run_dir, reporter, in_process=executor.in_process()))
            return base_url

        for i, stage in enumerate(stages):
            ctx = StageContext(cfg=cfg, run_dir=run_dir, overwrite=overwrite, reporter=reporter, budget=budget, verify=verify)
            reporter.info(f"[bold]== {escape(stage.name)}[/]", styled=True)
            out[stage.name] = st = run_stage(stage, ctx, executor=executor, start_llm=start_llm)
            if st.get("skipped"):  # evaluate with no data to read: the line says where to get some
                reporter.warn(st.get("reason", f"{stage.name} skipped"))
            if isinstance(st.get("this_run"), dict) and not st.get("reused"):
                budget = budget.after(st["this_run"])
            if unfinished(st):
                why = f"stopped by budget {st['stopped_by']}" if st.get("stopped_by") else "did not finish"
                reporter.warn(f"{stage.name} {why}; later stages not run")
                break
            if llm_idx and i == llm_idx[-1]:
                stack.close()  # the LLM is no longer needed: free its cores for scoring and training
                base_url = None
    return out
