"""Progress bars and summary tables (rich), silenced by --quiet and --json."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

#: the width of tables written to a file or a pipe (rich would take 80); $COLUMNS still wins
PIPE_WIDTH = 200


def report_console(*, stderr: bool = False) -> Console:
    """A console for tables: the terminal's width on a terminal, else $COLUMNS or :data:`PIPE_WIDTH`."""
    import os

    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    width = None if tty or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(stderr=stderr, highlight=False, width=width)


class Reporter:
    """What a stage tells a person: progress (rate, ETA, valid/rejected) and a closing table."""

    #: on a console that is no terminal: seconds between two plain progress lines (0: every update)
    line_every_s: float = 30.0

    def __init__(self, quiet: bool = False, json_mode: bool = False):
        self.quiet = quiet or json_mode
        self.json_mode = json_mode
        self.console = report_console(stderr=True)

    def info(self, msg: str, *, styled: bool = False) -> None:
        """A line on stderr, as written (``styled``: ``msg`` is rich markup, its own values escaped)."""
        if not self.quiet:
            self.console.print(msg if styled else escape(msg))

    def warn(self, msg: str) -> None:
        # shown even with --quiet (on stderr), never in --json stdout
        self.console.print(f"[yellow]warning:[/] {escape(msg)}")

    def waiting(self, line: str, waiting: bool) -> None:
        """The LLM server went away (``waiting``) or came back: a line on stderr, and the bar says so."""
        self.console.print(f"[yellow]{'waiting' if waiting else 'resumed'}:[/] {escape(line)}")
        bar = getattr(self, "_bar", None)
        if bar is not None:
            bar.label("waiting for the LLM server" if waiting else None)

    @contextmanager
    def progress(self, description: str, total: int | None, *, status: str | None = None, completed: int = 0):
        """A bar on stderr: done/total, rate, elapsed, ETA, and the valid/rejected counts
        (``bar.update(advance=1, valid=v, rejected=r)``) or, given ``status``, a free text
        (``bar.update(advance=1, status="loss 0.4123")``). ``completed``: work done before it.
        Silent with --quiet / --json; on no terminal, a plain line every :attr:`line_every_s` s."""
        if self.quiet or total == 0:
            yield _NullBar()
            return
        counts = (
            TextColumn("{task.fields[status]}")
            if status is not None
            else TextColumn("[green]{task.fields[valid]} valid[/] [red]{task.fields[rejected]} rejected[/]")
        )
        # in Jupyter no live display and no stderr redirect: rich's proxy for sys.stderr prints
        # through a console that writes to sys.stderr, and a library's own bar recursed without end
        jupyter = self.console.is_jupyter
        prog = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            counts,
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
            refresh_per_second=4,
            redirect_stdout=not jupyter,
            redirect_stderr=not jupyter,
            disable=jupyter,
        )
        with prog:
            fields: dict[str, Any] = {"status": status} if status is not None else {"valid": 0, "rejected": 0}
            tid = prog.add_task(description, total=total, completed=completed, rate="", **fields)
            self._bar = _Bar(prog, tid, description, line_every_s=self.line_every_s)
            try:
                yield self._bar
            finally:
                if jupyter:  # the bar's last state, as the one line a live bar would have left
                    self.console.print(self._bar.line(), markup=False, highlight=False)
                self._bar = None

    def table(self, title: str, rows: list[tuple[Any, ...]], header: tuple[str, ...] = ("", "")) -> None:
        """A summary table; an empty row draws a line between two sections."""
        if self.quiet:
            return
        t = Table(title=title, title_justify="left", show_header=any(header))
        for h in header:
            t.add_column(h)
        for r in rows:
            if r:
                t.add_row(*[str(x) for x in r])
            else:  # an empty row ends a section
                t.add_section()
        self.console.print(t)


class _NullBar:
    def update(self, advance: int = 0, **fields: Any) -> None:
        pass

    def print(self, line: str) -> None:
        pass


class _Bar:
    def __init__(self, prog: Progress, tid, description: str = "", line_every_s: float = 30.0):
        self.prog, self.tid, self.description = prog, tid, description
        self.t0 = time.monotonic()
        self.done = 0
        self.line_every_s = line_every_s
        self.last_line = self.t0

    def label(self, note: str | None) -> None:
        """Add ``note`` to the description (``None``: back to the plain one)."""
        self.prog.update(self.tid, description=self.description if note is None else f"{self.description} ({note})")

    def update(self, advance: int = 0, **fields: Any) -> None:
        self.done += advance
        dt = time.monotonic() - self.t0
        rate = f"{self.done / dt:.1f}/s" if dt > 0 else ""
        self.prog.update(self.tid, advance=advance, rate=rate, **fields)
        now = time.monotonic()
        if not self.prog.console.is_terminal and now - self.last_line >= self.line_every_s:
            self.last_line = now
            self.prog.console.print(self.line(), highlight=False)

    def print(self, line: str) -> None:
        """A plain line (no markup) above the bar (on a terminal the bar is redrawn below it)."""
        self.prog.console.print(line, markup=False, highlight=False)

    def line(self) -> str:
        """The bar as one plain line: ``train: 40/120 loss 0.4123 0.5/s elapsed 1:20 ETA 2:40``."""
        task = next(t for t in self.prog.tasks if t.id == self.tid)
        total = "?" if task.total is None else f"{task.total:.0f}"
        f = task.fields
        what = f["status"] if "status" in f else f"{f.get('valid', 0)} valid {f.get('rejected', 0)} rejected"
        eta = task.time_remaining
        parts = [f"{task.description}: {task.completed:.0f}/{total}", what, task.fields.get("rate", ""), f"elapsed {_clock(task.elapsed)}"]
        if eta is not None:
            parts.append(f"ETA {_clock(eta)}")
        return " ".join(p for p in parts if p)


def _clock(seconds: float | None) -> str:
    s = int(seconds or 0)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
