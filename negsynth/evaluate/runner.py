"""``evaluate``: run an :class:`~negsynth.embed.base.Embedder` over the suite and build a report.

The report (JSON, ``schema = "negsynth.evaluate/1"``)::

    {"schema", "embedder", "suite", "data_dir", "created", "seconds", "seed",
     "tasks": {name: {"category", "main_metric", "main_score", "metrics", "n", "seconds", "cpu_seconds",
                      "files", "subsampled", "instruction", "note"}},
     "categories": {"STS": mean main score, ...},      # MTEB categories present
     "average": mean main score over all MTEB-category tasks (MTEB: mean over datasets),
     "extra": {"Triplet": mean}, "skipped": {name: reason}, "notes": [...]}

Scores are 0-1; :func:`render_table` shows them x100 as MTEB leaderboards do.
"""

from __future__ import annotations

import contextlib
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from negsynth.data.readers import EvalDataError, read_beir, read_tsv
from negsynth.evaluate import cache as stored
from negsynth.evaluate.encode import encode_texts, pair_labels, sts_pairs
from negsynth.evaluate.suite import CATEGORIES, EXTRA_CATEGORIES, TASKS_BY_NAME, TaskSpec, select_tasks

SCHEMA = "negsynth.evaluate/1"


def _subsample(n: int, cap: int | None, seed: int, labels: list[str] | None = None) -> np.ndarray:
    """Sorted indices of at most ``cap`` of ``n`` rows (stratified by ``labels`` when given)."""
    if not cap or n <= cap:
        return np.arange(n)
    if labels is not None:
        from sklearn.model_selection import train_test_split

        idx, _ = train_test_split(np.arange(n), train_size=cap, random_state=seed, stratify=labels)
        return np.sort(idx)
    return np.sort(np.random.default_rng(seed).choice(n, size=cap, replace=False))


def _task_file(data_dir: Path | None, f: str) -> Path | None:
    """A task's file: an absolute path as it is (a folder task), else relative to the data dir."""
    if Path(f).is_absolute():
        return Path(f)
    return data_dir / f if data_dir is not None else None


def _run_task(embedder, spec: TaskSpec, files: list[Path], quick: bool, seed: int, cache: dict, per_query: bool) -> tuple[dict, int, bool]:
    """One task's metrics, its size (rows, or queries) and whether the quick suite cut it."""
    from negsynth.evaluate import metrics as M

    cap = spec.quick if quick else {}
    c = spec.columns
    ins = spec.instruction

    if spec.category == "STS":
        t1, t2, gold = sts_pairs(spec, files[0])
        idx = _subsample(len(gold), cap.get("rows"), seed)
        t1, t2 = [t1[i] for i in idx], [t2[i] for i in idx]
        e = encode_texts(embedder, t1 + t2, ins, query=True, cache=cache)
        return M.sts_scores(e[: len(t1)], e[len(t1) :], gold[idx]), len(idx), len(idx) < len(gold)

    if spec.category == "Pair":
        t1, t2, y = pair_labels(spec, files[0])
        idx = _subsample(len(y), cap.get("rows"), seed, [str(v) for v in y])
        t1, t2, yy = [t1[i] for i in idx], [t2[i] for i in idx], [y[i] for i in idx]
        e = encode_texts(embedder, t1 + t2, ins, query=True, cache=cache)
        return M.pair_scores(e[: len(t1)], e[len(t1) :], yy), len(idx), len(idx) < len(y)

    if spec.category == "Triplet":
        cols = read_tsv(files[0], (c["anchor"], c["positive"], c["negative"]))
        n = len(cols[c["anchor"]])
        idx = _subsample(n, cap.get("rows"), seed)
        a, p, ng = ([cols[c[k]][i] for i in idx] for k in ("anchor", "positive", "negative"))
        e = encode_texts(embedder, a + p + ng, ins, query=True, cache=cache)
        m = len(idx)
        return M.triplet_scores(e[:m], e[m : 2 * m], e[2 * m :]), m, m < n

    if spec.category == "Retr":
        queries, corpus, qrels = read_beir(files[0], doc_title=spec.doc_title)
        qids, dids = list(queries), list(corpus)
        sub = False
        if cap.get("queries") and len(qids) > cap["queries"]:
            qids = [qids[i] for i in _subsample(len(qids), cap["queries"], seed)]
            sub = True
        if cap.get("corpus") and len(dids) > cap["corpus"]:
            # keep every judged document of the kept queries, fill up with random distractors
            judged = {d for q in qids for d in qrels[q]}
            rest = [d for d in dids if d not in judged]
            fill = max(cap["corpus"] - len(judged), 0)
            extra = {rest[i] for i in _subsample(len(rest), fill, seed)} if fill else set()
            dids = [d for d in dids if d in judged or d in extra]
            sub = True
        q_emb = encode_texts(embedder, [queries[q] for q in qids], ins, query=True, cache=cache)
        d_emb = encode_texts(embedder, [corpus[d] for d in dids], None, query=False, cache=cache)
        return M.retrieval_scores(q_emb, d_emb, qids, dids, qrels, per_query=per_query), len(qids), sub

    if spec.category in ("Class", "Clust"):
        parts = [read_tsv(f, (c["text"], c["label"])) for f in files]
        if spec.category == "Class" and spec.eval_mode == "train_test":
            tr, te = parts
            idx = _subsample(len(tr[c["label"]]), cap.get("train"), seed, tr[c["label"]])
            xtr_t = [tr[c["text"]][i] for i in idx]
            ytr = [tr[c["label"]][i] for i in idx]
            e = encode_texts(embedder, xtr_t + te[c["text"]], ins, query=True, cache=cache)
            res = M.classification_scores(e[: len(xtr_t)], ytr, e[len(xtr_t) :], te[c["label"]], seed=seed)
            res["train"] = len(xtr_t)
            return res, len(te[c["label"]]), len(idx) < len(tr[c["label"]])
        texts = [t for p in parts for t in p[c["text"]]]
        labels = [lab for p in parts for lab in p[c["label"]]]
        idx = _subsample(len(labels), cap.get("rows"), seed, labels)
        texts, ys = [texts[i] for i in idx], [labels[i] for i in idx]
        e = encode_texts(embedder, texts, ins, query=True, cache=cache)
        if spec.category == "Class":
            res = M.classification_scores(None, None, e, ys, seed=seed)
        else:
            res = M.clustering_scores(e, ys)
        return res, len(idx), len(idx) < len(labels)

    raise ValueError(f"evaluate: task {spec.name} has unknown category {spec.category!r}")


def _summarise(tasks: dict[str, dict]) -> tuple[dict, float | None, dict]:
    """Mean main score per MTEB category, over all MTEB-category tasks, and per extra category."""

    def means(cats: tuple[str, ...]) -> dict[str, float]:
        by = {c: [t["main_score"] for t in tasks.values() if t["category"] == c] for c in cats}
        return {c: float(np.mean(v)) for c, v in by.items() if v}

    mteb = [t["main_score"] for t in tasks.values() if t["category"] in CATEGORIES]
    return means(CATEGORIES), (float(np.mean(mteb)) if mteb else None), means(EXTRA_CATEGORIES)


def evaluate(
    embedder,
    suite: str = "quick",
    data_dir: str | Path | None = None,
    tasks: list[str | TaskSpec] | str | None = None,
    progress: bool = True,
    *,
    out: str | Path | None = None,
    seed: int = 0,
    announce: bool = True,
    engine: str = "negsynth",
    per_query: bool = False,
    results_cache: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate ``embedder`` (any :class:`~negsynth.embed.base.Embedder`) and return the report.

    ``suite``: ``"quick"`` (subsampled, a CPU demo) or ``"full"``. ``tasks``: names, category names
    (``"STS,SciFact"``) or :class:`TaskSpec` s (:func:`~negsynth.evaluate.suite.retrieval_task`)
    instead of the suite's defaults. ``data_dir``: the benchmark folder (default
    :func:`negsynth.resources.default_data_dir`); with none reachable, one line and an empty report.
    A set missing from it is ``skipped``; a malformed file raises
    :class:`~negsynth.data.readers.EvalDataError`. ``out``: the JSON report, written atomically.
    ``progress``: one line per task on stderr, ``False``, or a bar factory
    ``progress(description, total, status="")`` (the stage's
    :meth:`~negsynth.pipeline.progress.Reporter.progress`).

    ``engine = "mteb"``: the MTEB tasks through the mteb library (:mod:`negsynth.evaluate.mteb_engine`).
    ``per_query``: retrieval tasks add ``{query id: nDCG@10}`` (for
    :func:`negsynth.evaluate.paired_test`). ``results_cache``: a folder where each task scored
    for an embedder with an ``identity()`` is kept and looked up first (:mod:`negsynth.evaluate.cache`).
    """
    hub_names: list[str] = []
    if engine == "mteb":
        specs, hub_names = _split_mteb_names(suite, tasks)
    else:
        specs = select_tasks(suite, tasks)
    name = getattr(embedder, "name", type(embedder).__name__)
    if data_dir is None:
        from negsynth.resources import default_data_dir

        data_dir = default_data_dir()
    started = time.perf_counter(), time.process_time()
    results: dict[str, dict] = {}
    by_path = bool(specs) and all(Path(f).is_absolute() for s in specs for f in s.files)  # folder tasks need no data dir
    if (data_dir is None or not Path(data_dir).is_dir()) and not hub_names and not by_path:
        where = f"no evaluation data at {data_dir}" if data_dir is not None else "no evaluation data found"
        reason = (
            f"evaluate: {where}; to see base vs trained, point NEGSYNTH_DATA_DIR (or evaluate.data_dir / --data-dir) "
            "at a folder of STS/BEIR/TSV sets laid out as in docs/evaluate.md (e.g. the project's shared/data), "
            "or, online, pip install 'negsynth[eval]' and use --engine mteb --tasks STSBenchmark,SciFact (MTEB's own copies)"
        )
        if announce:
            print(reason, file=sys.stderr)
        report = _report(embedder, name, suite, engine, None, seed, started, results, {}, [reason])
    else:
        data_dir = Path(data_dir) if data_dir is not None else None
        identity = embedder.identity() if results_cache is not None and hasattr(embedder, "identity") else None
        if engine == "mteb":
            specs = _score_through_mteb(embedder, specs, hub_names, data_dir, out=out, progress=progress, results=results)
        cache = Path(results_cache) if identity is not None else None
        run = _TaskRun(embedder, data_dir, suite == "quick", seed, per_query, identity, cache)
        skipped = run.score_all(specs, f"evaluate {name}", progress, results)
        notes = []
        if engine == "mteb":
            notes.append(
                "engine mteb: the MTEB tasks are scored by the mteb library on their full test splits; the others by negsynth's evaluator"
            )
        if suite == "quick":
            notes.append(f"quick suite: subsampled (seed {seed}); compare only with quick reports")
        report = _report(embedder, name, suite, engine, data_dir, seed, started, results, skipped, notes)
    if out is not None:
        write_report(report, out)
    return report


def _report(
    embedder,
    name: str,
    suite: str,
    engine: str,
    data_dir: Path | None,
    seed: int,
    started: tuple[float, float],
    results: dict[str, dict],
    skipped: dict[str, str],
    notes: list[str],
) -> dict[str, Any]:
    """The report (module docstring) of the scored ``results``: category means, the average, the
    ``notes`` a reader needs to compare it, and the wall and CPU time since ``started``."""
    cats, avg, extra = _summarise(results)
    return {
        "schema": SCHEMA,
        "embedder": name,
        "backend": getattr(embedder, "backend", None),
        "suite": suite,
        "engine": engine,
        "data_dir": None if data_dir is None else str(data_dir),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - started[0], 2),
        "cpu_seconds": round(time.process_time() - started[1], 2),
        "seed": seed,
        "instruct_queries": bool(getattr(embedder, "instruct_queries", False)),
        "tasks": results,
        "categories": cats,
        "average": avg,
        "extra": extra,
        "skipped": skipped,
        "notes": notes,
    }


def _score_through_mteb(
    embedder, specs: list[TaskSpec], hub_names: list[str], data_dir: Path | None, *, out, progress, results: dict[str, dict]
) -> list[TaskSpec]:
    """``engine = "mteb"``: score the MTEB tasks among ``specs`` and ``hub_names`` with the mteb
    library into ``results``; returns the specs left to negsynth's own evaluator."""
    from negsynth.evaluate.mteb_engine import LOCAL_CATEGORIES, evaluate_mteb, is_mteb_task

    through_mteb = [s.name for s in specs if s.category in LOCAL_CATEGORIES and is_mteb_task(s.name)] + hub_names
    specs = [s for s in specs if s.name not in through_mteb]
    bs = getattr(embedder, "batch_size", 64)
    results.update(
        evaluate_mteb(embedder, through_mteb, data_dir, out=Path(out).parent if out is not None else None, progress=progress, batch_size=bs)
    )
    return specs


class _TaskRun:
    """negsynth's evaluator over a list of tasks: each task scored (or taken from the results
    cache, or skipped when its files are missing) with one progress line, and its result entry."""

    def __init__(
        self, embedder, data_dir: Path | None, quick: bool, seed: int, per_query: bool, identity: dict | None, results_cache: Path | None
    ):
        self.embedder, self.data_dir, self.quick, self.seed, self.per_query = embedder, data_dir, quick, seed, per_query
        self.identity, self.results_cache = identity, results_cache  # identity None: no results cache
        self.encoded: dict = {}  # text -> vector, shared by the tasks (a text in two sets is encoded once)

    def score_all(self, specs: list[TaskSpec], title: str, progress, results: dict[str, dict]) -> dict[str, str]:
        """Score ``specs`` into ``results``, one line each (``progress``: see :func:`evaluate`);
        returns the skipped tasks and why."""
        skipped: dict[str, str] = {}
        # a bar over the tasks (the caller's, e.g. the stage's reporter), the one line per task above it
        bar_cm = progress(title, len(specs), status="") if callable(progress) else contextlib.nullcontext(_NoBar(bool(progress)))
        with bar_cm as bar:
            for i, spec in enumerate(specs, 1):
                files = [_task_file(self.data_dir, f) for f in spec.files]
                missing = [f for f, p in zip(spec.files, files, strict=True) if p is None or not p.exists()]
                if missing:
                    skipped[spec.name] = f"missing {', '.join(missing)} under {self.data_dir}"
                    line = f": skipped ({skipped[spec.name]})"
                else:
                    bar.update(status=f"{spec.name} ({spec.category})")
                    line = f" ({spec.category}) " + self._score(spec, files, results)
                bar.print(f"[{i}/{len(specs)}] {spec.name}{line}")
                bar.update(advance=1, status="")
        return skipped

    def _score(self, spec: TaskSpec, files: list[Path], results: dict[str, dict]) -> str:
        """Put one task's result entry for the report into ``results`` (from the results cache when
        it holds one) and return its progress line (score, size, time)."""
        key = None
        if self.identity is not None:
            key = stored.task_key(self.identity, spec, files, quick=self.quick, seed=self.seed, per_query=self.per_query)
            hit = stored.load(self.results_cache, key)
            if hit is not None:
                results[spec.name] = hit
                return f"{spec.main_metric}={100 * hit['main_score']:.2f} n={hit['n']} (cached)"
        t0, c0 = time.perf_counter(), time.process_time()
        metrics, n, sub = _run_task(self.embedder, spec, files, self.quick, self.seed, self.encoded, self.per_query)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        pq = metrics.pop("per_query", None)
        entry = {
            "category": spec.category,
            "main_metric": spec.main_metric,
            "main_score": float(metrics[spec.main_metric]),
            "metrics": metrics,
            "n": int(n),
            "seconds": round(dt, 2),
            "cpu_seconds": round(cpu, 2),
            "files": list(spec.files),
            "subsampled": bool(sub),
            "instruction": spec.instruction,
            "note": spec.note,
        }
        if pq is not None:
            entry["per_query"] = pq
        results[spec.name] = entry
        if key is not None:
            stored.store(self.results_cache, key, entry)
        return f"{spec.main_metric}={100 * metrics[spec.main_metric]:.2f} n={n} {dt:.1f}s (cpu {cpu:.1f}s)"


class _NoBar:
    """The bar of a caller that passed ``progress=True`` (lines on stderr) or ``False`` (nothing)."""

    def __init__(self, lines: bool):
        self.lines = lines

    def update(self, advance: int = 0, **fields: Any) -> None:
        pass

    def print(self, line: str) -> None:
        if self.lines:
            print(line, file=sys.stderr)


def _split_mteb_names(suite: str, tasks) -> tuple[list[TaskSpec], list[str]]:
    """negsynth's task specs for the names it lists, and the other names (MTEB tasks from the hub)."""
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks or [])
    known = [n for n in names if n in TASKS_BY_NAME or n in CATEGORIES or n in EXTRA_CATEGORIES]
    hub = [n for n in names if n not in known]
    specs = select_tasks(suite, known) if known or not names else []
    return specs, hub


def write_report(report: dict, path: str | Path) -> Path:
    """Write the report as JSON atomically (temp file + rename)."""
    from negsynth.data.shards import atomic_write_json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, report)
    return path


def load_report(path: str | Path) -> dict:
    import json

    path = Path(path)
    try:
        rep = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise EvalDataError(f"{path}: not a readable evaluation report ({e}); pass a JSON written by evaluate") from None
    if not isinstance(rep, dict) or rep.get("schema") != SCHEMA:
        raise EvalDataError(f"{path}: field 'schema' is not {SCHEMA!r}; pass a JSON written by evaluate")
    return rep


def compare(report: dict, baseline: dict) -> dict[str, Any]:
    """Deltas (report - baseline) of main scores for tasks in both, categories and average.

    Categories and average are recomputed over the *shared* tasks only, so a task present in
    one report does not shift the comparison. Warns (in ``notes``) when the suites differ.
    """
    shared = [t for t in report["tasks"] if t in baseline.get("tasks", {})]
    a = {t: report["tasks"][t] for t in shared}
    b = {t: baseline["tasks"][t] for t in shared}
    rows = {
        t: {
            "category": a[t]["category"],
            "main_metric": a[t]["main_metric"],
            "score": a[t]["main_score"],
            "baseline": b[t]["main_score"],
            "delta": a[t]["main_score"] - b[t]["main_score"],
        }
        for t in shared
    }
    ca, avg_a, ea = _summarise(a)
    cb, avg_b, eb = _summarise(b)
    cats = {c: {"score": ca[c], "baseline": cb[c], "delta": ca[c] - cb[c]} for c in ca if c in cb}
    cats.update({c: {"score": ea[c], "baseline": eb[c], "delta": ea[c] - eb[c]} for c in ea if c in eb})
    notes = []
    if report.get("suite") != baseline.get("suite"):
        notes.append(f"suites differ ({report.get('suite')} vs {baseline.get('suite')}): deltas are not comparable")
    only = sorted(set(report["tasks"]) ^ set(baseline.get("tasks", {})))
    if only:
        notes.append("not in both reports: " + ", ".join(only))
    return {
        "embedder": report.get("embedder"),
        "baseline_embedder": baseline.get("embedder"),
        "tasks": rows,
        "categories": cats,
        "average": None if avg_a is None or avg_b is None else {"score": avg_a, "baseline": avg_b, "delta": avg_a - avg_b},
        "notes": notes,
    }


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def _fmt_delta(x: float | None) -> str:
    if x is None:
        return "-"
    colour = "green" if x > 0 else "red" if x < 0 else "white"
    return f"[{colour}]{100 * x:+.2f}[/{colour}]"


def table_rows(report: dict, baseline: dict | None = None) -> tuple[str, tuple[str, ...], list[list[str]]]:
    """The report as a title, a header and rows: one row per task (main score x100), then
    category means and the MTEB-style average. With ``baseline``: baseline and delta columns
    (see :func:`compare`). An empty ``""`` row separates the tasks from the means."""
    title = f"evaluate [{report.get('suite')}] {report.get('embedder')}"
    if baseline is not None:
        title += f" vs {baseline.get('embedder')}"
    header: tuple[str, ...] = ("task", "category", "metric", "n", "score")
    cmp = compare(report, baseline) if baseline is not None else None
    if cmp:
        header += ("baseline", "delta")
    rows: list[list[str]] = []
    order = {c: i for i, c in enumerate(CATEGORIES + EXTRA_CATEGORIES)}
    for name, t in sorted(report["tasks"].items(), key=lambda kv: (order.get(kv[1]["category"], 99), kv[0])):
        row = [name, t["category"], t["main_metric"], "-" if t.get("n") is None else str(t["n"]), _fmt(t["main_score"])]
        if cmp:
            r = cmp["tasks"].get(name)
            row += [_fmt(r["baseline"]), _fmt_delta(r["delta"])] if r else ["-", "-"]
        rows.append(row)
    rows.append([])
    for cat, val in list(report["categories"].items()) + list(report.get("extra", {}).items()):
        n = sum(1 for t in report["tasks"].values() if t["category"] == cat)
        row = [f"{cat} mean", cat, "", str(n), _fmt(val)]
        if cmp:
            r = cmp["categories"].get(cat)
            row += [_fmt(r["baseline"]), _fmt_delta(r["delta"])] if r else ["-", "-"]
        rows.append(row)
    n_mteb = sum(1 for t in report["tasks"].values() if t["category"] in CATEGORIES)
    row = ["[bold]Average[/bold]", "MTEB-style", "mean over tasks", str(n_mteb), f"[bold]{_fmt(report.get('average'))}[/bold]"]
    if cmp:
        r = cmp["average"]
        row += [_fmt(r["baseline"]), _fmt_delta(r["delta"])] if r else ["-", "-"]
    rows.append(row)
    return title, header, rows


def report_notes(report: dict, baseline: dict | None = None) -> list[str]:
    """The lines printed under the table: skipped tasks and notes (the comparison's too)."""
    lines = [f"skipped {name}: {why}" for name, why in report.get("skipped", {}).items()]
    lines += [f"note: {note}" for note in report.get("notes", [])]
    if baseline is not None:
        lines += [f"note: {note}" for note in compare(report, baseline)["notes"]]
    return lines


def render_table(report: dict, baseline: dict | None = None):
    """A :class:`rich.table.Table` of :func:`table_rows`."""
    from rich.table import Table

    title, header, rows = table_rows(report, baseline)
    table = Table(title=title)
    for col in header:
        table.add_column(col, justify="right" if col in ("n", "score", "baseline", "delta") else "left")
    for row in rows:
        if row:
            table.add_row(*row)
        else:
            table.add_section()
    return table


def print_report(report: dict, baseline: dict | None = None, console=None) -> None:
    """Print :func:`render_table` plus skipped tasks and notes."""
    from rich.console import Console

    console = console or Console()
    if not report["tasks"]:
        console.print("evaluate: empty report - " + "; ".join(report.get("notes", [])))
        return
    console.print(render_table(report, baseline))
    for line in report_notes(report, baseline):
        console.print(line)
