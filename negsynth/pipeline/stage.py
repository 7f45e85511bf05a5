"""The stage contract (:class:`Stage`) and the checks :func:`~negsynth.pipeline.executor.run_stage`
makes around a stage's loop: its inputs, whether finished work can be reused (its outputs checked
against the manifest), the manifest before the loop and after it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

from negsynth.data.shards import list_shards
from negsynth.errors import UserError
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.manifest import (
    check_manifest,
    damaged_outputs,
    describe_outputs,
    own_record,
    read_manifest,
    record_manifest,
    swap_in,
)
from negsynth.pipeline.runner import storage_error
from negsynth.pipeline.tally import Tally
from negsynth.schemas.config import RunConfig
from negsynth.schemas.records import Record

Relaunch = Literal["resume", "rebuild", "always"]
#: how a stage's work is cut: ``ranks``: shards of ``pipeline.shard_size`` items that the ranks of
#: ``--executor ray`` share (when it calls the LLM); ``process``: in one process (its embedding may
#: still go to Ray workers); ``whole``: its items in one shard, finished only when the stage's
#: verdict on all of them passes (all or nothing)
Split = Literal["ranks", "process", "whole"]


class Summary(NamedTuple):
    """One table of a stage's summary: a title and its rows (two columns unless ``header`` says)."""

    title: str
    rows: list[tuple[Any, ...]]
    header: tuple[str, ...] = ("", "")


class Stage:
    """One stage of the method: a module subclasses it and ends with ``STAGE = MyStage()``; one line
    of :data:`negsynth.stages.METHOD` gives it its command and its ``[name]`` section of the run
    file (``config``, the class of ``cfg.<name>``).

    It answers from the run config which stages it reads (:meth:`inputs`), whether it calls the LLM
    (:meth:`uses_llm`) and whether its heavy work is embedding (:meth:`embeds`), and supplies its
    loop (:meth:`run`: ctx -> stats; heavy imports inside it), what its outputs are made from
    (:meth:`made_from`) and its summary (:meth:`report`); one that may call the LLM counts the
    requests ``negsynth estimate`` prints (:meth:`estimate`).

    ``relaunch``: what rerunning a finished stage does (docs/architecture.md, "Rerunning a stage");
    ``done_files``: the files in its folder that make it finished; ``records``: the record its
    shards hold (:class:`~negsynth.schemas.records.Example`: what ``score``, ``inspect`` and
    ``export`` read); ``split``: how its work is cut (:data:`Split`).
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    config: ClassVar[type | None] = None
    relaunch: ClassVar[Relaunch] = "resume"
    done_files: ClassVar[tuple[str, ...]] = ("stats.json",)
    records: ClassVar[type[Record] | None] = None
    split: ClassVar[Split] = "process"

    def section(self, cfg: RunConfig) -> Any:
        """Its section of the run file (``cfg.<name>``); the section's defaults where the run file
        has none (a stage added without one)."""
        own = getattr(cfg, self.name, None)
        return self.config() if own is None and self.config is not None else own

    def inputs(self, cfg: RunConfig) -> tuple[str, ...]:
        """The stages whose finished outputs it reads (one of them suffices)."""
        return ()

    def uses_llm(self, cfg: RunConfig) -> bool:
        return False

    def embeds(self, cfg: RunConfig) -> bool:
        """Whether its heavy work under ``cfg`` is embedding with ``[embedder]``
        (``--executor ray`` spreads that over its workers)."""
        return False

    def keeps_on_change(self, cfg: RunConfig) -> bool:
        """A ``rebuild`` stage that refuses a changed config instead (train with ``train.resume``)."""
        return False

    def made_from(self, ctx: StageContext) -> str | dict[str, Any] | None:
        """What its outputs are made from: the hash of its config and inputs, or the fields of its
        manifest entry (``config_hash`` among them); None: nothing to compare (``always``)."""
        return None

    def run(self, ctx: StageContext) -> dict:
        raise NotImplementedError

    def prepare(self, ctx: StageContext) -> None:
        """A stage that splits into ranks: its work done once in the driver before its ranks start
        (``--executor ray``), whose results the ranks read instead of each computing them."""

    def report(self, stats: dict) -> list[Summary]:
        return []

    def estimate(self, ctx: StageContext, tally: Tally) -> Any:
        """The requests ``negsynth estimate`` counts for it (:class:`~negsynth.pipeline.tally.Tally`);
        what later stages' estimators may read. Only a stage that may call the LLM has one."""
        raise NotImplementedError(f"stage {self.name!r} calls the LLM but counts no requests: define {type(self).__name__}.estimate")


def splits(stage: Stage, cfg: RunConfig) -> bool:
    """Whether ``--executor ray`` runs ``stage`` as ranks: its work is cut into ranks and it calls the LLM under ``cfg``."""
    return stage.split == "ranks" and stage.uses_llm(cfg)


def entry_of(made: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest entry of what :meth:`Stage.made_from` says (a hash: over one process's shards)."""
    if made is None:
        return None
    return {"shard_size": None, "num_shards": 1, **(made if isinstance(made, dict) else {"config_hash": made})}


def has_outputs(folder: Path) -> bool:
    """Whether a stage folder holds outputs a later stage can read (a finished shard, or a stage's
    closing stats.json). Not whether the stage is done: that is :func:`finished_stats`."""
    return bool(list_shards(folder)) or (folder / "stats.json").is_file()


def check_inputs(stage: Stage, ctx: StageContext) -> None:
    """One line naming the missing input and the command that makes it, before any work is paid
    for (a stage reading several needs one of them)."""
    names = stage.inputs(ctx.cfg)
    missing = [n for n in names if not has_outputs(ctx.run_dir / n)]
    if len(missing) < len(names) or not names:
        return
    where = " or ".join(str(ctx.run_dir / n) for n in missing)
    raise UserError(f"{stage.name}: no finished outputs in {where}; run `negsynth {missing[0]}` first")


def up_to_date(stage: Stage, ctx: StageContext, entry: dict[str, Any] | None) -> tuple[dict | None, StageContext]:
    """The stage's recorded stats when its outputs are finished and were made from the same config
    and inputs (``entry``), else None; and the context to run it with otherwise: a ``rebuild``
    stage whose config or inputs changed (or whose outputs are damaged) is rebuilt without asking
    (``overwrite``), unless it keeps them on a change; a ``resume`` stage runs, continuing
    unfinished work or refusing a changed config."""
    if stage.relaunch == "always" or entry is None or ctx.overwrite:
        return None, ctx
    out = ctx.run_dir / stage.name
    if not any((out / f).exists() for f in stage.done_files):
        return None, ctx
    stats = _read_stats(out / "stats.json")
    recorded = read_manifest(ctx.run_dir).get("stages", {}).get(stage.name) or {}
    if stats is not None and _finished_as_recorded(out, stage, stats) and same_entry(recorded, entry):
        if not repair_outputs(stage, ctx, recorded.get("outputs")):
            ctx.reporter.info(f"{stage.name}: up to date in {out} (same config and inputs); --overwrite redoes it")
            return {**stats, "reused": True}, ctx
        return None, replace(ctx, overwrite=stage.relaunch == "rebuild")
    if stage.relaunch == "rebuild" and not stage.keeps_on_change(ctx.cfg):
        ctx.reporter.info(f"{stage.name}: config or inputs changed since {out} was made: rebuilding it")
        return None, replace(ctx, overwrite=True)
    return None, ctx


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
    out = ctx.run_dir / stage.name
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


def check_manifest_entry(stage: Stage, ctx: StageContext, entry: dict[str, Any], *, begin: bool) -> None:
    """Refuse (one line) outputs made from another config unless ``--overwrite``; with ``begin``
    note in the stage folder what the outputs are made from (an LLM stage notes it itself once its
    key, endpoint and cache are checked; the manifest records the entry once the stage finished:
    :func:`record_finished`)."""
    try:  # the stage folder is written here, first: a read-only one is met before any work
        check_manifest(ctx.run_dir, stage.name, entry, overwrite=ctx.overwrite and not stage.keeps_on_change(ctx.cfg), begin=begin)
    except OSError as e:
        raise storage_error(e, ctx.run_dir / stage.name) from None


def record_finished(stage: Stage, ctx: StageContext, entry: dict[str, Any] | None, stats: dict) -> None:
    """A stage that finished: the manifest records its entry and its outputs' sizes and hashes (a
    stage that failed or stopped early records nothing)."""
    if entry is None or stats.get("reused") or not finished_stats(stats):
        return
    out = ctx.run_dir / stage.name
    own = own_record(out)  # the entry the stage began its outputs with (an item stage adds its item count)
    if own is not None and same_entry(own, entry):
        entry = own
    try:
        record_manifest(ctx.run_dir, stage.name, entry, outputs=describe_outputs(out))
    except OSError as e:
        raise storage_error(e, ctx.run_dir / "manifest.json") from None


def finish_overwrite(ctx: StageContext, name: str, staged: Path, stats: dict) -> None:
    """An ``--overwrite`` whose stage finished: its new outputs (in ``staged``) replace the old
    ones; one that did not: they wait there, and its ``stats`` say so."""
    if not finished_stats(stats):
        stats["overwrite_pending"] = f"the previous outputs in {ctx.run_dir / name} are kept; the new ones wait in {staged}"
        return
    try:
        swap_in(ctx.run_dir, name, staged)
    except OSError as e:
        raise storage_error(e, ctx.run_dir / name) from None


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
