"""``negsynth inspect RUN_DIR --html OUT.html``: the inspect report as one self-contained page.

Everything is inline (CSS, JS, the data as JSON, the plots as base64 PNG): no network, open it from
disk or mail it. It holds the stage tables, the task-type mix, the per-level score table, reject
reasons, the plots and a sample browser filtered by task type, level, flag and reject reason; the
filters live in the URL fragment (``OUT.html#task_type=sts&flag=false_negative&level=1``), so a
view can be bookmarked or shared.
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
        folder = (run_dir / name) if run_dir else (path if path.is_dir() else None)
        if folder is None:
            continue
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
    return PAGE.replace("__TITLE__", title).replace("__SUMMARY__", "\n".join(parts)).replace("__DATA__", data)


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


PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:12px 24px}header h1{font-size:18px;margin:0}
main{padding:8px 24px 40px;max-width:1200px}
h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;background:#fff;margin:4px 0}th,td{border:1px solid #e0e0e0;padding:3px 8px;text-align:right}
th{background:#f1f3f4}td:first-child,th:first-child{text-align:left}
figure{display:inline-block;margin:6px;background:#fff;border:1px solid #e0e0e0;padding:6px}figure img{max-width:520px;display:block}
figcaption{font-size:12px;color:#666;text-align:center}
#filters{position:sticky;top:0;background:#fafafa;padding:8px 0;border-bottom:1px solid #ddd;z-index:1}
#filters label{margin-right:14px}select{font:inherit}
.ex{background:#fff;border:1px solid #e0e0e0;border-radius:4px;margin:10px 0;padding:8px 12px}
.ex.reject{border-left:4px solid #c62828}.ex h3{font-size:13px;margin:0 0 4px;font-weight:600}
.ex .task{color:#555;font-style:italic;margin-bottom:4px}
.ex table{width:100%}.ex td{text-align:left;vertical-align:top}.ex td.num{text-align:right;white-space:nowrap;width:1%}
.ex td.lab{white-space:nowrap;width:1%;font-weight:600}.ex tr.hl td{background:#fff8e1}
.bar{display:inline-block;height:8px;background:#4C72B0;vertical-align:middle;margin-left:4px}
.badge{display:inline-block;font-size:11px;border-radius:3px;padding:0 5px;margin-left:4px;color:#fff}
.fn{background:#c62828}.easy{background:#f9a825}.nm{background:#6a1b9a}.rj{background:#c62828}.tt{background:#546e7a}
pre{white-space:pre-wrap;background:#f5f5f5;padding:6px;margin:4px 0;font-size:12px}
#count{color:#555;margin-left:8px}
</style></head><body>
<header><h1>__TITLE__</h1></header>
<main>
__SUMMARY__
<h2>Examples</h2>
<div id="filters">
<label>task type <select id="f-task_type"><option value="">all</option></select></label>
<label>level <select id="f-level"><option value="">any</option><option>1</option><option>2</option><option>3</option><option>4</option></select></label>
<label>flag <select id="f-flag"><option value="">any</option><option value="false_negative">false negative</option><option value="too_easy">too easy</option><option value="non_monotonic">not monotonic</option></select></label>
<label>reject reason <select id="f-reason"><option value="">kept examples</option><option value="*">any reject</option></select></label>
<span id="count"></span>
</div>
<div id="examples"></div>
</main>
<script type="application/json" id="data">__DATA__</script>
<script>
(function(){
"use strict";
var DATA = JSON.parse(document.getElementById("data").textContent), ITEMS = DATA.items, LIMIT = 300;
var KEYS = ["task_type", "level", "flag", "reason"];
function esc(s){ return String(s == null ? "" : s).replace(/[&<>"']/g, function(c){ return {"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;","'":"&#39;"}[c]; }); }
function fmt(x){ return x == null ? "" : Number(x).toFixed(3); }
function uniq(f){ var s = {}; ITEMS.forEach(function(it){ var v = f(it); if (v != null && v !== "") s[v] = 1; }); return Object.keys(s).sort(); }
function fill(id, vals){ var el = document.getElementById(id); vals.forEach(function(v){ var o = document.createElement("option"); o.value = v; o.textContent = v; el.appendChild(o); }); }
fill("f-task_type", uniq(function(it){ return it.task_type; }));
fill("f-reason", uniq(function(it){ return it.kind === "reject" ? it.reason : null; }));
function state(){ var s = {}; KEYS.forEach(function(k){ s[k] = document.getElementById("f-" + k).value; }); return s; }
function fromHash(){
  var h = (location.hash || "").replace(/^#/, ""), q = new URLSearchParams(h || location.search.replace(/^\?/, ""));
  KEYS.forEach(function(k){ var el = document.getElementById("f-" + k), v = q.get(k);
    if (v != null && Array.prototype.some.call(el.options, function(o){ return o.value === v; })) el.value = v; else el.value = ""; });
}
function matches(it, s){
  if (s.reason === "" && it.kind !== "example") return false;
  if (s.reason === "*" && it.kind !== "reject") return false;
  if (s.reason !== "" && s.reason !== "*" && !(it.kind === "reject" && it.reason === s.reason)) return false;
  if (s.task_type && it.task_type !== s.task_type) return false;
  var lv = s.level ? Number(s.level) : null;
  if (s.flag === "non_monotonic") return it.scored && it.monotonic === false;
  if (s.flag === "false_negative" || s.flag === "too_easy"){
    return it.negs.some(function(n){ return n[s.flag] && (lv == null || n.level === lv); });
  }
  return true;
}
function card(it, s){
  var lv = s.level ? Number(s.level) : null, h = [];
  h.push('<div class="ex' + (it.kind === "reject" ? " reject" : "") + '" data-id="' + esc(it.id) + '" data-kind="' + it.kind + '">');
  h.push("<h3>" + esc(it.id) + ' <span class="badge tt">' + esc(it.task_type) + "</span>");
  if (it.kind === "reject") h.push(' <span class="badge rj">' + esc(it.stage) + ": " + esc(it.reason) + "</span>");
  if (it.scored){ h.push(" τ " + fmt(it.kendall_tau)); if (it.monotonic === false) h.push(' <span class="badge nm">not monotonic</span>'); }
  h.push("</h3>");
  if (it.task) h.push('<div class="task">' + esc(it.task) + "</div>");
  if (it.kind === "reject" && it.detail) h.push("<div>" + esc(it.detail) + "</div>");
  if (it.query != null){
    h.push("<table><tr><td class=lab>query</td><td class=num></td><td>" + esc(it.query) + "</td></tr>");
    h.push("<tr><td class=lab>positive</td><td class=num>" + fmt(it.cos_pos) + bar(it.cos_pos) + "</td><td>" + esc(it.positive) + "</td></tr>");
    it.negs.forEach(function(n){
      var fl = (n.false_negative ? ' <span class="badge fn">false neg</span>' : "") + (n.too_easy ? ' <span class="badge easy">too easy</span>' : "");
      h.push('<tr class="neg' + (lv === n.level ? " hl" : "") + '"><td class=lab>level ' + n.level + fl + "</td><td class=num>" + fmt(n.cos) + bar(n.cos) + "</td><td>" + esc(n.text) + "</td></tr>");
    });
    h.push("</table>");
  }
  if (it.kind === "reject" && it.raw) h.push("<pre>" + esc(it.raw) + "</pre>");
  h.push("</div>");
  return h.join("");
}
function bar(c){ return c == null ? "" : '<span class="bar" style="width:' + Math.max(0, Math.round(60 * c)) + 'px"></span>'; }
function render(){
  var s = state(), hit = ITEMS.filter(function(it){ return matches(it, s); });
  document.getElementById("examples").innerHTML = hit.slice(0, LIMIT).map(function(it){ return card(it, s); }).join("");
  document.getElementById("count").textContent = hit.length + " shown of " + ITEMS.length + " in this page" + (hit.length > LIMIT ? " (first " + LIMIT + " rendered)" : "");
}
KEYS.forEach(function(k){ document.getElementById("f-" + k).addEventListener("change", function(){
  var s = state(), q = new URLSearchParams(); KEYS.forEach(function(k){ if (s[k]) q.set(k, s[k]); });
  history.replaceState(null, "", "#" + q.toString()); render(); }); });
window.addEventListener("hashchange", function(){ fromHash(); render(); });
fromHash(); render();
})();
</script>
</body></html>
"""
