"""The run manifest (``RUN_DIR/manifest.json``): what made each stage's outputs.

It stores per stage the config hash, seed, shard layout and package versions, never a secret.
A relaunch whose config or shard layout differs from what made existing outputs is refused
(use ``--overwrite`` or a new run dir), because mixing them would corrupt the dataset silently.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from negsynth import __version__
from negsynth.data.shards import atomic_write_json
from negsynth.errors import UserError


def versions() -> dict[str, str]:
    out = {"negsynth": __version__, "python": platform.python_version()}
    for pkg in ("openai", "pydantic", "polars", "torch", "sentence-transformers", "transformers", "llama-cpp-python"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def read_manifest(run_dir: Path) -> dict[str, Any]:
    p = Path(run_dir) / "manifest.json"
    if not p.exists():
        return {"stages": {}}
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{p}: not valid JSON; restore it or start a new --run-dir") from None


def stage_has_outputs(stage_dir: Path) -> bool:
    return stage_dir.is_dir() and any(stage_dir.glob("shard-*.jsonl*"))


def _remove_worker_outputs(stage_dir: Path, shard_index: int, num_shards: int, keep: set[Path] | None = None) -> None:
    """--overwrite for worker k of n: remove only the shards this worker owns (s % n == k)."""
    for p in (
        list(stage_dir.glob("shard-*.jsonl*"))
        + list((stage_dir / "rejects").glob("shard-*.jsonl*"))
        + list((stage_dir / "_shards").glob("*.json"))
    ):
        digits = "".join(ch for ch in p.name.split(".")[0] if ch.isdigit())
        if digits and int(digits) % num_shards == shard_index and (keep is None or p not in keep):
            p.unlink()
    stats = stage_dir / f"stats.{shard_index:05d}-of-{num_shards:05d}.json"
    if stats.exists():
        stats.unlink()


def check_manifest(run_dir: Path, stage: str, entry: dict[str, Any], *, overwrite: bool) -> None:
    """Refuse a relaunch that changes what made existing outputs. Reads only; writes nothing."""
    run_dir = Path(run_dir)
    recover_swap(run_dir, stage)
    stage_dir = run_dir / stage
    old = read_manifest(run_dir).get("stages", {}).get(stage)
    if old and stage_has_outputs(stage_dir) and not overwrite:
        _refuse_changed(stage_dir, old, entry)


def record_manifest(run_dir: Path, stage: str, entry: dict[str, Any], *, force: bool = False) -> None:
    """Record the stage's entry (a relaunch of the same job leaves the manifest untouched)."""
    run_dir = Path(run_dir)
    man = read_manifest(run_dir)
    old = man.get("stages", {}).get(stage)
    same = old is not None and {k: v for k, v in old.items() if k != "updated"} == entry and man.get("versions") == versions()
    if same and not force:
        return
    man.setdefault("stages", {})[stage] = {**entry, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    man["versions"] = versions()
    man.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    atomic_write_json(run_dir / "manifest.json", man)


# -- --overwrite without losing the old outputs ----------------------------------------------
# The new outputs are built in RUN_DIR/.<stage>.overwrite[-KKKKK-of-NNNNN] and swapped in only
# when the stage finishes; a failed, stopped or killed overwrite leaves the old outputs (and
# their manifest entry) as they were. Rerunning the same --overwrite resumes the staging folder.


#: folders of a stage that are caches, not outputs: moved into the new outputs by a swap
KEEP_ON_SWAP = ("_mined",)


def staging_dir(run_dir: Path, stage: str, shard_index: int = 0, num_shards: int = 1) -> Path:
    suffix = f"-{shard_index:05d}-of-{num_shards:05d}" if num_shards > 1 else ""
    return Path(run_dir) / f".{stage}.overwrite{suffix}"


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


def begin_staging(run_dir: Path, stage: str, entry: dict[str, Any], *, shard_index: int = 0, num_shards: int = 1) -> Path:
    """The folder an --overwrite writes to; a staging folder of the same job is resumed."""
    d = staging_dir(run_dir, stage, shard_index, num_shards)
    marker = d / "_overwrite.json"
    try:
        same = json.loads(marker.read_text(encoding="utf-8")) == entry
    except (OSError, ValueError):
        same = False
    if not same:
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        atomic_write_json(marker, entry)
    return d


def swap_in(run_dir: Path, stage: str, entry: dict[str, Any], staged: Path, *, shard_index: int = 0, num_shards: int = 1) -> None:
    """The overwrite finished: its outputs replace the old ones, then the manifest records them."""
    run_dir = Path(run_dir)
    stage_dir = run_dir / stage
    old = read_manifest(run_dir).get("stages", {}).get(stage)
    (staged / "_overwrite.json").unlink(missing_ok=True)
    if num_shards > 1 and old and old.get("num_shards") == num_shards and stage_dir.exists():
        # one worker of n: replace only the files this worker owns (s % n == k)
        moved = set()
        for p in sorted(staged.rglob("*")):
            if p.is_file() and not p.relative_to(staged).parts[0] == "_batch":
                dest = stage_dir / p.relative_to(staged)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(p, dest)
                moved.add(dest)
        _remove_worker_outputs(stage_dir, shard_index, num_shards, keep=moved)
        shutil.rmtree(staged, ignore_errors=True)
    else:
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
    record_manifest(run_dir, stage, entry, force=True)


def _refuse_changed(stage_dir: Path, old: dict[str, Any], entry: dict[str, Any]) -> None:
    for key, what in (
        ("config_hash", "a different config (or prompts, or inputs)"),
        ("shard_size", "a different pipeline.shard_size"),
        ("num_shards", "a different --num-shards"),
    ):
        if old.get(key) != entry.get(key):
            raise UserError(
                f"{stage_dir}: outputs were made with {what} ({key} {old.get(key)} != {entry.get(key)}); "
                f"rerun with --overwrite to discard them, or use a new --run-dir"
            )


def check_and_record(
    run_dir: Path, stage: str, entry: dict[str, Any], *, overwrite: bool, shard_index: int = 0, num_shards: int = 1
) -> None:
    """Refuse a relaunch that changes what made existing outputs; record the stage's entry.

    Workers ``0..n-1`` of one ``--num-shards n`` split share the entry (same config hash, shard
    size and n); a relaunch with another n is refused, because shard ownership would change.
    (The LLM stages use :func:`check_manifest`, :func:`begin_staging` and :func:`swap_in`.)
    """
    run_dir = Path(run_dir)
    stage_dir = run_dir / stage
    man = read_manifest(run_dir)
    old = man.get("stages", {}).get(stage)
    if old and stage_has_outputs(stage_dir) and not overwrite:
        _refuse_changed(stage_dir, old, entry)
    if overwrite and stage_dir.exists():
        if num_shards > 1 and old and old.get("num_shards") == num_shards:
            _remove_worker_outputs(stage_dir, shard_index, num_shards)  # leave the other workers' shards alone
        else:
            shutil.rmtree(stage_dir)
    same = old is not None and {k: v for k, v in old.items() if k != "updated"} == entry and man.get("versions") == versions()
    if same and not overwrite:
        return  # nothing to record: a relaunch of the same job leaves the manifest untouched
    man.setdefault("stages", {})[stage] = {**entry, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    man["versions"] = versions()
    man.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    atomic_write_json(run_dir / "manifest.json", man)
