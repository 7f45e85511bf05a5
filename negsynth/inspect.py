"""``negsynth inspect DIR_OR_SHARD``: what is in a run dir, a stage folder or one shard.

>>> from negsynth.inspect import inspect_path
>>> rep = inspect_path("runs/default", sample=2, flag="false_negative")   # doctest: +SKIP
>>> rep["stages"]["generate"]["records"], rep["score"]["levels"][0]["mean"]  # doctest: +SKIP
(60, 0.4125)

The report (also ``--json``) has:

* ``stages``: per stage folder — ``records``, ``shards``, ``rejected``, ``rejects_by_reason``,
  and from its ``stats.json`` files ``tokens`` {prompt, completion}, ``estimated_cost_usd``,
  ``wall_time_s``;
* ``task_types``: per stage, records per task type;
* ``score`` (when the examples carry scores): ``examples`` (after filters), ``cos_pos``
  {mean, median}, ``levels`` (per LLM level: n, mean, median, false_negative_rate, too_easy_rate),
  ``monotonic_pct``, ``kendall_tau_mean``, ``false_negative_rate_by_task_type``;
* ``selection``: the filters and how many examples match; ``samples``: ``--sample N`` examples.

Filters select examples: ``--task-type``; ``--flag false_negative|too_easy`` (at any level, or
at ``--level L``); ``--flag non_monotonic``; ``--level L`` alone keeps only level L in the
per-level table. The score statistics are computed over the selection.

Scale: shards are read with polars (``scan_ndjson`` with an explicit partial schema), so only
the columns a number needs are materialised — ids, task types, reasons and score structs, never
the texts. Texts are read only for the ``--sample`` rows, line by line from their files. A
corrupted shard ends with one line naming the file and line.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from negsynth.data.shards import ShardError, iter_jsonl, repair_hint
from negsynth.errors import UserError
from negsynth.stages import METHOD

#: stage folders in pipeline order (others follow alphabetically)
STAGE_ORDER = tuple(s.name for s in METHOD)
#: stages whose records are Examples, the latest in the method first (``score`` is preferred for
#: samples and scores)
EXAMPLE_STAGES = tuple(reversed([s.name for s in METHOD if s.examples]))
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


def _collect(lf, files: list[Path]):
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


def _scan(files: list[Path], schema: dict):
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
    col = _collect(_scan(files, {"model": pl.String}), files).get_column("model")
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
    for d in sorted(subdirs, key=lambda d: (STAGE_ORDER.index(d.name) if d.name in STAGE_ORDER else len(STAGE_ORDER), d.name)):
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
    from negsynth.data.shards import iter_jsonl
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
        df = _collect(_scan(files, {"task_type": pl.String}).select("task_type"), files)
        out["records"] = df.height
        vc = df.get_column("task_type").drop_nulls().value_counts(sort=True)
        out["task_types"] = {r[0]: int(r[1]) for r in vc.iter_rows()}
    if folder is not None:
        rej_files = _shards(folder / "rejects")
        rej_files = [f for f in rej_files if f.stat().st_size > 0]
        if rej_files:
            df = _collect(_scan(rej_files, {"reason": pl.String}).select("reason"), rej_files)
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
            cost = [s["estimated_cost_usd"] for s in stats if isinstance(s.get("estimated_cost_usd"), (int, float))]
            if cost:
                out["estimated_cost_usd"] = round(sum(cost), 6)
            wall = [s["wall_time_s"] for s in stats if isinstance(s.get("wall_time_s"), (int, float))]
            if wall:
                out["wall_time_s"] = round(sum(wall), 3)
            if name == "score" and stats[0].get("embedder"):
                out["embedder"] = stats[0]["embedder"]
            if name == "score" and stats[0].get("judge"):
                out["judge"] = stats[0]["judge"]  # what the false-negative judge flagged
            if name == "score" and stats[0].get("clean"):
                out["clean"] = stats[0]["clean"]  # near-duplicates / contamination dropped by score
            if name == "corpus":  # the queries the LLM wrote: styles, lengths, round-trip ranks
                keys = ("query_styles", "query_words", "round_trip", "negative_sources", "teacher_scores")
                out["queries"] = {k: stats[0][k] for k in keys if stats[0].get(k)}
    return out


# ---------------------------------------------------------------------------- score statistics


def score_frame(files: list[Path], *, task_type: str | None = None):
    """One row per (scored example, negative): ``_file, _row, id, task_type, cos_pos, cos_neg, level, false_negative, too_easy, monotonic, kendall_tau``.

    ``level`` is the LLM's level (1 = claimed hardest) even after ``reorder`` / ``filter``
    (taken from ``score.llm_order``).
    """
    pl = _pl()
    lf = _scan(files, _score_schema()).filter(pl.col("score").is_not_null())
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
    df = _collect(lf, files)
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


def score_stats(neg, *, level: int | None = None) -> dict[str, Any]:
    """Per-level statistics over the per-negative frame (see :func:`score_frame`): the score
    stage's own definition, so ``inspect`` and ``score/stats.json`` agree key for key."""
    from negsynth.stages.score.stats import level_stats

    return level_stats(neg, level=level)


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
    ex_stage = next((s for s in EXAMPLE_STAGES if stages.get(s)), None) or next((s for s in stages if stages[s]), None)
    report["selection"] = {"stage": ex_stage, "task_type": task_type, "flag": flag, "level": level}
    files = stages.get(ex_stage, []) if ex_stage else []
    neg = score_frame(files, task_type=task_type) if files else None
    if neg is not None and neg.height:
        sel = select_examples(neg, flag=flag, level=level)
        report["score"] = score_stats(sel, level=level)
        report["score"]["negatives"] = "mined" if negatives_mined(files) else "llm"
        report["selection"]["matching"] = report["score"]["examples"]
        report["samples"] = pick_samples(sel, sample, seed)
    else:
        report["score"] = None
        if flag:
            raise UserError(f"--flag {flag}: {path} holds no scored examples; run `negsynth score` first")
        if sample and files:
            pl = _pl()
            lf = _scan(files, {"task_type": pl.String})
            if task_type:
                lf = lf.filter(pl.col("task_type") == task_type)
            frame = _collect(lf, files)
            report["selection"]["matching"] = frame.height
            report["samples"] = pick_samples(frame, sample, seed)
        else:
            report["samples"] = []
    return report


# ---------------------------------------------------------------------------- rendering


def render(report: dict[str, Any], console) -> None:
    """Print the report as rich tables (and panels for samples)."""
    from rich.table import Table

    t = Table(title=f"{report['path']}: stages", title_justify="left")
    for h in ("stage", "shards", "records", "rejected", "pending", "tokens in / out", "cost (USD)", "wall time"):
        t.add_column(h, justify="right" if h != "stage" else "left")
    for name, s in report["stages"].items():
        tok = s.get("tokens")
        t.add_row(
            name,
            str(s["shards"]),
            str(s["records"]),
            str(s.get("rejected", "")),
            str(s.get("pending", "")),
            f"{tok.get('prompt', 0)} / {tok.get('completion', 0)}" if tok else "",
            f"{s['estimated_cost_usd']:.4f}" if "estimated_cost_usd" in s else "",
            f"{s['wall_time_s']:.1f} s" if "wall_time_s" in s else "",
        )
    console.print(t)

    for name, s in report["stages"].items():
        cl = s.get("clean")
        if cl:
            by_set = ", ".join(f"{k} {v}" for k, v in (cl.get("contaminated_by_set") or {}).items())
            con = (
                f"decontamination skipped ({cl['decontam_skipped']})"
                if cl.get("decontam_skipped")
                else f"{cl['contaminated']} contaminated{f' ({by_set})' if by_set else ''}"
            )
            console.print(f"{name} cleaning: {cl['near_duplicate']} near-duplicates dropped, {con}")
        j = s.get("judge")
        if j:
            nj = f", {j['not_judged']} examples not judged" if j.get("not_judged") else ""
            console.print(
                f"{name} false-negative judge ({j['model']}): {j['false_negatives']} of {j['negatives']} negatives judged false "
                f"({j['only_by_judge']} the cosine rule let through){nj}"
            )

        q = s.get("queries")
        if q:
            parts = []
            if q.get("query_styles"):
                parts.append("styles " + ", ".join(f"{k} {v}" for k, v in q["query_styles"].items()))
            if q.get("query_words"):
                parts.append(f"words p10/median/p90 {q['query_words']['p10']}/{q['query_words']['median']}/{q['query_words']['p90']}")
            rt = q.get("round_trip")
            if rt:
                parts.append(
                    f"round trip top-1 {rt['top1']:.1%}, top-10 {rt['top10']:.1%} (ranks {', '.join(f'{k}: {v}' for k, v in rt['ranks'].items())})"
                )
            ts = q.get("teacher_scores")
            if ts:  # the teacher's scores on its own scale (corpus.teacher): what a distillation loss learns from
                negs = ", ".join(_f(x) for x in ts["negatives"])
                parts.append(f"teacher score positive {_f(ts['positive'])}, negatives {negs} (mean of {ts['examples']})")
            if q.get("negative_sources"):  # mixed: the LLM's negatives that passed the mining margin vs mined fill-ins
                parts.append("negatives " + ", ".join(f"{k} {v}" for k, v in q["negative_sources"].items()))
            console.print(f"{name} queries: " + "; ".join(parts))

    reasons = [(n, r, c) for n, s in report["stages"].items() for r, c in (s.get("rejects_by_reason") or {}).items()]
    if reasons:
        t = Table(title="reject reasons", title_justify="left")
        for h in ("stage", "reason", "count"):
            t.add_column(h, justify="right" if h == "count" else "left")
        for n, r, c in reasons:
            t.add_row(n, r, str(c))
        console.print(t)

    mix = {n: m for n, m in report["task_types"].items() if m}
    if mix:
        types = sorted({tt for m in mix.values() for tt in m})
        t = Table(title="task-type mix", title_justify="left")
        t.add_column("task type")
        for n in mix:
            t.add_column(n, justify="right")
        for tt in types:
            cells = []
            for m in mix.values():
                tot = sum(m.values())
                cells.append(f"{m.get(tt, 0)} ({100 * m.get(tt, 0) / tot:.0f}%)" if tot else "0")
            t.add_row(tt, *cells)
        console.print(t)

    sc = report.get("score")
    sel = report["selection"]
    if sc:
        filt = ", ".join(f"{k}={v}" for k, v in sel.items() if k in ("task_type", "flag", "level") and v is not None)
        mined = sc.get("negatives") == "mined"
        what = "rank band (mined negatives, 1 = hardest)" if mined else "LLM level"
        title = f"score per {what} ({sel['stage']}, {sc['examples']} examples{', ' + filt if filt else ''})"
        t = Table(title=title, title_justify="left")
        for h in ("cos(q, ·)", "n", "mean", "median", "false neg", "too easy"):
            t.add_column(h, justify="left" if h == "cos(q, ·)" else "right")
        t.add_row("positive", str(sc["examples"]), _f(sc["cos_pos"]["mean"]), _f(sc["cos_pos"]["median"]), "", "")
        for lv in sc["levels"]:
            t.add_row(
                f"{'band' if mined else 'level'} {lv['level']}",
                str(lv["n"]),
                _f(lv["mean"]),
                _f(lv["median"]),
                _pct(lv["false_negative_rate"]),
                _pct(lv["too_easy_rate"]),
            )
        console.print(t)
        by_type = "false negatives by task type: " + ", ".join(f"{k} {_pct(v)}" for k, v in sc["false_negative_rate_by_task_type"].items())
        if mined:  # the bands are the retriever's own ranks: no LLM order to check them against
            console.print(by_type)
        else:
            console.print(f"monotonic: {_f(sc['monotonic_pct'], 1)}%   mean Kendall tau: {_f(sc['kendall_tau_mean'], 3)}   " + by_type)
    elif sel.get("stage"):
        console.print(f"[dim]no score data in {sel['stage']}: run `negsynth score` for cosines and flags[/]")
    for ex in report.get("samples") or []:
        console.print(_sample_panel(ex, sel.get("level")))


def _sample_panel(ex: dict, level: int | None):
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    sc = ex.get("score") or {}
    mined = str(ex.get("model") or "").startswith("mined:")
    # the teacher's scores ([positive, negatives as written], corpus.teacher): a column where present
    teacher = (ex.get("meta") or {}).get("teacher_label")
    teacher = teacher if isinstance(teacher, list) and teacher else None
    t = Table(show_header=True, box=None, expand=True, pad_edge=False)
    t.add_column("", style="bold", no_wrap=True)
    t.add_column("cos", justify="right", no_wrap=True)
    if teacher:
        t.add_column("teacher", justify="right", no_wrap=True)
    t.add_column("flags", no_wrap=True)
    t.add_column("text", ratio=1)
    cell = (lambda x: [_f(x)]) if teacher else (lambda x: [])  # noqa: E731
    t.add_row("query", "", *cell(None), "", escape(_clip(ex.get("query", ""))))
    t.add_row("positive", _f(sc.get("cos_pos")), *cell(teacher[0] if teacher else None), "", escape(_clip(ex.get("positive", ""))))
    order = sc.get("llm_order") or list(range(len(ex.get("negatives", []))))
    for i, neg in enumerate(ex.get("negatives", [])):
        lv = order[i] + 1 if i < len(order) else i + 1
        flags = [
            name
            for key, name in (
                ("false_negative", "[red]FALSE NEG[/]"),
                ("too_easy", "[yellow]too easy[/]"),
                ("judged_false_negative", "[magenta]judged FN[/]"),
            )
            if (sc.get(key) or [False] * 9)[i]
        ]
        label = f"{'band' if mined else 'level'} {lv}" + (" ◀" if level == lv else "")
        cos = sc.get("cos_neg", [None] * 9)[i] if sc else None
        j = (order[i] if i < len(order) else i) + 1  # the negative's place as written: its teacher score
        t.add_row(label, _f(cos), *cell(teacher[j] if teacher and j < len(teacher) else None), " ".join(flags), escape(_clip(neg)))
    sub = []
    if sc and not mined:  # a mined example's bands are the retriever's ranks: no LLM order to check
        sub.append(f"tau {_f(sc.get('kendall_tau'), 2)}")
        sub.append("monotonic" if sc.get("monotonic") else "[yellow]not monotonic[/]")
    title = f"{ex.get('id', '?')}  [dim]{ex.get('task_type', '')}[/]  {escape(_clip(ex.get('task', ''), 80))}"
    return Panel(t, title=title, title_align="left", subtitle="  ".join(sub) or None, subtitle_align="right")


def _clip(s: str, n: int = 300) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _f(x, nd: int = 3) -> str:
    return "" if x is None else f"{x:.{nd}f}"


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


# ---------------------------------------------------------------------------- plots


def write_plots(path: str | Path, out_dir: str | Path, *, task_type: str | None = None) -> list[Path]:
    """PNG figures of the scored examples under ``path`` -> list of files written.

    * ``cos_by_level.png``: distribution (violin + box) of cos(q, neg) per LLM level next to
      cos(q, pos), with each level's mean and MGH Table 4's means (another embedder) for reference;
    * ``flags_by_level.png``: false-negative and too-easy rate per level, one bar group per task type;
    * ``task_type_mix.png``: examples per task type;
    * ``kendall_tau.png``: histogram of the per-example Kendall tau.
    """
    try:
        import matplotlib
    except ImportError:
        raise UserError("--plots needs matplotlib; run: pip install 'negsynth[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pl = _pl()
    path, out = Path(path), Path(out_dir)
    run_dir, stages = resolve(path)
    ex_stage = next((s for s in EXAMPLE_STAGES if stages.get(s)), None) or next((s for s in stages if stages[s]), None)
    if ex_stage is None:
        raise UserError(f"{path}: no shard-*.jsonl found; nothing to plot")
    files = stages[ex_stage]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--plots {out}: cannot create it ({e.strerror}); choose a writable directory") from None
    written: list[Path] = []

    # task-type mix (works without scores)
    lf = _scan(files, {"task_type": pl.String})
    mix = _collect(lf, files).get_column("task_type").drop_nulls().value_counts(sort=True)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    names, counts = mix.get_column("task_type").to_list(), mix.get_column("count").to_list()
    bars = ax.barh(names[::-1], counts[::-1], color="#4C72B0")
    total = sum(counts) or 1
    for b, c in zip(bars, counts[::-1], strict=True):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {c} ({100 * c / total:.0f}%)", va="center", fontsize=9)
    ax.set_xlabel("examples")
    ax.set_title(f"task-type mix ({ex_stage}, {total} examples)")
    ax.set_xlim(0, max(counts or [1]) * 1.25)
    fig.tight_layout()
    written.append(_save(fig, out / "task_type_mix.png", plt))

    neg = score_frame(files, task_type=task_type)
    if neg.height == 0:
        return written
    mined = negatives_mined(files)
    ex = neg.unique(subset=["_file", "_row"], keep="first")
    levels = sorted(neg.get_column("level").unique().to_list())
    data = [ex.get_column("cos_pos").to_numpy()] + [neg.filter(pl.col("level") == lv).get_column("cos_neg").to_numpy() for lv in levels]
    labels = ["positive"] + [f"{'band' if mined else 'level'} {lv}" for lv in levels]
    fig, ax = plt.subplots(figsize=(7.2, 4.4))
    pos = np.arange(1, len(data) + 1)
    parts = ax.violinplot(data, positions=pos, showextrema=False, widths=0.8)
    for i, body in enumerate(parts["bodies"]):
        body.set_facecolor("#55A868" if i == 0 else "#4C72B0")
        body.set_alpha(0.35)
    ax.boxplot(data, positions=pos, widths=0.18, showfliers=False, medianprops={"color": "black"})
    means = [float(np.mean(d)) for d in data]
    ax.plot(pos, means, "o-", color="#C44E52", label="mean (this data)", zorder=3)
    from negsynth.stages.score import PAPER_TABLE4

    paper = [] if mined else [(p, PAPER_TABLE4[lv - 1]) for p, lv in zip(pos[1:], levels, strict=True) if lv <= len(PAPER_TABLE4)]
    if paper:
        ax.plot([p for p, _ in paper], [v for _, v in paper], "x--", color="grey", label="MGH Table 4 mean (their embedder)")
    ax.set_xticks(pos, labels)
    ax.set_ylabel("cosine similarity to the query")
    emb = _embedder_name(run_dir, path, ex_stage)
    ax.set_title(f"cos(query, ·) by {level_word(mined)} — {len(ex)} examples" + (f", {emb}" if emb else ""), fontsize=10)
    ax.axhline(0, color="lightgrey", lw=0.8, zorder=0)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    written.append(_save(fig, out / "cos_by_level.png", plt))

    # false-negative / too-easy rate per level, grouped by task type
    agg = neg.group_by("task_type", "level").agg(pl.col("false_negative").mean(), pl.col("too_easy").mean())
    overall = neg.group_by("level").agg(pl.col("false_negative").mean(), pl.col("too_easy").mean()).sort("level")
    tts = ["all"] + sorted(agg.get_column("task_type").unique().to_list())
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    width = 0.8 / len(tts)
    x = np.arange(len(levels))
    for col, ax, title in (("false_negative", axes[0], "false-negative rate"), ("too_easy", axes[1], "too-easy rate")):
        for j, tt in enumerate(tts):
            src = overall if tt == "all" else agg.filter(pl.col("task_type") == tt)
            vals = {r["level"]: r[col] for r in src.iter_rows(named=True)}
            ax.bar(
                x + (j - (len(tts) - 1) / 2) * width,
                [100 * vals.get(lv, 0.0) for lv in levels],
                width,
                label=tt,
                color="black" if tt == "all" else None,
                alpha=0.85,
            )
        ax.set_xticks(x, [f"{'band' if mined else 'level'} {lv}" for lv in levels])
        ax.set_ylabel("% of negatives")
        ax.set_title(title)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(tts), fontsize=8, frameon=False)
    fig.suptitle(
        f"flags per {level_word(mined)} (1 = {'the hardest rank band' if mined else 'claimed hardest'}), by task type", fontsize=10
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    written.append(_save(fig, out / "flags_by_level.png", plt))

    tau = ex.get_column("kendall_tau").drop_nulls().to_numpy()
    if len(tau) and not mined:  # mined negatives: no LLM order to compare with the cosines
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        vals, counts = np.unique(np.round(tau, 3), return_counts=True)
        ax.bar(vals, counts, width=0.06, color="#8172B2")
        ax.axvline(float(tau.mean()), color="#C44E52", ls="--", label=f"mean {tau.mean():.3f}")
        ax.set_xlabel("Kendall tau: LLM's order vs measured cosines (1 = identical)")
        ax.set_ylabel("examples")
        ax.set_xlim(-1.1, 1.1)
        ax.legend(fontsize=8)
        ax.set_title("how well the LLM's difficulty order matches the embedder", fontsize=10)
        fig.tight_layout()
        written.append(_save(fig, out / "kendall_tau.png", plt))
    return written


def _embedder_name(run_dir: Path | None, path: Path, stage: str) -> str | None:
    folder = (run_dir / stage) if run_dir else (path if path.is_dir() else path.parent)
    try:
        return json.loads((folder / "stats.json").read_text(encoding="utf-8")).get("embedder")
    except (OSError, json.JSONDecodeError):
        return None


def _save(fig, p: Path, plt) -> Path:
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
