"""Stage 3 — score: check the LLM's difficulty grading with a local embedder.

MGH's claim is that an LLM can order 4 negatives from hardest (level 1, most similar to the
query) to easiest (level 4). ``score`` measures that claim per example and flags negatives that
are really positives (false negatives) or too unrelated to teach anything (too easy).

In:  finished shards of the stages in ``score.inputs`` (default ``generate``, ``regenerate``;
     absent stages are skipped); config ``[score]`` and ``[embedder]``.
Out: ``RUN_DIR/score/``

* ``shard-XXXXX.jsonl`` — the input :class:`~negsynth.schemas.records.Example` records with
  ``score`` (:class:`~negsynth.schemas.records.ExampleScore`) filled in. Output shards
  **mirror the input shards one to one**, numbered in order over ``score.inputs`` then shard
  name: with generate shards 0..2 and regenerate shards 0..1, ``generate/shard-00001.jsonl``
  becomes ``score/shard-00001.jsonl`` and ``regenerate/shard-00000.jsonl`` becomes
  ``score/shard-00003.jsonl``. The mapping is in ``stats.json["inputs"]``.
* ``rejects/shard-XXXXX.jsonl`` — with ``policy = "filter"``: examples left with fewer than
  ``min_negatives`` negatives, as :class:`~negsynth.schemas.records.Reject` (reason =
  the flags that removed negatives, e.g. ``false_negative``; ``input`` = the scored example).
* ``_shards/XXXXX.json`` — per-shard measurements in the LLM's order (task types, cosines,
  flags, tau), from which ``stats.json`` is rebuilt on a resumed run.
* ``stats.json`` — see :func:`summarize`.

What is measured, per example, with unit vectors from the embedder (each distinct text embedded
once per block of ``block_examples`` examples; queries with the task instruction when
``embedder.instruct_queries``):

* ``cos_pos = cos(q, pos)``, ``cos_neg[i] = cos(q, neg_i)``, rounded to 6 decimals;
* ``kendall_tau``: Kendall's tau-b between the LLM's claimed ranks and the measured cosines
  (1.0 = the LLM's order is exactly the embedder's order, -1.0 = reversed);
* ``monotonic``: the cosines strictly decrease along the LLM's order;
* ``false_negative[i]``: ``cos_neg[i] >= fn_threshold(cos_pos, fn_ratio)`` — NV-Retriever's
  TopK-PercPos (``fn_ratio * cos_pos``; default 0.95);
* ``too_easy[i]``: ``cos_neg[i] < too_easy_floor``.

Policies: ``annotate`` writes the flags only; ``reorder`` sorts each example's negatives by
measured cosine (stable) and stores the LLM ranks in ``score.llm_order``; ``filter`` drops
negatives carrying a flag in ``filter_flags`` and sends an example left with fewer than
``min_negatives`` to ``rejects/``. The per-level statistics always describe the LLM's levels,
before any policy — they are MGH's Table 4 (0.881 > 0.857 > 0.845 > 0.793).

Rerun: a shard whose output exists is skipped; a rerun with a different config or changed
inputs is refused unless ``--overwrite`` (manifest config hash).
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from negsynth.data.clean import (
    Decontaminator,
    Deduplicator,
    EvalSetError,
    EvalTexts,
    eval_vectors,
    exact_key,
    load_eval_texts,
    pack_kept,
    quantize,
    unpack_kept,
)
from negsynth.data.readers import EvalDataError
from negsynth.data.shards import ShardError, atomic_write_bytes, atomic_write_json, atomic_write_text, iter_jsonl, list_shards, shard_name, write_jsonl
from negsynth.errors import UserError
from negsynth.pipeline.config_io import config_hash
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.manifest import check_and_record
from negsynth.schemas.config import ScoreConfig
from negsynth.schemas.records import Example
from negsynth.stages.common import inputs_fingerprint

STAGE = "score"
#: MGH Table 4: mean cos(q, neg) for levels 1..4 (their embedder, their data)
PAPER_TABLE4 = (0.881, 0.857, 0.845, 0.793)
FLAGS = ("false_negative", "too_easy")


# ---------------------------------------------------------------------------- measurement


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
    return {"cos_pos": cp, "cos_neg": cn, "false_negative": fn, "too_easy": easy, "tau": kendall_tau_claimed(cn), "monotonic": mono}


def drop_flags(cfg: ScoreConfig) -> list[str]:
    """The flags whose negatives a policy removes: ``filter_flags`` for ``filter``, ``measured_drop``
    for ``measured`` (false negatives only by default: a too-easy negative is harmless as level 4,
    a false negative teaches the model to push a right answer away)."""
    return list(cfg.measured_drop if cfg.policy == "measured" else cfg.filter_flags)


def apply_policy(row: dict, m: dict[str, Any], cfg: ScoreConfig, embedder: str) -> tuple[dict | None, dict | None]:
    """One example + its measurements (LLM order) -> (scored record, None) or (None, reject).

    ``m`` holds python values for this example: ``cos_pos`` float, ``cos_neg`` / ``false_negative``
    / ``too_easy`` lists, ``tau`` float or None, ``monotonic`` bool.
    """
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
        "kendall_tau": m["tau"],
        "monotonic": m["monotonic"],
        "false_negative": [m["false_negative"][i] for i in order],
        "too_easy": [m["too_easy"][i] for i in order],
        "policy": cfg.policy,
        "llm_order": order if cfg.policy != "annotate" else None,
    }
    out = dict(row)
    out["negatives"] = [row["negatives"][i] for i in order]
    out["score"] = score
    if cfg.easy_margin is not None and k:
        margin = m["cos_pos"] - max(m["cos_neg"])
        if margin > cfg.easy_margin:  # the embedder already ranks the positive far above every negative
            detail = f"cos_pos {m['cos_pos']:.3f} - hardest negative {max(m['cos_neg']):.3f} = {margin:.3f} > score.easy_margin={cfg.easy_margin}"
            return None, {"id": row["id"], "stage": STAGE, "reason": "easy_query", "detail": detail, "raw": None, "input": out, "usage": row.get("usage") or {}}
    if cfg.policy in ("filter", "measured") and len(order) < cfg.min_negatives:
        causes = sorted({f for f in drop_flags(cfg) for i in range(k) if i not in order and m[f][i]})
        reason = "+".join(causes) or "too_few_negatives"
        dropped = ", ".join(f"level {i + 1} ({'+'.join(f for f in FLAGS if m[f][i])}, cos {m['cos_neg'][i]:.3f})" for i in range(k) if i not in order)
        detail = f"{len(order)} of {k} negatives kept, score.min_negatives={cfg.min_negatives}; dropped: {dropped or 'none'}; cos_pos {m['cos_pos']:.3f}"
        reject = {"id": row["id"], "stage": STAGE, "reason": reason, "detail": detail, "raw": None, "input": out, "usage": row.get("usage") or {}}
        return None, reject
    return out, None


# ---------------------------------------------------------------------------- embedding


def _uses_base_formatting(embedder) -> bool:
    """True when queries are just ``format_query`` + ``encode`` (so queries and documents can share one pool)."""
    from negsynth.embed.base import Embedder

    t = type(embedder)
    return t.encode_queries is Embedder.encode_queries and t.encode_documents is Embedder.encode_documents


def embed_block(embedder, examples: list[dict], *, batch_size: int, reporter, label: str, raw: bool = False) -> tuple[np.ndarray, np.ndarray, dict]:
    """Embed the texts of ``examples``, each distinct text once -> (cos_pos [N], cos_neg list per example, info).

    Texts are sorted by length (longest first) once over the whole block and fed to the
    embedder in chunks of ``8 * batch_size`` (one progress step per chunk); the embedder's own
    per-call sort (sentence-transformers') then sees sorted input and changes nothing.

    ``raw``: also embed each query as written (as a document, no instruction; the same pool row
    when that is how queries are embedded anyway) and return ``info["pool"]`` = the pool texts,
    vectors and per-example rows (``q`` raw query, ``p`` positive, ``n`` negatives), for
    :mod:`negsynth.data.clean`.
    """
    shared = _uses_base_formatting(embedder)
    # pools: key -> row; a query key is its formatted text (shared pool) or ("q", text, task)
    doc_index: dict[Any, int] = {}
    q_index: dict[Any, int] = doc_index if shared else {}
    q_items: list[tuple[str, str | None]] = []  # (text, instruction) of pool rows that are queries (non-shared)
    pool_texts: list[str] = []
    is_query: list[bool] = []

    def add(key, text: str, query: bool, instr: str | None = None) -> int:
        idx = q_index if (query and not shared) else doc_index
        j = idx.get(key)
        if j is None:
            j = idx[key] = len(pool_texts)
            pool_texts.append(text)
            is_query.append(query and not shared)
            if query and not shared:
                q_items.append((text, instr))
        return j

    qi = np.empty(len(examples), dtype=np.int64)
    pi = np.empty(len(examples), dtype=np.int64)
    ni: list[list[int]] = []
    for e, ex in enumerate(examples):
        if shared:
            qt = embedder.format_query(ex["query"], ex.get("task"))
            qi[e] = add(qt, qt, True)
        else:
            qi[e] = add(("q", ex["query"], ex.get("task")), ex["query"], True, ex.get("task"))
        pi[e] = add(ex["positive"], ex["positive"], False)
        ni.append([add(n, n, False) for n in ex["negatives"]])
    qr = np.array([add(ex["query"], ex["query"], False) for ex in examples], dtype=np.int64) if raw else None
    n_texts = sum(2 + len(ex["negatives"]) for ex in examples)

    dim = embedder.dim
    vecs = np.zeros((len(pool_texts), dim), dtype=np.float32)
    instr_of = {}
    if not shared:
        # pool row -> instruction, for the query rows
        qrows = [j for j, q in enumerate(is_query) if q]
        instr_of = {j: q_items[n][1] for n, j in enumerate(qrows)}
    order = sorted(range(len(pool_texts)), key=lambda j: -len(pool_texts[j]))
    chunk = max(1, 8 * batch_size)
    t0 = time.perf_counter()
    with _progress(reporter, label, len(order)) as bar:
        for c0 in range(0, len(order), chunk):
            rows = order[c0 : c0 + chunk]
            if shared:
                vecs[rows] = embedder.encode([pool_texts[j] for j in rows], batch_size=batch_size)
            else:
                qrows = [j for j in rows if is_query[j]]
                drows = [j for j in rows if not is_query[j]]
                if qrows:
                    vecs[qrows] = embedder.encode_queries([pool_texts[j] for j in qrows], [instr_of[j] for j in qrows], batch_size=batch_size)
                if drows:
                    vecs[drows] = embedder.encode_documents([pool_texts[j] for j in drows], batch_size=batch_size)
            bar.update(advance=len(rows))
    embed_s = time.perf_counter() - t0

    cos_pos = np.einsum("nd,nd->n", vecs[qi], vecs[pi])
    cos_neg = [vecs[ni[e]] @ vecs[qi[e]] for e in range(len(examples))] if examples else []
    info: dict[str, Any] = {"texts": n_texts, "unique_texts": len(pool_texts), "embed_s": embed_s}
    if raw:
        info["pool"] = {"texts": pool_texts, "vecs": vecs, "q": qr, "p": pi, "n": ni}
    return cos_pos, cos_neg, info


@contextmanager
def _progress(reporter, label: str, total: int):
    """A texts-embedded progress bar on the reporter's console (silent with --quiet / --json)."""
    if reporter.quiet or total == 0:
        yield _NoBar()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    prog = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("texts"),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        console=reporter.console, refresh_per_second=4,
    )  # fmt: skip
    t0 = time.perf_counter()
    with prog:
        tid = prog.add_task(label, total=total, rate="")

        class Bar:
            done = 0

            def update(self, advance: int = 0) -> None:
                self.done += advance
                dt = time.perf_counter() - t0
                prog.update(tid, advance=advance, rate=f"{self.done / dt:.0f}/s" if dt > 0 else "")

        yield Bar()


class _NoBar:
    def update(self, advance: int = 0) -> None:
        pass


# ---------------------------------------------------------------------------- inputs


def input_shards(ctx: StageContext) -> list[tuple[str, Path]]:
    """(stage, shard path) of every finished input shard, in output order; one-line error if none."""
    out: list[tuple[str, Path]] = []
    for st in ctx.cfg.score.inputs:
        folder = ctx.run_dir / st
        shards = list_shards(folder)
        out += [(st, p) for p in shards]
        if folder.is_dir() and any(folder.glob("shard-*.jsonl.partial")):
            ctx.reporter.warn(f"{folder} has unfinished shards (.partial); score covers its finished shards only")
    if not out:
        where = " or ".join(str(ctx.run_dir / s) for s in ctx.cfg.score.inputs)
        raise UserError(f"no finished shards in {where}; run `negsynth generate` first (or set score.inputs)")
    return out


def read_examples(path: Path) -> list[dict]:
    """The records of one input shard, checked against :class:`Example` (one-line error naming the record)."""
    rows: list[dict] = []
    try:
        for n, row in enumerate(iter_jsonl(path), start=1):
            try:
                Example.model_validate(row)
            except ValidationError as e:
                err = e.errors()[0]
                loc = ".".join(str(x) for x in err["loc"]) or "record"
                raise UserError(f"{path}: record {n} is not an Example ({loc}: {err['msg']}); rerun the stage that wrote it with --overwrite") from None
            row = dict(row)
            row.pop("score", None)
            rows.append(row)
    except ShardError as e:
        raise UserError(str(e)) from None
    return rows


def embedder_fingerprint(cfg) -> dict:
    """The embedder settings that change cosines (device and batch size do not, beyond float noise)."""
    return cfg.model_dump(mode="json", exclude={"device", "batch_size"})


def stage_hash(ctx: StageContext, shards: list[tuple[str, Path]], eval_fingerprint: str | None = None) -> str:
    """Config + embedder + inputs (+ the evaluation texts decontaminated against, when any)."""
    parts: dict[str, Any] = {
        "score": ctx.cfg.score.model_dump(mode="json", exclude={"block_examples", "decontam_data_dir"}),
        "embedder": embedder_fingerprint(ctx.cfg.embedder),
        "inputs": {st: inputs_fingerprint(ctx.run_dir, st) for st in dict.fromkeys(s for s, _ in shards)},
    }
    if eval_fingerprint is not None:
        parts["decontam"] = eval_fingerprint
    return config_hash(parts)


def decontam_data_dir(ctx: StageContext) -> Path | None:
    """``score.decontam_data_dir``, else ``evaluate.data_dir``, else what ``negsynth evaluate`` uses by default."""
    d = ctx.cfg.score.decontam_data_dir or ctx.cfg.evaluate.data_dir
    if d:
        return Path(d)
    from negsynth.resources import default_data_dir

    return default_data_dir()


def load_decontam_texts(ctx: StageContext) -> EvalTexts:
    """The evaluation texts of ``score.decontam_sets`` (``skipped`` says why there are none)."""
    cfg = ctx.cfg.score
    try:
        return load_eval_texts(decontam_data_dir(ctx), cfg.decontam_sets, cfg.decontam_retrieval_docs)
    except (EvalSetError, EvalDataError) as e:
        raise UserError(str(e)) from None


# ---------------------------------------------------------------------------- statistics


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def summarize(sidecars: list[dict], cfg: ScoreConfig) -> dict[str, Any]:
    """Statistics over all scored examples, per LLM level (before any policy).

    Keys: ``examples``; ``cos_pos`` {mean, median}; ``levels``: one entry per level with ``n``,
    ``mean``, ``median``, ``gap_to_pos`` (mean cos_pos - mean cos_neg), ``fn_rate``,
    ``too_easy_rate`` and ``paper_mean`` (MGH Table 4); ``levels_decreasing`` (the means fall
    strictly from level 1 to 4, MGH's claim); ``monotonic_pct``; ``kendall_tau_mean``;
    ``tau_undefined``; ``fn_rate`` / ``too_easy_rate`` over all negatives; ``by_task_type``.
    """
    task_types: list[str] = []
    cos_pos: list[float] = []
    per_level: dict[int, dict[str, list]] = defaultdict(lambda: {"cos": [], "fn": [], "easy": [], "tt": []})
    taus: list[float] = []
    mono: list[bool] = []
    for sc in sidecars:
        task_types += sc["task_type"]
        cos_pos += sc["cos_pos"]
        taus += [t if t is not None else np.nan for t in sc["tau"]]
        mono += sc["monotonic"]
        for tt, cn, fn, ez in zip(sc["task_type"], sc["cos_neg"], sc["false_negative"], sc["too_easy"], strict=True):
            for lv, (c, f, z) in enumerate(zip(cn, fn, ez, strict=True), start=1):
                d = per_level[lv]
                d["cos"].append(c)
                d["fn"].append(f)
                d["easy"].append(z)
                d["tt"].append(tt)
    n = len(cos_pos)
    cp = np.asarray(cos_pos, dtype=np.float64)
    tau = np.asarray(taus, dtype=np.float64)
    levels = []
    for lv in sorted(per_level):
        d = per_level[lv]
        c = np.asarray(d["cos"], dtype=np.float64)
        levels.append(
            {
                "level": lv,
                "n": int(len(c)),
                "mean": _r(c.mean()),
                "median": _r(np.median(c)),
                "gap_to_pos": _r(cp.mean() - c.mean()) if n else None,
                "fn_rate": _r(np.mean(d["fn"])),
                "too_easy_rate": _r(np.mean(d["easy"])),
                "paper_mean": PAPER_TABLE4[lv - 1] if lv <= len(PAPER_TABLE4) else None,
            }
        )
    means = [lv["mean"] for lv in levels]
    by_tt: dict[str, Any] = {}
    tts = np.asarray(task_types)
    for tt in sorted(set(task_types)):
        sel = tts == tt
        lv_stats = {}
        for lv in sorted(per_level):
            d = per_level[lv]
            m = np.asarray(d["tt"]) == tt
            if m.any():
                lv_stats[str(lv)] = {
                    "mean": _r(np.asarray(d["cos"])[m].mean()),
                    "fn_rate": _r(np.asarray(d["fn"])[m].mean()),
                    "too_easy_rate": _r(np.asarray(d["easy"])[m].mean()),
                }
        all_fn = [f for lv in per_level.values() for f, t in zip(lv["fn"], lv["tt"]) if t == tt]
        by_tt[tt] = {
            "examples": int(sel.sum()),
            "cos_pos_mean": _r(cp[sel].mean()),
            "monotonic_pct": _r(100 * np.mean(np.asarray(mono)[sel]), 2),
            "kendall_tau_mean": _r(np.nanmean(tau[sel])) if np.isfinite(tau[sel]).any() else None,
            "fn_rate": _r(np.mean(all_fn)) if all_fn else None,
            "levels": lv_stats,
        }
    all_fn = [f for d in per_level.values() for f in d["fn"]]
    all_easy = [z for d in per_level.values() for z in d["easy"]]
    return {
        "examples": n,
        "cos_pos": {"mean": _r(cp.mean()) if n else None, "median": _r(np.median(cp)) if n else None},
        "levels": levels,
        "levels_decreasing": bool(len(means) > 1 and all(a is not None and b is not None and a > b for a, b in zip(means, means[1:]))),
        "monotonic_pct": _r(100 * np.mean(mono), 2) if n else None,
        "kendall_tau_mean": _r(np.nanmean(tau)) if np.isfinite(tau).any() else None,
        "tau_undefined": int(np.isnan(tau).sum()),
        "fn_rate": _r(np.mean(all_fn)) if all_fn else None,
        "too_easy_rate": _r(np.mean(all_easy)) if all_easy else None,
        "by_task_type": by_tt,
    }


def table_rows(stats: dict) -> list[tuple]:
    """The per-level table: positive first, then levels 1..4 against MGH Table 4."""
    pos = stats["cos_pos"]
    rows: list[tuple] = [("positive", stats["examples"], _f(pos["mean"]), _f(pos["median"]), "", "", "", "")]
    for lv in stats["levels"]:
        rows.append(
            (
                f"level {lv['level']}",
                lv["n"],
                _f(lv["mean"]),
                _f(lv["median"]),
                _f(lv["gap_to_pos"]),
                _pct(lv["fn_rate"]),
                _pct(lv["too_easy_rate"]),
                _f(lv["paper_mean"], 3),
            )
        )
    return rows


TABLE_HEADER = ("cos(q, ·)", "n", "mean", "median", "pos-mean", "false neg", "too easy", "MGH T4")


def _f(x, nd: int = 4) -> str:
    return "" if x is None else f"{x:.{nd}f}"


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def print_summary(ctx: StageContext, stats: dict) -> None:
    rep = ctx.reporter
    rep.table(f"score: by LLM level ({stats['embedder']})", table_rows(stats), TABLE_HEADER)
    tp = stats.get("throughput") or {}
    rows = [
        ("examples scored / kept / rejected", f"{stats['examples']} / {stats['kept']} / {stats['rejected']}"),
        ("levels decreasing (MGH claim)", "yes" if stats["levels_decreasing"] else "no"),
        ("monotonic examples", f"{_f(stats['monotonic_pct'], 1)}%"),
        ("mean Kendall tau", _f(stats["kendall_tau_mean"], 3)),
        ("policy", stats["policy"]),
    ]
    for reason, k in stats["rejects_by_reason"].items():
        rows.append((f"  rejected: {reason}", str(k)))
    rows += clean_rows(stats)
    if tp.get("examples"):
        rows.append(("throughput (this run)", f"{tp['examples_per_s']:.1f} examples/s, {tp['texts_per_s']:.1f} texts/s ({tp['unique_texts']} unique of {tp['texts']})"))
    rep.table("score", rows)


def clean_rows(stats: dict) -> list[tuple[str, str]]:
    """Summary rows for the cleaning checks (also used by ``negsynth inspect``)."""
    cl = stats.get("clean")
    if not cl:
        return []
    if cl["dedup"]:
        how = f"query and positive cos >= {cl['dedup_threshold']}" if cl["dedup_threshold"] is not None else "exact only"
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


# ---------------------------------------------------------------------------- the stage


def _sidecar_path(ctx: StageContext, k: int) -> Path:
    return ctx.stage_dir(STAGE) / "_shards" / f"{k:05d}.json"


def _load_sidecar(ctx: StageContext, k: int) -> dict:
    p = _sidecar_path(ctx, k)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        raise UserError(f"{p}: missing or unreadable (needed for stats.json); rerun `negsynth score --overwrite`") from None


def run(ctx: StageContext, embedder=None) -> dict:
    """Score every input example; return the stats (also in ``score/stats.json``).

    ``embedder``: an :class:`~negsynth.embed.base.Embedder` to use instead of loading
    ``[embedder]`` (tests pass a fake; Python users can pass one they already hold).
    """
    t_start = time.perf_counter()
    cfg = ctx.cfg.score
    shards = input_shards(ctx)
    ev = load_decontam_texts(ctx)
    h = stage_hash(ctx, shards, ev.fingerprint() if ev.texts else None)
    out_dir = ctx.stage_dir(STAGE)
    stats_path = out_dir / "stats.json"
    check_and_record(ctx.run_dir, STAGE, {"config_hash": h, "shard_size": None, "num_shards": 1, "inputs": len(shards)}, overwrite=ctx.overwrite)
    todo = [k for k in range(len(shards)) if not (out_dir / shard_name(k)).exists()]
    if todo and cfg.dedup:
        # a shard's duplicates depend on every earlier shard: redo everything from the first missing one
        redo = [k for k in range(todo[0], len(shards)) if k not in todo]
        if redo:
            ctx.reporter.info(f"score: {len(redo)} finished shard(s) after the first missing one are redone (dedup runs in input order)")
        todo = list(range(todo[0], len(shards)))
    if not todo and stats_path.exists():
        stats = json.loads(stats_path.read_text(encoding="utf-8"))
        if stats.get("config_hash") == h and stats.get("complete"):
            ctx.reporter.info(f"score: up to date ({len(shards)} shards); --overwrite recomputes")
            print_summary(ctx, stats)
            return stats

    emb = embedder
    this_run = Counter()
    if todo:
        if emb is None:
            from negsynth.embed import load_embedder

            ctx.reporter.info(f"score: loading embedder ({ctx.cfg.embedder.kind}: {ctx.cfg.embedder.model}) ...")
            emb = load_embedder(ctx.cfg.embedder)
        bs = ctx.cfg.embedder.batch_size
        cleaner = _Cleaner(ctx, emb, ev, first=todo[0], batch_size=bs)
        # group consecutive shards into blocks of ~block_examples examples (dedupe scope)
        blocks: list[list[tuple[int, list[dict]]]] = [[]]
        size = 0
        for k in todo:
            rows = read_examples(shards[k][1])
            if blocks[-1] and size + len(rows) > cfg.block_examples:
                _score_block(ctx, emb, blocks[-1], bs, this_run, len(blocks), cleaner)
                blocks.append([])
                size = 0
            blocks[-1].append((k, rows))
            size += len(rows)
        if blocks[-1]:
            _score_block(ctx, emb, blocks[-1], bs, this_run, len(blocks), cleaner)

    sidecars = [_load_sidecar(ctx, k) for k in range(len(shards))]
    stats: dict[str, Any] = {
        "stage": STAGE,
        "embedder": (emb.name if emb is not None else next((s["embedder"] for s in sidecars if s.get("embedder")), "?")),
        "policy": cfg.policy,
        "fn_ratio": cfg.fn_ratio,
        "too_easy_floor": cfg.too_easy_floor,
        **summarize(sidecars, cfg),
        "input_examples": sum(s.get("examples", len(s["cos_pos"])) for s in sidecars),
        "clean": clean_stats(ctx, sidecars, ev),
        "kept": sum(s["kept"] for s in sidecars),
        "rejected": sum(s["rejected"] for s in sidecars),
        "rejects_by_reason": dict(sum((Counter(s["reasons"]) for s in sidecars), Counter()).most_common()),
        "negatives_dropped": sum(s["negatives_dropped"] for s in sidecars),
        "reordered": sum(s["reordered"] for s in sidecars),
        "paper_table4": list(PAPER_TABLE4),
        "inputs": [{"stage": st, "shard": p.name, "out": shard_name(k), "examples": sidecars[k].get("examples", len(sidecars[k]["cos_pos"]))} for k, (st, p) in enumerate(shards)],
        "shards_scored_this_run": len(todo),
        "throughput": _throughput(this_run, emb),
        "config_hash": h,
        "complete": True,
        "wall_time_s": round(time.perf_counter() - t_start, 3),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(stats_path, stats)
    print_summary(ctx, stats)
    return stats


def _throughput(c: Counter, emb) -> dict:
    if not c.get("examples"):
        return {"examples": 0}
    return {
        "examples": c["examples"],
        "texts": c["texts"],
        "unique_texts": c["unique_texts"],
        "embed_s": round(c["embed_s"], 3),
        "total_s": round(c["total_s"], 3),
        "examples_per_s": round(c["examples"] / max(c["total_s"], 1e-9), 2),
        "texts_per_s": round(c["texts"] / max(c["embed_s"], 1e-9), 2),
        "unique_texts_per_s": round(c["unique_texts"] / max(c["embed_s"], 1e-9), 2),
        "device": getattr(emb, "device", "?") if emb is not None else "?",
    }


def _kept_path(ctx: StageContext, k: int) -> Path:
    return ctx.stage_dir(STAGE) / "_shards" / f"{k:05d}.kept.npy"


class _Cleaner:
    """This run's near-duplicate and contamination checks; the dedup state of the shards before
    ``first`` is rebuilt from their ``_shards/XXXXX.kept.npy`` (what a resumed run needs)."""

    def __init__(self, ctx: StageContext, emb, ev: EvalTexts, *, first: int, batch_size: int):
        cfg = ctx.cfg.score
        self.dedup: Deduplicator | None = None
        if cfg.dedup:
            self.dedup = Deduplicator(cfg.dedup_threshold, emb.dim)
            for k in range(first):
                p = _kept_path(ctx, k)
                try:
                    ids, keys, q, pv = unpack_kept(p)
                except (OSError, ValueError, KeyError):
                    raise UserError(f"{p}: missing or unreadable (needed to resume near-duplicate removal); rerun `negsynth score --overwrite`") from None
                if self.dedup.uses_vectors and q is None:
                    raise UserError(f"{p}: holds no vectors (written without score.dedup_threshold); rerun `negsynth score --overwrite`")
                self.dedup.add(ids, keys, q if self.dedup.uses_vectors else None, pv if self.dedup.uses_vectors else None)
        self.decontam: Decontaminator | None = None
        if ev.texts:
            vecs = None
            if cfg.decontam_threshold is not None:
                vecs, _ = eval_vectors(
                    emb, ev, ctx.run_dir / "cache", embedder_fingerprint(ctx.cfg.embedder), batch_size=batch_size,
                    progress=lambda label, total: _progress(ctx.reporter, label, total),
                )  # fmt: skip
            self.decontam = Decontaminator(ev, cfg.decontam_threshold, vecs)
        elif ev.skipped and cfg.decontam_sets != []:
            ctx.reporter.warn(f"score: decontamination skipped: {ev.skipped}")

    @property
    def needs_vectors(self) -> bool:
        return bool((self.dedup is not None and self.dedup.uses_vectors) or (self.decontam is not None and self.decontam.uses_vectors))

    def contamination(self, examples: list[dict], pool: dict | None, vecs16: np.ndarray | None) -> list[tuple[str, str] | None]:
        """Per example: ``(eval set, detail)`` of its first text (query, positive, negatives) matching an evaluation text."""
        out: list[tuple[str, str] | None] = [None] * len(examples)
        dc = self.decontam
        if dc is None:
            return out
        if pool is not None:
            rows = sorted({int(r) for r in pool["q"]} | {int(r) for r in pool["p"]} | {int(r) for ns in pool["n"] for r in ns})
            found = dict(zip(rows, dc.match([pool["texts"][r] for r in rows], vecs16[rows]), strict=True))

            def roles(e: int) -> list[tuple[str, Any]]:
                return [("query", int(pool["q"][e])), ("positive", int(pool["p"][e]))] + [(f"negative {i + 1}", int(r)) for i, r in enumerate(pool["n"][e])]
        else:
            distinct = list(dict.fromkeys(t for ex in examples for t in (ex["query"], ex["positive"], *ex["negatives"])))
            found = dict(zip(distinct, dc.match(distinct, None), strict=True))

            def roles(e: int) -> list[tuple[str, Any]]:
                ex = examples[e]
                return [("query", ex["query"]), ("positive", ex["positive"])] + [(f"negative {i + 1}", t) for i, t in enumerate(ex["negatives"])]

        for e in range(len(examples)):
            for role, key in roles(e):
                m = found[key]
                if m is not None:
                    set_name, where = dc.describe(m)
                    out[e] = (set_name, f"{role} matches {where}")
                    break
        return out


def clean_stats(ctx: StageContext, sidecars: list[dict], ev: EvalTexts) -> dict[str, Any]:
    """The ``clean`` block of stats.json: thresholds used and what each check dropped."""
    cfg = ctx.cfg.score
    c: Counter = Counter()
    by_set: Counter = Counter()
    for sc in sidecars:
        cl = sc.get("cleaned") or {}
        c.update({k: cl.get(k, 0) for k in ("near_duplicate", "near_duplicate_exact", "contaminated")})
        by_set.update(cl.get("contaminated_by_set") or {})
    return {
        "dedup": cfg.dedup,
        "dedup_threshold": cfg.dedup_threshold if cfg.dedup else None,
        "near_duplicate": c["near_duplicate"],
        "near_duplicate_exact": c["near_duplicate_exact"],
        "decontam_sets": cfg.decontam_sets,
        "decontam_threshold": cfg.decontam_threshold if ev.texts else None,
        "decontam_retrieval_docs": cfg.decontam_retrieval_docs,
        "decontam_data_dir": str(ev.data_dir) if ev.data_dir is not None else None,
        "decontam_skipped": None if ev.texts else ev.skipped,
        "eval_texts": len(ev.texts),
        "eval_sets": dict(ev.per_set),
        "contaminated": c["contaminated"],
        "contaminated_by_set": dict(sorted(by_set.items())),
    }


def _reject(row: dict, reason: str, detail: str) -> dict:
    return {"id": row["id"], "stage": STAGE, "reason": reason, "detail": detail, "raw": None, "input": row, "usage": row.get("usage") or {}}


def _score_block(ctx: StageContext, emb, block: list[tuple[int, list[dict]]], batch_size: int, this_run: Counter, nblock: int, cleaner: _Cleaner) -> None:
    """Embed one block of input shards together, clean, then write each shard's outputs.

    Per example, in input order: contaminated -> dropped; else the policy; an example the policy
    keeps is then checked against the examples kept so far (earlier shards and blocks included)
    and dropped as a near-duplicate or added to them. Only examples that end in an output shard
    count as kept, so a duplicate of an example the policy rejected still gets its chance.
    """
    t0 = time.perf_counter()
    cfg = ctx.cfg.score
    examples = [r for _, rows in block for r in rows]
    cos_pos, cos_neg, info = embed_block(
        emb, examples, batch_size=batch_size, reporter=ctx.reporter, label=f"score: embedding (block {nblock})", raw=cleaner.needs_vectors
    )
    pool = info.get("pool")
    vecs16 = quantize(pool["vecs"]) if pool is not None else None
    # measure per negative count (normally all 4)
    by_k: dict[int, list[int]] = defaultdict(list)
    for e, cn in enumerate(cos_neg):
        by_k[len(cn)].append(e)
    per_ex: list[dict] = [None] * len(examples)  # type: ignore[list-item]
    for k, idx in by_k.items():
        m = measure(cos_pos[idx], np.stack([cos_neg[e] for e in idx]) if k else np.zeros((len(idx), 0)), cfg)
        for r, e in enumerate(idx):
            tau = m["tau"][r]
            per_ex[e] = {
                "cos_pos": float(m["cos_pos"][r]),
                "cos_neg": [float(x) for x in m["cos_neg"][r]],
                "false_negative": [bool(x) for x in m["false_negative"][r]],
                "too_easy": [bool(x) for x in m["too_easy"][r]],
                "tau": None if np.isnan(tau) else round(float(tau), 6),
                "monotonic": bool(m["monotonic"][r]),
            }
    contam = cleaner.contamination(examples, pool, vecs16)
    policy = [None if contam[e] else apply_policy(row, per_ex[e], cfg, emb.name) for e, row in enumerate(examples)]
    dups: dict[int, Any] = {}
    keys: dict[int, bytes] = {}
    if cleaner.dedup is not None:
        cand = [e for e in range(len(examples)) if policy[e] is not None and policy[e][0] is not None]
        keys = {e: exact_key(examples[e]["query"], examples[e]["positive"]) for e in cand}
        qv = vecs16[pool["q"][cand]] if cleaner.dedup.uses_vectors else None
        pv = vecs16[pool["p"][cand]] if cleaner.dedup.uses_vectors else None
        found = cleaner.dedup.check_block([examples[e]["id"] for e in cand], [keys[e] for e in cand], qv, pv)
        dups = {e: d for e, d in zip(cand, found, strict=True) if d is not None}
    out_dir = ctx.stage_dir(STAGE)
    e0 = 0
    for k, rows in block:
        records, rejects = [], []
        reasons: Counter = Counter()
        cleaned: Counter = Counter()
        by_set: Counter = Counter()
        scored: list[int] = []  # examples that stay in the statistics (not cleaned out)
        kept: list[int] = []
        dropped = reordered = 0
        for e in range(e0, e0 + len(rows)):
            row = examples[e]
            if contam[e] is not None:
                set_name, detail = contam[e]
                rejects.append(_reject(row, "contaminated", detail))
                cleaned["contaminated"] += 1
                by_set[set_name] += 1
                continue
            rec, rej = policy[e]
            if e in dups:
                d = dups[e]
                rejects.append(_reject(rec, "near_duplicate", d.detail()))
                cleaned["near_duplicate"] += 1
                cleaned["near_duplicate_exact"] += int(d.cos_query is None)
                continue
            scored.append(e)
            sc = rec if rec is not None else rej["input"]
            dropped += len(row["negatives"]) - len(sc["negatives"])
            reordered += int(cfg.policy == "reorder" and sc["score"]["llm_order"] != sorted(sc["score"]["llm_order"]))
            if rec is not None:
                records.append(rec)
                kept.append(e)
            else:
                rejects.append(rej)
        for r in rejects:
            reasons[r["reason"]] += 1
        e0 += len(rows)
        ms = [per_ex[e] for e in scored]
        sidecar = {
            "embedder": emb.name,
            "examples": len(rows),
            "task_type": [examples[e]["task_type"] for e in scored],
            "cos_pos": [m["cos_pos"] for m in ms],
            "cos_neg": [m["cos_neg"] for m in ms],
            "false_negative": [m["false_negative"] for m in ms],
            "too_easy": [m["too_easy"] for m in ms],
            "tau": [m["tau"] for m in ms],
            "monotonic": [m["monotonic"] for m in ms],
            "kept": len(records),
            "rejected": len(rejects),
            "reasons": dict(reasons),
            "negatives_dropped": dropped,
            "reordered": reordered,
            "cleaned": {**{k2: cleaned[k2] for k2 in ("near_duplicate", "near_duplicate_exact", "contaminated")}, "contaminated_by_set": dict(sorted(by_set.items()))},
        }
        atomic_write_text(_sidecar_path(ctx, k), json.dumps(sidecar, separators=(",", ":")) + "\n")
        if cleaner.dedup is not None:
            uv = cleaner.dedup.uses_vectors
            atomic_write_bytes(
                _kept_path(ctx, k),
                pack_kept(
                    [examples[e]["id"] for e in kept], [keys[e] for e in kept],
                    vecs16[pool["q"][kept]] if uv else None, vecs16[pool["p"][kept]] if uv else None,
                ),
            )  # fmt: skip
        write_jsonl(out_dir / "rejects" / shard_name(k), rejects)
        write_jsonl(out_dir / shard_name(k), records)  # its presence marks the shard done: written last
    this_run["examples"] += len(examples)
    this_run["texts"] += info["texts"]
    this_run["unique_texts"] += info["unique_texts"]
    this_run["embed_s"] += info["embed_s"]
    this_run["total_s"] += time.perf_counter() - t0
