"""The score cells of the recipe benchmarks' result tables: a task's score x100 over the seeds
an arm ran, as ``mean`` or ``mean ± sd``."""

from __future__ import annotations

import statistics


def seed_scores(runs: list[dict], task: str) -> list[float]:
    """``task``'s score x100 in each of ``runs`` (one per seed) that has it."""
    return [100 * r["scores"][task] for r in runs if task in r["scores"]]


def mean_sd(v: list[float]) -> str:
    """The mean of ``v``, with ``± sd`` when there are two or more."""
    return f"{statistics.mean(v):.2f}" + (f" ± {statistics.stdev(v):.2f}" if len(v) > 1 else "")
