"""Progress bars and summary tables (rich), silenced by --quiet and --json."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


class Reporter:
    """What a stage tells a person: progress (rate, ETA, valid/rejected) and a closing table."""

    def __init__(self, quiet: bool = False, json_mode: bool = False):
        self.quiet = quiet or json_mode
        self.json_mode = json_mode
        self.console = Console(stderr=True, highlight=False)

    def info(self, msg: str) -> None:
        if not self.quiet:
            self.console.print(msg)

    def warn(self, msg: str) -> None:
        # warnings are shown even with --quiet (on stderr), never in --json stdout
        self.console.print(f"[yellow]warning:[/] {msg}")

    def waiting(self, line: str, waiting: bool) -> None:
        """The LLM server went away (``waiting``) or came back: a line on stderr (also with
        --quiet, never in --json stdout) and the bar's label says so while it lasts."""
        self.console.print(f"[yellow]{'waiting' if waiting else 'resumed'}:[/] {line}")
        bar = getattr(self, "_bar", None)
        if bar is not None:
            bar.label("waiting for the LLM server" if waiting else None)

    @contextmanager
    def progress(self, description: str, total: int | None):
        if self.quiet or total == 0:
            yield _NullBar()
            return
        prog = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[green]{task.fields[valid]} valid[/] [red]{task.fields[rejected]} rejected[/]"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
            refresh_per_second=4,
        )
        with prog:
            tid = prog.add_task(description, total=total, valid=0, rejected=0, rate="")
            self._bar = _Bar(prog, tid, description)
            try:
                yield self._bar
            finally:
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


class _Bar:
    def __init__(self, prog: Progress, tid, description: str = ""):
        self.prog, self.tid, self.description = prog, tid, description
        self.t0 = time.monotonic()
        self.done = 0

    def label(self, note: str | None) -> None:
        """Add ``note`` to the description (``None``: back to the plain one)."""
        self.prog.update(self.tid, description=self.description if note is None else f"{self.description} ({note})")

    def update(self, advance: int = 0, **fields: Any) -> None:
        self.done += advance
        dt = time.monotonic() - self.t0
        rate = f"{self.done / dt:.1f}/s" if dt > 0 else ""
        self.prog.update(self.tid, advance=advance, rate=rate, **fields)


def is_tty() -> bool:
    return sys.stderr.isatty()
