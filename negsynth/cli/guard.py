"""How a ``negsynth`` command ends: its exit codes, and one line on stderr instead of a traceback
for an error raised on purpose, an environment failure or an interrupt (:func:`guarded`);
:func:`run_app`, the console entry point's body, unwinds a SIGTERM as cleanly as a Ctrl-C.
"""

from __future__ import annotations

import errno
import functools
import signal
import sys

import typer

from negsynth.errors import NegsynthError

#: exit code when a --max-* budget stopped a stage: finished work is written, rerun to continue
EXIT_BUDGET = 3
#: exit code when requests failed at the transport level (an outage, timeouts): the items are
#: pending, not rejected; finished work is written, rerun the same command to retry them
EXIT_PENDING = 4
#: exit code of an environment failure (disk full, unreadable file): one line, no traceback
EXIT_ENV = 1


def guarded(fn):
    """Run ``fn``; an error raised on purpose, an OSError, a sqlite3 error or an interrupt ends in one line and its exit code."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except NegsynthError as e:  # every error raised on purpose: its line and its exit code
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            _ignore_signals()  # a second Ctrl-C while we exit must not end in a traceback
            typer.echo("interrupted: finished shards are kept; rerun the same command to resume", err=True)
            raise typer.Exit(143 if _TERMINATED else 130) from None
        except OSError as e:
            typer.echo(f"error: {_os_error_line(e)}", err=True)
            raise typer.Exit(EXIT_ENV) from None
        except Exception as e:
            import sqlite3

            if not isinstance(e, sqlite3.Error):
                raise
            typer.echo(
                f"error: the request cache (RUN_DIR/cache/llm.sqlite) failed: {e}; check the disk, or move the file away and rerun",
                err=True,
            )
            raise typer.Exit(EXIT_ENV) from None

    return wrapper


def _os_error_line(e: OSError) -> str:
    """One line for an OSError that reached the top: the file, the reason and the fix."""
    where = e.filename or "a file in the run dir"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"cannot write {where}: {e.strerror}; free some space and rerun the same command to resume"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{where}: {e.strerror}; fix its permissions (or use another --run-dir) and rerun"
    return f"{where}: {e.strerror or e}; check the file and rerun"


_TERMINATED = False


def _ignore_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread (tests)
            pass


def _sigterm(signum, frame) -> None:
    """Unwind like Ctrl-C (context managers stop the embedded server), then exit 143.

    Inside ``asyncio.run`` a SIGINT cancels the main task cleanly (asyncio's own handler); raising
    KeyboardInterrupt from a SIGTERM handler instead would tear the loop down mid-callback and
    print its tasks' tracebacks. So SIGTERM is turned into that SIGINT."""
    global _TERMINATED
    _TERMINATED = True
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not _sigterm:
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def run_app(app: typer.Typer) -> None:
    """Run ``app`` as the console entry point: SIGTERM unwinds like Ctrl-C, and an interrupt
    outside a command ends in one line and exit code 130 (143 after SIGTERM)."""
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        app()
    except KeyboardInterrupt:  # outside a command (or a second Ctrl-C during start-up)
        _ignore_signals()
        typer.echo("interrupted", err=True)
        sys.exit(143 if _TERMINATED else 130)
