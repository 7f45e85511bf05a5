"""Did it help? The verdict on the team's own documents, from held-out queries with no labels.

Each held-out query (written for one document the model never trained on) searches the whole
corpus, as the team's search would; its document is the one relevant answer. Per query and per
model: nDCG@10 (``1 / log2(rank + 1)`` within the top 10, else 0), recall@10 and recall@100. The
tuned model against the base on the same queries: the mean difference of nDCG@10 with its paired
bootstrap 95 % interval and sign-flip p (:func:`paired_test`), in points.

The rule (:func:`verdict`): *better* when the interval's lower end is above 0, *worse* when its
upper end is below 0, else *no measurable change*. Then the general sets, when the suite ran: a
drop of more than :data:`AVERAGE_DROP` points on their average, or of more than
:data:`CATEGORY_DROP` on one category, is a regression, and *better* becomes *better on your
documents, worse on general sets*.

>>> v = verdict(own_corpus(base_ranks, tuned_ranks, qids), general_sets(report, baseline))  # doctest: +SKIP
>>> v["line"]                                                                               # doctest: +SKIP
'verdict: better on your documents: nDCG@10 +2.31 (95 % CI +0.84 … +3.90, p 0.004, 100 held-out queries); general sets -0.12 (no regression)'
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: a drop of more than this many points on the general sets' average is a regression
AVERAGE_DROP = 1.0
#: ... or of more than this many points on one of their categories (fewer tasks: noisier)
CATEGORY_DROP = 2.0
#: the per-query metrics, in the order they are reported; the verdict reads the first
METRICS = ("ndcg@10", "recall@10", "recall@100")


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
    """Two-sided sign-flip permutation p-value of ``mean(diff) != 0`` (``diff``: per-query A - B):
    ``(1 + #{|mean(flipped)| >= |mean(observed)|}) / (1 + n_resamples)``; identical arms give 1."""
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
    """Arm A vs arm B on the same queries: mean difference, its bootstrap CI and the permutation p
    (deterministic given ``seed``).

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


def ranks_of(queries: np.ndarray, documents: np.ndarray, relevant: Sequence[int], chunk: int = 256) -> np.ndarray:
    """The rank (1 = first) of each query's relevant document among all ``documents`` by cosine
    (L2-normalised rows); a document scored as high as the relevant one counts above it."""
    rel = np.asarray(relevant, dtype=np.int64)
    out = np.empty(len(rel), dtype=np.int64)
    for s in range(0, len(rel), chunk):
        scores = queries[s : s + chunk] @ documents.T
        own = scores[np.arange(scores.shape[0]), rel[s : s + chunk]]
        out[s : s + chunk] = (scores >= own[:, None]).sum(axis=1)
    return out


def per_query(ranks: np.ndarray) -> dict[str, np.ndarray]:
    """nDCG@10, recall@10 and recall@100 of each query with one relevant document at ``ranks``."""
    r = np.asarray(ranks, dtype=np.float64)
    return {
        "ndcg@10": np.where(r <= 10, 1.0 / np.log2(r + 1.0), 0.0),
        "recall@10": (r <= 10).astype(np.float64),
        "recall@100": (r <= 100).astype(np.float64),
    }


def own_corpus(base_ranks: Sequence[int], tuned_ranks: Sequence[int], qids: Sequence[str], *, seed: int = 0) -> dict[str, Any]:
    """The tuned model against the base on the held-out queries: per metric the means and the
    paired test of tuned - base (in points), and every query's ranks and scores."""
    b, t = per_query(np.asarray(base_ranks)), per_query(np.asarray(tuned_ranks))
    metrics = {}
    for m in METRICS:
        test = paired_test(100 * t[m], 100 * b[m], seed=seed)
        metrics[m] = {"base": round(100 * float(b[m].mean()), 4), "tuned": round(100 * float(t[m].mean()), 4), **test}
    return {
        "queries": len(qids),
        "metrics": metrics,
        "per_query": [
            {
                "id": q,
                "base_rank": int(br),
                "tuned_rank": int(tr),
                **{f"base_{m}": float(b[m][i]) for m in METRICS},
                **{f"tuned_{m}": float(t[m][i]) for m in METRICS},
            }
            for i, (q, br, tr) in enumerate(zip(qids, base_ranks, tuned_ranks, strict=True))
        ],
    }


def general_sets(compared: dict[str, Any] | None, reason: str | None = None) -> dict[str, Any]:
    """The general sets' deltas (``negsynth.evaluate.compare`` of the suite's report and its
    baseline, 0-1 scores) in points, and the regressions the rule finds; ``reason`` when the suite
    did not run or had no baseline."""
    if not compared or compared.get("average") is None:
        return {"ran": False, "reason": reason or "no general sets evaluated beside a baseline"}
    avg = 100 * compared["average"]["delta"]
    cats = {c: round(100 * v["delta"], 4) for c, v in compared["categories"].items()}
    regressions = [f"average {avg:+.2f}"] if avg < -AVERAGE_DROP else []
    regressions += [f"{c} {d:+.2f}" for c, d in cats.items() if d < -CATEGORY_DROP]
    return {"ran": True, "average_delta": round(avg, 4), "category_deltas": cats, "regressions": regressions}


def verdict(own: dict[str, Any] | None, general: dict[str, Any], no_verdict: str | None = None) -> dict[str, Any]:
    """The verdict and its one line, from :func:`own_corpus` and :func:`general_sets`; with
    ``no_verdict`` (why none can be given), that reason instead."""
    if no_verdict is not None or own is None:
        return {"verdict": "none", "reason": no_verdict, "line": f"no verdict: {no_verdict}", "general_sets": general}
    m = own["metrics"]["ndcg@10"]
    if m["ci_low"] > 0:
        word = "better on your documents"
    elif m["ci_high"] < 0:
        word = "worse on your documents"
    else:
        word = "no measurable change on your documents"
    regressions = general.get("regressions") or []
    if regressions:
        word += f", worse on general sets ({', '.join(regressions)})"
    pct = round(100 * m["level"])
    detail = (
        f"nDCG@10 {m['mean_diff']:+.2f} ({pct} % CI {m['ci_low']:+.2f} … {m['ci_high']:+.2f}, "
        f"p {m['p_value']:.3f}, {own['queries']} held-out queries)"
    )
    if general.get("ran"):
        tail = f"general sets {general['average_delta']:+.2f} ({'regression' if regressions else 'no regression'})"
    else:
        tail = f"general sets not evaluated ({general.get('reason')})"
    short = "better" if word.startswith("better") else "worse" if word.startswith("worse") else "no measurable change"
    return {
        "verdict": short,
        "regression_on_general_sets": bool(regressions),
        "line": f"verdict: {word}: {detail}; {tail}",
        "own_corpus": own,
        "general_sets": general,
        "rule": (
            f"better: the {pct} % interval of the nDCG@10 difference (tuned - base) above 0; worse: below 0; else no measurable "
            f"change; a regression on general sets: their average down more than {AVERAGE_DROP} point or a category more than {CATEGORY_DROP}"
        ),
    }


def corpus_vectors(
    embedder: Any, batches: Callable[[], Iterable[list[str]]], count: int, corpus_key: Any, folder: Path | None
) -> np.ndarray:
    """The document vectors of a corpus (``batches()`` its texts in order, ``count`` of them), kept
    in ``folder`` under the embedder's identity and ``corpus_key`` (the corpus's files and how
    they are read): another run on the same corpus with the same model does not embed it again. An
    embedder without an identity (an in-memory model), or no ``folder``, embeds every time."""
    ident = embedder.identity() if folder is not None else None
    path = None
    if ident is not None:
        key = hashlib.sha256(json.dumps({"embedder": ident, "corpus": corpus_key}, sort_keys=True, default=str).encode()).hexdigest()
        path = Path(folder) / f"{key[:32]}.npy"
        try:
            vecs = np.load(path, mmap_mode="r")
            if vecs.shape[0] == count:
                return vecs
        except (OSError, ValueError):
            pass
    vecs = np.concatenate([embedder.encode_documents(b) for b in batches()] or [np.zeros((0, embedder.dim), np.float32)])
    if path is not None:
        from negsynth.embed.mining import save_npy

        try:
            save_npy(path, vecs)
        except OSError:
            pass  # a cache that cannot be written is skipped
    return vecs
