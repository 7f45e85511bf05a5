"""Shard IO: JSONL shards with atomic writes, append-only partial files and strict readers.

Layout of a stage folder (``RUN_DIR/<stage>/``)::

    shard-00000.jsonl          finished shard (written by temp file + rename: its presence marks it done)
    shard-00000.jsonl.partial  records appended while the shard is in progress (resume point)
    rejects/shard-00000.jsonl  rejected items with reason and raw LLM output
    _shards/00000.json         per-shard stats, merged into stats.json
    stats.json                 the stage's stats
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from negsynth.data import jsonfast
from negsynth.errors import NegsynthError

SHARD_GLOB = "shard-*.jsonl"
_UMASK = os.umask(0)
os.umask(_UMASK)


class ShardError(NegsynthError, ValueError):
    """A shard that cannot be read; the message names the file, line and fix."""


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.jsonl"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get the usual umask permissions
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def dumps_line(obj: Any) -> str:
    """One JSONL line: ``json.dumps(obj, ensure_ascii=False, separators=(",", ":"))``, written faster."""
    return jsonfast.dumps(obj).decode("utf-8") + "\n"


def write_jsonl(path: Path, rows: Iterable[dict]) -> int:
    """Atomically write ``rows`` as JSONL; returns the row count."""
    n = 0
    parts: list[str] = []
    for r in rows:
        parts.append(dumps_line(r))
        n += 1
    atomic_write_text(Path(path), "".join(parts))
    return n


def repair_hint(path: Path) -> str:
    """The command that makes a damaged shard of a stage folder again: the stage, rerun with
    ``--verify`` (it checks its outputs against the manifest and makes a damaged one again, an LLM
    stage from its request cache, so nothing is paid twice)."""
    path = Path(path)
    stage_dir = path.parent.parent if path.parent.name == "rejects" else path.parent
    return (
        f"rerun `negsynth {stage_dir.name} -d {stage_dir.parent} --verify` with the same -c/--set: "
        "it makes the damaged shard again (an LLM stage from its request cache, nothing paid twice)"
    )


def iter_jsonl(path: Path, *, tolerate_truncated_tail: bool = False) -> Iterator[dict]:
    """Yield the JSON objects of a JSONL file.

    A line that does not parse raises :class:`ShardError` naming file and line, except a
    truncated *last* line when ``tolerate_truncated_tail`` (the mark of a killed writer on a
    ``.partial`` file), which is skipped.
    """
    path = Path(path)
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise ShardError(f"{path}: file not found") from None
    except PermissionError:
        raise ShardError(f"{path}: permission denied; fix the file's permissions") from None
    with fh:
        data = fh.read()
    lines = data.split(b"\n")
    last = len(lines) - 1
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if tolerate_truncated_tail and i == last:
                return
            what = " (truncated last line)" if i == last else ""
            raise ShardError(f"{path}:{i + 1}: not valid JSON{what}: {e.msg if hasattr(e, 'msg') else e}; {repair_hint(path)}") from None
        if not isinstance(obj, dict):
            raise ShardError(f"{path}:{i + 1}: expected a JSON object per line, got {type(obj).__name__}")
        yield obj


def list_shards(folder: Path) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(folder.glob(SHARD_GLOB))


def read_stage(folder: Path) -> Iterator[dict]:
    """Yield every record of the finished shards of a stage folder, in shard order."""
    for p in list_shards(folder):
        yield from iter_jsonl(p)


class PartialWriter:
    """Append-only writer for a shard in progress; each line is flushed to the OS at once.

    A process killed with SIGKILL loses nothing that was written (the OS holds it); at worst the
    last line is truncated, which :func:`iter_jsonl` skips with ``tolerate_truncated_tail``.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        self._fh = open(self.path, "a", encoding="utf-8")

    def _repair_tail(self) -> None:
        # drop a truncated last line left by a killed writer so appends start on a fresh line
        if not self.path.exists():
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return
            cut = data.rfind(b"\n") + 1
            f.truncate(cut)

    def write(self, obj: dict) -> None:
        self._fh.write(dumps_line(obj))
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
