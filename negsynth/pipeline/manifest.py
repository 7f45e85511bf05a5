"""The run manifest (``RUN_DIR/manifest.json``): what made each stage's outputs.

It stores per stage the config hash, seed, shard layout and package versions, never a secret.
A relaunch whose config or shard layout differs from what made existing outputs is refused
(use ``--overwrite`` or a new run dir), because mixing them would corrupt the dataset silently.
"""

from __future__ import annotations

import json
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


def _remove_worker_outputs(stage_dir: Path, shard_index: int, num_shards: int) -> None:
    """--overwrite for worker k of n: remove only the shards this worker owns (s % n == k)."""
    for p in list(stage_dir.glob("shard-*.jsonl*")) + list((stage_dir / "rejects").glob("shard-*.jsonl*")) + list((stage_dir / "_shards").glob("*.json")):
        digits = "".join(ch for ch in p.name.split(".")[0] if ch.isdigit())
        if digits and int(digits) % num_shards == shard_index:
            p.unlink()
    stats = stage_dir / f"stats.{shard_index:05d}-of-{num_shards:05d}.json"
    if stats.exists():
        stats.unlink()


def check_and_record(
    run_dir: Path, stage: str, entry: dict[str, Any], *, overwrite: bool, shard_index: int = 0, num_shards: int = 1
) -> None:
    """Refuse a relaunch that changes what made existing outputs; record the stage's entry.

    Workers ``0..n-1`` of one ``--num-shards n`` split share the entry (same config hash, shard
    size and n); a relaunch with another n is refused, because shard ownership would change.
    """
    run_dir = Path(run_dir)
    stage_dir = run_dir / stage
    man = read_manifest(run_dir)
    old = man.get("stages", {}).get(stage)
    if old and stage_has_outputs(stage_dir) and not overwrite:
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
