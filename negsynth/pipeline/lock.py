"""One process per run dir: a lock file that names its holder.

Two processes writing one run dir interleave shards, manifests and checkpoints silently, so a
stage (and ``negsynth run``) holds ``RUN_DIR/.negsynth.lock`` while it runs. The lock is a
``fcntl.flock`` on that file, so the kernel releases it when the holder dies, however it dies;
the file holds the holder's PID, host, command and start time, and is removed when the holder
lets go. A second command stops before it reads or sends anything, with one line naming the
holder (exit 2). A file left behind by a killed holder is taken over with a line saying so.

Workers of a split run (``--shard-index k --num-shards n``, Ray's tasks) share the run dir on
purpose: each locks ``RUN_DIR/.negsynth.<stage>.<k>-of-<n>.lock`` instead, so two workers of
the same shard exclude each other and the others run side by side. A worker also refuses to
start while a whole-run-dir command holds the run dir, and that command refuses to start while
a worker holds its shard. One exception: the workers a whole-run-dir command launches itself
(``negsynth run --executor ray``). The run-dir lock file names a random token of its holder's;
the command passes it to its workers (``hold(..., under=token)``), and a worker whose token is
the holder's runs under it. Any other process has no such token and is refused as before.

Re-entrant within a process (``negsynth run`` holds the run dir and each of its stages asks again).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from negsynth.errors import UserError

try:
    import fcntl
except ImportError:  # Windows: no flock; the PID check below still names a live holder
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".negsynth.lock"
#: how long a lock that looks held is retried before refusing (a holder may be letting go)
RETRY_S = 0.3

_held: dict[str, list] = {}  # lock path -> [fd, count, token]: what this process holds
_mutex = threading.Lock()


def lock_path(run_dir: Path, stage: str | None = None, shard: tuple[int, int] | None = None) -> Path:
    """``RUN_DIR/.negsynth.lock``, or a worker's ``RUN_DIR/.negsynth.<stage>.<k>-of-<n>.lock``."""
    if shard is None:
        return Path(run_dir) / LOCK_NAME
    k, n = shard
    return Path(run_dir) / f".negsynth.{stage}.{k:05d}-of-{n:05d}.lock"


def _me(token: str | None = None) -> dict:
    prog = os.path.basename(sys.argv[0] or "python") if sys.argv else "python"
    argv = ["negsynth" if prog == "__main__.py" else prog] + sys.argv[1:2]
    info = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(argv), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    return {**info, "token": token} if token else info


def _read_holder(path: Path) -> dict | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not text:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
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


def _try_flock(path: Path, mode: int) -> int | None:
    """An fd holding ``mode`` on ``path``, or None while someone else holds it (after RETRY_S)."""
    deadline = time.monotonic() + RETRY_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
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
            st = os.stat(path)
        except FileNotFoundError:
            os.close(fd)
            continue
        fst = os.fstat(fd)
        if (st.st_ino, st.st_dev) != (fst.st_ino, fst.st_dev):
            os.close(fd)
            continue
        return fd


def _write_info(fd: int, token: str | None) -> None:
    data = (json.dumps(_me(token)) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _refuse(run_dir: Path, path: Path, info: dict | None, what: str = "") -> UserError:
    return UserError(
        f"{run_dir}: in use by {describe(info)}{what}; wait for it to finish or stop it, or use another --run-dir (lock: {path})"
    )


def _acquire(run_dir: Path, path: Path, warn: Callable[[str], None], token: str | None = None) -> int | None:
    """Take ``path`` exclusively -> its fd (None where flock is unavailable: PID-file rules);
    ``token`` is written into the file with the holder's PID."""
    try:
        fd = _try_flock(path, fcntl.LOCK_EX) if fcntl is not None else None
        if fcntl is not None and fd is None:
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
            f.write(json.dumps(_me(token)) + "\n")
    else:
        _write_info(fd, token)
    if old and old.get("pid") != os.getpid():
        gone = "no longer running" if old.get("host") == socket.gethostname() and not _alive(int(old["pid"])) else "not holding it"
        warn(f"took over the lock {path} left by {describe(old)}: {gone}")
    return fd


def _release(path: Path, fd: int | None) -> None:
    try:
        if fd is None or (os.stat(path).st_ino, os.stat(path).st_dev) == (os.fstat(fd).st_ino, os.fstat(fd).st_dev):
            path.unlink()  # while still holding it: a waiter that opened this file sees it gone and retries
    except OSError:
        pass
    if fd is not None:
        os.close(fd)


def _probe_main(run_dir: Path, under: str | None = None) -> None:
    """A worker: refuse while a whole-run-dir command holds the run dir (a shared probe, let go at
    once), unless that command launched it: the holder's lock file names the token ``under``."""
    path = lock_path(run_dir)
    if fcntl is None or not path.exists():
        return
    try:
        fd = _try_flock(path, fcntl.LOCK_SH)
    except (_NoFlock, FileNotFoundError):
        return
    if fd is None:
        holder = _read_holder(path)
        if under and holder and holder.get("token") == under:
            return  # the holder launched this worker and passed it its token
        raise _refuse(run_dir, path, holder)
    os.close(fd)  # the file stays: it is not ours to remove


def _probe_workers(run_dir: Path) -> None:
    """A whole-run-dir command: refuse while a worker of a split run holds its shard; remove
    worker lock files their killed holders left."""
    if fcntl is None:
        return
    for path in sorted(Path(run_dir).glob(".negsynth.*-of-*.lock")):
        try:
            fd = _try_flock(path, fcntl.LOCK_EX)
        except (_NoFlock, FileNotFoundError):
            continue
        if fd is None:
            raise _refuse(run_dir, path, _read_holder(path), " (a worker of a split run)")
        _release(path, fd)


def token(run_dir: str | Path) -> str | None:
    """The token of the run-dir lock this process holds on ``run_dir`` (None when it holds none):
    what it passes to the workers it launches (``hold(..., under=token)``)."""
    with _mutex:
        mine = _held.get(str(lock_path(Path(run_dir)).resolve()))
    return mine[2] if mine is not None else None


@contextlib.contextmanager
def hold(
    run_dir: str | Path,
    *,
    stage: str | None = None,
    shard: tuple[int, int] | None = None,
    warn: Callable[[str], None] | None = None,
    under: str | None = None,
) -> Iterator[Path]:
    """Hold the run dir (``shard=None``) or one worker's (stage, shard) while the block runs.

    Raises :class:`UserError` (one line naming the holder, exit 2) when another process holds
    it. ``warn`` gets the line saying a lock left by a dead process was taken over. ``under``
    (a worker): the :func:`token` of the process holding the run dir that launched it; the
    worker then runs while that process holds the run dir.
    """
    run_dir = Path(run_dir)
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = lock_path(run_dir, stage, shard)
    key = str(path.resolve())
    with _mutex:
        mine = _held.get(key)
        if mine is not None:
            mine[1] += 1
    if mine is not None:
        try:
            yield path
        finally:
            with _mutex:
                mine[1] -= 1
        return
    tok = secrets.token_hex(16) if shard is None else None  # what its own workers get (token())
    fd = _acquire(run_dir, path, warn, tok)
    try:
        if shard is None:
            _probe_workers(run_dir)
        else:
            _probe_main(run_dir, under)
    except BaseException:
        _release(path, fd)
        raise
    with _mutex:
        _held[key] = [fd, 1, tok]
    try:
        yield path
    finally:
        with _mutex:
            entry = _held[key]
            entry[1] -= 1
            last = entry[1] == 0
            if last:
                del _held[key]
        if last:
            _release(path, fd)
            if created:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()  # only if it is still empty
