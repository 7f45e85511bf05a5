"""The stage contract: what every stage declares, and the checks
:func:`~negsynth.pipeline.executor.run_stage` makes around a stage's own loop (``run(ctx) ->
stats``): its inputs (:func:`check_inputs`), whether finished work made from the same config and
inputs can be reused (:func:`up_to_date`, once its outputs are checked against the manifest:
:func:`repair_outputs`), the manifest before the loop (:func:`check_manifest_entry`; the
fingerprint is computed once and kept in ``ctx.made_from``) and after it
(:func:`record_finished`: a stage that finished is recorded with its outputs' sizes and hashes).
The LLM stages' loops share one shape on top of this, :mod:`negsynth.pipeline.llm_stage`. The
method's stages, in order, are declared in :mod:`negsynth.stages`.

Relaunch policies (what rerunning a finished stage does), one per kind of stage:

``resume``
    LLM and scoring stages. A finished stage is reused as it is; finished shards are kept and a
    rerun continues where the last run stopped, so no request is paid for twice; a changed
    config is refused with one line (``--overwrite`` starts afresh, building the new outputs
    beside the old ones).
``rebuild``
    Derived data (curriculum, train). Reused when its config and inputs are unchanged;
    rebuilt, without asking, when either changed, because the old result is stale.
``always``
    Reports (evaluate). Cheap next to what they read, so they are recomputed every time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from negsynth.data.shards import list_shards
from negsynth.errors import UserError
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.manifest import (
    check_and_record,
    check_manifest,
    damaged_outputs,
    describe_outputs,
    own_record,
    read_manifest,
    record_manifest,
)
from negsynth.pipeline.runner import storage_error
from negsynth.pipeline.tally import Tally
from negsynth.schemas.config import RunConfig, register_section

Relaunch = Literal["resume", "rebuild", "always"]


class Summary(NamedTuple):
    """One table of a stage's summary: a title and its rows (two columns unless ``header`` says)."""

    title: str
    rows: list[tuple[Any, ...]]
    header: tuple[str, ...] = ("", "")


@dataclass(frozen=True)
class Stage:
    """One stage of a pipeline, as the runner sees it: each stage module declares its own
    ``STAGE = Stage(...)`` next to the functions it names, so a reader (and a type checker) can
    follow a stage from the CLI to its code.

    ``run`` is its loop (ctx -> stats; heavy imports stay inside it, so torch is loaded only by
    the stages that need it). ``config`` is the class of its section of the run file
    (``cfg.<name>``). ``inputs`` names the stages whose finished outputs it reads (a function of
    the config where that is configurable); with ``any_input`` one of them suffices. ``llm`` says
    whether it calls the LLM (a function of the config where that depends on it); a stage that
    may call it declares ``estimate`` (ctx, :class:`~negsynth.pipeline.tally.Tally` -> what later
    stages' estimators may read), the requests ``negsynth estimate`` counts for it; one without is
    refused when it is built, so no LLM stage is estimated at zero requests. ``fingerprint``
    (ctx -> the hash of its config and inputs, or the fields of its manifest entry) and
    ``done_files`` (the files in its folder that make it finished) let :func:`run_stage` reuse
    finished work and check (and record) the run manifest before the loop. A ``staged`` stage (the
    LLM stages) records its entry itself once its endpoint, key and cache checks passed, or when
    an ``--overwrite`` built beside the old outputs is swapped in. ``keep_on_change`` (a function
    of the config) makes a ``rebuild`` stage refuse a changed config instead (train with
    ``train.resume``). ``report`` (stats -> the :class:`Summary` tables) is its summary, printed
    after it ran (or was reused). ``shardable``: its work splits into shard workers
    (``--executor ray``). ``embeds`` (a function of the config where that depends on it): its
    heavy work is embedding with ``[embedder]``, which it loads through ``ctx.embedder_factory``
    (or, to mine, ``ctx.mining_model_factory``) when one is set (``--executor ray`` spreads the
    encoding over Ray workers; the stage itself runs in one process). ``examples``: its shards
    hold example records (query, positive, negatives), the ones ``inspect`` and ``export`` read.
    ``prepare``: work a ``shardable`` stage does once in the driver before its ranks start
    (``--executor ray``; its embedding on the Ray workers), whose results the ranks then read
    instead of each computing it (regenerate's mining, the staging folder of an ``--overwrite``).
    """

    name: str
    summary: str
    run: Callable[[StageContext], dict]
    config: type | None = None
    fingerprint: Callable[[StageContext], str | dict[str, Any]] | None = None
    report: Callable[[dict], list[Summary]] | None = None
    inputs: tuple[str, ...] | Callable[[RunConfig], Sequence[str]] = ()
    any_input: bool = False
    llm: bool | Callable[[RunConfig], bool] = False
    relaunch: Relaunch = "resume"
    done_files: tuple[str, ...] = ("stats.json",)
    staged: bool = False
    keep_on_change: Callable[[RunConfig], bool] | None = None
    shardable: bool = False
    embeds: bool | Callable[[RunConfig], bool] = False
    examples: bool = False
    prepare: Callable[[StageContext], None] | None = None
    estimate: Callable[[StageContext, Tally], Any] | None = None

    def __post_init__(self) -> None:
        if self.llm and self.estimate is None:  # True, or a function of the config
            raise TypeError(
                f"stage {self.name!r} calls the LLM (llm={self.llm!r}) but declares no estimate: "
                "pass Stage(estimate=fn), fn(ctx, tally) counting its requests (negsynth.pipeline.tally)"
            )
        if self.config is not None:  # a stage RunConfig does not list gets its [name] section of the run file
            register_section(self.name, self.config)

    def input_stages(self, cfg: RunConfig) -> tuple[str, ...]:
        return tuple(self.inputs(cfg) if callable(self.inputs) else self.inputs)

    def needs_llm(self, cfg: RunConfig) -> bool:
        return bool(self.llm(cfg) if callable(self.llm) else self.llm)

    def embeds_with(self, cfg: RunConfig) -> bool:
        """Whether its heavy work under ``cfg`` is embedding with ``[embedder]`` (``embeds``)."""
        return bool(self.embeds(cfg) if callable(self.embeds) else self.embeds)


def has_outputs(folder: Path) -> bool:
    """Whether a stage folder holds outputs a later stage can read (a finished shard, or a stage's
    closing stats.json). Not whether the stage is done: that is :func:`finished_stats`."""
    return bool(list_shards(folder)) or (folder / "stats.json").is_file()


def check_inputs(stage: Stage, ctx: StageContext) -> None:
    """One line naming the missing input and the command that makes it, before any work is paid for."""
    names = stage.input_stages(ctx.cfg)
    missing = [n for n in names if not has_outputs(ctx.run_dir / n)]
    if not names or not missing or (stage.any_input and len(missing) < len(names)):
        return
    where = " or ".join(str(ctx.run_dir / n) for n in missing)
    raise UserError(f"{stage.name}: no finished outputs in {where}; run `negsynth {missing[0]}` first")


def manifest_entry(stage: Stage, ctx: StageContext) -> dict[str, Any] | None:
    """What the stage's outputs are made from, as the manifest records it: its fingerprint (a hash,
    or a dict of fields) over a one-process shard layout. The fingerprint is computed here, once
    per run, and kept in ``ctx.made_from`` for the stage's loop."""
    ctx.made_from = fp = None if stage.fingerprint is None else stage.fingerprint(ctx)
    if fp is None:
        return None
    return {"shard_size": None, "num_shards": 1, **(fp if isinstance(fp, dict) else {"config_hash": fp})}


def up_to_date(stage: Stage, ctx: StageContext, entry: dict[str, Any] | None) -> dict | None:
    """The stage's recorded stats when its outputs are finished and were made from the same config
    and inputs (``entry`` = the manifest's), else None.

    Otherwise a ``rebuild`` stage is marked for rebuilding (``ctx.overwrite``) without asking
    (unless ``keep_on_change``); a ``resume`` stage runs, continuing unfinished work or refusing a
    changed config."""
    if stage.relaunch == "always" or entry is None or ctx.overwrite:
        return None
    out = ctx.stage_dir(stage.name)
    if not any((out / f).exists() for f in stage.done_files):
        return None
    stats = _read_stats(out / "stats.json")
    recorded = read_manifest(ctx.run_dir).get("stages", {}).get(stage.name) or {}
    if stats is not None and _finished_as_recorded(out, stage, stats) and same_entry(recorded, entry):
        if not repair_outputs(stage, ctx, recorded.get("outputs")):
            ctx.reporter.info(f"{stage.name}: up to date in {out} (same config and inputs); --overwrite redoes it")
            return {**stats, "reused": True}
        return None
    if stage.relaunch == "rebuild" and not (stage.keep_on_change and stage.keep_on_change(ctx.cfg)):
        ctx.reporter.info(f"{stage.name}: config or inputs changed since {out} was made: rebuilding it")
        ctx.overwrite = True
    return None


def same_entry(recorded: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Whether outputs recorded with ``recorded`` are made from ``entry``; the number of workers
    that wrote them (``num_shards``) aside: every shard is the same whichever worker wrote it."""
    return all(recorded.get(k) == v for k, v in entry.items() if k != "num_shards")


def repair_outputs(stage: Stage, ctx: StageContext, recorded: dict[str, Any] | None) -> bool:
    """Check a finished stage's outputs against what the manifest recorded when it finished
    (:func:`~negsynth.pipeline.manifest.damaged_outputs`: sizes, and hashes with ``--verify`` or
    when an mtime moved). A damaged shard is removed so that the stage makes it again: an LLM
    stage from its request cache (nothing paid twice), another by recomputing it (a ``rebuild``
    stage rebuilds whole). True when something was damaged (the stage then runs)."""
    out = ctx.stage_dir(stage.name)
    bad = damaged_outputs(out, recorded, full=ctx.verify)
    if not bad:
        return False
    first, why = next(iter(bad.items()))
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    ctx.reporter.warn(f"{stage.name}: {out / first} is not what the stage wrote ({why}){more}: making it again")
    for rel in bad:
        name = rel.rsplit("/", 1)[-1]
        for p in (out / name, out / "rejects" / name):  # a shard and its rejects are made together
            try:
                p.unlink(missing_ok=True)
            except OSError as e:
                raise storage_error(e, p) from None
    if stage.relaunch == "rebuild":
        ctx.overwrite = True
    return True


def check_writable(stage_dir: Path) -> None:
    """A stage folder (or one of its subfolders) this process cannot write is one line before any
    work (embedding, mining, requests), not after it: a file is made and removed in each."""
    import os
    import tempfile

    if not stage_dir.is_dir():
        return
    for d in [stage_dir, *(p for p in stage_dir.iterdir() if p.is_dir() and not p.is_symlink())]:
        try:
            fd, probe = tempfile.mkstemp(prefix=".writable-", dir=d)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise storage_error(OSError(e.errno, e.strerror), d) from None  # the folder, not the probe


def check_manifest_entry(stage: Stage, ctx: StageContext, entry: dict[str, Any]) -> None:
    """Refuse (one line) outputs made from another config unless ``--overwrite``; note in the stage
    folder what the outputs are made from, except for a ``staged`` stage, which notes it when it
    starts writing (the manifest records the entry once the stage finished: :func:`record_finished`)."""
    overwrite = ctx.overwrite and not (stage.keep_on_change and stage.keep_on_change(ctx.cfg))
    if stage.staged:
        check_manifest(ctx.run_dir, stage.name, entry, overwrite=overwrite)
    else:
        try:  # the stage folder is written here, first: a read-only one is met before any work
            check_and_record(ctx.run_dir, stage.name, entry, overwrite=overwrite)
        except OSError as e:
            raise storage_error(e, ctx.run_dir / stage.name) from None


def record_finished(stage: Stage, ctx: StageContext, entry: dict[str, Any] | None, stats: dict) -> None:
    """A stage that finished: the manifest records its entry and its outputs' sizes and hashes (a
    stage that failed or stopped early records nothing)."""
    if entry is None or stats.get("reused") or not finished_stats(stats):
        return
    out = ctx.stage_dir(stage.name)
    own = own_record(out)  # the entry the stage began its outputs with (an item stage adds its item count)
    if own is not None and same_entry(own, entry):
        entry = own
    try:
        record_manifest(ctx.run_dir, stage.name, entry, outputs=describe_outputs(out))
    except OSError as e:
        raise storage_error(e, ctx.run_dir / "manifest.json") from None


def _finished_as_recorded(out: Path, stage: Stage, stats: dict) -> bool:
    """Its done files are there, its stats say complete, and its shards are the ones they count
    (none turned back into a ``.partial`` or lost since)."""
    if not all((out / f).exists() for f in stage.done_files) or not finished_stats(stats):
        return False
    if any(out.glob("shard-*.partial")):
        return False
    expected = stats.get("shards_total")
    if expected is None and isinstance(stats.get("inputs"), list):  # score: one output shard per input shard
        expected = len(stats["inputs"])
    return expected is None or len(list_shards(out)) == expected


def _read_stats(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # missing or torn: the stage runs and writes it again


def unfinished(stats: dict) -> bool:
    """Whether a stage's stats say it stopped early (budget, outage, pending items, failure)."""
    return bool(stats.get("failed") or stats.get("outage") or stats.get("stopped_by") or stats.get("pending"))


def finished_stats(stats: dict) -> bool:
    """The one rule for "this stage is done", read from its stats: complete (every shard written, a
    stage without shards has no ``complete`` key) and not stopped early (:func:`unfinished`).
    :attr:`RunReport.finished <negsynth.pipeline.runner.RunReport.finished>` is the same rule on
    the report the stats are made from."""
    return bool(stats.get("complete", True)) and not unfinished(stats)
