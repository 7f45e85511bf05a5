"""The score stage: embed, measure, clean and write each shard; resume by shard."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from negsynth.data.clean import Decontaminator, Deduplicator, EvalTexts, eval_vectors, exact_key, pack_kept, quantize, unpack_kept
from negsynth.data.shards import atomic_write_bytes, atomic_write_text, shard_name, write_jsonl
from negsynth.embed.base import encode_parts
from negsynth.errors import UserError
from negsynth.pipeline import Stage, StageContext
from negsynth.schemas.config import ScoreConfig
from negsynth.schemas.records import SYNTHETIC_SOURCE, Example
from negsynth.stages.score.embedding import embed_block
from negsynth.stages.score.inputs import embedder_fingerprint, input_shards, input_stages, load_decontam_texts, read_examples, scores_hash
from negsynth.stages.score.measure import NAME, PAPER_TABLE4, apply_policy, fn_threshold, measure_examples
from negsynth.stages.score.shard import ShardOutcome
from negsynth.stages.score.stats import level_stats, negatives_frame, report


def _sidecar_path(ctx: StageContext, k: int) -> Path:
    return ctx.run_dir / NAME / "_shards" / f"{k:05d}.json"


def _load_sidecar(ctx: StageContext, k: int) -> dict:
    p = _sidecar_path(ctx, k)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        raise UserError(f"{p}: missing or unreadable (needed for stats.json); rerun `negsynth score --overwrite`") from None


def run(ctx: StageContext) -> dict:
    """Score every input example; return the stats. ``ctx.judge``: anything with ``name`` and
    ``score_examples`` (a :class:`~negsynth.embed.cross_encoder.CrossEncoderJudge`) instead of
    loading ``score.judge_model``."""
    t_start = time.perf_counter()
    cfg = ctx.cfg.score
    shards = input_shards(ctx)
    ev = load_decontam_texts(ctx)
    h = scores_hash(ctx, shards, ev.fingerprint() if ev.texts else None)
    out_dir = ctx.run_dir / NAME
    todo = [k for k in range(len(shards)) if not (out_dir / shard_name(k)).exists()]
    if todo and cfg.dedup:
        # a shard's duplicates depend on every earlier shard: redo everything from the first missing one
        redo = [k for k in range(todo[0], len(shards)) if k not in todo]
        if redo:
            ctx.reporter.info(f"score: {len(redo)} finished shard(s) after the first missing one are redone (dedup runs in input order)")
        todo = list(range(todo[0], len(shards)))
    blocks = plan_blocks([p for _, p in shards], cfg.block_examples) if todo else []
    emb, judge = ctx.embedder, ctx.judge
    this_run = Counter()
    if todo:
        if emb is None:
            ctx.reporter.info(f"score: loading embedder ({ctx.cfg.embedder.kind}: {ctx.cfg.embedder.model}) ...")
            emb = ctx.load_embedder()
        if judge is None and cfg.judge_model is not None:
            from negsynth.embed.cross_encoder import CrossEncoderJudge

            ctx.reporter.info(f"score: loading the false-negative judge ({cfg.judge_model}) ...")
            judge = CrossEncoderJudge.load(cfg.judge_model, device=ctx.cfg.embedder.device, batch_size=cfg.judge_batch_size)
        _score_shards(ctx, emb, shards, blocks, todo, this_run, ev, judge)
    return _finish(ctx, t_start, h, emb, shards, todo, this_run, ev)


def plan_blocks(paths: list[Path], block_examples: int) -> list[list[int]]:
    """The input shards grouped into consecutive blocks of ~``block_examples`` examples, from
    shard 0 whatever is already scored: a block is the unit of embedding (its texts are sorted
    and batched together), so fixing the blocks fixes every batch, and a resumed run embeds each
    text in the same batch as an uninterrupted one, to the same bits."""
    blocks: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for k, p in enumerate(paths):
        with open(p, "rb") as f:  # its records: non-blank lines, not parsed
            n = sum(1 for line in f if line.strip())
        if cur and size + n > block_examples:
            blocks.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += n
    if cur:
        blocks.append(cur)
    return blocks


def _score_shards(
    ctx: StageContext, emb, shards, blocks: list[list[int]], todo: list[int], this_run: Counter, ev: EvalTexts, judge=None
) -> None:
    """Score the shards in ``todo``: every block holding one is embedded whole (finished shards
    in it are recomputed, not rewritten), so its batches are those of an uninterrupted run."""
    bs = ctx.cfg.embedder.batch_size
    want = set(todo)
    run_blocks = [b for b in blocks if want.intersection(b)]
    first = run_blocks[0][0]
    if first < todo[0]:
        ctx.reporter.info(f"score: {todo[0] - first} finished shard(s) embedded again with the block they belong to (not rewritten)")
    cleaner = _Cleaner(ctx, emb, ev, first=first, batch_size=bs)
    try:
        # only the current block's examples are held, never the run's
        for nblock, b in enumerate(run_blocks, start=1):
            block = [(k, read_examples(shards[k][1])) for k in b]
            _score_block(ctx, emb, block, bs, this_run, nblock, cleaner, judge, write=want)
    finally:
        if cleaner.dedup is not None:
            cleaner.dedup.close()


def _finish(ctx: StageContext, t_start: float, h: str, emb, shards, todo: list[int], this_run: Counter, ev: EvalTexts) -> dict:
    """The stage's stats over every shard (this run's and earlier ones)."""
    cfg = ctx.cfg.score
    done = range(len(shards))
    sidecars = [_load_sidecar(ctx, k) for k in done]
    stats: dict[str, Any] = {
        "stage": NAME,
        "embedder": (emb.name if emb is not None else next((s["embedder"] for s in sidecars if s.get("embedder")), "?")),
        "policy": cfg.policy,
        "fn_ratio": cfg.fn_ratio,
        "too_easy_floor": cfg.too_easy_floor,
        **level_stats(negatives_frame(sidecars)),  # every scored example, before any policy
        "input_examples": sum(s.get("examples", len(s["cos_pos"])) for s in sidecars),
        "clean": clean_stats(ctx, sidecars, ev),
        "kept": sum(s["kept"] for s in sidecars),
        "rejected": sum(s["rejected"] for s in sidecars),
        "rejects_by_reason": dict(sum((Counter(s["reasons"]) for s in sidecars), Counter()).most_common()),
        "negatives_dropped": sum(s["negatives_dropped"] for s in sidecars),
        "judge": _judge_stats(cfg, sidecars),
        "reordered": sum(s["reordered"] for s in sidecars),
        # every scored example's negatives were mined: their levels are a retriever's rank bands,
        # not an LLM's grading (sidecars from before this count read as not mined)
        "negatives_mined": bool(sidecars)
        and all(s.get("mined", -1) == len(s["cos_pos"]) for s in sidecars)
        and any(s["cos_pos"] for s in sidecars),
        "paper_table4": list(PAPER_TABLE4),
        "inputs": [
            {"stage": shards[k][0], "shard": shards[k][1].name, "out": shard_name(k), "examples": sc.get("examples", len(sc["cos_pos"]))}
            for k, sc in zip(done, sidecars, strict=True)
        ],
        "shards_scored_this_run": len(todo),
        "throughput": _throughput(this_run, emb),
        "config_hash": h,
        "complete": True,
        "stopped_by": None,
        "wall_time_s": round(time.perf_counter() - t_start, 3),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return stats


def _judge_stats(cfg, sidecars: list[dict]) -> dict | None:
    """What the false-negative judge flagged: all negatives it called false, and those the
    embedder's cosine rule had let through (its own contribution)."""
    if cfg.judge_model is None and not any("judged_false_negative" in s for s in sidecars):
        return None
    judged = flagged = only = 0
    for sc in sidecars:
        for j, cp, cn in zip(sc.get("judged_false_negative") or [], sc["cos_pos"], sc["cos_neg"], strict=False):
            if j is None:  # a contaminated example: not judged
                continue
            judged += len(j)
            flagged += sum(j)
            thr = float(fn_threshold(cp, cfg.fn_ratio))
            only += sum(v and not c >= thr for v, c in zip(j, cn, strict=True))
    return {"model": cfg.judge_model, "ratio": cfg.judge_ratio, "negatives": judged, "false_negatives": flagged, "only_by_judge": only}


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
        **({"judge_pairs": c["judge_pairs"], "judge_s": round(c["judge_s"], 3)} if c.get("judge_pairs") else {}),
    }


def _kept_path(ctx: StageContext, k: int) -> Path:
    return ctx.run_dir / NAME / "_shards" / f"{k:05d}.kept.npy"


class _Cleaner:
    """This run's near-duplicate and contamination checks; the dedup state of the shards before
    ``first`` is rebuilt from their ``_shards/XXXXX.kept.npy`` (what a resumed run needs)."""

    def __init__(self, ctx: StageContext, emb, ev: EvalTexts, *, first: int, batch_size: int):
        cfg = ctx.cfg.score
        self.dedup: Deduplicator | None = None
        if cfg.dedup:
            # kept vectors beyond the first 64k go to a file there, removed when the stage ends
            self.dedup = Deduplicator(cfg.dedup_threshold, emb.dim, spill_dir=ctx.run_dir / NAME / "_dedup")
            for k in range(first):
                p = _kept_path(ctx, k)
                try:
                    ids, keys, q, pv = unpack_kept(p)
                except (OSError, ValueError, KeyError):
                    raise UserError(
                        f"{p}: missing or unreadable (needed to resume near-duplicate removal); rerun `negsynth score --overwrite`"
                    ) from None
                if self.dedup.uses_vectors and q is None:
                    raise UserError(f"{p}: holds no vectors (written without score.dedup_threshold); rerun `negsynth score --overwrite`")
                self.dedup.add(ids, keys, q if self.dedup.uses_vectors else None, pv if self.dedup.uses_vectors else None)
        self.decontam: Decontaminator | None = None
        if ev.texts:
            vecs = None
            if cfg.decontam_threshold is not None:
                vecs, _ = eval_vectors(
                    emb,
                    ev,
                    ctx.run_dir / "cache",
                    embedder_fingerprint(ctx.cfg.embedder),
                    batch_size=batch_size,
                    progress=lambda label, total: ctx.reporter.progress(label, total, status="texts"),
                    encode_parts=lambda parts: encode_parts(emb, parts, batch_size=batch_size),
                )
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
                return [("query", int(pool["q"][e])), ("positive", int(pool["p"][e]))] + [
                    (f"negative {i + 1}", int(r)) for i, r in enumerate(pool["n"][e])
                ]
        else:
            distinct = list(dict.fromkeys(t for ex in examples for t in (ex["query"], ex["positive"], *ex["negatives"])))
            found = dict(zip(distinct, dc.match(distinct, None), strict=True))

            def roles(e: int) -> list[tuple[str, Any]]:
                ex = examples[e]
                return [("query", ex["query"]), ("positive", ex["positive"])] + [
                    (f"negative {i + 1}", t) for i, t in enumerate(ex["negatives"])
                ]

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


def _judge_block(ctx: StageContext, judge, examples: list[dict], per_ex: list[dict], contam: list, this_run: Counter) -> None:
    """The cross-encoder's second opinion: score (query, positive) and (query, negative) of every
    example that is not contaminated, and OR its verdict into ``false_negative`` so every policy
    drops what either check calls a false negative."""
    from negsynth.embed.cross_encoder import judged_false_negatives

    t0 = time.perf_counter()
    idx = [e for e in range(len(examples)) if contam[e] is None]
    ctx.reporter.info(f"score: judging {len(idx)} examples' negatives with {judge.name} ...")
    pos, negs = judge.score_examples([examples[e] for e in idx])
    ratio = ctx.cfg.score.judge_ratio
    for e, p, ns in zip(idx, pos, negs, strict=True):
        m = per_ex[e]
        jp, jn = round(float(p), 6), [round(float(x), 6) for x in ns]
        verdict = judged_false_negatives(jp, jn, ratio)
        m.update(judge=judge.name, judge_pos=jp, judge_neg=jn, judged_false_negative=verdict)
        m["false_negative"] = [a or b for a, b in zip(m["false_negative"], verdict, strict=True)]
    this_run["judge_pairs"] += sum(1 + len(examples[e]["negatives"]) for e in idx)
    this_run["judge_s"] += time.perf_counter() - t0


def _near_duplicates(
    cleaner: _Cleaner, cfg, examples: list[dict], policy: list, pool: dict | None, vecs16
) -> tuple[dict[int, Any], dict[int, bytes]]:
    """``(duplicates, keys)`` of the block's examples the policy keeps: each one that repeats an
    example kept before it (earlier blocks included) -> its match, and each one's exact-match key
    (what the shard's ``kept.npy`` records). Empty without ``score.dedup``."""
    if cleaner.dedup is None:
        return {}, {}
    cand = [e for e in range(len(examples)) if policy[e] is not None and policy[e][0] is not None]
    keys = {e: exact_key(examples[e]["query"], examples[e]["positive"]) for e in cand}
    qv = vecs16[pool["q"][cand]] if cleaner.dedup.uses_vectors else None
    pv = vecs16[pool["p"][cand]] if cleaner.dedup.uses_vectors else None
    exact = [examples[e].get("source", SYNTHETIC_SOURCE) != SYNTHETIC_SOURCE for e in cand]
    found = cleaner.dedup.check_block([examples[e]["id"] for e in cand], [keys[e] for e in cand], qv, pv, exact_only=exact)
    return {e: d for e, d in zip(cand, found, strict=True) if d is not None}, keys


def _write_shard(
    ctx: StageContext, k: int, shard: ShardOutcome, sidecar: dict, cleaner: _Cleaner, examples: list[dict], keys: dict, pool, vecs16
) -> None:
    """Write output shard ``k`` and its companions: the sidecar, the kept examples' dedup state
    (``kept.npy``, what a resumed run rebuilds the dedup from) and the rejects; the output shard
    last, because its presence marks the shard done."""
    out_dir = ctx.run_dir / NAME
    atomic_write_text(_sidecar_path(ctx, k), json.dumps(sidecar, separators=(",", ":")) + "\n")
    if cleaner.dedup is not None:
        uv = cleaner.dedup.uses_vectors
        atomic_write_bytes(
            _kept_path(ctx, k),
            pack_kept(
                [examples[e]["id"] for e in shard.kept],
                [keys[e] for e in shard.kept],
                vecs16[pool["q"][shard.kept]] if uv else None,
                vecs16[pool["p"][shard.kept]] if uv else None,
            ),
        )
    write_jsonl(out_dir / "rejects" / shard_name(k), shard.rejects)
    write_jsonl(out_dir / shard_name(k), shard.records)  # its presence marks the shard done: written last


def _score_block(
    ctx: StageContext,
    emb,
    block: list[tuple[int, list[dict]]],
    batch_size: int,
    this_run: Counter,
    nblock: int,
    cleaner: _Cleaner,
    judge=None,
    write: set[int] | None = None,
) -> None:
    """Embed one block of input shards together, clean, then write each shard's outputs (those in
    ``write``, when given: the others are finished and come out the same). An example the policy
    keeps is checked against those kept so far: a duplicate of a rejected one still gets its chance."""
    t0 = time.perf_counter()
    cfg = ctx.cfg.score
    examples = [r for _, rows in block for r in rows]
    cos_pos, cos_neg, info = embed_block(
        emb, examples, batch_size=batch_size, reporter=ctx.reporter, label=f"score: embedding (block {nblock})", raw=cleaner.needs_vectors
    )
    pool = info.get("pool")
    vecs16 = quantize(pool["vecs"]) if pool is not None else None
    per_ex = measure_examples(cos_pos, cos_neg, cfg)
    contam = cleaner.contamination(examples, pool, vecs16)
    if judge is not None:
        _judge_block(ctx, judge, examples, per_ex, contam, this_run)
    policy = [None if contam[e] else apply_policy(row, per_ex[e], cfg, emb.name) for e, row in enumerate(examples)]
    dups, keys = _near_duplicates(cleaner, cfg, examples, policy, pool, vecs16)
    e0 = 0
    for k, rows in block:
        shard = ShardOutcome.sort(examples, range(e0, e0 + len(rows)), contam, policy, dups, cfg.policy)
        e0 += len(rows)
        if write is None or k in write:
            sidecar = shard.sidecar(emb.name, examples, per_ex, len(rows), judged=judge is not None)
            _write_shard(ctx, k, shard, sidecar, cleaner, examples, keys, pool, vecs16)
    this_run["examples"] += len(examples)
    this_run["texts"] += info["texts"]
    this_run["unique_texts"] += info["unique_texts"]
    this_run["embed_s"] += info["embed_s"]
    this_run["total_s"] += time.perf_counter() - t0


class Score(Stage):
    """Measured difficulty and filters: see the package's docstring."""

    name = NAME
    summary = "measured difficulty and filters"
    config = ScoreConfig
    records = Example

    def inputs(self, cfg) -> tuple[str, ...]:
        return input_stages(cfg)

    def embeds(self, cfg) -> bool:
        return True

    def made_from(self, ctx: StageContext) -> dict:
        """The hash of the settings, input shards and evaluation texts the scores are made from, and
        the number of input shards."""
        ev = load_decontam_texts(ctx)
        shards = input_shards(ctx)
        return {"config_hash": scores_hash(ctx, shards, ev.fingerprint() if ev.texts else None), "inputs": len(shards)}

    run = staticmethod(run)
    report = staticmethod(report)


STAGE = Score()
