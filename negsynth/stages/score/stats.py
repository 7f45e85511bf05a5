"""Statistics per LLM level, written to ``score/stats.json`` and read by ``negsynth inspect``."""

from __future__ import annotations

from typing import Any

import numpy as np

from negsynth.pipeline import Summary
from negsynth.stages.score.measure import PAPER_TABLE4


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def _kendall_tau(sidecar: dict) -> list:
    """A sidecar's Kendall tau per example (written as ``tau`` before the records' spelling)."""
    return sidecar["kendall_tau"] if "kendall_tau" in sidecar else sidecar["tau"]


def negatives_frame(sidecars: list[dict]):
    """The per-negative frame of :func:`level_stats` built from score's sidecars (one per shard)."""
    import polars as pl

    # one row per negative, its values in this order
    schema = {
        "_file": pl.String,
        "_row": pl.Int64,
        "task_type": pl.String,
        "cos_pos": pl.Float64,
        "cos_neg": pl.Float64,
        "level": pl.Int64,
        "false_negative": pl.Boolean,
        "too_easy": pl.Boolean,
        "monotonic": pl.Boolean,
        "kendall_tau": pl.Float64,
    }
    rows: list[tuple] = []
    row = 0
    for k, sc in enumerate(sidecars):
        per_example = zip(
            sc["task_type"],
            sc["cos_pos"],
            sc["cos_neg"],
            sc["false_negative"],
            sc["too_easy"],
            sc["monotonic"],
            _kendall_tau(sc),
            strict=True,
        )
        for tt, cp, cn, fn, ez, mono, tau in per_example:
            for lv, (c, f, z) in enumerate(zip(cn, fn, ez, strict=True), start=1):
                rows.append((str(k), row, tt, cp, c, lv, f, z, mono, tau))
            row += 1
    return pl.DataFrame(rows, schema=schema, orient="row")


def level_stats(neg, *, level: int | None = None) -> dict[str, Any]:
    """Statistics per LLM level over a per-negative frame (:func:`negatives_frame`'s columns; ``_file``
    and ``_row`` together name the example) — the one definition that score's ``stats.json`` and
    ``negsynth inspect`` share; its keys are listed in docs/score.md. ``level``: one level only."""
    import polars as pl

    ex = neg.unique(subset=["_file", "_row"], keep="first", maintain_order=True)
    per_level = (
        pl.col("cos_neg").mean().alias("mean"),
        pl.col("false_negative").mean().alias("false_negative_rate"),
        pl.col("too_easy").mean().alias("too_easy_rate"),
    )
    lv_frame = (
        neg.filter(pl.col("level") == level if level is not None else pl.lit(True))
        .group_by("level")
        .agg(pl.len().alias("n"), *per_level, pl.col("cos_neg").median().alias("median"))
        .sort("level")
    )
    pos_mean = ex.get_column("cos_pos").mean() if ex.height else None
    levels = [
        {
            "level": r["level"],
            "n": r["n"],
            "mean": _r(r["mean"]),
            "median": _r(r["median"]),
            "gap_to_pos": _r(pos_mean - r["mean"]) if pos_mean is not None else None,
            "false_negative_rate": _r(r["false_negative_rate"]),
            "too_easy_rate": _r(r["too_easy_rate"]),
            "paper_mean": PAPER_TABLE4[r["level"] - 1] if r["level"] <= len(PAPER_TABLE4) else None,
        }
        for r in lv_frame.iter_rows(named=True)
    ]
    means = [lv["mean"] for lv in levels]
    by_tt: dict[str, Any] = {}
    for tt in sorted(set(ex.get_column("task_type").to_list())):
        e = ex.filter(pl.col("task_type") == tt)
        n_tt = neg.filter(pl.col("task_type") == tt)
        tau = e.get_column("kendall_tau").drop_nulls().drop_nans()
        by_tt[tt] = {
            "examples": e.height,
            "cos_pos_mean": _r(e.get_column("cos_pos").mean()),
            "monotonic_pct": _r(100 * e.get_column("monotonic").mean(), 2),
            "kendall_tau_mean": _r(tau.mean()) if len(tau) else None,
            "false_negative_rate": _r(n_tt.get_column("false_negative").mean()) if n_tt.height else None,
            "levels": {
                str(r["level"]): {k: _r(r[k]) for k in ("mean", "false_negative_rate", "too_easy_rate")}
                for r in n_tt.group_by("level").agg(*per_level).sort("level").iter_rows(named=True)
            },
        }
    tau = ex.get_column("kendall_tau").drop_nulls().drop_nans()
    return {
        "examples": ex.height,
        "cos_pos": {"mean": _r(pos_mean), "median": _r(ex.get_column("cos_pos").median()) if ex.height else None},
        "levels": levels,
        "levels_decreasing": bool(len(means) > 1 and all(a is not None and b is not None and a > b for a, b in zip(means, means[1:]))),
        "monotonic_pct": _r(100 * ex.get_column("monotonic").mean(), 2) if ex.height else None,
        "kendall_tau_mean": _r(tau.mean()) if len(tau) else None,
        "kendall_tau_undefined": ex.height - len(tau),
        "false_negative_rate": _r(neg.get_column("false_negative").mean()) if neg.height else None,
        "too_easy_rate": _r(neg.get_column("too_easy").mean()) if neg.height else None,
        "by_task_type": by_tt,
        "false_negative_rate_by_task_type": {tt: v["false_negative_rate"] for tt, v in by_tt.items()},
    }


def table_rows(stats: dict, by: str = "level") -> list[tuple]:
    """The per-level table: positive first, then levels 1..4 (``by``: "level" or "rank band") against MGH Table 4."""
    pos = stats["cos_pos"]
    rows: list[tuple] = [("positive", stats["examples"], fmt_num(pos["mean"]), fmt_num(pos["median"]), "", "", "", "")]
    for lv in stats["levels"]:
        rows.append(
            (
                f"{'band' if by == 'rank band' else 'level'} {lv['level']}",
                lv["n"],
                fmt_num(lv["mean"]),
                fmt_num(lv["median"]),
                fmt_num(lv["gap_to_pos"]),
                fmt_pct(lv["false_negative_rate"]),
                fmt_pct(lv["too_easy_rate"]),
                fmt_num(lv["paper_mean"], 3),
            )
        )
    return rows


TABLE_HEADER = ("cos(q, ·)", "n", "mean", "median", "pos-mean", "false neg", "too easy", "MGH T4")


def fmt_num(x, nd: int = 4) -> str:
    return "" if x is None else f"{x:.{nd}f}"


def fmt_pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def report(stats: dict) -> list[Summary]:
    """The per-level table and the stage's summary."""
    tp = stats.get("throughput") or {}
    mined = bool(stats.get("negatives_mined"))
    rows = [("examples scored / kept / rejected", f"{stats['examples']} / {stats['kept']} / {stats['rejected']}")]
    if mined:  # rank bands of a retriever: no LLM order to check
        rows.append(("levels", "rank bands of mined negatives (1 = hardest); no LLM order to check"))
    else:
        rows += [
            ("levels decreasing (MGH claim)", "yes" if stats["levels_decreasing"] else "no"),
            ("monotonic examples", f"{fmt_num(stats['monotonic_pct'], 1)}%"),
            ("mean Kendall tau", fmt_num(stats["kendall_tau_mean"], 3)),
        ]
    rows.append(("policy", stats["policy"]))
    for reason, k in stats["rejects_by_reason"].items():
        rows.append((f"  rejected: {reason}", str(k)))
    j = stats.get("judge")
    if j:
        rows.append(
            (
                "false-negative judge",
                f"{j['model']}: {j['false_negatives']} of {j['negatives']} negatives >= {j['ratio']} x the positive "
                f"({j['only_by_judge']} the cosine rule let through)",
            )
        )
    rows += clean_rows(stats)
    if tp.get("examples"):
        rows.append(
            (
                "throughput (this run)",
                f"{tp['examples_per_s']:.1f} examples/s, {tp['texts_per_s']:.1f} texts/s ({tp['unique_texts']} unique of {tp['texts']})",
            )
        )
    by = "rank band" if mined else "LLM level"
    return [Summary(f"score: by {by} ({stats['embedder']})", table_rows(stats, by), TABLE_HEADER), Summary("score", rows)]


def clean_rows(stats: dict) -> list[tuple[str, str]]:
    """Summary rows for the cleaning checks (also used by ``negsynth inspect``)."""
    cl = stats.get("clean")
    if not cl:
        return []
    if cl["dedup"]:
        how = f"query and positive cos >= {cl['dedup_threshold']}" if cl["dedup_threshold"] is not None else "exact only"
        if cl["dedup_threshold"] is not None:
            how += "; dataset pairs exact only"
        dup = f"{cl['near_duplicate']} ({cl['near_duplicate_exact']} exact; {how})"
    else:
        dup = "off"
    if cl.get("decontam_skipped"):
        con = f"skipped: {cl['decontam_skipped']}"
    else:
        sets = ", ".join(f"{k} {v}" for k, v in cl["contaminated_by_set"].items())
        how = f"cos >= {cl['decontam_threshold']}" if cl["decontam_threshold"] is not None else "exact only"
        con = f"{cl['contaminated']}{f' ({sets})' if sets else ''}; checked against {cl['eval_texts']} texts of {len(cl['eval_sets'])} eval sets, {how}"
    return [("near-duplicates dropped", dup), ("contaminated dropped", con)]
