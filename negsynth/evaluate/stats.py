"""Paired significance over queries: is arm A better than arm B on the same test queries?

Two systems evaluated on the same queries give two per-query scores (e.g. nDCG@10); the
question a reviewer asks is whether their mean difference is larger than what the choice of
queries (and of training seeds) alone would produce. Welch's t over a handful of seed means
ignores that both arms answer the *same* queries and has two to five observations a side; the
tests here use every query, paired:

- :func:`paired_permutation_p`: a two-sided sign-flip randomisation test of the per-query
  differences (under H0 the two arms are exchangeable on each query, so each difference is as
  likely to be negated). ``p = (1 + #{|mean(flipped)| >= |mean(observed)|}) / (1 + n)``, the
  usual unbiased Monte-Carlo estimate; identical arms give ``p = 1``.
- :func:`paired_bootstrap_ci`: a percentile CI of the mean difference, resampling queries with
  replacement and — where an arm has several seeds — that arm's seeds too (a two-level bootstrap,
  so the interval carries the seed-to-seed spread as well as the query sample's).
- :func:`paired_test`: both, from per-query scores of shape ``[seeds, queries]`` (one row per
  training seed; seeds are pooled by averaging each query's score over them).

Everything is deterministic given ``seed`` (``numpy.random.default_rng``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def _as_matrix(x) -> np.ndarray:
    """``[seeds, queries]`` float64 from a vector (one seed) or a matrix."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"per-query scores must be [queries] or [seeds, queries], got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("per-query scores contain NaN or inf")
    return a


def paired_permutation_p(diff: Sequence[float] | np.ndarray, n_resamples: int = 10000, seed: int = 0) -> float:
    """Two-sided sign-flip permutation p-value of ``mean(diff) != 0`` (``diff``: per-query A - B)."""
    d = np.asarray(diff, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError("diff must be a non-empty vector of per-query differences")
    obs = abs(d.mean())
    rng = np.random.default_rng(seed)
    hits = 0
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))  # ties with the observed statistic count as hits
    for s in range(0, n_resamples, 1000):  # in blocks: memory is 1000 x n at a time
        m = min(1000, n_resamples - s)
        signs = rng.integers(0, 2, size=(m, d.size), dtype=np.int8) * 2 - 1
        stats = np.abs(signs @ d) / d.size
        hits += int(np.sum(stats >= obs - tol))
    return (1 + hits) / (1 + n_resamples)


def paired_bootstrap_ci(
    a, b, n_resamples: int = 10000, seed: int = 0, level: float = 0.95, resample_seeds: bool = True
) -> tuple[float, float]:
    """Percentile CI of ``mean(A) - mean(B)`` over queries (per-query scores ``[seeds, queries]``).

    Each resample draws the queries with replacement (the same draw for both arms: paired) and,
    with ``resample_seeds``, each arm's seeds with replacement (an arm with one seed keeps it)."""
    a, b = _as_matrix(a), _as_matrix(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"the arms were scored on different numbers of queries ({a.shape[1]} vs {b.shape[1]})")
    rng = np.random.default_rng(seed)
    n = a.shape[1]
    out = np.empty(n_resamples)
    for i in range(n_resamples):
        q = rng.integers(0, n, size=n)
        ra = a[rng.integers(0, a.shape[0], size=a.shape[0])] if resample_seeds and a.shape[0] > 1 else a
        rb = b[rng.integers(0, b.shape[0], size=b.shape[0])] if resample_seeds and b.shape[0] > 1 else b
        out[i] = ra[:, q].mean() - rb[:, q].mean()
    alpha = (1 - level) / 2
    lo, hi = np.quantile(out, [alpha, 1 - alpha])
    return float(lo), float(hi)


def paired_test(a, b, n_resamples: int = 10000, seed: int = 0, level: float = 0.95) -> dict:
    """Arm A vs arm B on the same queries: mean difference, its bootstrap CI and the permutation p.

    ``a`` / ``b``: per-query scores, ``[queries]`` or ``[seeds, queries]`` (the columns in the same
    query order for both). Seeds are pooled by averaging each query over them for the difference and
    the p-value; the CI resamples seeds as well (see :func:`paired_bootstrap_ci`)."""
    a, b = _as_matrix(a), _as_matrix(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"the arms were scored on different numbers of queries ({a.shape[1]} vs {b.shape[1]})")
    diff = a.mean(axis=0) - b.mean(axis=0)
    lo, hi = paired_bootstrap_ci(a, b, n_resamples=n_resamples, seed=seed, level=level)
    return {
        "mean_diff": float(diff.mean()),
        "ci_low": lo,
        "ci_high": hi,
        "level": level,
        "p_value": paired_permutation_p(diff, n_resamples=n_resamples, seed=seed),
        "queries": int(a.shape[1]),
        "seeds_a": int(a.shape[0]),
        "seeds_b": int(b.shape[0]),
        "wins": int(np.sum(diff > 0)),
        "losses": int(np.sum(diff < 0)),
        "method": "two-sided sign-flip permutation over queries (seed means); percentile bootstrap CI over queries and seeds",
    }


def align(per_query: Sequence[Mapping[str, float]], qids: Sequence[str] | None = None) -> tuple[list[str], np.ndarray]:
    """``[seeds, queries]`` from per-seed ``{query id: score}`` maps, in ``qids`` order (default: the
    sorted ids of the first map). A query missing from any seed is an error: the test is paired."""
    if not per_query:
        raise ValueError("no per-query scores")
    ids = list(qids) if qids is not None else sorted(per_query[0])
    missing = [(i, q) for i, m in enumerate(per_query) for q in ids if q not in m]
    if missing:
        i, q = missing[0]
        raise ValueError(f"seed #{i} has no score for query {q!r} ({len(missing)} missing): the arms must be scored on the same queries")
    return ids, np.array([[m[q] for q in ids] for m in per_query], dtype=np.float64)
