"""A corpus and no labels: does negsynth's ``corpus`` stage make all-MiniLM-L6-v2 better?

The LLM (the embedded SmolLM2-135M unless ``--llm-base-url``) writes queries for a seeded sample
of a corpus's documents; ``score`` -> ``curriculum`` -> ``train`` turn them into a model, with no
label of the dataset used. Every arm runs negsynth's own stages from one TOML (printed into
``OUT/<dataset>/<arm>/pipeline.toml``) and only the ``[corpus]`` section differs:

==============  ===========================================================================
arm             what it is
==============  ===========================================================================
base            the untouched all-MiniLM-L6-v2
mined           the default: 1 query per document, 4 mined positive-aware negatives from the
                same corpus (``corpus.negatives = "mined"``)
mined-rt        the same + the round-trip filter (``round_trip_k = 10``: keep a query only if
                the base model ranks its own document in the top 10)
mined-rt1       the same with ``round_trip_k = 1`` (Promptagator's strict filter)
mined-rt100     the same with ``round_trip_k = 100``: drops only the queries whose own document
                the base model ranks below 100 (a query that does not describe its document)
llm             the LLM's 4 graded negatives written for the document
mixed           the 2 hardest mined + the LLM's 2 hardest that pass the same positive-aware
                margin (a slot whose LLM negative fails takes the next mined one)
mined-q3        3 queries per document (one request), mined negatives
mined-e2        ``mined`` trained for two passes over its kept examples (no new LLM call)
mined-q3-e2     ``mined-q3`` trained for two passes
mined-gc8       ``mined`` trained with GradCache (``train.mini_batch_size = 8``): the memory check
st-stock        sentence-transformers' stock recipe on **the same examples**: the ``mined`` arm's
                valid ``corpus`` records (query, document), ``mine_hard_negatives`` (4, relative
                margin 0.05, its own candidate window, ``top``, n-tuple: a query with fewer than 4
                candidates inside the window is dropped), ``MultipleNegativesRankingLoss``,
                ``NO_DUPLICATES``, one pass; batch, lr, length, warmup and seed as every arm
mined-win41     ``mined`` with the stock candidate window (``corpus.mining.range_max = 41``: the
                library's default for 4 negatives and one positive): negatives only from the 41
                nearest documents, a query whose document ranks below that finds fewer than 4
mined-nofilter  ``mined`` with ``score.policy = "annotate"`` and the cleaning off: every valid record
                trains (the score stage's filters ablated)
mined-plain     ``mined`` trained with plain MNRL (``train.mini_batch_size`` off: no GradCache chunks)
mined-shuffled  ``mined`` trained with the stock recipe's sampler (``train.batch_sampler = "shuffled"``:
                sentence-transformers' NO_DUPLICATES, rows reshuffled, short batches where they collide)
mined-teacher   ``mined`` with the hybrid teacher (``corpus.teacher = "hybrid"``: BM25 and the embedder
                fused by reciprocal rank fusion): a query is kept when the teacher ranks its
                document in its top 10, and a candidate it ranks above the document is no negative
mined-teacher-k3   the same, top 3
mined-teacher-veto the teacher's negative veto alone (``teacher_k = 0``: every query kept)
mined-teacher-kl   ``mined-teacher-veto`` trained on the teacher's scores instead of InfoNCE:
                   ``train.loss = "distill-kl"`` (sentence-transformers' ``DistillKLDivLoss``,
                   listwise over [document, 4 negatives], its default temperature) on the
                   teacher's min-max BM25 + cosine sums (the curriculum's ``label`` column)
mined-teacher-mse  the same with ``train.loss = "margin-mse"`` (``MarginMSELoss``: GPL's loss)
mined-teacher-mix  the same with ``train.loss = "mnrl+distill-kl"``: InfoNCE + 1 x the KL term
mined-teacher-kl-sharp  ``mined-teacher-kl`` with the student's cosines at 0.05 (its InfoNCE
                   temperature) and the teacher's scores at 0.1: at the library's 1.0 both
                   softmaxes are nearly flat and the loss barely moves
mined-teacher-kl-soft   the same, the teacher at 0.2
title-teacher-kl-sharp / -soft, title-teacher-mse   the same losses on ``title-mined``'s queries
                   (no LLM): the teacher's effect apart from the LLM's queries
mined-hybridcand   ``mined`` with hybrid candidates (``corpus.candidates = "hybrid"``): the 4
                   hardest of the fused BM25 + dense ranking that pass the embedder's margin and
                   rank below the document (lexical near-misses the embedder alone ranks low)
title-hybridcand   the same on ``title-mined``'s queries (no LLM)
mined-lik-k1       ``mined`` with the LLM's query likelihood as teacher (``corpus.teacher =
                   "llm-likelihood"``, ``teacher_k = 1``): a query is kept only when the embedded
                   LLM finds it likelier after its document than after each of its 4 negatives
mined-lik-kl-sharp every query kept, trained on the likelihoods with ``distill-kl`` (student 0.05,
                   teacher 0.1)
mined-lik-kl-t1    the same with the teacher at 1.0 (its scores lie ~1.2 nats apart: at 0.1 its
                   distribution is nearly one-hot, at 1.0 it keeps the negatives' order)
title-mined        the no-LLM floor: the document's title as its query (``corpus.queries = "title"``)
sentence-mined     the same with a sentence of its body (``"sentence"``)
mix-title-mined    both sources: the LLM's query and the title, each an example
                   (``corpus.queries = "llm+title"``; the LLM's requests are ``mined``'s, cached)
==============  ===========================================================================

The ``st-stock`` arm and every negsynth arm start from one list of examples: the benchmark checks
that the ids the stock recipe reads are exactly the ``corpus`` stage's valid records that negsynth's
``score`` reads (``same_input``: count and a hash of the sorted ids, in ``results.json``), and
refuses to train when they differ. Per-query nDCG@10 is kept for every arm, so each table row
also gets a paired test against ``st-stock`` (``--resamples``).

Datasets (``--datasets``): ``scifact`` (5,183 abstracts; reported on the full SciFact test
split, 300 claims, nDCG@10; settings are chosen on ``SciFact-dev``, the 809 SciFact *train*
claims against the same corpus — never on the test claims) and ``cranfield`` (1,400 aeronautics
abstracts; its 225 queries are the test; it has no train split, which is this setting). Both also
report STS-B test (Spearman) and TREC clustering (V-measure) to show nothing else broke.

Training protocol, every arm: batch 32, lr 2e-5, 128 tokens, one pass over the kept examples
(``--steps N`` for a fixed count, the rows cycled when there are fewer), seeds drive the
curriculum and the trainer. The LLM's answers are cached per dataset (``OUT/<dataset>/_cache``)
and shared by every arm and seed that sends the same request, so seeds and the round-trip arms
cost no LLM time. Each arm's model is saved as ``OUT/<dataset>/<arm>/seed<N>/model`` (a plain
``SentenceTransformer(path)`` loads it). ``OUT/results.json`` is written after every arm and
seed; a rerun skips what is in it (``--fresh`` redoes).

    python benchmarks/corpus_recipe.py --out runs/corpus                  # the default run
    python benchmarks/corpus_recipe.py --out runs/corpus --arms all --seeds 0 --select   # choose on the dev split
    python benchmarks/corpus_recipe.py --out runs/corpus --arms mined --seeds 0,1,2      # then the test split once
    python benchmarks/corpus_recipe.py --out runs/corpus --llm-base-url http://127.0.0.1:8000/v1 --llm-model Qwen/Qwen2.5-7B-Instruct --max-docs 5000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _kl(teacher_temperature: float) -> dict:
    return {"loss": "distill-kl", "distill_temperature": 0.05, "distill_teacher_temperature": teacher_temperature}


ARMS: dict[str, dict | None] = {
    "base": None,
    "mined": {"negatives": "mined"},
    "mined-rt": {"negatives": "mined", "round_trip_k": 10},
    "mined-rt1": {"negatives": "mined", "round_trip_k": 1},
    "mined-rt100": {"negatives": "mined", "round_trip_k": 100},
    "llm": {"negatives": "llm"},
    "mixed": {"negatives": "mixed"},
    "mined-q3": {"negatives": "mined", "queries_per_doc": 3},
    # training-side arms: the same cached LLM answers, another pass count over the kept examples
    "mined-e2": {"negatives": "mined", "curriculum": {"epochs": 2}},
    "mined-q3-e2": {"negatives": "mined", "queries_per_doc": 3, "curriculum": {"epochs": 2}},
    # GradCache (train.mini_batch_size = 8): the same loss with one 8-row chunk's activations in memory
    "mined-gc8": {"negatives": "mined", "train": {"mini_batch_size": 8}},
    # the stock recipe on the mined arm's own valid corpus records (trained outside negsynth's stages)
    "st-stock": {"stock": True},
    # one difference between the two recipes at a time, through negsynth's stages
    "mined-win41": {"negatives": "mined", "mining": {"range_max": 41}},
    "mined-nofilter": {"negatives": "mined", "score": {"policy": "annotate", "dedup": False}},
    "mined-plain": {"negatives": "mined", "train": {"mini_batch_size": "off"}},
    "mined-shuffled": {"negatives": "mined", "train": {"batch_sampler": "shuffled"}},
    # the no-LLM floor: the same pipeline with queries taken from the documents (what the LLM adds)
    "title-mined": {"negatives": "mined", "queries": "title"},
    "sentence-mined": {"negatives": "mined", "queries": "sentence"},
    # the LLM's query and the title, each an example (the LLM's requests as in "mined": cached)
    "mix-title-mined": {"negatives": "mined", "queries": "llm+title"},
    # the curriculum's rule before short batches: a phase's rows that fill no whole batch dropped
    "mined-dropshort": {"negatives": "mined", "curriculum": {"incomplete_batches": "drop"}},
    # the hybrid teacher (BM25 + the embedder, RRF): queries whose document it ranks in its top k,
    # negatives it ranks below the document
    "mined-teacher": {"negatives": "mined", "teacher": "hybrid", "teacher_k": 10},
    "mined-teacher-k3": {"negatives": "mined", "teacher": "hybrid", "teacher_k": 3},
    "mined-teacher-veto": {"negatives": "mined", "teacher": "hybrid", "teacher_k": 0},
    # distillation: every query kept (teacher_k = 0), the model learns the teacher's scores of each
    # example's document and negatives instead of (or beside) InfoNCE's one-hot target
    "mined-teacher-kl": {"negatives": "mined", "teacher": "hybrid", "teacher_k": 0, "train": {"loss": "distill-kl"}},
    "mined-teacher-mse": {"negatives": "mined", "teacher": "hybrid", "teacher_k": 0, "train": {"loss": "margin-mse"}},
    "mined-teacher-mix": {"negatives": "mined", "teacher": "hybrid", "teacher_k": 0, "train": {"loss": "mnrl+distill-kl"}},
    # the KL at temperatures that carry a signal: the student's cosines at its InfoNCE temperature
    # (0.05), the teacher's scores (median spread 0.7 in a row) at 0.1 (sharp) or 0.2 (soft)
    "mined-teacher-kl-sharp": {"negatives": "mined", "teacher": "hybrid", "teacher_k": 0, "train": _kl(0.1)},
    "mined-teacher-kl-soft": {"negatives": "mined", "teacher": "hybrid", "teacher_k": 0, "train": _kl(0.2)},
    "title-teacher-kl-sharp": {"negatives": "mined", "queries": "title", "teacher": "hybrid", "teacher_k": 0, "train": _kl(0.1)},
    "title-teacher-kl-soft": {"negatives": "mined", "queries": "title", "teacher": "hybrid", "teacher_k": 0, "train": _kl(0.2)},
    "title-teacher-mse": {"negatives": "mined", "queries": "title", "teacher": "hybrid", "teacher_k": 0, "train": {"loss": "margin-mse"}},
    # hybrid candidates: the negatives taken from the fused BM25 + dense ranking (the embedder's
    # margin kept), so lexical near-misses the embedder ranks low become negatives
    "mined-hybridcand": {"negatives": "mined", "candidates": "hybrid"},
    "title-hybridcand": {"negatives": "mined", "queries": "title", "candidates": "hybrid"},
    # the embedded LLM's query likelihood as the teacher (UPR), over each document and its 4 mined
    # negatives: keep a query only when the teacher prefers its document to all four (k1), or
    # learn the teacher's scores (kl-sharp: student 0.05, teacher 0.1)
    "mined-lik-k1": {"negatives": "mined", "teacher": "llm-likelihood", "teacher_k": 1},
    # the hybrid teacher and the LLM's likelihood fused (the best re-ranker on SciFact-dev): a
    # query kept when the fused order puts its document first among it and its mined negatives
    "mined-ens-k1": {"negatives": "mined", "teacher": "hybrid+llm-likelihood", "teacher_k": 1},
    "mined-lik-kl-sharp": {"negatives": "mined", "teacher": "llm-likelihood", "teacher_k": 0, "train": _kl(0.1)},
    # the likelihoods lie ~1.2 nats apart: at 0.1 the teacher is one-hot; at 1.0 it keeps its order
    "mined-lik-kl-t1": {"negatives": "mined", "teacher": "llm-likelihood", "teacher_k": 0, "train": _kl(1.0)},
    # a cross-encoder the user names (--teacher-model: a hub name or a folder; GPU when present):
    # GPL's recipe (MarginMSE on its scores), listwise KL, and a filter keeping a query only when
    # the model prefers its document to its 4 mined negatives
    "mined-ce-mse": {"negatives": "mined", "teacher": "cross-encoder", "teacher_k": 0, "train": {"loss": "margin-mse"}},
    "mined-ce-kl": {"negatives": "mined", "teacher": "cross-encoder", "teacher_k": 0, "train": _kl(1.0)},
    "mined-ce-k1": {"negatives": "mined", "teacher": "cross-encoder", "teacher_k": 1},
}
#: arms that need --teacher-model
NEEDS_TEACHER_MODEL = [a for a, spec in ARMS.items() if spec and spec.get("teacher") == "cross-encoder"]
STOCK_ARM = "st-stock"
DEFAULT_ARM = "mined"
DATASETS = {
    # dataset -> (data folder, tasks: the reported split first, then the dev split if there is one)
    "scifact": ("scifact", ["SciFact", "SciFact-dev", "STSBenchmark", "TRECClustering"]),
    "cranfield": ("cranfield", ["Cranfield", "STSBenchmark", "TRECClustering"]),
}


def pipeline_toml(corpus_dir: Path, arm: dict, args, seed: int) -> str:
    llm = f"[llm]\nbase_url = {json.dumps(args.llm_base_url)}\nmodel = {json.dumps(args.llm_model)}\nmax_concurrency = {args.concurrency}\n"
    llm += "temperature = 0.7\nseed = 0\nmax_tokens = 400\nmax_attempts = 3\ntimeout = 300\n"
    if args.llm_key_env:
        llm += f"api_key_env = {json.dumps(args.llm_key_env)}\n"
    serve = (
        (f"n_threads = {args.llm_threads}\n" if args.llm_threads else "")
        + (f"servers = {args.llm_servers}\n" if args.llm_servers else "")
        + (f"engine = {json.dumps(args.llm_engine)}\n" if args.llm_engine else "")
    )
    if serve:
        llm += "[serve]\n" + serve
    arm = dict(arm)
    cur = {"epochs": 1} if args.steps is None else {"total_steps": args.steps}
    cur.update(arm.pop("curriculum", {}))
    train = "".join(f"{k} = {json.dumps(v)}\n" for k, v in arm.pop("train", {}).items())
    score = "".join(f"{k} = {json.dumps(v)}\n" for k, v in arm.pop("score", {}).items())
    mining = "".join(f"{k} = {json.dumps(v)}\n" for k, v in arm.pop("mining", {}).items())
    # whole documents, as the published figures were measured (and their run dirs' config hashes
    # made); an arm may set chunk_tokens to measure passages
    arm.setdefault("chunk_tokens", 0)
    corpus = f"[corpus]\nmax_docs = {args.max_docs}\nseed = 0\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in arm.items())
    corpus += f"[[corpus.inputs]]\npath = {json.dumps(str(corpus_dir))}\n"
    if mining:
        corpus += "[corpus.mining]\n" + mining
    return (
        llm
        + "[pipeline]\nshard_size = 100\n"
        + corpus
        + '[score]\ninputs = ["corpus"]\n'
        + score
        + f"[curriculum]\nseed = {seed}\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in cur.items())
        + f"[train]\nbatch_size = {args.batch_size}\ngrad_accum = 1\nlr = {args.lr}\nmax_length = {args.max_length}\nseed = {seed}\n"
        + train
    )


def evaluate_model(path: str | None, tasks: list[str], args) -> dict:
    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.evaluate import evaluate

    emb = SentenceTransformerEmbedder.load(path or "default", device="cpu", batch_size=64)
    rep = evaluate(emb, suite="full", tasks=tasks, progress=False, data_dir=args.data_dir, seed=0, per_query=True)
    scores = {name: float(t["main_score"]) for name, t in rep["tasks"].items()}
    per_query = {name: t["per_query"] for name, t in rep["tasks"].items() if "per_query" in t}
    return {"scores": scores, "per_query": per_query, "eval_max_length": emb.model.max_seq_length}


def prepare_run(dataset: str, arm: str, seed: int, args) -> tuple[Path, Path]:
    """The arm's run dir (its LLM cache and corpus index shared by every arm of the dataset) and
    its pipeline TOML."""
    folder, _ = DATASETS[dataset]
    dest = args.out / dataset / arm
    run_dir = dest / "run"
    (run_dir).mkdir(parents=True, exist_ok=True)
    shared = args.out / dataset / "_cache"
    shared.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "cache").exists():
        (run_dir / "cache").symlink_to(shared.resolve(), target_is_directory=True)
    index = args.out / dataset / "_index"  # the corpus embedded once for every arm (same embedder)
    index.mkdir(parents=True, exist_ok=True)
    (run_dir / "corpus").mkdir(exist_ok=True)
    if not (run_dir / "corpus" / "_index").exists():
        (run_dir / "corpus" / "_index").symlink_to(index.resolve(), target_is_directory=True)
    toml = dest / "pipeline.toml"
    toml.write_text(pipeline_toml(Path(args.data_dir) / folder, ARMS[arm], args, seed))
    return dest, run_dir


def input_digest(run_dir: Path) -> dict:
    """What an arm starts from: the ``corpus`` stage's valid records (count, hash of the sorted ids)."""
    import hashlib

    from negsynth.data.shards import read_stage

    ids = sorted(r["id"] for r in read_stage(run_dir / "corpus"))
    return {"examples": len(ids), "ids_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]}


def train_arm(dataset: str, arm: str, seed: int, args) -> dict:
    """negsynth's stages on the corpus (the LLM's answers shared through the dataset's cache)."""
    from negsynth.schemas.config_io import load_config
    from negsynth.stages import run_pipeline

    if ARMS[arm].get("stock"):
        return train_stock(dataset, seed, args)
    dest, run_dir = prepare_run(dataset, arm, seed, args)
    toml = dest / "pipeline.toml"
    from negsynth.errors import UserError

    t0 = time.monotonic()
    model = dest / f"seed{seed}" / "model"
    no_model = None
    try:
        stats = run_pipeline(load_config(toml), run_dir, stages=["corpus", "score", "curriculum", "train"])
        shutil.rmtree(model, ignore_errors=True)
        shutil.copytree(run_dir / "train" / "final", model)
    except UserError as e:  # e.g. score kept too few examples for one batch: the arm is a result, not a crash
        no_model = str(e)
        print(f"corpus_recipe: {dataset} {arm} seed {seed}: no model ({no_model})", file=sys.stderr)
        stats = {
            k: json.loads((run_dir / k / "stats.json").read_text())
            for k in ("corpus", "score", "curriculum")
            if (run_dir / k / "stats.json").is_file()
        }
    wall = time.monotonic() - t0
    c, s, cur, tr = (stats.get(k, {}) for k in ("corpus", "score", "curriculum", "train"))
    this = c.get("this_run") or {}
    return {
        **({"model_dir": str(model)} if no_model is None else {"no_model": no_model}),
        "corpus": {
            k: c.get(k)
            for k in (
                "items",
                "valid",
                "rejected",
                "rejects_by_reason",
                "tokens",
                "wall_time_s",
                "round_trip",
                "query_styles",
                "query_words",
            )
        },
        "llm_requests_this_run": this.get("requests"),
        "kept": s.get("kept"),
        "rows": cur.get("rows"),
        "steps": tr.get("steps"),
        "loss": [tr.get("loss_first"), tr.get("loss_last")],
        "pipeline_s": round(wall, 1),
        "same_input": input_digest(run_dir),
    }


def train_stock(dataset: str, seed: int, args) -> dict:
    """sentence-transformers' stock recipe on negsynth's own examples: the default arm's valid
    ``corpus`` records (its corpus stage is run first when it has not been: the LLM's answers come
    from the dataset's shared cache), mined with ``mine_hard_negatives`` over the same documents
    and trained with MNRL and the ``NO_DUPLICATES`` sampler for one pass."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives
    from transformers import set_seed

    from negsynth.data.corpus import read_corpus
    from negsynth.data.shards import read_stage
    from negsynth.resources import minilm_path
    from negsynth.schemas.config_io import load_config
    from negsynth.stages import run_pipeline

    t0 = time.monotonic()
    src_dest, src_run = prepare_run(dataset, DEFAULT_ARM, 0, args)
    cfg = load_config(src_dest / "pipeline.toml")
    if not (src_run / "corpus" / "stats.json").is_file():
        run_pipeline(cfg, src_run, stages=["corpus"])
    records = sorted(read_stage(src_run / "corpus"), key=lambda r: r["id"])
    docs = [d.text for spec in cfg.corpus.inputs for d in read_corpus(spec).documents()]
    set_seed(seed)
    model = SentenceTransformer(str(minilm_path()), device="cpu")
    base_len = model.max_seq_length
    model.max_seq_length = args.max_length  # mining sees what training sees
    ds = Dataset.from_dict({"anchor": [r["query"] for r in records], "positive": [r["positive"] for r in records]})
    ds = mine_hard_negatives(
        ds,
        model,
        corpus=docs,
        num_negatives=4,
        relative_margin=0.05,
        sampling_strategy="top",
        output_format="n-tuple",
        batch_size=64,
        verbose=False,
    )
    # back to the base model's length before training: the trainer saves the model at the length it
    # was handed, and every arm is evaluated at the base model's (a stock model saved at 128 tokens
    # was once scored on truncated documents beside negsynth's at 256)
    model.max_seq_length = base_len
    dest = args.out / dataset / "st-stock" / f"seed{seed}"
    out = dest / "model"
    shutil.rmtree(out, ignore_errors=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _stock import train_stock_recipe

    trainer = train_stock_recipe(
        model, ds, out, batch_size=args.batch_size, lr=args.lr, seed=seed, max_length=args.max_length, steps=args.steps
    )
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {
        "model_dir": str(out),
        "kept": len(ds),
        "rows": len(ds),
        "steps": trainer.state.global_step,
        "batch_rows": trainer.batch_rows,  # NO_DUPLICATES leaves a batch short where rows share a text
        "loss": [losses[0], losses[-1]] if losses else [None, None],
        "pipeline_s": round(time.monotonic() - t0, 1),
        "same_input": input_digest(src_run),
    }


def dev_tasks(dataset: str) -> list[str]:
    return [t for t in DATASETS[dataset][1] if t.endswith("-dev")]


def run_one(dataset: str, arm: str, seed: int, args, tasks: list[str], prior: dict | None = None) -> dict:
    """Train the arm (unless ``prior`` already holds its saved model) and evaluate ``tasks``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _mem import PeakRSS

    if prior and prior.get("no_model"):
        return prior  # the arm gave no training data (its reason is recorded): nothing to evaluate
    if prior and (ARMS[arm] is None or Path(prior.get("model_dir", "")).is_dir()):
        # a model trained and scored on the dev split earlier: only the missing tasks are evaluated
        todo = [t for t in tasks if t not in prior["scores"]]
        with PeakRSS() as eval_mem:
            ev = evaluate_model(prior.get("model_dir"), todo, args)
        return {
            **prior,
            "eval_max_length": ev["eval_max_length"],
            "scores": {**prior["scores"], **ev["scores"]},
            "per_query": {**prior.get("per_query", {}), **ev["per_query"]},
            "eval_s": round(prior.get("eval_s", 0) + eval_mem.seconds, 1),
        }
    info: dict = {}
    path = None
    with PeakRSS() as train_mem:
        if ARMS[arm] is not None:
            info = train_arm(dataset, arm, seed, args)
            path = info.get("model_dir")
    with PeakRSS() as eval_mem:
        ev = evaluate_model(path, tasks, args) if "no_model" not in info else {"scores": {}, "per_query": {}}
    return {
        "dataset": dataset,
        "arm": arm,
        "seed": seed,
        "scores": ev["scores"],
        "per_query": ev["per_query"],
        **({"eval_max_length": ev["eval_max_length"]} if "eval_max_length" in ev else {}),
        **info,
        "train_s": round(train_mem.seconds, 1),
        "eval_s": round(eval_mem.seconds, 1),
        "train_peak_mib": train_mem.peak_mib,
        "eval_peak_mib": eval_mem.peak_mib,
    }


def summarise(results: list[dict], dataset: str) -> list[tuple]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _table import mean_sd, seed_scores

    _, tasks = DATASETS[dataset]
    rows = []
    base = next((r["scores"] for r in results if r["dataset"] == dataset and r["arm"] == "base"), None)
    for arm in ARMS:
        rs = [r for r in results if r["dataset"] == dataset and r["arm"] == arm]
        if not rs:
            continue
        cells = []
        for t in tasks:
            v = seed_scores(rs, t)
            if not v:
                cells.append("–")
                continue
            cell = mean_sd(v)
            if base and t in base and arm != "base":
                cell += f" ({statistics.mean(v) - 100 * base[t]:+.2f})"
            cells.append(cell)
        kept = [r.get("kept") for r in rs if r.get("kept") is not None]
        if all(r.get("no_model") for r in rs):
            cells = ["no model"] * len(cells)
        rows.append((arm, ",".join(str(r["seed"]) for r in rs), *cells, str(kept[0]) if kept else "–"))
    return rows


def paired_vs_stock(results: list[dict], dataset: str, arm: str, task: str, n_resamples: int) -> dict | None:
    """Per-query paired test of ``arm`` against ``st-stock`` on ``task`` (seeds pooled), or None."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _stock import paired_against_stock

    return paired_against_stock([r for r in results if r["dataset"] == dataset], arm, STOCK_ARM, task, n_resamples)


def print_paired(results: list[dict], dataset: str, tasks: list[str], n_resamples: int) -> None:
    retrieval = [t for t in tasks if any(t in r.get("per_query", {}) for r in results if r["dataset"] == dataset)]
    rows = []
    for arm in ARMS:
        cells = []
        for t in retrieval:
            p = paired_vs_stock(results, dataset, arm, t, n_resamples)
            cells.append(
                "–"
                if p is None
                else f"{100 * p['mean_diff']:+.2f} [{100 * p['ci_low']:+.2f}, {100 * p['ci_high']:+.2f}], p {p['p_value']:.3f}"
            )
        if any(c != "–" for c in cells):
            rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    if rows:
        print(
            f"\nPer query against {STOCK_ARM} (nDCG@10 x 100, seeds pooled; 95 % bootstrap CI; two-sided sign-flip p, {n_resamples} resamples)\n"
        )
        print("| arm | " + " | ".join(retrieval) + " |")
        print("|---|" + "---:|" * len(retrieval))
        print("\n".join(rows))


def check_same_input(results: list[dict], dataset: str) -> None:
    """The stock recipe and negsynth's default must start from the same examples (count and ids)."""
    seen = {(r["arm"], r["seed"]): r.get("same_input") for r in results if r["dataset"] == dataset and r.get("same_input")}
    stock = [v for (a, _), v in seen.items() if a == STOCK_ARM]
    mine = [v for (a, _), v in seen.items() if a == DEFAULT_ARM]
    if stock and mine:
        if any(v != mine[0] for v in stock + mine):
            raise SystemExit(
                f"corpus_recipe: {dataset}: {STOCK_ARM} and {DEFAULT_ARM} did not start from the same examples: {stock} vs {mine}"
            )
        print(
            f"\nsame input ({dataset}): {STOCK_ARM} and {DEFAULT_ARM} read the same {mine[0]['examples']} examples (ids {mine[0]['ids_sha256']})"
        )


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
        _, tasks = DATASETS[d]
        print(f"\n### {d} (x100; mean ± sd over seeds, (Δ vs base))\n")
        print("| arm | seeds | " + " | ".join(tasks) + " | examples kept |")
        print("|---|---|" + "---:|" * (len(tasks) + 1))
        for row in summarise(results, d):
            print("| " + " | ".join(row) + " |")
        print_paired(results, d, tasks, args.resamples)
        check_same_input(results, d)
        llm = [r for r in results if r["dataset"] == d and r.get("corpus")]
        for arm in dict.fromkeys(r["arm"] for r in llm):
            r = next(x for x in llm if x["arm"] == arm)
            c = r["corpus"]
            docs = c.get("items") or 0
            if docs:
                tok = c.get("tokens") or {}
                print(
                    f"- {arm}: {c['valid']} valid of {c['items']} queries, rejects {c.get('rejects_by_reason')}, tokens in/out {tok.get('prompt')}/{tok.get('completion')}, "
                    f"LLM wall {c.get('wall_time_s')} s (first run), round trip {(c.get('round_trip') or {}).get('top1')} top-1"
                )


def load_results(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def save_result(path: Path, r: dict) -> list[dict]:
    """Add one result to ``results.json`` and return them all: read again right before the write,
    under a lock, so arms another process runs into the same ``--out`` at the same time are kept."""
    import fcntl

    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = [x for x in load_results(path) if (x["dataset"], x["arm"], x["seed"]) != (r["dataset"], r["arm"], r["seed"])] + [r]
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(path)
    return results


def build_parser() -> argparse.ArgumentParser:
    from negsynth.resources import default_data_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/corpus-recipe"))
    ap.add_argument("--datasets", default="scifact,cranfield", help="comma-separated: scifact, cranfield")
    ap.add_argument("--arms", default=f"base,{DEFAULT_ARM}", help=f"comma-separated, or 'all': {', '.join(ARMS)}")
    ap.add_argument("--seeds", default="0,1,2", help="seeds of the trained arms (the base model has none)")
    ap.add_argument("--max-docs", type=int, default=400, help="documents sampled per corpus (seeded; every reported figure used 400)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: one pass over the kept examples)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--llm-base-url", default="embedded")
    ap.add_argument("--llm-model", default="smollm2-135m-instruct")
    ap.add_argument("--llm-key-env", default=None, help="environment variable holding the API key")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument(
        "--llm-threads",
        type=int,
        default=None,
        help="the embedded server's threads (default: the cores free when it starts; 1 on a machine other jobs share)",
    )
    ap.add_argument(
        "--llm-servers",
        type=int,
        default=None,
        help="the embedded LLM's servers side by side (default: serve.servers's auto, one per free core)",
    )
    ap.add_argument(
        "--teacher-model",
        default="",
        help="the cross-encoder the mined-ce-* arms use as their teacher (corpus.teacher_model: a hub name or a folder)",
    )
    ap.add_argument(
        "--llm-engine",
        default=None,
        choices=["llama-server", "llama-cpp-python"],
        help="the embedded server's engine (default: serve.engine's auto)",
    )
    ap.add_argument("--data-dir", default=str(default_data_dir() or "../shared/data"))
    ap.add_argument("--fresh", action="store_true", help="redo arms already in results.json")
    ap.add_argument(
        "--tasks",
        type=lambda v: [t.strip() for t in v.split(",") if t.strip()],
        default=None,
        help="evaluate only these of each dataset's tasks (e.g. Cranfield,SciFact-dev: the retrieval figures alone, for quick ablations)",
    )
    ap.add_argument("--resamples", type=int, default=10000, help="bootstrap / permutation resamples of the paired per-query tests")
    ap.add_argument(
        "--select",
        action="store_true",
        help="evaluate the dev split only (SciFact-dev: SciFact's train claims): choose settings with this, "
        "then run without it to score the chosen arm on the test split once (its saved model is reused)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.arms.strip() == "all":  # the cross-encoder arms only when a model is named
        arms = [a for a in ARMS if args.teacher_model or a not in NEEDS_TEACHER_MODEL]
    else:
        arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        ap.error(f"--arms: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(ARMS)} or all")
    ce_arms = [a for a in arms if a in NEEDS_TEACHER_MODEL]
    if ce_arms and not args.teacher_model:
        ap.error(f"--arms {','.join(ce_arms)}: name the cross-encoder with --teacher-model (a hub name or a folder)")
    for a in ce_arms:
        ARMS[a] = {**ARMS[a], "teacher_model": args.teacher_model}
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not datasets or any(d not in DATASETS for d in datasets):
        ap.error(f"--datasets: choose from {', '.join(DATASETS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: comma-separated integers, e.g. 0,1,2")
    for d in datasets:
        if not (Path(args.data_dir) / DATASETS[d][0]).is_dir():
            print(
                f"corpus_recipe: no {d} data under {args.data_dir}; pass --data-dir (the folder holding {DATASETS[d][0]}/)", file=sys.stderr
            )
            return 2
    # score decontaminates the generated queries against the evaluation sets read from here
    os.environ["NEGSYNTH_DATA_DIR"] = str(Path(args.data_dir).resolve())
    args.out.mkdir(parents=True, exist_ok=True)
    res_path = args.out / "results.json"
    results = [] if args.fresh else load_results(res_path)
    # every arm once before any second seed: an interrupted run still has the whole table
    plan = [(d, a, s) for s_i, s in enumerate(seeds) for d in datasets for a in arms if not (a == "base" and s_i > 0)]
    for d, a, s in plan:
        key = (d, a, -1 if a == "base" else s)
        tasks = dev_tasks(d) if args.select else DATASETS[d][1]
        if args.tasks:
            tasks = [t for t in tasks if t in args.tasks]
        if not tasks:
            print(f"corpus_recipe: {d} has no dev split; --select skips it", file=sys.stderr)
            continue
        # --fresh: every planned run is redone once, though results (read back after each save)
        # still hold its earlier figure
        prior = None if args.fresh else next((r for r in results if (r["dataset"], r["arm"], r["seed"]) == key), None)
        if prior and all(t in prior["scores"] for t in tasks):
            continue
        print(f"corpus_recipe: {d} {a} seed {key[2]} ({', '.join(tasks)}) ...", file=sys.stderr, flush=True)
        r = run_one(d, a, key[2], args, tasks, prior)
        results = save_result(res_path, r)
        print(json.dumps({k: r[k] for k in ("dataset", "arm", "seed", "scores", "train_s", "eval_s")}), file=sys.stderr, flush=True)
    print_table(results, datasets, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
