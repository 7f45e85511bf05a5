"""A corpus and no labels: does negsynth's ``corpus`` stage make all-MiniLM-L6-v2 better?

The LLM (the embedded SmolLM2-135M unless ``--llm-base-url``) writes queries for a seeded sample
of a corpus's documents; ``score`` -> ``curriculum`` -> ``train`` turn them into a model, with no
label of the dataset used. Every arm runs negsynth's own stages from one run file (written to
``OUT/<dataset>/<arm>/pipeline.toml``) and only what the arm names differs:

==================  =========================================================================
arm                 what it is
==================  =========================================================================
base                the untouched all-MiniLM-L6-v2
mined               the default: 1 query per document; the curriculum mines the corpus stage's
                    valid records again with ``mine_hard_negatives`` (4, relative margin 0.05, its own
                    candidate window) and train trains those rows the stock way (``NO_DUPLICATES``,
                    MNRL, one pass): sentence-transformers' stock recipe, by construction
st-stock            the same recipe outside negsynth (``harness.mine_stock`` + ``train_stock_recipe``) on
                    **the same records**, in their order, mined by the base model at its own length as
                    negsynth's ``[embedder]`` mines: the check that ``mined`` is it (same rows and
                    model; the table is refused where the rows differ)
own                 negsynth's own path (``curriculum.schedule = "tuple"``): the corpus stage's negatives,
                    searched over the whole corpus (no query dropped), ``score``'s cleaning, the tuple
                    curriculum and negsynth's order-keeping sampler; the default until 2026-12
mined-rt            the default + the round-trip filter (``round_trip_k = 10``: keep a query only if
                    the base model ranks its own document in the top 10); ``-rt1`` (Promptagator's
                    strict filter), ``-rt100`` (drops only queries that do not describe their document)
mined-q3            3 queries per document (one request)
mined-e2            ``own`` + two passes over the kept examples (no new LLM call); ``mined-q3-e2`` with
                    3 queries per document
mined-gc8           ``own`` + GradCache (``train.mini_batch_size = 8``): the memory check
mined-win41         ``own`` + the stock candidate window (``corpus.mining.range_max = 41``)
mined-nofilter      ``own`` + ``score.policy = "annotate"``, the cleaning off: every valid record trains
mined-plain         ``own`` + plain MNRL (``train.mini_batch_size`` off)
mined-shuffled      ``own`` + the stock recipe's sampler (``train.batch_sampler = "shuffled"``)
mined-hybridcand    hybrid candidates (``corpus.candidates = "hybrid"``): the 4 hardest of the fused
                    BM25 + dense ranking that pass the embedder's margin (``auto`` trains them as ``own``
                    does: the stock recipe has no such negatives); ``title-hybridcand`` the same on
                    ``title-mined``'s queries
mined-ce-mse        a cross-encoder teacher (``--teacher-model``: a hub name or a folder): GPL's recipe,
                    MarginMSE on its scores; ``-kl`` listwise KL; ``-k1`` keeps a query only when the
                    teacher prefers its document to its 4 mined negatives (``auto``: the ``own`` path)
title-mined         the no-LLM floor: the document's title as its query (``corpus.queries = "title"``);
                    ``title-2k`` titles over 2,000 documents (the known collapse: InfoNCE on queries
                    too easy)
mined-c224          the default on 224-token passages (``corpus.chunk_tokens = 224``) where every
                    other arm reads whole documents (``chunk_tokens = 0``, the default)
==================  =========================================================================

Each trained arm's run also writes the held-out set (``--heldout N`` documents, one query each,
drawn over the whole corpus: the same set for every arm of a dataset) and ``evaluate``'s no-label
verdict on it; a last table sets it beside the labelled delta over base and checks the verdict's
rules (never *better* where the labelled delta is significantly negative, *worse* there, the same
sign whenever both are significant).

``st-stock``, ``mined`` and ``own`` start from one list of examples: the ids the stock recipe reads are
the ``corpus`` stage's valid records that ``score`` reads (count and hash, in ``results.json``), and a
table where they differ is refused, as is one where ``mined`` trained other rows than ``st-stock`` or
whose arms were evaluated at different token lengths. Each table row is also tested against
``st-stock`` per query (``--resamples``).

Datasets (``--datasets``): ``scifact`` (5,183 abstracts; reported on the full SciFact test split;
settings chosen on ``SciFact-dev``, SciFact's train claims against the same corpus) and ``cranfield``
(1,400 abstracts; its 225 queries are the test). Both also report STS-B and TREC clustering.
Training, every arm: batch 32, lr 2e-5, 128 tokens, one pass over the kept examples (``--steps N``
for a fixed count). The LLM's answers are cached per dataset (``OUT/<dataset>/_cache``) and shared
by every arm and seed that sends the same request. Each arm's model is saved as
``OUT/<dataset>/<arm>/seed<N>/model``; ``OUT/results.json`` is written after every arm and seed (a
rerun skips what it holds; ``--fresh`` redoes)::

    python benchmarks/corpus_recipe.py --out runs/corpus                                   # the default run
    python benchmarks/corpus_recipe.py --out runs/corpus --arms all --seeds 0 --select     # choose on the dev split
    python benchmarks/corpus_recipe.py --out runs/corpus --arms mined --seeds 0,1,2        # then the test split once
    python benchmarks/corpus_recipe.py --out runs/corpus --llm-base-url http://127.0.0.1:8000/v1 --llm-model Qwen/Qwen2.5-7B-Instruct --max-docs 5000
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import harness


def _kl(teacher_temperature: float) -> dict:
    return {"loss": "distill-kl", "distill_temperature": 0.05, "distill_teacher_temperature": teacher_temperature}


CE = {"teacher": "cross-encoder"}
#: negsynth's own path, the default before the stock recipe: the corpus stage's own negatives, tuple rows, its sampler
OWN = {"curriculum": {"schedule": "tuple"}}


def _own(**spec) -> dict:
    return harness.layered(OWN, spec)


ARMS: dict[str, dict | None] = {
    "base": None,
    "mined": {},
    "st-stock": {"stock": True},
    "own": OWN,
    "mined-rt": {"round_trip_k": 10},
    "mined-rt1": {"round_trip_k": 1},
    "mined-rt100": {"round_trip_k": 100},
    "mined-q3": {"queries_per_doc": 3},
    "mined-e2": _own(curriculum={"epochs": 2}),
    "mined-q3-e2": _own(queries_per_doc=3, curriculum={"epochs": 2}),
    "mined-gc8": _own(train={"mini_batch_size": 8}),
    "mined-win41": _own(mining={"range_max": 41}),
    "mined-nofilter": _own(score={"policy": "annotate", "dedup": False}),
    "mined-plain": _own(train={"mini_batch_size": "off"}),
    "mined-shuffled": _own(train={"batch_sampler": "shuffled"}),
    "title-mined": {"queries": "title"},
    "title-2k": {"queries": "title", "max_docs": 2000},
    "mined-c224": {"chunk_tokens": 224},
    "mined-hybridcand": {"candidates": "hybrid"},
    "title-hybridcand": {"queries": "title", "candidates": "hybrid"},
    "mined-ce-mse": {**CE, "teacher_k": 0, "train": {"loss": "margin-mse"}},
    "mined-ce-kl": {**CE, "teacher_k": 0, "train": _kl(1.0)},
    "mined-ce-k1": {**CE, "teacher_k": 1},
}
NEEDS_TEACHER_MODEL = [a for a, spec in ARMS.items() if spec and spec.get("teacher") == "cross-encoder"]
STOCK_ARM = "st-stock"
DEFAULT_ARM = "mined"
DATASETS = {  # dataset -> (data folder, tasks: the reported split first, then the dev split if there is one)
    "scifact": ("scifact", ["SciFact", "SciFact-dev", "STSBenchmark", "TRECClustering"]),
    "cranfield": ("cranfield", ["Cranfield", "STSBenchmark", "TRECClustering"]),
}
KEY = ("dataset", "arm", "seed")
#: the held-out queries' per-query nDCG@10 under these names in a result's ``per_query``
OWN_TASK, OWN_BASE = "own-corpus", "own-corpus-base"


def pipeline_toml(corpus_dir: Path, arm: dict, args, seed: int) -> dict:
    """The arm's run file: the LLM, the corpus stage on ``corpus_dir``, score, curriculum and
    train, the arm's keys merged in."""
    own = {k: v for k, v in arm.items() if k not in ("curriculum", "train", "score", "mining")}
    corpus = {"max_docs": args.max_docs, "seed": 0, **own, "inputs": [{"path": str(corpus_dir)}]}
    if "mining" in arm:
        corpus["mining"] = arm["mining"]
    passes = {"epochs": 1} if args.steps is None else {"total_steps": args.steps}
    train = {"batch_size": args.batch_size, "grad_accum": 1, "lr": args.lr, "max_length": args.max_length, "seed": seed}
    # the held-out set (one for every arm of a dataset: drawn over the whole corpus, whatever max_docs)
    # and the verdict alone: the labelled sets are scored by harness.evaluate, so evaluate reads no data
    heldout = {"queries": args.heldout, "share": 0.5}
    verdict_only = {"data_dir": str(args.out / "_no_general_sets"), "cache": True}
    return harness.layered(
        harness.llm_tables(args, max_tokens=400),
        {"pipeline": {"shard_size": 100}, "corpus": corpus, "score": {"inputs": ["corpus"]}, "curriculum": {"seed": seed, **passes}},
        {"heldout": heldout, "evaluate": verdict_only},
        {"train": train},
        {k: arm[k] for k in ("score", "curriculum", "train") if k in arm},
    )


def prepare_run(dataset: str, arm: str, seed: int, args) -> tuple[Path, dict]:
    """The arm's run dir (its LLM cache and corpus index links shared by every arm of the dataset)
    and its run file."""
    run_dir = args.out / dataset / arm / "run"
    for shared, link in (("_cache", run_dir / "cache"), ("_index", run_dir / "corpus" / "_index")):
        (args.out / dataset / shared).mkdir(parents=True, exist_ok=True)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to((args.out / dataset / shared).resolve(), target_is_directory=True)
    return run_dir, pipeline_toml(Path(args.data_dir) / DATASETS[dataset][0], ARMS[arm], args, seed)


def input_digest(run_dir: Path) -> dict:
    """What an arm starts from: the ``corpus`` stage's valid records (count, hash of the sorted ids)."""
    ids = sorted(r["id"] for r in harness.records(run_dir / "corpus"))
    return {"examples": len(ids), "ids_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]}


def model_length(path: str | None) -> int:
    """The token length a saved model (None: the base model) is evaluated at."""
    import negsynth

    folder = Path(path or negsynth.model_path())
    st = json.loads((folder / "sentence_bert_config.json").read_text())
    # sentence-transformers 6 saves the length with the tokenizer, not in sentence_bert_config.json
    return st.get("max_seq_length") or json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"]


def train_arm(dataset: str, arm: str, seed: int, args) -> dict:
    """negsynth's stages on the corpus (the LLM's answers shared through the dataset's cache)."""
    from negsynth.data.curriculum import load_curriculum
    from negsynth.errors import UserError

    if ARMS[arm].get("stock"):
        return train_stock(dataset, seed, args)
    run_dir, cfg = prepare_run(dataset, arm, seed, args)
    t0 = time.monotonic()
    model = run_dir.parent / f"seed{seed}" / "model"
    no_model = None
    try:
        (args.out / "_no_general_sets").mkdir(parents=True, exist_ok=True)
        stages = (
            ["corpus", "heldout", "score", "curriculum", "train", "evaluate"]
            if args.heldout
            else ["corpus", "score", "curriculum", "train"]
        )
        stats = harness.run_stages(cfg, run_dir, stages)
        shutil.rmtree(model, ignore_errors=True)
        shutil.copytree(run_dir / "train" / "final", model)
    except UserError as e:  # e.g. score kept too few examples for one batch: the arm is a result, not a crash
        no_model = str(e)
        print(f"corpus_recipe: {dataset} {arm} seed {seed}: no model ({no_model})", file=sys.stderr)
        stats = {k: json.loads(p.read_text()) for k in ("corpus", "score", "curriculum") if (p := run_dir / k / "stats.json").is_file()}
    c, s, cur, tr = (stats.get(k, {}) for k in ("corpus", "score", "curriculum", "train"))
    trained = run_dir / "curriculum" / "dataset"
    keep = ("items", "valid", "rejected", "rejects_by_reason", "tokens", "wall_time_s", "round_trip", "query_styles", "query_words")
    return {
        **({"model_dir": str(model)} if no_model is None else {"no_model": no_model}),
        "corpus": {k: c.get(k) for k in keep},
        "llm_requests_this_run": (c.get("this_run") or {}).get("requests"),
        "kept": s.get("kept"),
        "rows": cur.get("rows"),
        "steps": tr.get("steps"),
        "loss": [tr.get("loss_first"), tr.get("loss_last")],
        "pipeline_s": round(time.monotonic() - t0, 1),
        "same_input": input_digest(run_dir),
        **({"same_rows": rows_digest(load_curriculum(trained.parent))} if trained.is_dir() and no_model is None else {}),
        **own_corpus(run_dir),
    }


def own_corpus(run_dir: Path) -> dict:
    """The run's verdict on its held-out queries (``evaluate/verdict.json``): its word and line, and
    the per-query nDCG@10 (0-1) of the tuned and the base model under ``per_query``."""
    path = run_dir / "evaluate" / "verdict.json"
    if not path.is_file():
        return {}
    v = json.loads(path.read_text())
    rows = (v.get("own_corpus") or {}).get("per_query") or []
    return {
        "verdict": {"verdict": v["verdict"], "line": v["line"]},
        "per_query": {OWN_TASK: {q["id"]: q["tuned_ndcg@10"] for q in rows}, OWN_BASE: {q["id"]: q["base_ndcg@10"] for q in rows}},
    }


def rows_digest(ds) -> dict:
    """The training rows (their text columns, in order): count and hash."""
    cols = harness.text_columns(ds.column_names)
    rows = ["\x1f".join(r[c] for c in cols) for r in ds.select_columns(cols)]
    return {"rows": len(rows), "rows_sha256": hashlib.sha256("\x1e".join(rows).encode()).hexdigest()[:16]}


def train_stock(dataset: str, seed: int, args) -> dict:
    """sentence-transformers' stock recipe on negsynth's own examples: the default arm's valid
    ``corpus`` records in their order (its corpus stage run first when it has not been: the LLM's
    answers come from the dataset's shared cache), mined with ``mine_hard_negatives`` over the same
    documents by the base model at its own length (as negsynth's ``[embedder]`` mines), trained with
    MNRL and ``NO_DUPLICATES`` for one pass at the training length: what the default arm trains."""
    from datasets import Dataset

    t0 = time.monotonic()
    src_run, cfg = prepare_run(dataset, DEFAULT_ARM, 0, args)
    if not (src_run / "corpus" / "stats.json").is_file():
        harness.run_stages(cfg, src_run, ["corpus"])
    recs = harness.records(src_run / "corpus")
    model = harness.base_model("cpu")
    ds = Dataset.from_dict({"anchor": [r["query"] for r in recs], "positive": [r["positive"] for r in recs]})
    ds = harness.mine_stock(ds, model, list(harness.documents(Path(args.data_dir) / DATASETS[dataset][0] / "corpus.jsonl").values()), 4)
    out = args.out / dataset / STOCK_ARM / f"seed{seed}" / "model"
    shutil.rmtree(out, ignore_errors=True)
    t = harness.train_stock_recipe(
        model, ds, out, batch_size=args.batch_size, lr=args.lr, seed=seed, max_length=args.max_length, steps=args.steps
    )
    losses = [e["loss"] for e in t.state.log_history if "loss" in e]
    return {
        "model_dir": str(out),
        "kept": len(ds),
        "rows": len(ds),
        "steps": t.state.global_step,
        "batch_rows": t.batch_rows,
        "loss": [losses[0], losses[-1]] if losses else [None, None],
        "pipeline_s": round(time.monotonic() - t0, 1),
        "same_input": input_digest(src_run),
        "same_rows": rows_digest(ds),
    }


def run_one(dataset: str, arm: str, seed: int, args, tasks: list[str], prior: dict | None = None) -> dict:
    """Train the arm (unless ``prior`` already holds its saved model) and evaluate ``tasks``."""
    if prior and prior.get("no_model"):
        return prior  # the arm gave no training data (its reason is recorded): nothing to evaluate
    info: dict = {}
    with harness.PeakRSS() as train_mem:
        if prior and (ARMS[arm] is None or Path(prior.get("model_dir", "")).is_dir()):
            info, tasks = prior, [t for t in tasks if t not in prior["scores"]]  # trained and scored on dev earlier
        elif ARMS[arm] is not None:
            info = train_arm(dataset, arm, seed, args)
    path = info.get("model_dir")
    with harness.PeakRSS() as eval_mem:
        scores, per_query = harness.evaluate(path, tasks, args) if "no_model" not in info else ({}, {})
    cost = {"eval_s": round(info.get("eval_s", 0) + eval_mem.seconds, 1), "eval_peak_mib": eval_mem.peak_mib}
    if not prior:
        cost |= {"train_s": round(train_mem.seconds, 1), "train_peak_mib": train_mem.peak_mib}
    return {
        **info,
        "dataset": dataset,
        "arm": arm,
        "seed": seed,
        "scores": {**info.get("scores", {}), **scores},
        "per_query": {**info.get("per_query", {}), **per_query},
        "eval_max_length": model_length(path),
        **cost,
    }


def check_same_input(results: list[dict], dataset: str) -> None:
    """The stock recipe and negsynth's arms must start from the same examples (count and ids), and
    the default must train the stock recipe's rows (count and hash, in order)."""
    mine = [r for r in results if r["dataset"] == dataset]
    for key, arms in (("same_input", (DEFAULT_ARM, "own")), ("same_rows", (DEFAULT_ARM,))):
        stock = [r[key] for r in mine if r["arm"] == STOCK_ARM and r.get(key)]
        ours = [(r["arm"], r[key]) for r in mine if r["arm"] in arms and r.get(key)]
        if not stock or not ours:
            continue
        if any(v != stock[0] for v in stock + [v for _, v in ours]):
            raise SystemExit(f"corpus_recipe: {dataset}: {STOCK_ARM} and {', '.join(arms)} differ in {key}: {stock} vs {ours}")
        print(f"\n{key.replace('_', ' ')} ({dataset}): {STOCK_ARM} and {', '.join(sorted({a for a, _ in ours}))}: {stock[0]}")


def eval_length(r: dict):
    """The token length ``r``'s model was evaluated at: recorded, or (results from before it was
    recorded) what its saved model loads with; the base model's own for the base arm."""
    if "eval_max_length" in r:
        return r["eval_max_length"]
    path = Path(r["model_dir"]) / "tokenizer_config.json" if r.get("model_dir") else None
    if path is not None and path.is_file():
        return json.loads(path.read_text()).get("model_max_length", "not recorded")
    return 256 if r["arm"] == "base" else "not recorded"


def check_eval_length(results: list[dict], dataset: str) -> None:
    """Every arm of a table was evaluated at one token length (the base model's): a model saved at
    another truncates the documents it is scored on, which moves nDCG by tenths."""
    lengths: dict = {}
    for r in results:
        if r["dataset"] == dataset and r.get("scores"):
            lengths.setdefault(eval_length(r), []).append(f"{r['arm']}/{r['seed']}")
    if len(lengths) > 1:
        where = "; ".join(f"{n}: {', '.join(v[:6])}{' ...' if len(v) > 6 else ''}" for n, v in lengths.items())
        raise SystemExit(
            f"corpus_recipe: {dataset}: arms were evaluated at different token lengths ({where}); rerun the odd ones with --fresh"
        )


def print_table(results: list[dict], datasets: list[str], args) -> None:
    for d in datasets:
        check_eval_length(results, d)
        tasks = DATASETS[d][1]
        base = next((r["scores"] for r in results if r["dataset"] == d and r["arm"] == "base"), {})
        rows = []
        for arm in ARMS:
            if not (rs := [r for r in results if r["dataset"] == d and r["arm"] == arm]):
                continue
            cells = []
            for t in tasks:
                v = harness.seed_scores(rs, t)
                delta = f" ({statistics.mean(v) - 100 * base[t]:+.2f})" if v and t in base and arm != "base" else ""
                cells.append("no model" if all(r.get("no_model") for r in rs) else harness.mean_sd(v) + delta if v else "-")
            kept = next((r["kept"] for r in rs if r.get("kept") is not None), "-")
            rows.append([arm, ",".join(str(r["seed"]) for r in rs), *cells, kept])
        retrieval = [t for t in tasks if any(t in r.get("per_query", {}) for r in results if r["dataset"] == d)]
        mine = [r for r in results if r["dataset"] == d]
        paired = [[a, *(harness.paired_cell(harness.paired(mine, a, STOCK_ARM, t, args.resamples)) for t in retrieval)] for a, *_ in rows]
        print(f"\n### {d} (x100; mean ± sd over seeds, (Δ vs base))\n")
        print(harness.table(["arm", "seeds", *tasks, "examples kept"], rows))
        print(
            f"\nPer query against {STOCK_ARM} (nDCG@10 x 100, seeds pooled; 95 % bootstrap CI; two-sided sign-flip p, {args.resamples} resamples)\n"
        )
        print(harness.table(["arm", *retrieval], [p for p in paired if any(c != "-" for c in p[1:])]))
        print_verdicts(mine, DATASETS[d][1][0], args)
        check_same_input(results, d)
        for r in {r["arm"]: r for r in results if r["dataset"] == d and (r.get("corpus") or {}).get("items")}.values():
            c, tok = r["corpus"], r["corpus"].get("tokens") or {}
            print(
                f"- {r['arm']}: {c['valid']} valid of {c['items']} queries, rejects {c.get('rejects_by_reason')}, tokens in/out "
                f"{tok.get('prompt')}/{tok.get('completion')}, LLM wall {c.get('wall_time_s')} s, round trip {(c.get('round_trip') or {}).get('top1')} top-1"
            )


def print_verdicts(results: list[dict], task: str, args) -> None:
    """Is the no-label verdict honest? Per trained arm: the labelled delta over base on ``task`` and
    the held-out queries' delta over base (each per query, seeds pooled; 95 % bootstrap CI; sign-flip
    p), the verdict of each seed's run, and whether the rules hold: never *better* where the labelled
    delta is significantly negative, *worse* there, the same sign whenever both are significant."""
    from negsynth.evaluate import paired_test

    rows = []
    for arm in dict.fromkeys(r["arm"] for r in results if r.get("verdict")):
        rs = sorted((r for r in results if r["arm"] == arm and r.get("verdict")), key=lambda r: r["seed"])
        labelled = harness.paired(results, arm, "base", task, args.resamples)
        qids, base = harness.align([r["per_query"][OWN_BASE] for r in rs])
        _, tuned = harness.align([r["per_query"][OWN_TASK] for r in rs], qids)
        own = paired_test(tuned, base[:1], n_resamples=args.resamples, seed=0)
        words = [r["verdict"]["verdict"] for r in rs]
        sig = {k: (t["ci_low"] > 0) - (t["ci_high"] < 0) if t else 0 for k, t in (("labelled", labelled), ("own", own))}
        ok = []
        if sig["labelled"] < 0:
            ok.append("never better: " + ("yes" if "better" not in words else "NO"))
            ok.append("says worse: " + ("yes" if all(w == "worse" for w in words) else "NO"))
        if sig["labelled"] and sig["own"]:
            ok.append("same sign: " + ("yes" if sig["labelled"] == sig["own"] else "NO"))
        rows.append(
            [
                arm,
                ",".join(str(r["seed"]) for r in rs),
                harness.paired_cell(labelled),
                harness.paired_cell(own),
                "/".join(words),
                "; ".join(ok) or "-",
            ]
        )
    if rows:
        print(f"\nThe no-label verdict beside the labelled result ({task}; held-out queries written for documents never trained on)\n")
        print(harness.table(["arm", "seeds", f"{task} Δ base", "own corpus Δ base", "verdict per seed", "rules"], rows))


def build_parser():
    ap = harness.parser(__doc__)
    ap.add_argument("--out", type=Path, default=Path("runs/corpus-recipe"))
    ap.add_argument("--datasets", default="scifact,cranfield", help="comma-separated: scifact, cranfield")
    ap.add_argument("--arms", default=f"base,{DEFAULT_ARM}", help=f"comma-separated, or 'all': {', '.join(ARMS)}")
    ap.add_argument("--seeds", type=harness.int_list, default="0,1,2", help="seeds of the trained arms (the base model has none)")
    ap.add_argument("--max-docs", type=int, default=400, help="documents sampled per corpus (seeded; every reported figure used 400)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: one pass over the kept examples)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--max-length", type=int, default=128)
    harness.add_llm_args(ap)
    ap.add_argument("--teacher-model", default="", help="the mined-ce-* arms' cross-encoder (corpus.teacher_model: a hub name or a folder)")
    ap.add_argument("--data-dir", default=None, help="the shared data (default: NEGSYNTH_DATA_DIR or ../shared/data)")
    ap.add_argument("--fresh", action="store_true", help="redo arms already in results.json")
    ap.add_argument(
        "--tasks", type=lambda v: [t.strip() for t in v.split(",") if t.strip()], default=None, help="evaluate only these tasks"
    )
    ap.add_argument(
        "--heldout", type=int, default=100, help="held-out documents per corpus, one query each, for the no-label verdict (0: none)"
    )
    ap.add_argument("--resamples", type=int, default=10000, help="bootstrap / permutation resamples of the paired per-query tests")
    ap.add_argument("--select", action="store_true", help="evaluate the dev split only (SciFact-dev); a later run adds the test split")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    arms = (
        [a for a in ARMS if args.teacher_model or a not in NEEDS_TEACHER_MODEL]
        if args.arms.strip() == "all"
        else harness.names(args.arms, list(ARMS))
    )
    if (ce := [a for a in arms if a in NEEDS_TEACHER_MODEL]) and not args.teacher_model:
        ap.error(f"--arms {','.join(ce)}: name the cross-encoder with --teacher-model (a hub name or a folder)")
    for a in ce:
        ARMS[a] = {**ARMS[a], "teacher_model": args.teacher_model}
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not datasets or any(d not in DATASETS for d in datasets):
        ap.error(f"--datasets: choose from {', '.join(DATASETS)}")
    args.data_dir = harness.data_dir(args.data_dir)
    if missing := [d for d in datasets if not (args.data_dir / DATASETS[d][0]).is_dir()]:
        sys.exit(
            f"corpus_recipe: no {missing[0]} data under {args.data_dir}; pass --data-dir (the folder holding {DATASETS[missing[0]][0]}/)"
        )
    os.environ["NEGSYNTH_DATA_DIR"] = str(args.data_dir.resolve())  # score decontaminates against the sets read from here
    res_path = args.out / "results.json"
    results = [] if args.fresh else harness.load_results(res_path)
    for (d, a), s in [((d, a), s) for a, s in harness.jobs(arms, args.seeds, lambda a: a != "base") for d in datasets]:
        key = (d, a, -1 if a == "base" else s)
        tasks = [t for t in DATASETS[d][1] if t.endswith("-dev") or not args.select]
        tasks = [t for t in tasks if not args.tasks or t in args.tasks]
        if not tasks:
            print(f"corpus_recipe: {d} has no dev split; --select skips it", file=sys.stderr)
            continue
        # --fresh: every planned run is redone once, though results (read back after each save) still hold its earlier figure
        prior = None if args.fresh else next((r for r in results if tuple(r[k] for k in KEY) == key), None)
        if prior and all(t in prior["scores"] for t in tasks):
            continue
        print(f"corpus_recipe: {d} {a} seed {key[2]} ({', '.join(tasks)}) ...", file=sys.stderr, flush=True)
        r = run_one(d, a, key[2], args, tasks, prior)
        results = harness.save_result(res_path, r, KEY, args)
        print(json.dumps({k: r.get(k) for k in ("dataset", "arm", "seed", "scores", "train_s", "eval_s")}), file=sys.stderr, flush=True)
    print_table(results, datasets, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
