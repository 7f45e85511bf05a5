"""The run manifest (``RUN_DIR/manifest.json``): per finished stage, what its outputs are made from
(config hash, shard layout, versions; never a secret) and each output's size, hash and mtime. While
a stage runs, its entry is in ``RUN_DIR/<stage>/_entry.json``. A relaunch that would mix outputs of
another config is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from negsynth.data.shards import atomic_write_json
from negsynth.errors import UserError


def versions() -> dict[str, str]:
    """The installed versions of negsynth, Python and the libraries that shape the outputs."""
    out = {"python": platform.python_version()}
    for pkg in ("negsynth", "openai", "pydantic", "polars", "torch", "sentence-transformers", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when it is missing or unreadable (torn, not JSON)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_manifest(run_dir: Path) -> dict[str, Any]:
    p = Path(run_dir) / "manifest.json"
    if not p.exists():
        return {"stages": {}}
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{p}: not valid JSON; restore it or start a new --run-dir") from None


#: in a stage folder: the entry its outputs are being made from, written before the first of them
MADE_FROM = "_entry.json"
#: manifest entry fields that are not part of what the outputs are made from
_NOT_MADE_FROM = ("updated", "outputs")


def own_record(stage_dir: Path) -> dict[str, Any] | None:
    """The stage folder's own record of what its outputs are made from (:data:`MADE_FROM`), or None."""
    own = read_json(Path(stage_dir) / MADE_FROM)
    return own if isinstance(own, dict) else None


def made_from(run_dir: Path, stage: str) -> dict[str, Any] | None:
    """What the outputs in ``RUN_DIR/<stage>`` are made from: the stage folder's record, else the manifest's."""
    run_dir = Path(run_dir)
    return own_record(run_dir / stage) or read_manifest(run_dir).get("stages", {}).get(stage)


def begin_outputs(stage_dir: Path, entry: dict[str, Any]) -> None:
    """Record in the stage folder what its outputs are made from, before the first is written."""
    if own_record(stage_dir) != entry:
        atomic_write_json(Path(stage_dir) / MADE_FROM, entry)


def check_manifest(run_dir: Path, stage: str, entry: dict[str, Any], *, overwrite: bool, begin: bool = False) -> None:
    """Refuse a relaunch that changes what made existing outputs (one line). ``begin``: discard them
    under ``overwrite`` and note what the new outputs are made from; without it nothing is written."""
    run_dir = Path(run_dir)
    recover_swap(run_dir, stage)
    stage_dir = run_dir / stage
    old = made_from(run_dir, stage)
    if old and not overwrite and stage_dir.is_dir() and any(stage_dir.glob("shard-*.jsonl*")):
        _refuse_changed(stage_dir, old, entry)
    if not begin:
        return
    if overwrite and stage_dir.exists():
        shutil.rmtree(stage_dir)
        forget_stage(run_dir, stage)
    stage_dir.mkdir(parents=True, exist_ok=True)
    begin_outputs(stage_dir, entry)


def output_files(stage_dir: Path) -> list[Path]:
    """The files of a stage folder a later stage reads: shards, their rejects, and parquet tables."""
    stage_dir = Path(stage_dir)
    return (
        sorted(stage_dir.glob("shard-*.jsonl"))
        + sorted((stage_dir / "rejects").glob("shard-*.jsonl"))
        + sorted(stage_dir.glob("*.parquet"))
    )


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def describe_outputs(stage_dir: Path) -> dict[str, dict[str, Any]]:
    """Each output file's size, SHA-256 and mtime, by its path in the stage folder."""
    out = {}
    for p in output_files(stage_dir):
        st = p.stat()
        out[p.relative_to(stage_dir).as_posix()] = {"size": st.st_size, "sha256": _sha256(p), "mtime_ns": st.st_mtime_ns}
    return out


def damaged_outputs(stage_dir: Path, recorded: dict[str, Any] | None, *, full: bool = False) -> dict[str, str]:
    """The output files that are no longer what the finished stage wrote: path -> why. Sizes; a hash
    only when the mtime moved (or ``full``). Without a record only ``full`` checks: that shards parse."""
    stage_dir = Path(stage_dir)
    bad: dict[str, str] = {}
    if not isinstance(recorded, dict):
        if full:
            from negsynth.data.shards import ShardError, iter_jsonl

            for p in output_files(stage_dir):
                try:
                    for _ in iter_jsonl(p):
                        pass
                except ShardError as e:
                    bad[p.relative_to(stage_dir).as_posix()] = str(e).split(": ", 1)[-1]
        return bad
    for rel, want in recorded.items():
        p = stage_dir / rel
        try:
            st = p.stat()
        except OSError:
            bad[rel] = "missing"
            continue
        if st.st_size != want.get("size"):
            bad[rel] = f"{st.st_size} bytes, {want.get('size')} when it was written"
        elif (full or st.st_mtime_ns != want.get("mtime_ns")) and _sha256(p) != want.get("sha256"):
            bad[rel] = "its content changed since it was written"
    return bad


def record_manifest(run_dir: Path, stage: str, entry: dict[str, Any], *, outputs: dict[str, Any] | None = None) -> None:
    """Record the entry of a stage that finished, with its ``outputs``; unchanged: untouched."""
    run_dir = Path(run_dir)
    man = read_manifest(run_dir)
    old = man.get("stages", {}).get(stage)
    same = (
        old is not None
        and {k: v for k, v in old.items() if k not in _NOT_MADE_FROM} == entry
        and old.get("outputs") == outputs
        and man.get("versions") == versions()
    )
    if same:
        return
    new = {**entry, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if outputs is not None:
        new["outputs"] = outputs
    man.setdefault("stages", {})[stage] = new
    man["versions"] = versions()
    man.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    atomic_write_json(run_dir / "manifest.json", man)


def forget_stage(run_dir: Path, stage: str) -> None:
    """Drop a stage's entry (its outputs were discarded)."""
    run_dir = Path(run_dir)
    man = read_manifest(run_dir)
    if stage in man.get("stages", {}):
        del man["stages"][stage]
        atomic_write_json(run_dir / "manifest.json", man)


# -- --overwrite builds in RUN_DIR/.<stage>.overwrite, swapped in only when the stage finishes ----


#: folders of a stage that are caches, not outputs: moved into the new outputs by a swap
KEEP_ON_SWAP = ("_mined",)


def staging_dir(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / f".{stage}.overwrite"


def _trash_dir(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / f".{stage}.old"


def recover_swap(run_dir: Path, stage: str) -> None:
    """Finish or undo a swap that a kill interrupted (the manifest is recorded after the swap)."""
    trash, stage_dir = _trash_dir(run_dir, stage), Path(run_dir) / stage
    if not trash.exists():
        return
    if stage_dir.exists():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(trash, stage_dir)  # killed between the two renames: the old outputs are back


def begin_staging(run_dir: Path, stage: str, entry: dict[str, Any]) -> Path:
    """The folder an --overwrite writes to; a staging folder of the same job is resumed."""
    d = staging_dir(run_dir, stage)
    marker = d / "_overwrite.json"
    if read_json(marker) != entry:
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        atomic_write_json(marker, entry)
        atomic_write_json(d / MADE_FROM, entry)  # the stage folder's own record, once swapped in
    return d


def swap_in(run_dir: Path, stage: str, staged: Path) -> None:
    """The overwrite finished: its outputs replace the old ones, whose manifest entry goes."""
    run_dir = Path(run_dir)
    stage_dir = run_dir / stage
    (staged / "_overwrite.json").unlink(missing_ok=True)
    trash = _trash_dir(run_dir, stage)
    if trash.exists():
        shutil.rmtree(trash)
    for keep in KEEP_ON_SWAP:  # caches beside the outputs survive an overwrite
        if (stage_dir / keep).is_dir() and not (staged / keep).exists():
            os.rename(stage_dir / keep, staged / keep)
    if stage_dir.exists():
        os.rename(stage_dir, trash)
    os.rename(staged, stage_dir)
    shutil.rmtree(trash, ignore_errors=True)
    forget_stage(run_dir, stage)


def _refuse_changed(stage_dir: Path, old: dict[str, Any], entry: dict[str, Any]) -> None:
    """The number of workers (``num_shards``) is no reason: a shard is the same whoever wrote it."""
    for key, what in (
        ("config_hash", "a different config (or prompts, or inputs)"),
        ("shard_size", "a different pipeline.shard_size"),
    ):
        if old.get(key) != entry.get(key):
            raise UserError(
                f"{stage_dir}: outputs were made with {what} ({key} {old.get(key)} != {entry.get(key)}); "
                f"rerun with --overwrite to discard them, or use a new --run-dir"
            )
