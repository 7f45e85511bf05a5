"""Peak resident memory of a block: ``with PeakRSS() as m: train(...)``; ``m.peak_mib`` after it.

A daemon thread reads this process's resident set size every ``interval`` seconds (``/proc/self/statm``
on Linux; elsewhere the process's lifetime peak from ``resource.getrusage``), so the figure is
what a training run needed beside the rest of the process, not a lower bound set earlier by
another stage. Sampling can miss a spike shorter than the interval.
"""

from __future__ import annotations

import os
import threading


def current_rss() -> int:
    """Resident bytes of this process now (the lifetime peak where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


class PeakRSS:
    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, current_rss())

    def __enter__(self) -> PeakRSS:
        self.peak = current_rss()
        self._thread = threading.Thread(target=self._run, daemon=True, name="negsynth-peak-rss")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, current_rss())

    @property
    def peak_mib(self) -> int:
        return round(self.peak / 2**20)
