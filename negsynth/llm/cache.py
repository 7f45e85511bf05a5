"""A persistent request cache so a rerun or a resumed run pays for no LLM call twice.

Keyed by a SHA-256 of the whole request body and the sample index (never the API key); SQLite in
WAL mode. In an event loop the answers of one iteration (or of ``commit_window`` seconds) share
one commit.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

from negsynth.data import jsonfast


def request_key_and_body(payload: dict[str, Any], sample_index: int) -> tuple[str, bytes]:
    """The cache key, SHA-256 of ``{"n":N,"p":<payload>}`` as sorted compact JSON (the bytes of
    ``json.dumps(..., sort_keys=True, ensure_ascii=False, separators=(",", ":"))``), and the
    request body, that dump's inner slice."""
    blob = jsonfast.dumps({"n": sample_index, "p": payload}, sort_keys=True)  # the same bytes as json.dumps
    head = len(b'{"n":%d,"p":' % sample_index)
    return hashlib.sha256(blob).hexdigest(), blob[head:-1]


class RequestCache:
    """``get(key) -> dict | None`` and ``put(key, value)``; values are JSON objects."""

    def __init__(self, path: Path, *, commit_window: float = 0.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a killed process loses no commit
            # checkpoint (the only fsync) every ~40 MB of WAL instead of ~4 MB: halves the cost of a put
            self._db.execute("PRAGMA wal_autocheckpoint=10000")
            self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            # a corrupt file can open and still fail on the first read: find out now, before any work
            self._db.execute("SELECT key, value FROM responses LIMIT 1").fetchall()
        except sqlite3.Error:
            self._db.close()
            raise
        self._pending: dict[str, str] = {}  # key -> value, written at the end of this loop iteration
        self._error: Exception | None = None  # a failed deferred commit, raised by the next put
        #: seconds the first pending answer waits for others to share its commit (0: this loop iteration)
        self.commit_window = commit_window

    def get(self, key: str) -> dict | None:
        with self._lock:
            blob = self._pending.get(key)
            if blob is None:
                row = self._db.execute("SELECT value FROM responses WHERE key = ?", (key,)).fetchone()
                blob = row[0] if row else None
        return jsonfast.loads(blob) if blob is not None else None

    def put(self, key: str, value: dict) -> None:
        blob = jsonfast.dumps(value).decode("utf-8")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        with self._lock:
            if loop is None:
                self._db.execute("INSERT OR REPLACE INTO responses (key, value) VALUES (?, ?)", (key, blob))
                return
            first = not self._pending
            self._pending[key] = blob
        if first:
            if self.commit_window > 0:
                loop.call_later(self.commit_window, self._flush_soon)
            else:
                loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        try:
            self.flush()
        except (sqlite3.Error, OSError) as e:  # disk full, read-only: the answers stay pending, the next put says so
            self._error = e

    def flush(self) -> None:
        """Commit the answers put since the last flush, in one transaction."""
        with self._lock:
            if not self._pending:
                return
            rows, self._pending = list(self._pending.items()), {}
            self._db.execute("BEGIN")
            try:
                self._db.executemany("INSERT OR REPLACE INTO responses (key, value) VALUES (?, ?)", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                self._pending = dict(rows) | self._pending
                raise
            self._db.execute("COMMIT")

    def __len__(self) -> int:
        self.flush()
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        self.flush()
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass  # another process holds it (n workers share the cache): they checkpoint later
            self._db.close()
