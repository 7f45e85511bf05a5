"""One child process measured from outside: wall time, CPU time and peak resident memory
(``/usr/bin/time``), for the benchmarks that compare whole processes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def measured_run(cmd: list[str], cwd: Path) -> dict:
    """Run ``cmd``; ``{"wall_s", "cpu_s", "peak_rss_mb", "stdout"}``, or exit with its stderr's tail."""
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %M %U %S", *cmd], capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr[-3000:]}")
    _, kb, user, system = next(x for x in reversed(out.stderr.splitlines()) if x.startswith("TIME ")).split()
    return {"wall_s": wall, "cpu_s": float(user) + float(system), "peak_rss_mb": int(kb) / 1024, "stdout": out.stdout}
