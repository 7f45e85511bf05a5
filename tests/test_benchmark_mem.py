"""The benchmarks' memory probe: a block that allocates shows a peak above one that does not."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from harness import PeakRSS  # noqa: E402


def test_peak_rss_sees_an_allocation():
    """Measured against this process's own memory before the block: the probe also counts child
    processes, and one an earlier test left winding down can exit while the block runs."""
    import psutil

    with PeakRSS() as idle:
        pass
    own_before = psutil.Process().memory_info().rss / 2**20
    with PeakRSS() as busy:
        block = bytearray(200 * 2**20)  # 200 MiB, touched
        block[::4096] = b"x" * len(block[::4096])
        time.sleep(0.3)  # held longer than the sampling interval
        del block
    assert busy.peak_mib >= own_before + 150
    assert busy.seconds >= 0 and idle.peak_mib > 0


def test_gpu_peak_is_none_without_a_gpu():
    """The GPU column stays empty where torch has no CUDA device (or was never imported)."""
    import torch

    with PeakRSS() as m:
        torch.ones(8) * 2
    assert m.gpu_peak_mib is None or torch.cuda.is_available()
