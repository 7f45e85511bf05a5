"""``negsynth inspect RUN_DIR --html OUT.html``: the inspect report as one self-contained page
(CSS, JS, the data and the plots inline; what it shows: docs/score.md, "HTML report").
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from itertools import islice
from pathlib import Path
from typing import Any

from negsynth.errors import UserError

MAX_TEXT = 2000  # characters kept per text in the page
#: the page: its style, filters and sample browser, with __TITLE__, __SUMMARY__ and __DATA__ to fill
PAGE = Path(__file__).with_name("report.html")


def _clip(s: Any, n: int = MAX_TEXT) -> str:
    s = "" if s is None else str(s)
    return s if len(s) <= n else s[: n - 1] + "…"


def _example_item(ex: dict) -> dict:
    sc = ex.get("score") or {}
    negs = ex.get("negatives") or []
    order = sc.get("llm_order") or list(range(len(negs)))
    cos = sc.get("cos_neg") or [None] * len(negs)
    fn = sc.get("false_negative") or [False] * len(negs)
    easy = sc.get("too_easy") or [False] * len(negs)
    return {
        "kind": "example",
        "id": ex.get("id"),
        "task_type": ex.get("task_type"),
        "task": _clip(ex.get("task"), 400),
        "query": _clip(ex.get("query")),
        "positive": _clip(ex.get("positive")),
        "cos_pos": sc.get("cos_pos"),
        "negs": [
            {
                "text": _clip(t),
                "level": (order[i] + 1) if i < len(order) else i + 1,
                "cos": cos[i] if i < len(cos) else None,
                "false_negative": bool(fn[i]) if i < len(fn) else False,
                "too_easy": bool(easy[i]) if i < len(easy) else False,
            }
            for i, t in enumerate(negs)
        ],
        "kendall_tau": sc.get("kendall_tau"),
        "monotonic": sc.get("monotonic"),
        "scored": bool(sc),
        "source": ex.get("source"),
    }


def _reject_item(rej: dict, stage: str) -> dict:
    inp = rej.get("input") if isinstance(rej.get("input"), dict) else {}
    item = _example_item(inp) if inp.get("query") is not None else {"kind": "example", "negs": [], "scored": False}
    item.update(
        {
            "kind": "reject",
            "id": rej.get("id"),
            "stage": stage,
            "reason": rej.get("reason"),
            "detail": _clip(rej.get("detail"), 600),
            "raw": _clip(rej.get("raw"), 1500),
            "task_type": item.get("task_type") or inp.get("task_type"),
            "task": item.get("task") or _clip(inp.get("task"), 400),
        }
    )
    return item


def _rejects(path: Path, stages: dict, limit: int) -> list[dict]:
    from negsynth.data.shards import iter_jsonl
    from negsynth.inspect import resolve

    run_dir, _ = resolve(path)
    out: list[dict] = []
    for name in stages:
        folder = run_dir / name if run_dir else path  # a stage folder (never a shard: see write_html)
        recs = (rec for f in sorted((folder / "rejects").glob("shard-*.jsonl")) for rec in iter_jsonl(f, tolerate_truncated_tail=True))
        out += [_reject_item(rec, name) for rec in islice(recs, limit)]
    return out


def _plots(path: Path) -> list[tuple[str, str]]:
    from negsynth.inspect import write_plots

    with tempfile.TemporaryDirectory(prefix="negsynth-html-") as d:
        try:
            files = write_plots(path, d)
        except UserError:
            return []
        return [(p.stem.replace("_", " "), base64.b64encode(p.read_bytes()).decode("ascii")) for p in files]


def _table(headers: list[str], rows: list[list[Any]], cls: str = "") -> str:
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


def render_html(report: dict, items: list[dict], plots: list[tuple[str, str]]) -> str:
    """The page for an :func:`negsynth.inspect.inspect_path` report plus browser items and plots."""
    st = report["stages"]
    stage_rows = []
    for name, s in st.items():
        tok = s.get("tokens") or {}
        stage_rows.append(
            [
                name,
                s.get("shards"),
                s.get("records"),
                s.get("rejected", ""),
                s.get("pending", ""),
                f"{tok.get('prompt', '')} / {tok.get('completion', '')}" if tok else "",
                s.get("estimated_cost_usd", ""),
                f"{s['wall_time_s']:.1f} s" if isinstance(s.get("wall_time_s"), (int, float)) else "",
            ]
        )
    parts = [
        f"<h2>Stages</h2>{_table(['stage', 'shards', 'records', 'rejected', 'pending', 'tokens in / out', 'cost (USD)', 'wall time'], stage_rows)}"
    ]
    if report.get("verdict"):
        parts.append(f"<h2>Did it help? Your own documents, held out</h2><p><b>{html.escape(report['verdict']['line'])}</b></p>")
    tts = sorted({t for m in report["task_types"].values() for t in m})
    if tts:
        parts.append(
            "<h2>Task types</h2>"
            + _table(["stage", *tts], [[n, *[m.get(t, 0) for t in tts]] for n, m in report["task_types"].items() if m])
        )
    sc = report.get("score")
    if sc:
        from negsynth.stages.score.stats import TABLE_HEADER, fmt_num, fmt_pct, table_rows

        mined = sc.get("negatives") == "mined"  # rank bands of a retriever: no LLM order to check
        rows = table_rows(sc, "rank band" if mined else "level")  # the terminal's table, the same columns
        what = "rank band (mined negatives, 1 = hardest)" if mined else "LLM level"
        parts.append(f"<h2>Score: cos(query, ·) per {what}</h2>" + _table(["", *TABLE_HEADER[1:]], rows))
        order = (
            ""
            if mined
            else f"monotonic examples: <b>{sc.get('monotonic_pct')}%</b> · mean Kendall τ: <b>{fmt_num(sc.get('kendall_tau_mean'), 3)}</b> · "
        )
        parts.append(
            f"<p>{order}"
            f"false-negative rate: <b>{fmt_pct(sc.get('false_negative_rate'))}</b> ("
            + ", ".join(f"{html.escape(k)} {fmt_pct(v)}" for k, v in sc.get("false_negative_rate_by_task_type", {}).items())
            + ")</p>"
        )
    rej = [[n, r, c] for n, s in st.items() for r, c in (s.get("rejects_by_reason") or {}).items()]
    if rej:
        parts.append("<h2>Reject reasons</h2>" + _table(["stage", "reason", "count"], rej))
    if plots:
        parts.append(
            "<h2>Plots</h2>"
            + "".join(
                f'<figure><img alt="{html.escape(t)}" src="data:image/png;base64,{b}"><figcaption>{html.escape(t)}</figcaption></figure>'
                for t, b in plots
            )
        )
    data = json.dumps({"items": items}, ensure_ascii=False).replace("<", "\\u003c")  # no tag can end the script block
    title = html.escape(f"negsynth inspect: {report['path']}")
    return PAGE.read_text(encoding="utf-8").replace("__TITLE__", title).replace("__SUMMARY__", "\n".join(parts)).replace("__DATA__", data)


def write_html(path: str | Path, out: str | Path, *, max_examples: int = 500, max_rejects: int = 200, seed: int = 0) -> Path:
    """Write the page for ``path`` (a run dir, a stage folder or a shard) to ``out``."""
    from negsynth.inspect import inspect_path

    path, out = Path(path), Path(out)
    report = inspect_path(path, sample=max_examples, seed=seed)
    items = [_example_item(ex) for ex in report.get("samples", [])]
    items += _rejects(path, report["stages"], max_rejects) if not path.is_file() else []
    page = render_html(report, items, _plots(path))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page, encoding="utf-8")
    except OSError as e:
        raise UserError(f"--html {out}: cannot write it ({e.strerror}); choose a writable path") from None
    return out
