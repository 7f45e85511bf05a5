"""The stage contract (:class:`Stage`) and the checks :func:`~negsynth.pipeline.executor.run_stage`
makes around it: inputs, reuse of finished work, the manifest before and after."""

from __future__ import annotations

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
    read_json,
    read_manifest,
    record_manifest,
    swap_in,
)
from negsynth.pipeline.runner import storage_error, storing
from negsynth.pipeline.tally import Tally
from negsynth.schemas.config import RunConfig
from negsynth.schemas.records import Record

Relaunch = Literal["resume", "rebuild", "always"]
#: how a stage's work is cut: ``ranks``: shards the ranks of ``--executor ray`` share (when it calls
#: the LLM); ``process``: in one process; ``whole``: one shard, finished only when the stage's verdict passes
Split = Literal["ranks", "process", "whole"]


class Summary(NamedTuple):
    """One table of a stage's summary: a title and its rows (two columns unless ``header`` says)."""

    title: str
    rows: list[tuple[Any, ...]]
    header: tuple[str, ...] = ("", "")


class Stage:
    """One stage of the method: a module subclasses it and ends with ``STAGE = MyStage()``; one line
    of :data:`negsynth.stages.METHOD` gives it its command and its ``[name]`` section (``config``).
    It supplies :meth:`run` (ctx -> stats; heavy imports inside), :meth:`made_from` and
    :meth:`report`, and one that may call the LLM :meth:`estimate`.

    ``relaunch``: what rerunning a finished stage does (docs/architecture.md); ``done_files``: the
    files that make it finished; ``records``: the record its shards hold; ``split``: :data:`Split`.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    config: ClassVar[type | None] = None
    relaunch: ClassVar[Relaunch] = "resume"
    done_files: ClassVar[tuple[str, ...]] = ("stats.json",)
    records: ClassVar[type[Record] | None] = None
    split: ClassVar[Split] = "process"

    def section(self, cfg: RunConfig) -> Any:
        """Its section of the run file (``cfg.<name>``), or the section's defaults."""
        own = getattr(cfg, self.name, None)
        return self.config() if own is None and self.config is not None else own

    def inputs(self, cfg: RunConfig) -> tuple[str, ...]:
        """The stages whose finished outputs it reads (one of them suffices)."""
        return ()

    def uses_llm(self, cfg: RunConfig) -> bool:
        return False

    def embeds(self, cfg: RunConfig) -> bool:
        """Whether its heavy work under ``cfg`` is embedding (``--executor ray`` spreads it)."""
        return False

    def keeps_on_change(self, cfg: RunConfig) -> bool:
        """A ``rebuild`` stage that refuses a changed config instead (train with ``train.resume``)."""
        return False

    def made_from(self, ctx: StageContext) -> str | dict[str, Any] | None:
        """What its outputs are made from: a hash, or manifest entry fields with ``config_hash``; None: nothing to compare."""
        return None

    def run(self, ctx: StageContext) -> dict:
        raise NotImplementedError

    def prepare(self, ctx: StageContext) -> None:
        """``--executor ray``: work done once in the driver before the ranks start."""

    def report(self, stats: dict) -> list[Summary]:
        return []

    def estimate(self, ctx: StageContext, tally: Tally) -> None:
        """Count its requests for ``negsynth estimate``."""
        raise NotImplementedError(f"stage {self.name!r} calls the LLM but counts no requests: define {type(self).__name__}.estimate")


def splits(stage: Stage, cfg: RunConfig) -> bool:
    """Whether ``--executor ray`` runs ``stage`` as ranks."""
    return stage.split == "ranks" and stage.uses_llm(cfg)


def entry_of(made: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest entry of what :meth:`Stage.made_from` says (a hash: over one process's shards)."""
    if made is None:
        return None
    return {"shard_size": None, "num_shards": 1, **(made if isinstance(made, dict) else {"config_hash": made})}


def check_inputs(stage: Stage, ctx: StageContext) -> None:
    """One line naming the missing input and the command that makes it (one of several suffices)."""
    names = stage.inputs(ctx.cfg)
    # outputs a later stage can read (not whether the stage is done): shards, or its stats
    missing = [n for n in names if not (list_shards(ctx.run_dir / n) or (ctx.run_dir / n / "stats.json").is_file())]
    if len(missing) < len(names) or not names:
        return
    where = " or ".join(str(ctx.run_dir / n) for n in missing)
    raise UserError(f"{stage.name}: no finished outputs in {where}; run `negsynth {missing[0]}` first")


def up_to_date(stage: Stage, ctx: StageContext, entry: dict[str, Any] | None) -> tuple[dict | None, StageContext]:
    """The stage's recorded stats when its finished outputs were made from ``entry``, else None; and
    the context to run it with (a changed or damaged ``rebuild`` stage: with ``overwrite``)."""
    if stage.relaunch == "always" or entry is None or ctx.overwrite:
        return None, ctx
    out = ctx.run_dir / stage.name
    if not any((out / f).exists() for f in stage.done_files):
        return None, ctx
    stats = read_json(out / "stats.json")  # missing or torn: the stage runs and writes it again
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
    """Whether outputs recorded with ``recorded`` are made from ``entry`` (``num_shards`` aside)."""
    return all(recorded.get(k) == v for k, v in entry.items() if k != "num_shards")


def repair_outputs(stage: Stage, ctx: StageContext, recorded: dict[str, Any] | None) -> bool:
    """Remove the finished outputs that are not what the manifest recorded, so the stage makes them
    again (an LLM stage from its cache); True when something was damaged."""
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
            with storing(p):
                p.unlink(missing_ok=True)
    return True


def check_writable(stage_dir: Path) -> None:
    """One line before any work when this process cannot write the stage folder or a subfolder."""
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
    """Refuse outputs made from another config unless ``--overwrite``; ``begin``: note what the
    outputs are made from (an LLM stage does it itself once its checks passed)."""
    # the stage folder is written here, first: a read-only one is met before any work
    with storing(ctx.run_dir / stage.name):
        check_manifest(ctx.run_dir, stage.name, entry, overwrite=ctx.overwrite and not stage.keeps_on_change(ctx.cfg), begin=begin)


def record_finished(stage: Stage, ctx: StageContext, entry: dict[str, Any] | None, stats: dict) -> None:
    """A stage that finished: the manifest records its entry and its outputs' sizes and hashes."""
    if entry is None or stats.get("reused") or not finished_stats(stats):
        return
    out = ctx.run_dir / stage.name
    own = own_record(out)  # the entry the stage began its outputs with (an item stage adds its item count)
    if own is not None and same_entry(own, entry):
        entry = own
    with storing(ctx.run_dir / "manifest.json"):
        record_manifest(ctx.run_dir, stage.name, entry, outputs=describe_outputs(out))


def finish_overwrite(ctx: StageContext, name: str, staged: Path, stats: dict) -> None:
    """Swap a finished ``--overwrite``'s outputs (in ``staged``) in; an unfinished one's ``stats`` say where they wait."""
    if not finished_stats(stats):
        stats["overwrite_pending"] = f"the previous outputs in {ctx.run_dir / name} are kept; the new ones wait in {staged}"
        return
    with storing(ctx.run_dir / name):
        swap_in(ctx.run_dir, name, staged)


def _finished_as_recorded(out: Path, stage: Stage, stats: dict) -> bool:
    """Its done files are there, its stats say complete, and its shards are the ones they count."""
    if not all((out / f).exists() for f in stage.done_files) or not finished_stats(stats):
        return False
    if any(out.glob("shard-*.partial")):
        return False
    expected = stats.get("shards_total")
    if expected is None and isinstance(stats.get("inputs"), list):  # score: one output shard per input shard
        expected = len(stats["inputs"])
    return expected is None or len(list_shards(out)) == expected


def unfinished(stats: dict) -> bool:
    """Whether a stage's stats say it stopped early (budget, outage, pending items, failure)."""
    return bool(stats.get("failed") or stats.get("outage") or stats.get("stopped_by") or stats.get("pending"))


def finished_stats(stats: dict) -> bool:
    """The one rule for "this stage is done": complete (no ``complete`` key: no shards) and not
    stopped early (:func:`unfinished`)."""
    return bool(stats.get("complete", True)) and not unfinished(stats)
