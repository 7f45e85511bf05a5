"""Measurement: thresholds, the claimed order against the measured one, and the policies."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from negsynth.schemas.config import ScoreConfig

NAME = "score"
#: MGH Table 4: mean cos(q, neg) for levels 1..4 (their embedder, their data)
PAPER_TABLE4 = (0.881, 0.857, 0.845, 0.793)
FLAGS = ("false_negative", "too_easy")


def fn_threshold(cos_pos: np.ndarray | float, fn_ratio: float) -> np.ndarray:
    """The cosine at or above which a negative is a false negative.

    ``fn_ratio * cos_pos`` (TopK-PercPos) when ``cos_pos >= 0``. For ``cos_pos < 0`` that product
    would lie *above* the positive, so a negative more similar than the positive could pass; the
    same margin is kept below instead: ``cos_pos - (1 - fn_ratio) * |cos_pos|``.

    >>> float(fn_threshold(0.8, 0.95)), float(fn_threshold(-0.2, 0.5))
    (0.76, -0.3)
    """
    cp = np.asarray(cos_pos, dtype=np.float64)
    return cp - (1.0 - fn_ratio) * np.abs(cp)


def kendall_tau_claimed(cos_neg: np.ndarray) -> np.ndarray:
    """Kendall's tau-b between the claimed order (column 0 hardest) and the measured cosines.

    ``cos_neg``: ``[N, k]``, negatives in the LLM's order. Returns ``[N]`` float64, NaN where all
    ``k`` cosines tie (tau undefined). Equal to ``scipy.stats.kendalltau([k, ..., 1], row)`` per
    row, vectorised: the claimed ranks never tie, so tau-b = (C - D) / sqrt(n0 * (n0 - ties)).
    """
    x = np.asarray(cos_neg, dtype=np.float64)
    n, k = x.shape
    if k < 2:
        return np.full(n, np.nan)
    i, j = np.triu_indices(k, 1)
    s = np.sign(x[:, i] - x[:, j])  # +1: concordant (earlier = more similar), -1: discordant, 0: tie
    n0 = len(i)
    ties = (s == 0).sum(axis=1)
    denom = np.sqrt(n0 * (n0 - ties).astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = s.sum(axis=1) / denom
    tau[ties == n0] = np.nan
    return tau


def measure(cos_pos: np.ndarray, cos_neg: np.ndarray, cfg: ScoreConfig) -> dict[str, np.ndarray]:
    """Flags, tau and monotonicity for ``N`` examples of ``k`` negatives in the LLM's order.

    Inputs are rounded to 6 decimals first, so the stored numbers reproduce the flags exactly.
    """
    cp = np.round(np.asarray(cos_pos, dtype=np.float64), 6)
    cn = np.round(np.asarray(cos_neg, dtype=np.float64), 6)
    fn = cn >= fn_threshold(cp, cfg.fn_ratio)[:, None]
    easy = cn < cfg.too_easy_floor if cfg.too_easy_floor is not None else np.zeros_like(fn)
    mono = np.all(np.diff(cn, axis=1) < 0, axis=1) if cn.shape[1] > 1 else np.ones(len(cn), dtype=bool)
    return {"cos_pos": cp, "cos_neg": cn, "false_negative": fn, "too_easy": easy, "kendall_tau": kendall_tau_claimed(cn), "monotonic": mono}


def measure_examples(cos_pos: np.ndarray, cos_neg: list[np.ndarray], cfg: ScoreConfig) -> list[dict[str, Any]]:
    """:func:`measure` per example, as the JSON-ready values a record and its sidecar store.

    ``cos_neg`` holds one array per example, normally of 4 negatives (fewer when an earlier filter
    removed some): the examples are measured in groups of one negative count."""
    by_k: dict[int, list[int]] = defaultdict(list)
    for e, cn in enumerate(cos_neg):
        by_k[len(cn)].append(e)
    per_ex: list[dict] = [None] * len(cos_neg)  # type: ignore[list-item]
    for k, idx in by_k.items():
        m = measure(cos_pos[idx], np.stack([cos_neg[e] for e in idx]) if k else np.zeros((len(idx), 0)), cfg)
        for r, e in enumerate(idx):
            tau = m["kendall_tau"][r]
            per_ex[e] = {
                "cos_pos": float(m["cos_pos"][r]),
                "cos_neg": [float(x) for x in m["cos_neg"][r]],
                "false_negative": [bool(x) for x in m["false_negative"][r]],
                "too_easy": [bool(x) for x in m["too_easy"][r]],
                "kendall_tau": None if np.isnan(tau) else round(float(tau), 6),
                "monotonic": bool(m["monotonic"][r]),
            }
    return per_ex


def drop_flags(cfg: ScoreConfig) -> list[str]:
    """The flags whose negatives a policy removes: ``filter_flags`` for ``filter``, ``measured_drop``
    for ``measured`` (false negatives only by default: a too-easy negative is harmless as level 4,
    a false negative teaches the model to push a right answer away)."""
    return list(cfg.measured_drop if cfg.policy == "measured" else cfg.filter_flags)


def apply_policy(row: dict, m: dict[str, Any], cfg: ScoreConfig, embedder: str) -> tuple[dict | None, dict | None]:
    """One example and its :func:`measure_examples` values (LLM order) -> (scored record, None) or (None, reject)."""
    k = len(m["cos_neg"])
    order = list(range(k))
    if cfg.policy == "reorder":
        order = sorted(range(k), key=lambda i: -m["cos_neg"][i])  # stable: ties keep the LLM order
    elif cfg.policy in ("filter", "measured"):
        order = [i for i in range(k) if not any(m[f][i] for f in drop_flags(cfg))]
        if cfg.policy == "measured":  # levels from the measurement: survivors sorted by cosine, hardest first
            order.sort(key=lambda i: -m["cos_neg"][i])
    score = {
        "embedder": embedder,
        "cos_pos": m["cos_pos"],
        "cos_neg": [m["cos_neg"][i] for i in order],
        "kendall_tau": m["kendall_tau"],
        "monotonic": m["monotonic"],
        "false_negative": [m["false_negative"][i] for i in order],
        "too_easy": [m["too_easy"][i] for i in order],
        "policy": cfg.policy,
        "llm_order": order if cfg.policy != "annotate" else None,
    }
    if "judge_neg" in m:
        score.update(
            judge=m["judge"],
            judge_pos=m["judge_pos"],
            judge_neg=[m["judge_neg"][i] for i in order],
            judged_false_negative=[m["judged_false_negative"][i] for i in order],
        )
    out = dict(row)
    out["negatives"] = [row["negatives"][i] for i in order]
    out["score"] = score
    if cfg.policy in ("filter", "measured") and len(order) < cfg.min_negatives:
        causes = sorted({f for f in drop_flags(cfg) for i in range(k) if i not in order and m[f][i]})
        reason = "+".join(causes) or "too_few_negatives"
        dropped = ", ".join(
            f"level {i + 1} ({'+'.join(f for f in FLAGS if m[f][i])}, cos {m['cos_neg'][i]:.3f})" for i in range(k) if i not in order
        )
        detail = f"{len(order)} of {k} negatives kept, score.min_negatives={cfg.min_negatives}; dropped: {dropped or 'none'}; cos_pos {m['cos_pos']:.3f}"
        return None, reject(out, reason, detail)
    return out, None


def reject(row: dict, reason: str, detail: str) -> dict:
    """A :class:`~negsynth.schemas.records.Reject` of the score stage for ``row``."""
    return {"id": row["id"], "stage": NAME, "reason": reason, "detail": detail, "raw": None, "input": row, "usage": row.get("usage") or {}}
