"""Peak memory of a block of a benchmark: ``with PeakRSS() as m: ...; m.peak_mib``.

A thread samples the resident set size of this process and its children every ``interval``
seconds (psutil); the peak is what a user must have free to run the block beside other work.
Sampling can miss a spike shorter than the interval, so the figure is a lower bound. Where torch
has initialised CUDA, ``gpu_peak_mib`` is the block's peak of memory allocated on the current GPU
(torch's own counter, exact); None otherwise.
"""

from __future__ import annotations

import threading
import time


class PeakRSS:
    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self.gpu_peak: int | None = None

    def _rss(self) -> int:
        import psutil

        p = psutil.Process()
        total = p.memory_info().rss
        for c in p.children(recursive=True):
            try:
                total += c.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self._stop.wait(self.interval)

    @staticmethod
    def _cuda():
        import sys

        torch = sys.modules.get("torch")  # never imports torch itself
        return torch.cuda if torch is not None and torch.cuda.is_available() else None

    def __enter__(self) -> PeakRSS:
        if (cuda := self._cuda()) is not None and cuda.is_initialized():  # else the counter starts at 0 anyway
            cuda.reset_peak_memory_stats()
        self._t0 = time.monotonic()
        self.peak = self._rss()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())
        self.seconds = time.monotonic() - self._t0
        if (cuda := self._cuda()) is not None and cuda.is_initialized():
            self.gpu_peak = cuda.max_memory_allocated()

    @property
    def peak_mib(self) -> int:
        return round(self.peak / 2**20)

    @property
    def gpu_peak_mib(self) -> int | None:
        return None if self.gpu_peak is None else round(self.gpu_peak / 2**20)
