"""The corpus stage's stats (:func:`run_stats`) and summary table (:func:`report`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from negsynth import pipeline
from negsynth.data.corpus import CorpusData
from negsynth.data.shards import read_stage
from negsynth.pipeline import StageContext, Summary

#: rank buckets of the round-trip histogram in stats.json
RANK_BUCKETS = ((1, 1), (2, 3), (4, 10), (11, 100), (101, None))


def describe(folder: Path) -> dict[str, Any]:
    """Query styles, lengths, the round-trip ranks (kept and rejected queries) and the teacher's scores."""
    styles: Counter = Counter()
    lengths: list[int] = []
    ranks: list[int] = []
    labels: list[list[float]] = []
    for r in read_stage(folder):
        if r.get("meta", {}).get("teacher_label"):
            labels.append(r["meta"]["teacher_label"])
        styles[r.get("attributes", {}).get("style", "?")] += 1
        lengths.append(len(r["query"].split()))
        if "round_trip_rank" in r.get("meta", {}):
            ranks.append(r["meta"]["round_trip_rank"])
    for r in read_stage(folder / "rejects"):
        rank = (r.get("input") or {}).get("round_trip_rank")
        if rank is not None:
            ranks.append(rank)
    out: dict[str, Any] = {"query_styles": dict(sorted(styles.items()))}
    if lengths:
        s = sorted(lengths)
        out["query_words"] = {
            "mean": round(sum(s) / len(s), 2),
            "p10": s[len(s) // 10],
            "median": s[len(s) // 2],
            "p90": s[(9 * len(s)) // 10],
        }
    if ranks:
        hist = {}
        for lo, hi in RANK_BUCKETS:
            label = f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi else f">{lo - 1}")
            hist[label] = sum(1 for r in ranks if r >= lo and (hi is None or r <= hi))
        out["round_trip"] = {
            "queries": len(ranks),
            "top1": round(sum(r == 1 for r in ranks) / len(ranks), 4),
            "top10": round(sum(r <= 10 for r in ranks) / len(ranks), 4),
            "mrr": round(sum(1 / r for r in ranks) / len(ranks), 4),
            "ranks": hist,
        }
    if labels:
        mean = lambda xs: round(sum(xs) / len(xs), 4) if xs else None  # noqa: E731
        bands = max(len(lab) for lab in labels) - 1
        out["teacher_scores"] = {
            "examples": len(labels),
            "positive": mean([lab[0] for lab in labels]),
            "negatives": [mean([lab[b + 1] for lab in labels if len(lab) > b + 1]) for b in range(bands)],
        }
    return out


def report(stats: dict) -> list[Summary]:
    rows = pipeline.summary_rows(stats)
    docs = stats.get("documents") or {}
    rows.insert(0, ("documents sampled / in corpus", f"{docs.get('sampled', '?')} / {docs.get('in_corpus', '?')}"))
    rows.insert(1, ("queries per document", str(stats.get("queries_per_doc"))))
    if docs.get("split_into_passages"):
        rows.insert(1, ("long documents split into passages", str(docs["split_into_passages"])))
    if stats.get("query_styles"):
        rows.append(("query styles", ", ".join(f"{k} {v}" for k, v in stats["query_styles"].items())))
    if stats.get("query_words"):
        w = stats["query_words"]
        rows.append(("query words (p10 / median / p90)", f"{w['p10']} / {w['median']} / {w['p90']}"))
    rt = stats.get("round_trip")
    if rt:
        rows.append(("round trip: own document top-1 / top-10 / MRR", f"{rt['top1']:.1%} / {rt['top10']:.1%} / {rt['mrr']:.3f}"))
        rows.append(("round trip: ranks", ", ".join(f"{k}: {v}" for k, v in rt["ranks"].items())))
    ts = stats.get("teacher_scores")
    if ts:
        rows.append(
            ("teacher score: positive / negatives (mean)", f"{ts['positive']:.3f} / " + ", ".join(f"{x:.3f}" for x in ts["negatives"]))
        )
    return [Summary("corpus", rows)]


def run_stats(ctx: StageContext, corpora: list[CorpusData], n_items: int, folder: Path) -> dict[str, Any]:
    """The corpus stage's own stats: documents, corpora, settings, and what the queries are like."""
    docs = {
        "in_corpus": sum(c.count for c in corpora),
        "sampled": n_items // ctx.cfg.corpus.queries_per_doc,
        "empty_skipped": sum(c.empty_skipped for c in corpora),
        "duplicate_ids": sum(c.duplicate_ids for c in corpora),
    }
    if any(c.chunked for c in corpora):  # in_corpus and sampled then count passages
        docs["split_into_passages"] = sum(c.chunked for c in corpora)
    return {
        "documents": docs,
        "corpora": {c.name: corpus_stats(c) for c in corpora},
        "queries_per_doc": ctx.cfg.corpus.queries_per_doc,
        **({"queries": ctx.cfg.corpus.queries} if ctx.cfg.corpus.queries != "llm" else {}),
        "round_trip_k": ctx.cfg.corpus.round_trip_k,
        **describe(folder),
    }


def corpus_stats(c: CorpusData) -> dict[str, Any]:
    """One corpus in stats.json: where it is, its documents and how they were read."""
    out: dict[str, Any] = {"path": c.path, "documents": c.count, "columns": c.columns}
    if c.fmt == "folder":
        out["files"] = len(c.parts)
        if c.skipped_files:
            out["skipped_files"] = c.skipped_files  # files of no corpus type, by kind
    if c.chunked:
        out["rows"] = c.rows
        out["split_into_passages"] = c.chunked
    if c.ids != "column":
        out["ids"] = c.ids
    return out
