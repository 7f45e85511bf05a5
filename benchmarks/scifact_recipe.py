"""Before/after benchmark on real data: does negsynth's data make all-MiniLM-L6-v2 better?

Train split: SciFact **train** (809 claims, all 919 (claim, abstract) pairs, corpus of 5,183
abstracts). Evaluation: the **full** SciFact test split (300 claims against all 5,183 abstracts,
nDCG@10), STS-B test (1,379 pairs, Spearman) and TREC clustering (5,952 questions, V-measure),
through ``negsynth.evaluate``'s ``full`` suite. Every trained arm uses the same base model,
batch size, optimizer steps and learning rate; only the data (negatives, order) and the trainer
differ:

=====================  ==========================================================================
arm                    what it is
=====================  ==========================================================================
base                   the untouched all-MiniLM-L6-v2
st-inbatch             sentence-transformers' own trainer + MNRL on (claim, abstract), its
                       ``NO_DUPLICATES`` sampler: what a user writes without negsynth
st-mined-1             the same + ``mine_hard_negatives`` (1 negative, TopK-PercPos 95 %, top)
st-mined-4             the same with 4 mined negatives per row (n-tuple)
ns-graded-curriculum   negsynth: multi-granularity mined negatives (one per rank band
                       1-3 / 4-10 / 11-30 / 31-100, positive-aware), curriculum 4 -> 1 (easiest
                       band first, 25 % of the steps each), negsynth's trainer defaults
ns-graded-random       the same negatives, level drawn at random per row (order ablation)
ns-graded-reverse      the same negatives, hardest band first
ns-graded-tuple        every graded negative used: each row carries its 4 multi-granularity
                       negatives (negative_1..4, hardest band first) and the curriculum orders
                       the rows by measured difficulty (hardest negative's cosine over the
                       positive's), easiest quarter first
ns-tuple-curriculum    every row carries 4 mined negatives (like st-mined-4) and the curriculum
                       moves the 4-negative window down the positive-aware candidate list:
                       ranks 31-34 in the first quarter of the steps, then 11-14, 4-7 and
                       finally 1-4 (the st-mined-4 row); negsynth's trainer and sampler
ns-tuple-hard          the same rows, all at ranks 1-4 (st-mined-4's data through negsynth's
                       trainer: separates the trainer from the schedule)
ns-tuple-hard-hw       ns-tuple-hard with hardness weighting: MNRL ``hardness_mode =
                       "hard_negatives"``, ``hardness_strength`` 5 (EmbeddingGemma's alpha;
                       ``--hardness-strength``): each row's own hard negatives weigh by how close
                       the model currently puts them (train.hardness_mode / hardness_strength)
ns-tuple-hard-noeasy   ns-tuple-hard with the easiness filter (NeMo Curator's retriever SDG; negsynth's
                       ``score.easy_margin``): queries whose positive the base model already ranks
                       above the hardest kept negative by more than ``--easy-margin`` (0.1: a
                       quarter of SciFact train) are dropped, and the same 28 steps cycle over the rest
ns-pipeline            negsynth's own pipeline with its defaults, end to end through the stages:
                       ``regenerate.negatives = "mined"`` (no LLM: the 4 hardest positive-aware
                       candidates, ``mining.strategy = "top"``) -> ``score`` (measured policy) ->
                       ``curriculum`` (``schedule = "auto"`` -> ``tuple``) -> ``train``; only batch,
                       steps, lr, length and seed set as for every arm (run dir ``OUT/ns-pipeline/seedN/run``)
ns-pipeline-neardedup  ns-pipeline with ``score.dedup_labelled = "near"`` (the default before): a
                       dataset's near-identical pairs dropped too (SciFact: 115 claim / altered-claim
                       pairs with the same abstract)
ns-pipeline-wide       ns-pipeline with ``regenerate.mining.range_max = 340`` instead of ~44-60
                       candidates: 29 queries short of 4 negatives instead of 121
ns-pipeline-noeasy     ns-pipeline with ``score.easy_margin = 0.1`` (the easiness filter of the
                       ns-tuple-hard-noeasy arm, through the stages)
ns-llm-{curriculum,    LLM-graded negatives from a ``regenerate`` run (``--llm-run DIR``; the
random,reverse}        examples' scored levels), in curriculum / random / reverse order
=====================  ==========================================================================

The arm trained with negsynth's default settings (``ns-pipeline``) is also saved as
``OUT/negsynth-default/``; every arm's model is saved under ``OUT/<arm>/`` (a plain
``SentenceTransformer(path)`` loads each), so anyone can evaluate them on other data.

The key arms (``st-mined-4``, the strongest stock recipe, and ``ns-pipeline``, negsynth's defaults) run over
``--seeds`` (default 0; 0,1,2 for the spread: the seed drives the trainer, the sampler, the mining draws and the
curriculum); the others over the first seed (``--all-seeds`` for every arm). Every arm runs once
before any second seed, so an interrupted run still has the whole table. Prints a Markdown table (mean +- sd) and
writes ``OUT/results.json`` after every arm, so an interrupted run keeps what it measured and a
rerun skips the arms already in it (``--fresh`` to redo them).

The default invocation runs the headline: ``base``, ``st-mined-4`` and ``ns-pipeline`` at seed 0
(``--arms all`` for every arm, ``--seeds 0,1,2`` for the key arms' spread). Cost, measured on this
project's 2-core CPU while other jobs shared it (one core per process, load 2-5): one trained arm,
28 steps x 32 rows plus the full evaluation, took 25-48 min, the full evaluation alone (SciFact's
5,183 abstracts) most of it; so the default invocation should take about an hour or a little more on
2 cores (an estimate from those per-arm times, not a timed run), and the whole
grid (every arm, key arms over 3 seeds) an overnight job. ``--eval-suite quick`` cuts the evaluation,
and a GPU makes every arm minutes::

    python benchmarks/scifact_recipe.py --out runs/recipe                                   # the headline, seed 0
    python benchmarks/scifact_recipe.py --out runs/recipe --seeds 0,1,2                     # + the key arms' spread
    python benchmarks/scifact_recipe.py --out runs/recipe --arms all --llm-run runs/scifact-llm   # every arm

The LLM-graded arms read a finished ``regenerate`` (+ ``score``) run on SciFact train, made once::

    negsynth regenerate --run-dir runs/scifact-llm --config benchmarks/scifact_llm.toml
    negsynth score --run-dir runs/scifact-llm --config benchmarks/scifact_llm.toml
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

KEY_ARMS = ("st-mined-4", "ns-pipeline")  # the strongest stock recipe and negsynth's default
# in the order they run: the strongest stock recipe and negsynth's default first
ALL_ARMS = ("base", "st-mined-4", "ns-graded-curriculum", "st-inbatch", "st-mined-1", "ns-graded-tuple", "ns-graded-random", "ns-graded-reverse",
            "ns-tuple-curriculum", "ns-tuple-hard", "ns-tuple-hard-hw", "ns-tuple-hard-noeasy", "ns-pipeline", "ns-pipeline-neardedup",
            "ns-pipeline-wide", "ns-pipeline-noeasy", "ns-llm-curriculum", "ns-llm-random", "ns-llm-reverse")  # fmt: skip
DEFAULT_ARM = "ns-pipeline"  # negsynth's defaults, through its own stages
HEADLINE_ARMS = ("base", "st-mined-4", DEFAULT_ARM)  # the default invocation (~1-1.5 h on 2 CPU cores)
# the pipeline arms: negsynth's stages with their defaults, plus these TOML lines
PIPELINE_ARMS = {
    "ns-pipeline": "",
    # the default until score kept a dataset's near-identical pairs: SciFact's claim / altered-claim
    # pairs (same abstract, query cos >= 0.95) dropped as near-duplicates
    "ns-pipeline-neardedup": '[score]\ndedup_labelled = "near"\n',
    # 340 mining candidates per query instead of ~44-60: fewer queries short of 4 negatives
    "ns-pipeline-wide": "[regenerate.mining]\nrange_max = 340\n",
    # + the easiness filter: queries the base model already solves by > 0.1 cosine dropped
    "ns-pipeline-noeasy": "[score]\neasy_margin = 0.1\n",
}


def scifact_train(data_dir: Path):
    """(pairs, corpus texts) of SciFact train, documents as negsynth reads BEIR ("title text")."""
    from negsynth.data.sources import load_source
    from negsynth.schemas.config import SourceSpec

    src = load_source(SourceSpec(path=str(data_dir / "scifact"), split="train"))
    return src


def base_model():
    from sentence_transformers import SentenceTransformer

    from negsynth.resources import minilm_path

    return SentenceTransformer(str(minilm_path()), device="cpu")


def evaluate_model(path: str | None, args) -> dict:
    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.evaluate import evaluate

    emb = SentenceTransformerEmbedder.load(path or "default", device="cpu", batch_size=64)
    rep = evaluate(emb, suite=args.eval_suite, tasks=args.eval_tasks, progress=False, data_dir=args.data_dir, seed=0)
    return {name: float(t["main_score"]) for name, t in rep["tasks"].items()}


# ------------------------------------------------------------------------------ data of each arm


def cached_mining(src, args, name: str, mine) -> dict:
    """``mine(model, queries, positives)`` over SciFact train with the base model at the training
    length (as the stock arms mine), cached as ``OUT/_mined/<name>.json``."""
    cache = args.out / "_mined" / f"{name}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    queries = {p.query_key: p.query for p in src.pairs}
    positives = {k: src.positives_by_query.get(k, []) for k in queries}
    model = base_model()
    model.max_seq_length = args.max_length
    found = mine(model, queries, positives)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(found))
    return found


def graded_found(src, args, seed: int) -> dict:
    """Multi-granularity mining over SciFact train (cached per seed under OUT/_mined)."""
    from negsynth.embed.mining import mine_graded

    return cached_mining(src, args, f"graded-seed{seed}", lambda model, queries, positives: mine_graded(
        model, queries, positives, src.corpus, seed=seed, cache_folder=args.emb_cache))  # fmt: skip


def graded_tuple_rows(src, args, seed: int) -> list[dict]:
    """n-tuple rows with all 4 graded negatives (hardest band first), in 4 phases of measured
    row difficulty: the hardest negative's cosine relative to the positive's, easiest first."""
    found = graded_found(src, args, seed)
    rows = []
    for p in src.pairs:
        f = found.get(p.query_key) or {}
        negs = [n for n in f.get("negatives", []) if n != p.positive]
        if len(negs) == 4 and f.get("pos_score"):
            rows.append(({"anchor": p.query, "positive": p.positive, **{f"negative_{j + 1}": t for j, t in enumerate(negs)}}, f["scores"][0] / f["pos_score"]))
    rows.sort(key=lambda r: r[1])
    n = len(rows) - len(rows) % args.batch_size  # whole batches
    out = []
    for i, (r, _) in enumerate(rows[:n]):
        phase = i * 4 // n + 1
        out.append({**r, "phase": phase, "level": 5 - phase})
    return out


def mined_graded(src, args, seed: int) -> list[dict]:
    """Examples with 4 multi-granularity mined negatives (cached per seed under OUT/_mined)."""
    found = graded_found(src, args, seed)
    out = []
    for i, p in enumerate(src.pairs):
        f = found.get(p.query_key) or {}
        negs = [n for n in f.get("negatives", []) if n != p.positive]
        if len(negs) == 4:
            out.append({"id": f"scifact-{i}", "task": "", "task_type": "short-long", "query": p.query, "positive": p.positive, "negatives": negs, "source": "scifact"})
    return out


#: first candidate rank of a level's 4-negative window (level 1 = hardest, 4 = easiest)
TUPLE_START = {1: 1, 2: 4, 3: 11, 4: 31}


def tuple_rows(src, arm: str, args, seed: int, steps: int) -> list[dict]:
    """n-tuple rows (``negative_1..4``, hardest first): the curriculum slides each row's window of
    4 negatives from candidate ranks 31-34 (first quarter of the steps) to 1-4 (last quarter);
    ``ns-tuple-hard`` puts every row at ranks 1-4."""
    import random

    from negsynth.embed.mining import mine_negatives

    depth = TUPLE_START[4] + 3
    pool = cached_mining(src, args, f"pool{depth}", lambda model, queries, positives: mine_negatives(
        model, queries, positives, src.corpus, depth, relative_margin=0.05,
        range_max=depth + 4 * max((len(v) for v in positives.values()), default=1) + 300, cache_folder=args.emb_cache))  # fmt: skip
    cands = {id(p): [x for x in (pool.get(p.query_key) or {}).get("negatives", []) if x != p.positive] for p in src.pairs}
    # every phase fills whole batches (steps / 4 of them); pairs whose margin-filtered candidate list
    # is too short for the easy windows can still serve the hardest one (ranks 1-4)
    rng = random.Random(seed)
    pairs = src.pairs
    if arm.endswith("-noeasy"):  # the easiness filter: cos_pos - hardest negative's cosine > margin -> dropped
        def margin(p) -> float:
            f = pool.get(p.query_key) or {}
            return f["pos_score"] - f["scores"][0] if f.get("scores") and f.get("pos_score") is not None else float("inf")

        pairs = [p for p in pairs if margin(p) <= args.easy_margin]
        print(f"easiness filter: {len(src.pairs) - len(pairs)} of {len(src.pairs)} queries dropped (margin > {args.easy_margin})", flush=True)
    deep = [p for p in pairs if len(cands[id(p)]) >= depth]
    shallow = [p for p in pairs if 4 <= len(cands[id(p)]) < depth]
    rng.shuffle(deep)
    rng.shuffle(shallow)
    per_phase = (steps // 4) * args.batch_size
    if arm.startswith("ns-tuple-hard"):
        kept = deep + shallow
        chosen = (kept * (-(-4 * per_phase // max(len(kept), 1))))[: 4 * per_phase]  # cycle when the filter left fewer rows
        rng.shuffle(chosen)
    else:
        easy_need = 3 * per_phase
        chosen = deep[:easy_need] + (deep[easy_need:] + shallow)[:per_phase]
    rows = []
    for i, p in enumerate(chosen):
        phase = i // per_phase + 1
        level = 1 if arm.startswith("ns-tuple-hard") else 5 - phase
        start = TUPLE_START[level] - 1
        negs = cands[id(p)][start : start + 4]
        rows.append({"anchor": p.query, "positive": p.positive, **{f"negative_{j + 1}": t for j, t in enumerate(negs)}, "phase": phase, "level": level})
    return rows


def llm_examples(run_dir: Path) -> list[dict]:
    """Scored (else regenerated) SciFact examples of an LLM run, 4 negatives each."""
    from negsynth.data.shards import read_stage

    for stage in ("score", "regenerate"):
        d = run_dir / stage
        if d.is_dir() and any(d.glob("shard-*.jsonl")):
            ex = [r for r in read_stage(d) if r.get("source") == "scifact" and len(r["negatives"]) == 4]
            for r in ex:
                r["task"] = ""  # MiniLM is evaluated without instructions: train the same way
            return ex
    sys.exit(f"scifact_recipe: {run_dir} has no finished regenerate or score shards; run regenerate first (see --help)")


def ns_rows(examples: list[dict], schedule: str, steps: int, args, seed: int) -> list[dict]:
    from negsynth.data.curriculum import build_curriculum

    return list(build_curriculum(examples, schedule=schedule, batch_size=args.batch_size, total_steps=steps, seed=seed, homogeneous_batches=False, instruction_template=None))


def pipeline_toml(src_dir: Path, args, seed: int, extra_toml: str = "") -> str:
    """The run file of a pipeline arm: mined negatives for SciFact train, the shared training protocol."""
    return (
        f'[regenerate]\nnegatives = "mined"\n[[regenerate.inputs]]\npath = {json.dumps(str(src_dir / "scifact"))}\nsplit = "train"\n'
        f"[curriculum]\nseed = {seed}\ntotal_steps = {args.steps}\n"
        f"[train]\nbatch_size = {args.batch_size}\ngrad_accum = 1\nlr = {args.lr}\nmax_length = {args.max_length}\nseed = {seed}\n" + extra_toml
    )


def train_pipeline(src_dir: Path, args, seed: int, dest: Path, extra_toml: str = "") -> dict:
    """negsynth's stages with their defaults on SciFact train (no LLM: mined negatives), then the model
    copied to ``dest``. Only what every arm shares is set: batch (32 rows per optimizer step, no
    accumulation), optimizer steps (the curriculum's ``total_steps``: another seeded pass over the
    examples when the filters left fewer rows), lr, training length, seed."""
    import shutil

    from negsynth.pipeline.config_io import load_config
    from negsynth.stages import run_pipeline

    run_dir = dest / "run"
    toml = dest / "pipeline.toml"
    dest.mkdir(parents=True, exist_ok=True)
    # the mined examples do not depend on the seed: another seed's finished regenerate + score are
    # copied in and reused by the stages' own resume check (same config -> not recomputed)
    done = [d for d in sorted(dest.parent.glob("seed*/run")) if d != run_dir and (d / "score" / "stats.json").is_file()]
    if done and not run_dir.exists():
        shutil.copytree(done[0], run_dir, ignore=lambda folder, names: [n for n in names if n in ("curriculum", "train", "evaluate")] if Path(folder) == done[0] else [])
    toml.write_text(pipeline_toml(src_dir, args, seed, extra_toml))
    stats = run_pipeline(load_config(toml), run_dir, stages=["regenerate", "score", "curriculum", "train"])
    final = run_dir / "train" / "final"
    shutil.rmtree(dest / "model", ignore_errors=True)
    shutil.copytree(final, dest / "model")
    cur, tr = stats.get("curriculum", {}), stats.get("train", {})
    return {"rows": cur.get("rows"), "schedule": cur.get("schedule"), "examples": stats.get("score", {}).get("kept", stats.get("regenerate", {}).get("valid")),
            "steps": tr.get("steps"), "loss": [tr.get("loss_first"), tr.get("loss_last")], "model_dir": str(dest / "model")}  # fmt: skip


# ------------------------------------------------------------------------------ trainers


def train_stock(src, arm: str, args, seed: int, dest: Path) -> dict:
    """sentence-transformers' own recipe: SentenceTransformerTrainer + MNRL (scale 20), NO_DUPLICATES."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.util import mine_hard_negatives
    from transformers import set_seed

    set_seed(seed)
    model = base_model()
    base_len = model.max_seq_length
    model.max_seq_length = args.max_length
    ds = Dataset.from_dict({"anchor": [p.query for p in src.pairs], "positive": [p.positive for p in src.pairs]})
    if arm.startswith("st-mined-"):
        k = int(arm.rsplit("-", 1)[1])
        ds = mine_hard_negatives(ds, model, corpus=list(src.corpus), num_negatives=k, relative_margin=0.05, sampling_strategy="top",
                                 output_format="triplet" if k == 1 else "n-tuple", batch_size=64, verbose=False,
                                 cache_folder=str(args.emb_cache))  # fmt: skip
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(dest / "_ckpt"), per_device_train_batch_size=args.batch_size, learning_rate=args.lr, max_steps=args.steps,
        warmup_ratio=0.1, batch_sampler=BatchSamplers.NO_DUPLICATES, seed=seed, data_seed=seed, save_strategy="no", report_to="none",
        logging_steps=max(1, args.steps // 4), disable_tqdm=True,
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=ds, loss=MultipleNegativesRankingLoss(model))
    trainer.train()
    model.max_seq_length = base_len  # evaluated like the base model (documents up to 256 tokens)
    model.save(str(dest))
    return {"rows": len(ds), "columns": ds.column_names, "steps": trainer.state.global_step, "loss": [e["loss"] for e in trainer.state.log_history if "loss" in e]}


def train_ns(rows: list[dict], args, seed: int, dest: Path, **overrides) -> dict:
    """negsynth's trainer with its defaults (τ by model family, warmup, clipping, order-keeping sampler)."""
    from datasets import Dataset

    from negsynth.train import TrainConfig, make_trainer
    from negsynth.train.trainer import save_model

    # one pass over the planned batches: the sampler keeps every text once per batch by moving
    # colliding rows later, which can add a few partial batches; a step cap would cut the hardest phase
    cfg = TrainConfig(model="default", batch_size=args.batch_size, grad_accum=1, lr=args.lr, max_steps=-1, epochs=1, max_length=args.max_length,
                      seed=seed, output_dir=str(dest / "_ckpt"), save_steps=10**6, save_total_limit=1, logging_steps=max(1, args.steps // 4),
                      **overrides)  # fmt: skip
    cols = [c for c in rows[0] if c in ("anchor", "positive", "negative", "phase", "level") or c.startswith("negative_")]
    ds = Dataset.from_dict({k: [r[k] for r in rows] for k in cols})
    trainer, model = make_trainer(ds, cfg)
    trainer.train()
    save_model(model, str(dest))  # with the base model's max_seq_length, like the stock arms
    return {"rows": len(rows), "steps": trainer.state.global_step, "loss": [e["loss"] for e in trainer.state.log_history if "loss" in e]}


# ------------------------------------------------------------------------------ driver


def run_arm(arm: str, seed: int, src, args) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _mem import PeakRSS

    t0 = time.time()
    with PeakRSS() as train_mem:
        info, path = train_arm(arm, seed, src, args)
    with PeakRSS() as eval_mem:
        scores = evaluate_model(path, args)
    cost = {"train_s": round(train_mem.seconds, 1), "eval_s": round(eval_mem.seconds, 1), "train_peak_mib": train_mem.peak_mib, "eval_peak_mib": eval_mem.peak_mib}
    return {"arm": arm, "seed": seed, "scores": scores, "model": path, "seconds": round(time.time() - t0, 1), **cost, **info}


def train_arm(arm: str, seed: int, src, args) -> tuple[dict, str | None]:
    """Train one arm: ``(its info, the model folder)``; the base arm trains nothing (None)."""
    dest = args.out / arm / f"seed{seed}"
    info: dict = {}
    if arm == "base":
        path = None
    elif arm.startswith("st-"):
        info = train_stock(src, arm, args, seed, dest)
        path = str(dest)
    elif arm in PIPELINE_ARMS:
        info = train_pipeline(Path(args.data_dir), args, seed, dest, PIPELINE_ARMS[arm])
        path = info["model_dir"]
    elif arm == "ns-graded-tuple":
        rows = graded_tuple_rows(src, args, seed)
        info = train_ns(rows, args, seed, dest)
        path = str(dest)
    elif arm.startswith("ns-tuple-"):
        rows = tuple_rows(src, arm, args, seed, args.steps)
        hw = {"hardness_mode": "hard_negatives", "hardness_strength": args.hardness_strength} if arm.endswith("-hw") else {}
        info = train_ns(rows, args, seed, dest, **hw)
        path = str(dest)
    else:
        if arm.startswith("ns-graded-"):
            examples = mined_graded(src, args, seed)
        else:
            examples = llm_examples(args.llm_run)
        steps = min(args.steps, len(examples) // args.batch_size)
        rows = ns_rows(examples, arm.rsplit("-", 1)[1], steps, args, seed)
        info = train_ns(rows, args, seed, dest)
        info["examples"] = len(examples)
        path = str(dest)
    return info, path


def summarise(results: list[dict], tasks: list[str]) -> list[tuple]:
    by_arm: dict[str, list[dict]] = {}
    for r in results:
        by_arm.setdefault(r["arm"], []).append(r)
    table = []
    for arm in ALL_ARMS:
        rs = by_arm.get(arm)
        if not rs:
            continue
        cells = []
        for t in tasks:
            v = [100 * r["scores"][t] for r in rs if t in r["scores"]]
            if not v:
                cells.append("-")
            elif len(v) == 1:
                cells.append(f"{v[0]:.2f}")
            else:
                cells.append(f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}")
        def med(key: str) -> str:  # per seed: median over the seeds that recorded it
            v = [r[key] for r in rs if r.get(key) is not None]
            return f"{statistics.median(v):.0f}" if v else "-"

        table.append((arm, len(rs), cells, round(sum(r["seconds"] for r in rs)), [med(k) for k in ("train_s", "eval_s", "train_peak_mib", "eval_peak_mib")]))
    return table


def print_table(results: list[dict], args) -> None:
    tasks = args.eval_tasks
    print(f"\nall-MiniLM-L6-v2 on SciFact train ({args.steps} steps x batch {args.batch_size}, lr {args.lr}); {args.eval_suite} test sets\n")
    print("| arm | seeds | " + " | ".join(tasks) + " | train s | eval s | train peak MiB | eval peak MiB |")
    print("|---|---:|" + "---:|" * len(tasks) + "---:|---:|---:|---:|")
    for arm, n, cells, _secs, cost in summarise(results, tasks):
        print(f"| {arm} | {n} | " + " | ".join(cells) + " | " + " | ".join(cost) + " |")
    print("\n(train / eval: seconds and peak resident memory of one seed, median over seeds; '-' for results recorded before they were measured)")


def save_result(res_path: Path, r: dict, args) -> list[dict]:
    """Add one arm's result to ``results.json`` and return them all. The file is read again right
    before the write, so arms run by other processes into the same ``--out`` are kept."""
    import fcntl

    with open(res_path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = json.loads(res_path.read_text())["results"] if res_path.exists() else []
        results = [x for x in results if (x["arm"], x["seed"]) != (r["arm"], r["seed"])] + [r]
        tmp = res_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1))
        tmp.replace(res_path)
    return results


def select_arms(text: str) -> list[str]:
    """``--arms``: comma-separated names, or ``all``; an unknown name stops the run in one line."""
    arms = list(ALL_ARMS) if text.strip() == "all" else [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in arms if a not in ALL_ARMS]
    if bad or not arms:
        sys.exit(f"scifact_recipe: unknown arm(s) {bad or text!r}; choose from {','.join(ALL_ARMS)} or 'all'")
    return arms


def seed_list(text: str) -> list[int]:
    """``--seeds``: comma-separated integers (argparse turns the ValueError into a one-line usage error)."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds:
        raise argparse.ArgumentTypeError("no seed given; e.g. --seeds 0")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", type=Path, default=Path("runs/recipe"), help="models (one folder per arm and seed) and results.json")
    ap.add_argument("--data-dir", type=Path, default=None, help="evaluation data (default: NEGSYNTH_DATA_DIR or ../shared/data)")
    ap.add_argument("--llm-run", type=Path, default=None, help="a regenerate(+score) run dir on SciFact train for the ns-llm-* arms")
    ap.add_argument("--arms", default=",".join(HEADLINE_ARMS), help=f"comma-separated, or 'all' ({','.join(ALL_ARMS)})")
    ap.add_argument("--seeds", type=seed_list, default="0", help="seeds of the key arms (0,1,2 for the README's spread); other arms use the first")
    ap.add_argument("--all-seeds", action="store_true", help="run every arm over every seed")
    ap.add_argument("--steps", type=int, default=28, help="optimizer steps per arm (28 = one pass over 919 pairs at batch 32)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--easy-margin", type=float, default=0.1, help="the *-noeasy arms: drop queries with cos_pos - hardest negative > this")
    ap.add_argument("--hardness-strength", type=float, default=5.0, help="alpha of the *-hw arms (MNRL hardness_mode='hard_negatives')")
    ap.add_argument("--max-length", type=int, default=128, help="training max tokens (evaluation uses the model's 256)")
    ap.add_argument("--eval-tasks", default="SciFact,STSBenchmark,TRECClustering")
    ap.add_argument("--eval-suite", choices=["full", "quick"], default="full",
                    help="quick: SciFact's 300 test queries cut to 100 against 1,000 documents (every judged one kept), the other sets subsampled; "
                         "a full SciFact evaluation embeds 5,183 abstracts (~45 min on one loaded CPU core)")
    ap.add_argument("--fresh", action="store_true", help="redo arms already in OUT/results.json")
    ap.add_argument("--emb-cache", type=Path, default=None, help="base-model query/corpus embeddings for mining (default OUT/_mined/emb; shared by every arm)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.emb_cache = args.emb_cache or args.out / "_mined" / "emb"
    args.eval_tasks = [t.strip() for t in args.eval_tasks.split(",") if t.strip()]

    from negsynth.resources import default_data_dir

    args.data_dir = args.data_dir or default_data_dir()
    if args.data_dir is None or not (Path(args.data_dir) / "scifact" / "train" / "qrels.tsv").exists():
        sys.exit("scifact_recipe: no SciFact data; point NEGSYNTH_DATA_DIR (or --data-dir) at a folder with scifact/{corpus,queries}.jsonl, scifact/train/")
    seeds = args.seeds
    arms = select_arms(args.arms)
    if args.llm_run is None:
        dropped = [a for a in arms if a.startswith("ns-llm-")]
        arms = [a for a in arms if not a.startswith("ns-llm-")]
        if dropped:
            print(f"scifact_recipe: no --llm-run, skipping {', '.join(dropped)}", file=sys.stderr)
    llm_arms = [a for a in arms if a.startswith("ns-llm-")]
    if llm_arms:  # a weak LLM leaves few usable examples: say so before any training
        usable = len(llm_examples(args.llm_run))
        if min(args.steps, usable // args.batch_size) < 4:
            sys.exit(f"scifact_recipe: {args.llm_run} has {usable} scored examples with 4 negatives, {usable // args.batch_size} batch(es) of "
                     f"{args.batch_size}; the {', '.join(llm_arms)} arms need >= 4 (one per curriculum phase): regenerate more pairs "
                     f"(regenerate.inputs limit) or lower --batch-size")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    res_path = args.out / "results.json"
    results: list[dict] = [] if args.fresh or not res_path.exists() else json.loads(res_path.read_text())["results"]
    done = {(r["arm"], r["seed"]) for r in results}
    src = scifact_train(Path(args.data_dir))
    print(f"SciFact train: {len(src.pairs)} pairs, corpus {len(src.corpus)}", file=sys.stderr)
    t0 = time.time()
    # every arm once first, then the further seeds of the key arms: an interrupted run has the whole table
    jobs = [(arm, seeds[0]) for arm in arms] + [(arm, s) for s in seeds[1:] for arm in arms if arm != "base" and (arm in KEY_ARMS or args.all_seeds)]
    for arm, seed in jobs:
        if (arm, seed) in done:
            continue
        r = run_arm(arm, seed, src, args)
        print(f"{arm} seed {seed}: " + ", ".join(f"{k} {100 * v:.2f}" for k, v in r["scores"].items()) + f" ({r['seconds']:.0f} s)", file=sys.stderr)
        results = save_result(res_path, r, args)
    default = [r for r in results if r["arm"] == DEFAULT_ARM and r["seed"] == seeds[0] and r.get("model")]
    if default:
        import shutil

        target = args.out / "negsynth-default"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(default[0]["model"], target, ignore=shutil.ignore_patterns("_ckpt"))
        print(f"negsynth's default arm saved as {target}", file=sys.stderr)
    print_table(results, args)
    print(f"\nmodels under {args.out}/<arm>/seed<N>/; results in {res_path}; this invocation {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
