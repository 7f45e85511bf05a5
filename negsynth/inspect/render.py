"""``negsynth inspect`` on a terminal: the report (:func:`negsynth.inspect.inspect_path`) as rich
tables, one line per stage note (cleaning, judge, queries) and a panel per sample."""

from __future__ import annotations

from typing import Any

from negsynth.stages.score.stats import fmt_pct


def render(report: dict[str, Any], console) -> None:
    """Print the report as rich tables (and panels for samples)."""
    console.print(_stages_table(report))
    if report.get("verdict"):  # did it help? (the held-out documents; "[heldout]" in a reason is no markup)
        from rich.markup import escape

        console.print(f"[bold]{escape(report['verdict']['line'])}[/]", highlight=False)
    for name, s in report["stages"].items():
        _print_stage_notes(name, s, console)
    reasons = [(n, r, c) for n, s in report["stages"].items() for r, c in (s.get("rejects_by_reason") or {}).items()]
    if reasons:
        console.print(_rejects_table(reasons))
    mix = {n: m for n, m in report["task_types"].items() if m}
    if mix:
        console.print(_task_mix_table(mix))
    sel = report["selection"]
    if report.get("score"):
        _print_score(report["score"], sel, console)
    elif sel.get("stage"):
        console.print(f"[dim]no score data in {sel['stage']}: run `negsynth score` for cosines and flags[/]")
    for ex in report.get("samples") or []:
        console.print(_sample_panel(ex, sel.get("level")))


def _stages_table(report: dict[str, Any]):
    """One row per stage: shards, records, rejects, pending items, tokens, cost and wall time."""
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
    return t


def _print_stage_notes(name: str, s: dict[str, Any], console) -> None:
    """The lines a stage's stats add when present: score's cleaning and false-negative judge, the
    corpus stage's queries (styles, lengths, round trip, teacher scores, negative sources)."""
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
        console.print(
            f"{name} false-negative judge ({j['model']}): {j['false_negatives']} of {j['negatives']} negatives judged false "
            f"({j['only_by_judge']} the cosine rule let through)"
        )

    h = s.get("held_out")
    if h:
        told = f"{h['held_out']} of {h['documents']} documents held out (never trained on)" if h["held_out"] else h.get("reason")
        console.print(f"{name}: {told}", markup=False)
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
        console.print(f"{name} queries: " + "; ".join(parts))


def _rejects_table(reasons: list[tuple[str, str, int]]):
    """Rejects per (stage, reason)."""
    from rich.table import Table

    t = Table(title="reject reasons", title_justify="left")
    for h in ("stage", "reason", "count"):
        t.add_column(h, justify="right" if h == "count" else "left")
    for n, r, c in reasons:
        t.add_row(n, r, str(c))
    return t


def _task_mix_table(mix: dict[str, dict[str, int]]):
    """Records per task type, a column per stage, with each stage's share."""
    from rich.table import Table

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
    return t


def _print_score(sc: dict[str, Any], sel: dict[str, Any], console) -> None:
    """The score table (the positive and each level or rank band) over the selection, then the
    false-negative rate by task type and, for an LLM's negatives, how monotonic its grading was."""
    from rich.table import Table

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
            fmt_pct(lv["false_negative_rate"]),
            fmt_pct(lv["too_easy_rate"]),
        )
    console.print(t)
    by_type = "false negatives by task type: " + ", ".join(f"{k} {fmt_pct(v)}" for k, v in sc["false_negative_rate_by_task_type"].items())
    if mined:  # the bands are the retriever's own ranks: no LLM order to check them against
        console.print(by_type)
    else:
        console.print(f"monotonic: {_f(sc['monotonic_pct'], 1)}%   mean Kendall tau: {_f(sc['kendall_tau_mean'], 3)}   " + by_type)


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
