"""One process per run dir: ``RUN_DIR/.negsynth.lock``, a ``fcntl.flock`` (released by the kernel
however the holder dies) on a file naming its holder. A second command stops with one line naming
the holder (exit 2); a file left by a dead holder is taken over with a warning. Re-entrant within a
process; Ray's workers run under the driver's lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from negsynth.errors import UserError
from negsynth.pipeline.manifest import read_json

LOCK_NAME = ".negsynth.lock"
#: how long a held lock is retried before refusing (a holder may be letting go)
RETRY_S = 0.3

_held: dict[str, list] = {}  # lock path -> [fd, count]: what this process holds
_mutex = threading.Lock()


def lock_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOCK_NAME


def _me() -> dict:
    prog = os.path.basename(sys.argv[0] or "python") if sys.argv else "python"
    argv = ["negsynth" if prog == "__main__.py" else prog] + sys.argv[1:2]
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(argv), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _read_holder(path: Path) -> dict | None:
    info = read_json(path)  # None: none yet, empty or half-written, so no holder to name
    return info if isinstance(info, dict) and "pid" in info else None


def describe(info: dict | None) -> str:
    if not info:
        return "another negsynth process (it has not written its PID yet)"
    what = f" ({info['command']}, since {info['since']})" if info.get("command") and info.get("since") else ""
    return f"PID {info['pid']} on host {info.get('host', '?')}{what}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, ValueError, OverflowError):
        return False
    return True


class _NoFlock(Exception):
    """The filesystem does not do flock (some network mounts)."""


def _try_flock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None while someone else holds it (after RETRY_S)."""
    deadline = time.monotonic() + RETRY_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
            continue
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise _NoFlock from None
            raise
        # a holder that lets go removes the file: make sure the path still names what we locked
        try:
            same = os.path.samestat(os.stat(path), os.fstat(fd))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _write_info(fd: int) -> None:
    data = (json.dumps(_me()) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _refuse(run_dir: Path, path: Path, info: dict | None) -> UserError:
    return UserError(f"{run_dir}: in use by {describe(info)}; wait for it to finish or stop it, or use another --run-dir (lock: {path})")


def _acquire(run_dir: Path, path: Path, warn: Callable[[str], None]) -> int | None:
    """Take ``path`` exclusively -> its fd (None where the filesystem has no flock: PID-file rules)."""
    try:
        fd = _try_flock(path)
        if fd is None:
            raise _refuse(run_dir, path, _read_holder(path))
    except _NoFlock:
        fd = None
    old = _read_holder(path)
    if fd is None:  # no flock here: a live PID on this host holds it; another host's cannot be checked
        if old and old.get("pid") != os.getpid():
            if old.get("host") != socket.gethostname():
                raise UserError(
                    f"{run_dir}: in use by {describe(old)} (this filesystem has no file locks, so it cannot be checked); "
                    f"if that process is gone, delete {path} and rerun"
                )
            if _alive(int(old["pid"])):
                raise _refuse(run_dir, path, old)
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(_me()) + "\n")
    else:
        _write_info(fd)
    if old and old.get("pid") != os.getpid():
        gone = "no longer running" if old.get("host") == socket.gethostname() and not _alive(int(old["pid"])) else "not holding it"
        warn(f"took over the lock {path} left by {describe(old)}: {gone}")
    return fd


def _release(path: Path, fd: int | None) -> None:
    try:
        if fd is None or os.path.samestat(os.stat(path), os.fstat(fd)):
            path.unlink()  # while still holding it: a waiter that opened this file sees it gone and retries
    except OSError:
        pass
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def hold(run_dir: str | Path, *, warn: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold the run dir while the block runs; :class:`UserError` when another process holds it.
    ``warn`` gets the line saying a lock left by a dead process was taken over."""
    run_dir = Path(run_dir)
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = lock_path(run_dir)
    key = str(path.resolve())
    with _mutex:
        mine = _held.get(key)
        if mine is not None:
            mine[1] += 1
    if mine is None:
        fd = _acquire(run_dir, path, warn)
        with _mutex:
            _held[key] = mine = [fd, 1]
    try:
        yield path
    finally:
        with _mutex:  # the last holder to leave releases it, whichever thread took it
            mine[1] -= 1
            last = mine[1] == 0
            if last:
                del _held[key]
        if last:
            _release(path, mine[0])
            if created:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()  # only if it is still empty
