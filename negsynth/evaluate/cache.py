"""Scored once, not again: a cache of evaluation results per (model, task).

A base-vs-trained comparison re-scores the unchanged base model on every run, mostly re-encoding
corpora. With a cache folder :func:`negsynth.evaluate.evaluate` looks each task up first. The key
holds everything a result depends on: the embedder's ``identity()`` (its model files by content,
how it encodes, the library versions; an embedder without one is never cached), the task and its
data files (path, size, mtime), the cut (quick, seed, per-query) and the source of the evaluation
code itself, so a change to how a score is computed is a miss, never a stale score. A hit carries
``"cached": true``. Entries are JSON files written atomically; deleting the folder is always safe
(``--no-cache`` scores everything).
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

#: bump to drop every stored result (a change of the entry format)
FORMAT = 1


def default_folder() -> Path:
    """``$NEGSYNTH_EVAL_CACHE_DIR``, else ``$NEGSYNTH_CACHE_DIR/eval`` (default ``~/.cache/negsynth/eval``)."""
    import os

    from negsynth.embed.hf import cache_dir

    return Path(os.environ.get("NEGSYNTH_EVAL_CACHE_DIR") or cache_dir() / "eval")


@cache
def code_digest() -> str:
    """The source of the code a score goes through: any edit to it makes every key new."""
    root = Path(__file__).resolve().parent.parent  # the package folder
    h = hashlib.sha256()
    for p in sorted([*(root / "evaluate").glob("*.py"), *(root / "embed").glob("*.py"), root / "data" / "readers.py"]):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _files_state(path: Path) -> list[tuple[str, int, int]]:
    """(path, size, mtime_ns) of a data file, or of every file under a data folder."""
    if path.is_dir():
        return [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*")) if p.is_file()]
    st = path.stat()
    return [(str(path), st.st_size, st.st_mtime_ns)]


def task_key(identity: dict[str, Any], spec, files: list[Path], *, quick: bool, seed: int, per_query: bool) -> str:
    """The key of one task's result for one embedder (see the module docstring)."""
    from dataclasses import asdict

    payload = {
        "format": FORMAT,
        "code": code_digest(),
        "embedder": identity,
        "task": asdict(spec),
        "data": [_files_state(f) for f in files],
        "quick": quick,
        "seed": seed if quick else None,
        "per_query": per_query,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def load(folder: Path, key: str) -> dict | None:
    """The stored result for ``key``, or None (missing, or unreadable: then it is scored again)."""
    p = Path(folder) / key[:2] / f"{key}.json"
    try:
        entry = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("result"), dict):
        return None
    return {**entry["result"], "cached": True}


def store(folder: Path, key: str, result: dict) -> None:
    """Keep ``result`` under ``key`` (atomically); a cache that cannot be written is skipped."""
    from negsynth.data.shards import atomic_write_json

    try:
        atomic_write_json(Path(folder) / key[:2] / f"{key}.json", {"key": key, "result": result})
    except OSError:
        pass
