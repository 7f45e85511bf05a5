"""The stage contract: what every stage declares, and the one function that runs a stage.

A stage module implements only its own loop (``run(ctx) -> stats``). What is the same for every
stage lives here: its inputs are checked before anything is paid for, the embedded LLM server
runs around the stages that call the LLM (and only those), and ``negsynth run`` is a loop over
:func:`run_stage`. The method's stages, in order, are declared in :mod:`negsynth.stages`.

Relaunch policies (what rerunning a finished stage does), one per kind of stage:

``resume``
    LLM and scoring stages. Finished shards are kept and a rerun continues where the last run
    stopped, so no request is paid for twice; a changed config is refused with one line
    (``--overwrite`` starts afresh, building the new outputs beside the old ones).
``rebuild``
    Derived data (curriculum, train). Reused when its config and inputs are unchanged;
    rebuilt, without asking, when either changed, because the old result is stale.
``always``
    Reports (evaluate). Cheap next to what they read, so they are recomputed every time.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from negsynth.data.shards import list_shards
from negsynth.errors import UserError
from negsynth.pipeline.context import Budget, StageContext
from negsynth.pipeline.llm_stage import llm_endpoint
from negsynth.pipeline.manifest import read_manifest
from negsynth.pipeline.progress import Reporter
from negsynth.schemas.config import RunConfig

Relaunch = Literal["resume", "rebuild", "always"]


@dataclass(frozen=True)
class Stage:
    """One stage of a pipeline, as the runner sees it.

    ``target`` is ``"module:function"``, imported when the stage runs (so torch is loaded only by
    the stages that need it). ``inputs`` names the stages whose finished outputs it reads (a
    function of the config where that is configurable); with ``any_input`` one of them suffices.
    ``llm`` says whether it calls the LLM (a function of the config where that depends on it).
    A ``rebuild`` stage names its ``fingerprint`` (``"module:function"``, ctx -> the hash of its
    config and inputs) and the files in its folder that make it finished (``done_files``).
    """

    name: str
    target: str
    summary: str
    inputs: tuple[str, ...] | Callable[[RunConfig], Sequence[str]] = ()
    any_input: bool = False
    llm: bool | Callable[[RunConfig], bool] = False
    relaunch: Relaunch = "resume"
    fingerprint: str | None = None
    done_files: tuple[str, ...] = ("stats.json",)

    def function(self) -> Callable[..., dict]:
        return _load(self.target)

    def input_stages(self, cfg: RunConfig) -> tuple[str, ...]:
        return tuple(self.inputs(cfg) if callable(self.inputs) else self.inputs)

    def needs_llm(self, cfg: RunConfig) -> bool:
        return bool(self.llm(cfg) if callable(self.llm) else self.llm)


def _load(target: str) -> Callable[..., Any]:
    mod, fn = target.split(":")
    return getattr(importlib.import_module(mod), fn)


def finished(folder: Path) -> bool:
    """Whether a stage folder holds finished outputs (shards, or a stage's closing stats.json)."""
    return bool(list_shards(folder)) or (folder / "stats.json").is_file()


def check_inputs(stage: Stage, ctx: StageContext) -> None:
    """One line naming the missing input and the command that makes it, before any work is paid for."""
    names = stage.input_stages(ctx.cfg)
    missing = [n for n in names if not finished(ctx.run_dir / n)]
    if not names or not missing or (stage.any_input and len(missing) < len(names)):
        return
    where = " or ".join(str(ctx.run_dir / n) for n in missing)
    raise UserError(f"{stage.name}: no finished outputs in {where}; run `negsynth {missing[0]}` first")


def reuse_or_rebuild(stage: Stage, ctx: StageContext) -> dict | None:
    """The ``rebuild`` policy: the stage's stats when its outputs are finished and were made from
    the same config and inputs (fingerprint = the manifest's hash); else None, and outputs made
    from another config are marked for rebuilding (``ctx.overwrite``) without asking."""
    if stage.relaunch != "rebuild" or stage.fingerprint is None or ctx.overwrite:
        return None
    out = ctx.stage_dir(stage.name)
    if not any((out / f).exists() for f in stage.done_files):
        return None
    recorded = read_manifest(ctx.run_dir).get("stages", {}).get(stage.name, {}).get("config_hash")
    if recorded == _load(stage.fingerprint)(ctx) and all((out / f).exists() for f in stage.done_files):
        stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
        ctx.reporter.info(f"{stage.name}: up to date in {out} (same config and inputs); --overwrite redoes it")
        return stats
    ctx.reporter.info(f"{stage.name}: config or inputs changed since {out} was made: rebuilding it")
    ctx.overwrite = True
    return None


def run_stage(stage: Stage, ctx: StageContext, **kwargs: Any) -> dict:
    """Run one stage: check its inputs, reuse it when its relaunch policy says it is up to date,
    start the embedded server if it calls the LLM and no endpoint is up yet, run its loop and
    return its stats."""
    check_inputs(stage, ctx)
    reused = reuse_or_rebuild(stage, ctx)
    if reused is not None:
        return reused
    needed = stage.needs_llm(ctx.cfg) and ctx.base_url is None
    with llm_endpoint(ctx.cfg, ctx.run_dir, ctx.reporter, needed=needed) as url:
        if url:
            ctx.base_url = url
        return stage.function()(ctx, **kwargs)


def unfinished(stats: dict) -> bool:
    """Whether a stage's stats say it stopped early (budget, outage, pending items, failure)."""
    return bool(stats.get("failed") or stats.get("outage") or stats.get("stopped_by") or stats.get("pending"))


def run_stages(
    stages: Sequence[Stage],
    cfg: RunConfig,
    run_dir: str | Path,
    *,
    reporter: Reporter | None = None,
    overwrite: bool = False,
    budget: Budget | None = None,
) -> dict[str, dict]:
    """Run ``stages`` in order with :func:`run_stage`; returns each stage's stats.

    One embedded server serves every LLM stage of the run (started before the first, stopped
    after the last so scoring and training get its cores). A stage that stops early ends the
    run: later stages would train and evaluate on partial (or no) data."""
    run_dir = Path(run_dir)
    reporter = reporter or Reporter()
    llm_idx = [i for i, s in enumerate(stages) if s.needs_llm(cfg)]
    out: dict[str, dict] = {}
    with ExitStack() as stack:
        base_url = None
        for i, stage in enumerate(stages):
            ctx = StageContext(cfg=cfg, run_dir=run_dir, overwrite=overwrite, reporter=reporter, base_url=base_url, budget=budget or Budget())
            if llm_idx and i == llm_idx[0]:
                check_inputs(stage, ctx)  # before the server starts
                base_url = ctx.base_url = stack.enter_context(llm_endpoint(cfg, run_dir, reporter))
            reporter.info(f"[bold]== {stage.name}[/]")
            out[stage.name] = st = run_stage(stage, ctx)
            if unfinished(st):
                if st.get("stopped_by"):
                    reporter.warn(f"{stage.name} stopped by budget {st['stopped_by']}; later stages not run")
                else:
                    reporter.warn(f"{stage.name} did not finish; later stages not run")
                break
            if llm_idx and i == llm_idx[-1]:
                stack.close()  # the LLM is no longer needed: free its cores for scoring and training
                base_url = None
    return out
