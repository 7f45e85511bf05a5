"""The report of ``negsynth inspect`` (see :mod:`negsynth.inspect`): stage counts read from the
shards with polars (only the columns a number needs), the score statistics over the selected
examples, and the ``--sample`` records read line by line from their files."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import negsynth.stages
from negsynth.data.shards import ShardError, iter_jsonl, repair_hint
from negsynth.errors import UserError
from negsynth.stages.score.stats import level_stats


def stage_order() -> tuple[str, ...]:
    """Stage folders in the method's order (others follow alphabetically); ``METHOD`` read when called."""
    return tuple(s.name for s in negsynth.stages.METHOD)


FLAGS = ("false_negative", "too_easy", "non_monotonic")


def _pl():
    import polars as pl

    return pl


def _score_schema():
    pl = _pl()
    return {
        "id": pl.String,
        "task_type": pl.String,
        "score": pl.Struct(
            {
                "cos_pos": pl.Float64,
                "cos_neg": pl.List(pl.Float64),
                "kendall_tau": pl.Float64,
                "monotonic": pl.Boolean,
                "false_negative": pl.List(pl.Boolean),
                "too_easy": pl.List(pl.Boolean),
                "llm_order": pl.List(pl.Int64),
            }
        ),
    }


# ---------------------------------------------------------------------------- reading


def collect_shards(lf, files: list[Path]):
    """Collect ``lf``; on a parse error find the bad file and line and say so in one line."""
    pl = _pl()
    try:
        return lf.collect()
    except pl.exceptions.PolarsError as e:
        for f in files:
            for _ in iter_jsonl(f):  # raises ShardError "FILE:LINE: not valid JSON ..."
                pass
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        names = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
        raise ShardError(f"{names}: cannot read as shards ({first}); a record has an unexpected type: {repair_hint(files[0])}") from None


def scan_shards(files: list[Path], schema: dict):
    """Lazy scan of ``files`` with only ``schema``'s columns plus ``_file``, ``_row`` (global) and ``_i`` (record index in its file)."""
    pl = _pl()
    lf = pl.scan_ndjson([str(f) for f in files], schema=schema, include_file_paths="_file", row_index_name="_row")
    return lf.with_columns((pl.col("_row") - pl.col("_row").min().over("_file")).alias("_i"))


def negatives_mined(files: list[Path]) -> bool:
    """Every example's negatives were mined (``model`` = ``mined:…``: regenerate or corpus with
    mined negatives): their levels are rank bands of a retriever, not an LLM's grading, so no LLM
    order to compare with (Kendall tau, monotonic) and no "LLM level"."""
    if not files:
        return False
    pl = _pl()
    col = collect_shards(scan_shards(files, {"model": pl.String}), files).get_column("model")
    return col.len() > 0 and bool(col.fill_null("").str.starts_with("mined:").all())


def level_word(mined: bool) -> str:
    return "rank band" if mined else "LLM level"


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("shard-*.jsonl")) if folder.is_dir() else []


def resolve(path: Path) -> tuple[Path | None, dict[str, list[Path]]]:
    """``path`` -> (run dir or None, stage name -> shard files). Accepts a run dir, a stage folder or a shard."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory; pass a run dir, a stage folder or a shard-XXXXX.jsonl file")
    if path.is_file():
        stage = path.parent.name if path.parent.name != "rejects" else path.parent.parent.name
        return None, {stage: [path]}
    if _shards(path) or (path / "stats.json").exists():
        return None, {path.name: _shards(path)}
    stages = {}
    subdirs = [
        d
        for d in path.iterdir()
        if d.is_dir() and not d.name.startswith(".") and (_shards(d) or (d / "stats.json").exists() or (d / "rejects").is_dir())
    ]
    order = stage_order()
    for d in sorted(subdirs, key=lambda d: (order.index(d.name) if d.name in order else len(order), d.name)):
        stages[d.name] = _shards(d)
    return path, stages


def _stats_files(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.glob("stats*.json")):
        try:
            out.append(json.loads(p.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"{p}: not valid JSON; rerun the stage that wrote it") from None
    return out


def _pending(folder: Path) -> Counter:
    """Items of unfinished shards whose requests failed at the transport level: not rejected,
    a rerun retries them (see :data:`negsynth.pipeline.runner.PENDING`)."""
    from negsynth.pipeline.runner import PENDING, rows_of

    out: Counter = Counter()
    for p in sorted(folder.glob("shard-*.jsonl.partial")):
        last: dict[int, list[str]] = {}  # item -> the reasons of its last line's rejects
        for row in iter_jsonl(p, tolerate_truncated_tail=True):
            rows = rows_of(row.get("k", ""), row.get("r") or {})
            last[row.get("i", -1)] = [str(r.get("reason", "")) for k, r in rows if k == "rej"]
        out.update(r for reasons in last.values() for r in reasons if r.startswith(PENDING))
    return out


def stage_summary(name: str, files: list[Path], folder: Path | None) -> dict[str, Any]:
    """Counts, reject reasons, task-type mix, tokens and cost of one stage folder (or one shard)."""
    pl = _pl()
    out: dict[str, Any] = {"shards": len(files), "records": 0, "task_types": {}}
    if files:
        df = collect_shards(scan_shards(files, {"task_type": pl.String}).select("task_type"), files)
        out["records"] = df.height
        vc = df.get_column("task_type").drop_nulls().value_counts(sort=True)
        out["task_types"] = {r[0]: int(r[1]) for r in vc.iter_rows()}
    if folder is not None:
        rej_files = [f for f in _shards(folder / "rejects") if f.stat().st_size > 0]
        if rej_files:
            df = collect_shards(scan_shards(rej_files, {"reason": pl.String}).select("reason"), rej_files)
            out["rejected"] = df.height
            out["rejects_by_reason"] = {r[0]: int(r[1]) for r in df.get_column("reason").value_counts(sort=True).iter_rows()}
        else:
            out["rejected"], out["rejects_by_reason"] = 0, {}
        pending = _pending(folder)
        if pending:
            out["pending"], out["pending_by_reason"] = sum(pending.values()), dict(pending)
        stats = _stats_files(folder)
        if stats:
            tok = Counter()
            for s in stats:
                tok.update({k: v for k, v in (s.get("tokens") or {}).items() if isinstance(v, (int, float))})
            if tok:
                out["tokens"] = dict(tok)
            for key, digits in (("estimated_cost_usd", 6), ("wall_time_s", 3)):
                vals = [s[key] for s in stats if isinstance(s.get(key), (int, float))]
                if vals:
                    out[key] = round(sum(vals), digits)
            if name == "score":  # its embedder, what the false-negative judge flagged, what cleaning dropped
                out.update({k: stats[0][k] for k in ("embedder", "judge", "clean") if stats[0].get(k)})
            if name == "heldout":  # how many documents were set aside, or why none were
                held = stats[0].get("heldout") or {}
                out["held_out"] = {
                    "documents": held.get("documents"),
                    "held_out": held.get("held_out", 0),
                    "reason": stats[0].get("reason"),
                }
            if name == "corpus":  # the queries the LLM wrote: styles, lengths, round-trip ranks
                keys = ("query_styles", "query_words", "round_trip", "teacher_scores")
                out["queries"] = {k: stats[0][k] for k in keys if stats[0].get(k)}
    return out


# ---------------------------------------------------------------------------- score statistics


def score_frame(files: list[Path], *, task_type: str | None = None):
    """One row per (scored example, negative): ``_file, _row, id, task_type, cos_pos, cos_neg, level, false_negative, too_easy, monotonic, kendall_tau``.

    ``level`` is the LLM's level (1 = claimed hardest) even after ``reorder`` / ``filter``
    (taken from ``score.llm_order``).
    """
    pl = _pl()
    lf = scan_shards(files, _score_schema()).filter(pl.col("score").is_not_null())
    if task_type:
        lf = lf.filter(pl.col("task_type") == task_type)
    s = pl.col("score")
    lf = lf.select(
        "_file",
        "_row",
        "_i",
        "id",
        "task_type",
        s.struct.field("cos_pos"),
        s.struct.field("cos_neg"),
        s.struct.field("false_negative"),
        s.struct.field("too_easy"),
        s.struct.field("monotonic"),
        s.struct.field("kendall_tau"),
        pl.when(s.struct.field("llm_order").is_null())
        .then(pl.int_ranges(0, s.struct.field("cos_neg").list.len()))
        .otherwise(s.struct.field("llm_order"))
        .alias("level"),
    )
    df = collect_shards(lf, files)
    if df.height == 0:
        return df
    return df.explode(["cos_neg", "false_negative", "too_easy", "level"]).with_columns((pl.col("level") + 1).cast(pl.Int64))


def select_examples(neg, *, flag: str | None, level: int | None):
    """Filter the per-negative frame to the examples matching ``flag`` (at ``level``); all their rows kept."""
    pl = _pl()
    if flag is None or neg.height == 0:
        return neg
    if flag == "non_monotonic":
        return neg.filter(~pl.col("monotonic"))
    hit = neg.filter(pl.col(flag) & (pl.lit(True) if level is None else pl.col("level") == level))
    keys = hit.select("_file", "_row").unique()
    return neg.join(keys, on=["_file", "_row"], how="semi")


# ---------------------------------------------------------------------------- samples


def read_lines(picks: list[tuple[str, int]]) -> list[dict]:
    """The records at (file, 0-based record index) — only those lines are parsed."""
    by_file: dict[str, set[int]] = {}
    for f, i in picks:
        by_file.setdefault(f, set()).add(i)
    found: dict[tuple[str, int], dict] = {}
    for f, want in by_file.items():
        n = -1
        with open(f, "rb") as fh:
            for line in fh:
                if not line.strip():
                    continue
                n += 1
                if n in want:
                    found[(f, n)] = json.loads(line)
                    if len(found) == len(picks):
                        break
    return [found[p] for p in picks if p in found]


def pick_samples(frame, n: int, seed: int) -> list[dict]:
    """``n`` records chosen with ``seed`` among the (file, row) pairs of ``frame``."""
    if n <= 0 or frame.height == 0:
        return []
    keys = frame.select("_file", "_i", "_row").unique(subset=["_row"]).sort("_row")
    pairs = list(zip(keys.get_column("_file").to_list(), keys.get_column("_i").to_list(), strict=True))
    chosen = sorted(random.Random(seed).sample(range(len(pairs)), min(n, len(pairs))))
    return read_lines([pairs[i] for i in chosen])


# ---------------------------------------------------------------------------- the report


def read_verdict(folder: Path) -> dict[str, Any] | None:
    """The verdict on the held-out documents in an evaluate folder (``verdict.json``), less its
    per-query rows; None where there is none."""
    try:
        v = json.loads((Path(folder) / "verdict.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(v.get("own_corpus"), dict):
        v["own_corpus"] = {k: x for k, x in v["own_corpus"].items() if k != "per_query"}
    return v


def example_stage(stages: dict[str, list[Path]]) -> str | None:
    """The stage whose records the scores, samples and plots come from: the latest Example stage
    with shards, else the first stage that has any."""
    return next((s for s in reversed(negsynth.stages.example_stages()) if stages.get(s)), None) or next(
        (s for s in stages if stages[s]), None
    )


def inspect_path(
    path: str | Path,
    *,
    sample: int = 0,
    task_type: str | None = None,
    flag: str | None = None,
    level: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Build the report described in the module docstring."""
    if flag is not None and flag not in FLAGS:
        raise UserError(f"--flag {flag!r}: choose from {', '.join(FLAGS)}")
    if level is not None and not 1 <= level <= 4:
        raise UserError(f"--level {level}: choose 1 (hardest) .. 4 (easiest)")
    path = Path(path)
    run_dir, stages = resolve(path)
    if not any(stages.values()) and not any((path / s / "stats.json").exists() for s in stages):
        where = "directory" if path.is_dir() else "file"
        raise UserError(f"{path}: empty {where} — no shard-*.jsonl found; run `negsynth run` (or a stage) first")
    report: dict[str, Any] = {"path": str(path), "stages": {}, "task_types": {}}
    for name, files in stages.items():
        folder = None if path.is_file() else ((run_dir / name) if run_dir else path)
        s = stage_summary(name, files, folder)
        report["task_types"][name] = s.pop("task_types")
        report["stages"][name] = s
    verdict = read_verdict(run_dir / "evaluate" if run_dir else path)
    if verdict:
        report["verdict"] = verdict
    ex_stage = example_stage(stages)
    report["selection"] = {"stage": ex_stage, "task_type": task_type, "flag": flag, "level": level}
    files = stages.get(ex_stage, []) if ex_stage else []
    neg = score_frame(files, task_type=task_type) if files else None
    if neg is not None and neg.height:
        sel = select_examples(neg, flag=flag, level=level)
        report["score"] = level_stats(sel, level=level)  # score's own definition: inspect and score/stats.json agree
        report["score"]["negatives"] = "mined" if negatives_mined(files) else "llm"
        report["selection"]["matching"] = report["score"]["examples"]
        report["samples"] = pick_samples(sel, sample, seed)
    else:
        report["score"] = None
        if flag:
            raise UserError(f"--flag {flag}: {path} holds no scored examples; run `negsynth score` first")
        if sample and files:
            pl = _pl()
            lf = scan_shards(files, {"task_type": pl.String})
            if task_type:
                lf = lf.filter(pl.col("task_type") == task_type)
            frame = collect_shards(lf, files)
            report["selection"]["matching"] = frame.height
            report["samples"] = pick_samples(frame, sample, seed)
        else:
            report["samples"] = []
    return report
