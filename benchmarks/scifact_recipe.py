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
                       candidates in the library's window, ``mining.strategy = "top"``) -> ``score``
                       (measured policy) -> ``curriculum`` (``schedule = "auto"`` -> ``stock``: the rows
                       in input order, once) -> ``train`` (the stock sampler, plain MNRL, the
                       curriculum's ``total_steps``); only batch, steps, lr, length, seed and the mining
                       length (the training length, as the stock arm mines) set as for every arm (run
                       dir ``OUT/ns-pipeline/seedN/run``). It trains the stock recipe's rows tuple for
                       tuple (checked: the table is refused otherwise) and, where ``score`` drops
                       nothing, its model bit for bit
ns-pipeline-reordered  the default's rows and trainer, the rows in the ``tuple`` builder's seeded
                       order: how far the row order alone moves a figure
ns-pipeline-tuple      the default before ``stock``: the ``tuple`` builder (seeded passes in planned
                       batches, the order-keeping sampler, GradCache on CPU) and the wider window
                       (10 x 4 + 4 x the most positives of a query)
ns-pipeline-neardedup  ns-pipeline with ``score.dedup_labelled = "near"`` (the default before): a
                       dataset's near-identical pairs dropped too (SciFact: 115 claim / altered-claim
                       pairs with the same abstract)
ns-pipeline-wide       ns-pipeline with ``regenerate.mining.range_max = 340`` instead of ~44-60
                       candidates: 29 queries short of 4 negatives instead of 121
ns-pipeline-noeasy     ns-pipeline with ``score.easy_margin = 0.1`` (the easiness filter of the
                       ns-tuple-hard-noeasy arm, through the stages)
ns-pipeline-gc8        ns-pipeline trained with ``train.mini_batch_size = 8`` (GradCache: the same
                       loss in 8-row chunks, a sixth of the training memory; dropout drawn in
                       another order)
ns-pipeline-b12        ns-pipeline with 12 rows a batch: fewer rows per step than the stock recipe's
                       sampler leaves where queries have several positives (Cranfield: 320 rows in
                       17 steps, 10-25 a batch), where the default trains 32
ns-pipeline-qbalanced  ns-pipeline-tuple with ``curriculum.balance = "queries"``: a pass is one row per
                       query, its positives in turn (each query weighs once, as in nDCG@10)
ns-stockrows           the stock recipe's own rows (``st-mined-4``'s ``mine_hard_negatives`` output)
                       through negsynth's curriculum (``tuple``, as many row visits as steps x batch)
                       and trainer defaults. Where queries have several positives the rows share
                       anchors and pack into many short batches (Cranfield: ~54 steps instead of
                       17), so there it is not a like-for-like trainer comparison; the bit-for-bit
                       test and ``ns-pipeline`` are
ns-llm-{curriculum,    LLM-graded negatives from a ``regenerate`` run (``--llm-run DIR``; the
random,reverse}        examples' scored levels), in curriculum / random / reverse order
=====================  ==========================================================================

**Protocol: choose on dev, report test once.** ``--dataset DIR`` is any BEIR-format folder with a
train and a test split (default: SciFact from ``--data-dir``; the layouts read are
``DIR/{corpus,queries}.jsonl`` + ``DIR/qrels.tsv`` as the test split + ``DIR/train/{queries.jsonl,qrels.tsv}``,
as in ``../shared/data/scifact``, and BEIR's own ``DIR/{corpus,queries}.jsonl`` +
``DIR/qrels/{train,test}.tsv``). A seeded slice of the *train* queries (``--dev-frac``, by query,
``--split-seed``) is held out as the dev split; every arm trains on the rest (``fit``) and is
evaluated on dev, where settings are compared and chosen. The test split is evaluated only for the
arms a reader needs to see there — base, the stock recipe (``st-mined-4``), negsynth's default
(``ns-pipeline``) and the negsynth arm that scored best on dev — once each per seed, after every
arm's dev figure is in (``--dev-frac 0``: no dev split, every arm is evaluated on test, the old
protocol). The split files (queries and qrels only; the corpus is a link) are written under
``OUT/<dataset>/_split/``. Each arm is compared with the stock recipe **per query**: the
per-query nDCG@10 of each arm is averaged over its seeds, and the table gives the mean difference,
its 95 % bootstrap CI (queries and seeds resampled) and a two-sided paired sign-flip permutation
p-value (``negsynth.evaluate.stats``). ``--counts-only`` prints, without training, how many
training pairs and queries survive positive-aware mining and the false-negative filters in the
stock recipe and in negsynth's pipeline arms, and how the kept rows are cycled to fill the step
budget (the stages' own stats; also printed after a full run).

The arm trained with negsynth's default settings (``ns-pipeline``) is also saved as
``OUT/<dataset>/negsynth-default/``; every arm's model is saved under ``OUT/<dataset>/<arm>/`` (a plain
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
    python benchmarks/scifact_recipe.py --out runs/recipe --dataset path/to/beir-folder --counts-only   # data flow, no training
    python benchmarks/scifact_recipe.py --out runs/recipe --dataset path/to/beir-folder     # the same arms on your own data
    python benchmarks/scifact_recipe.py --out runs/recipe --arms ARMS --dev-only            # dev figures only; rerun without it for test

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
ALL_ARMS = (
    "base",
    "st-mined-4",
    "ns-graded-curriculum",
    "st-inbatch",
    "st-mined-1",
    "ns-graded-tuple",
    "ns-graded-random",
    "ns-graded-reverse",
    "ns-tuple-curriculum",
    "ns-tuple-hard",
    "ns-tuple-hard-hw",
    "ns-tuple-hard-noeasy",
    "ns-pipeline",
    "ns-pipeline-neardedup",
    "ns-pipeline-wide",
    "ns-pipeline-noeasy",
    "ns-pipeline-gc8",
    "ns-pipeline-b12",
    "ns-pipeline-qbalanced",
    "ns-pipeline-reordered",
    "ns-pipeline-tuple",
    "ns-stockrows",
    "ns-llm-curriculum",
    "ns-llm-random",
    "ns-llm-reverse",
)
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
    # the same data trained with GradCache (8-row chunks): does the memory saving change the model?
    "ns-pipeline-gc8": "[train]\nmini_batch_size = 8\n",
    # the default with fewer rows a batch than the stock recipe's sampler leaves on data whose queries
    # have several positives (Cranfield's fit split: 320 rows in 17 batches of 10-25; the default: 32
    # each): the same steps, fewer rows and fewer in-batch negatives per step
    "ns-pipeline-b12": "[train]\nbatch_size = 12\n",
    # a pass is one row per query, its positives in turn: a query with nine positives weighs as one
    # with one (the stock recipe's sampler does something like it by accident on such data)
    # (on the tuple path: the stock schedule writes each example once and draws no passes)
    "ns-pipeline-qbalanced": '[curriculum]\nschedule = "tuple"\nbalance = "queries"\n',
    # the stock recipe's rows and trainer (the default's), the rows in the tuple builder's seeded
    # order instead of the library's: how far the row order alone moves a figure
    "ns-pipeline-reordered": (
        '[curriculum]\nschedule = "tuple"\nepochs = 1\n[train]\nmax_steps = {steps}\nbatch_sampler = "shuffled"\nmini_batch_size = "off"\n'
    ),
    # the default before the stock schedule: negsynth's tuple builder (seeded passes packed into
    # planned batches, the order-keeping sampler, GradCache on CPU) and its wider mining window
    # (10 x 4 + 4 x the most positives of one query)
    "ns-pipeline-tuple": '[curriculum]\nschedule = "tuple"\n[regenerate.mining]\nrange_max = {tuple_range_max}\n',
}
# the arms whose examples must be the stock recipe's rows, tuple for tuple (check_same_rows)
SAME_ROWS_ARMS = ("ns-pipeline", "ns-pipeline-reordered")


STOCK_ARM = "st-mined-4"  # the stock recipe every arm is tested against


def pipeline_extra(arm: str, src, args=None) -> str:
    """A pipeline arm's TOML lines, with ``{tuple_range_max}`` filled in for the fit split (the
    window before the library's: 10 x 4 negatives + 4 x the most positives of one query) and
    ``{steps}`` with the protocol's step count."""
    from collections import Counter

    most = max(Counter(p.query for p in src.pairs).values(), default=1)
    return PIPELINE_ARMS[arm].format(tuple_range_max=40 + 4 * most, steps=args.steps if args is not None else None)


# ------------------------------------------------------------------------------ dataset and splits


def dataset_files(root: Path) -> dict[str, Path]:
    """The corpus and the train / test (queries, qrels) files of a BEIR folder, in either layout
    (this project's ``scifact``: test at the top, ``train/`` beside it; BEIR's: ``qrels/{train,test}.tsv``)."""

    def first(cands):
        return next(((q, r) for q, r in cands if q.is_file() and r.is_file()), None)

    corpus = root / "corpus.jsonl"
    train = first(
        [(root / "train" / "queries.jsonl", root / "train" / "qrels.tsv"), (root / "queries.jsonl", root / "qrels" / "train.tsv")]
    )
    test = first(
        [
            (root / "test" / "queries.jsonl", root / "test" / "qrels.tsv"),
            (root / "queries.jsonl", root / "qrels" / "test.tsv"),
            (root / "queries.jsonl", root / "qrels.tsv"),
        ]
    )
    missing = [what for what, ok in (("corpus.jsonl", corpus.is_file()), ("a train split", train), ("a test split", test)) if not ok]
    if missing:
        sys.exit(
            f"scifact_recipe: {root} is not a BEIR folder with train and test splits (missing {', '.join(missing)}); "
            "expected corpus.jsonl + queries.jsonl + qrels.tsv (test) + train/{queries.jsonl,qrels.tsv}, or qrels/{train,test}.tsv"
        )
    return {"corpus": corpus, "train_queries": train[0], "train_qrels": train[1], "test_queries": test[0], "test_qrels": test[1]}


def split_one_set(root: Path, dest: Path, test_frac: float, split_seed: int) -> Path:
    """A labelled folder with one query set (``DIR/{corpus,queries}.jsonl`` + ``DIR/qrels.tsv``, e.g.
    Cranfield): hold out ``test_frac`` of its judged queries (by query id, seeded) as ``dest/test``,
    the rest as ``dest/train``; the corpus is a link. Returns ``dest``, a folder in this project's
    layout that :func:`dataset_files` reads."""
    import random

    from negsynth.data.readers import read_id_texts, read_tsv

    qpath, rpath = root / "queries.jsonl", root / "qrels.tsv"
    if not (root / "corpus.jsonl").is_file() or not qpath.is_file() or not rpath.is_file():
        sys.exit(f"scifact_recipe: --test-frac needs {root}/corpus.jsonl, queries.jsonl and qrels.tsv (one labelled query set to split)")
    queries = read_id_texts(qpath)
    cols = read_tsv(rpath, ("query-id", "corpus-id", "score"))
    rows = list(zip(cols["query-id"], cols["corpus-id"], cols["score"]))
    qids = sorted({q for q, _, g in rows if float(g) > 0 and queries.get(q)})
    order = qids[:]
    random.Random(f"test-split-{split_seed}").shuffle(order)  # another draw than the dev split's
    n_test = round(test_frac * len(qids))
    if n_test < 10 or len(qids) - n_test < 20:
        sys.exit(
            f"scifact_recipe: --test-frac {test_frac} holds out {n_test} of {len(qids)} judged queries; choose a fraction that leaves >= 10 test and >= 20 train queries"
        )
    test = set(order[:n_test])
    # a judged document with no text cannot be a training positive (Cranfield has two empty ones):
    # its train qrels are left out and counted; the test split keeps every judgement
    empty = {d for d, title, text in read_corpus_rows(root / "corpus.jsonl") if not (title or text).strip()}
    dropped = [r for r in rows if r[0] not in test and r[1] in empty]
    if dropped:
        print(f"scifact_recipe: {len(dropped)} train qrel(s) point at empty documents and are left out of train", file=sys.stderr)
    rows = [r for r in rows if r[0] in test or r[1] not in empty]
    dest.mkdir(parents=True, exist_ok=True)
    link = dest / "corpus.jsonl"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to((root / "corpus.jsonl").resolve())
    for split, keep in (("train", lambda q: q not in test), ("test", lambda q: q in test)):
        d = dest / split
        d.mkdir(exist_ok=True)
        ids = [q for q in qids if keep(q)]
        kept = set(ids)
        (d / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": queries[q]}) + "\n" for q in ids), encoding="utf-8")
        (d / "qrels.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t{g}\n" for q, c, g in rows if q in kept), encoding="utf-8"
        )
    return dest


def read_corpus_rows(path: Path):
    """``(id, title, text)`` of each document of a BEIR ``corpus.jsonl``."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                yield str(d["_id"]), d.get("title") or "", d.get("text") or ""


def make_splits(root: Path, dest: Path, dev_frac: float, split_seed: int) -> dict:
    """Hold out ``dev_frac`` of the train queries (by query id, seeded) as ``dest/dev``; the rest is
    ``dest/fit`` (what every arm trains on); ``dest/test`` links the test split. Only query and qrels
    files are written (the corpus is a link). Returns the split's description (sizes, seed)."""
    import random

    from negsynth.data.readers import read_id_texts, read_tsv

    f = dataset_files(root)
    queries = read_id_texts(f["train_queries"])
    cols = read_tsv(f["train_qrels"], ("query-id", "corpus-id", "score"))
    rows = list(zip(cols["query-id"], cols["corpus-id"], cols["score"]))
    qids = sorted({q for q, _, g in rows if float(g) > 0 and queries.get(q)})
    rng = random.Random(split_seed)
    order = qids[:]
    rng.shuffle(order)
    n_dev = round(dev_frac * len(qids))
    dev = set(order[:n_dev])
    if dev_frac > 0 and (n_dev < 10 or n_dev == len(qids)):
        sys.exit(
            f"scifact_recipe: --dev-frac {dev_frac} holds out {n_dev} of {len(qids)} train queries; choose a fraction that leaves >= 10 on each side"
        )
    dest.mkdir(parents=True, exist_ok=True)

    def link(target: Path, name: Path) -> None:
        if name.is_symlink() or name.exists():
            name.unlink()
        name.symlink_to(target.resolve())

    link(f["corpus"], dest / "corpus.jsonl")
    for split, keep in (("fit", lambda q: q not in dev), ("dev", lambda q: q in dev)):
        d = dest / split
        d.mkdir(exist_ok=True)
        ids = [q for q in qids if keep(q)]
        (d / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": queries[q]}) + "\n" for q in ids), encoding="utf-8")
        kept = set(ids)
        (d / "qrels.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t{g}\n" for q, c, g in rows if q in kept), encoding="utf-8"
        )
    (dest / "test").mkdir(exist_ok=True)
    link(f["test_queries"], dest / "test" / "queries.jsonl")
    link(f["test_qrels"], dest / "test" / "qrels.tsv")
    test_q = {q for q, g in zip(*read_tsv(f["test_qrels"], ("query-id", "score")).values()) if float(g) > 0}
    info = {
        "dataset": str(root.resolve()),
        "dev_frac": dev_frac,
        "split_seed": split_seed,
        "train_queries": len(qids),
        "fit_queries": len(qids) - len(dev),
        "dev_queries": len(dev),
        "test_queries": len(test_q),
        "fit_pairs": sum(1 for q, _, g in rows if float(g) > 0 and q in queries and q not in dev),
        "dev_pairs": sum(1 for q, _, g in rows if float(g) > 0 and q in dev),
    }
    (dest / "split.json").write_text(json.dumps(info, indent=1))
    return info


def fit_source(args):
    """The training pairs (the ``fit`` split) as negsynth reads a BEIR folder ("title text" documents)."""
    from negsynth.data.sources import load_source
    from negsynth.schemas.config import SourceSpec

    return load_source(SourceSpec(path=str(args.split_dir), split="fit", name=args.name))


def dev_task(args):
    from negsynth.evaluate import retrieval_task

    return retrieval_task(
        f"{args.name}-dev", args.split_dir / "dev", doc_title=args.doc_title, note="held-out train queries: for choosing settings"
    )


def test_task(args):
    from negsynth.evaluate import retrieval_task

    return retrieval_task(
        f"{args.name}-test", args.split_dir / "test", doc_title=args.doc_title, note="the test split: reported once per chosen setting"
    )


def base_model(args):
    from sentence_transformers import SentenceTransformer

    from negsynth.embed.base import resolve_device
    from negsynth.resources import minilm_path

    return SentenceTransformer(str(minilm_path()), device=resolve_device(args.device))


def evaluate_model(path: str | None, args, tasks: list) -> tuple[dict, dict]:
    """``(main scores, per-query nDCG@10 of the retrieval tasks)`` of one model on ``tasks``."""
    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.evaluate import evaluate

    emb = SentenceTransformerEmbedder.load(path or "default", device=args.device, dtype="float32", batch_size=64)
    rep = evaluate(emb, suite=args.eval_suite, tasks=tasks, progress=False, data_dir=args.data_dir, seed=0, per_query=True)
    return (
        {name: float(t["main_score"]) for name, t in rep["tasks"].items()},
        {name: t["per_query"] for name, t in rep["tasks"].items() if "per_query" in t},
    )


# ------------------------------------------------------------------------------ data of each arm


def cached_mining(src, args, name: str, mine) -> dict:
    """``mine(model, queries, positives)`` over SciFact train with the base model at the training
    length (as the stock arms mine), cached as ``OUT/_mined/<name>.json``."""
    cache = args.out / "_mined" / f"{name}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    queries = {p.query_key: p.query for p in src.pairs}
    positives = {k: src.positives_by_query.get(k, []) for k in queries}
    model = base_model(args)
    model.max_seq_length = args.max_length
    found = mine(model, queries, positives)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(found))
    return found


def graded_found(src, args, seed: int) -> dict:
    """Multi-granularity mining over SciFact train (cached per seed under OUT/_mined)."""
    from negsynth.embed.mining import mine_graded

    return cached_mining(
        src,
        args,
        f"graded-seed{seed}",
        lambda model, queries, positives: mine_graded(model, queries, positives, src.corpus, seed=seed, cache_folder=args.emb_cache),
    )


def graded_tuple_rows(src, args, seed: int) -> list[dict]:
    """n-tuple rows with all 4 graded negatives (hardest band first), in 4 phases of measured
    row difficulty: the hardest negative's cosine relative to the positive's, easiest first."""
    found = graded_found(src, args, seed)
    rows = []
    for p in src.pairs:
        f = found.get(p.query_key) or {}
        negs = [n for n in f.get("negatives", []) if n != p.positive]
        if len(negs) == 4 and f.get("pos_score"):
            rows.append(
                (
                    {"anchor": p.query, "positive": p.positive, **{f"negative_{j + 1}": t for j, t in enumerate(negs)}},
                    f["scores"][0] / f["pos_score"],
                )
            )
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
            out.append(
                {
                    "id": f"scifact-{i}",
                    "task": "",
                    "task_type": "short-long",
                    "query": p.query,
                    "positive": p.positive,
                    "negatives": negs,
                    "source": "scifact",
                }
            )
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
    pool = cached_mining(
        src,
        args,
        f"pool{depth}",
        lambda model, queries, positives: mine_negatives(
            model,
            queries,
            positives,
            src.corpus,
            depth,
            relative_margin=0.05,
            range_max=depth + 4 * max((len(v) for v in positives.values()), default=1) + 300,
            cache_folder=args.emb_cache,
        ),
    )
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
        print(
            f"easiness filter: {len(src.pairs) - len(pairs)} of {len(src.pairs)} queries dropped (margin > {args.easy_margin})", flush=True
        )
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
        rows.append(
            {
                "anchor": p.query,
                "positive": p.positive,
                **{f"negative_{j + 1}": t for j, t in enumerate(negs)},
                "phase": phase,
                "level": level,
            }
        )
    return rows


def stockrows_curriculum(src, args, seed: int) -> list[dict]:
    """The stock recipe's own rows (``st-mined-4``: the pairs ``mine_hard_negatives`` kept, their 4
    negatives hardest first) as negsynth examples, through negsynth's curriculum (``tuple``, seeded
    passes over the rows for the arms' row budget, packed without a duplicate text per batch)."""
    ds = stock_rows(src, STOCK_ARM, args)
    negs = [c for c in ds.column_names if c.startswith("negative")]
    examples = [
        {
            "id": f"stock-{i}",
            "task": "",
            "task_type": "short-long",
            "query": r["anchor"],
            "positive": r["positive"],
            "negatives": [r[c] for c in negs],
            "source": "stock",
        }
        for i, r in enumerate(ds)
    ]
    from negsynth.data.curriculum import build_curriculum

    # as many row visits as the stock trainer's step budget (steps x batch): 33-odd queries with
    # several positives each cannot fill whole batches of distinct texts for a fixed step count, so
    # the passes are given and the rows that collide train in short batches, as NO_DUPLICATES does
    epochs = args.steps * args.batch_size / max(len(examples), 1)
    return list(
        build_curriculum(
            examples,
            schedule="tuple",
            batch_size=args.batch_size,
            epochs=epochs,
            seed=seed,
            homogeneous_batches=False,
            instruction_template=None,
        )
    )


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

    return list(
        build_curriculum(
            examples,
            schedule=schedule,
            batch_size=args.batch_size,
            total_steps=steps,
            seed=seed,
            homogeneous_batches=False,
            instruction_template=None,
        )
    )


def decontam_sets_without(folder: str) -> list[str]:
    """Every evaluation set ``score`` decontaminates against by default, less ``folder``. A
    ``--test-frac`` dataset is split by query from one query file, so decontaminating its training
    queries against that file (which holds them all) would reject every one as contaminated; the
    split itself keeps the test queries out of training."""
    from negsynth.data.clean import select_eval_files
    from negsynth.evaluate.suite import TASKS

    return sorted({s for s, _ in select_eval_files("auto", TASKS)} - {folder})


def pipeline_toml(src_dir: Path, args, seed: int, extra_toml: str = "", split: str = "train", name: str | None = None) -> str:
    """The run file of a pipeline arm: mined negatives for the training split, the shared training
    protocol, and the arm's own TOML merged over it (an arm's key replaces the protocol's: e.g.
    ``[train] batch_size``). ``src_dir``: the data dir holding ``scifact/`` (``name`` None), else the
    BEIR folder itself."""
    import tomllib

    import tomli_w

    from negsynth.schemas.config_io import layer

    path = src_dir / "scifact" if name is None else src_dir
    cfg: dict = {
        "regenerate": {"negatives": "mined", "inputs": [{"path": str(path), "split": split, **({"name": name} if name else {})}]},
        "curriculum": {"seed": seed, "total_steps": args.steps},
        "train": {"batch_size": args.batch_size, "grad_accum": 1, "lr": args.lr, "max_length": args.max_length, "seed": seed},
        # mined (and scored) at the training length, as the stock arm mines: the same rows for both
        "embedder": {"max_length": args.max_length},
    }
    own = getattr(args, "split_from", None)
    if own:  # --test-frac: the dataset's own query file holds the train queries too (see decontam_sets)
        cfg["score"] = {"decontam_sets": decontam_sets_without(own)}

    merged = layer(cfg, tomllib.loads(extra_toml))  # the arm's tables over the protocol's, key by key
    if "epochs" in merged["curriculum"]:  # an arm that sizes the curriculum by passes, not steps
        merged["curriculum"].pop("total_steps", None)
    return tomli_w.dumps(merged)


PIPELINE_DATA_STAGES = ["regenerate", "score", "curriculum"]


def run_pipeline_arm(args, seed: int, dest: Path, extra_toml: str = "", stages: list[str] | None = None) -> dict:
    """negsynth's stages on the fit split in ``dest/run`` (every stage by default; the data stages only
    for ``--counts-only``, which a later full run resumes). Returns each stage's stats."""
    import shutil

    from negsynth.schemas.config_io import load_config
    from negsynth.stages import run_pipeline

    run_dir = dest / "run"
    toml = dest / "pipeline.toml"
    dest.mkdir(parents=True, exist_ok=True)
    # the mined examples do not depend on the seed: another seed's finished regenerate + score are
    # copied in and reused by the stages' own resume check (same config -> not recomputed); an arm
    # that changes only score (or later) takes another pipeline arm's regenerate the same way
    done = [d for d in sorted(dest.parent.glob("seed*/run")) if d != run_dir and (d / "score" / "stats.json").is_file()]
    skip = ("curriculum", "train", "evaluate")
    if not done and "[regenerate" not in extra_toml:
        done = [args.out / a / dest.name / "run" for a, extra in PIPELINE_ARMS.items() if "[regenerate" not in extra]
        done = [d for d in done if d != run_dir and (d / "regenerate" / "stats.json").is_file()]
        skip = ("score", *skip)
    if done and not run_dir.exists():
        shutil.copytree(done[0], run_dir, ignore=lambda folder, names: [n for n in names if n in skip] if Path(folder) == done[0] else [])
    toml.write_text(pipeline_toml(args.split_dir, args, seed, extra_toml, split="fit", name=args.name))
    return run_pipeline(load_config(toml), run_dir, stages=stages or PIPELINE_DATA_STAGES + ["train"])


def train_pipeline(args, seed: int, dest: Path, extra_toml: str = "") -> dict:
    """negsynth's stages with their defaults on the fit split (no LLM: mined negatives), then the model
    copied to ``dest``. Only what every arm shares is set: batch (32 rows per optimizer step, no
    accumulation), optimizer steps (the curriculum's ``total_steps``: another seeded pass over the
    examples when the filters left fewer rows), lr, training length, seed."""
    import shutil

    stats = run_pipeline_arm(args, seed, dest, extra_toml)
    final = dest / "run" / "train" / "final"
    shutil.rmtree(dest / "model", ignore_errors=True)
    shutil.copytree(final, dest / "model")
    cur, tr = stats.get("curriculum", {}), stats.get("train", {})
    return {
        "rows": cur.get("rows"),
        "schedule": cur.get("schedule"),
        "examples": stats.get("score", {}).get("kept", stats.get("regenerate", {}).get("valid")),
        "steps": tr.get("steps"),
        "loss": [tr.get("loss_first"), tr.get("loss_last")],
        "model_dir": str(dest / "model"),
    }


# ------------------------------------------------------------------------------ data flow (no training)


def stock_rows(src, arm: str, args):
    """The stock recipe's training rows: (anchor, positive) pairs, + ``mine_hard_negatives`` for st-mined-K."""
    from datasets import Dataset

    ds = Dataset.from_dict({"anchor": [p.query for p in src.pairs], "positive": [p.positive for p in src.pairs]})
    if arm.startswith("st-mined-"):
        from sentence_transformers.util import mine_hard_negatives

        k = int(arm.rsplit("-", 1)[1])
        model = base_model(args)
        model.max_seq_length = args.max_length
        ds = mine_hard_negatives(
            ds,
            model,
            corpus=list(src.corpus),
            num_negatives=k,
            relative_margin=0.05,
            sampling_strategy="top",
            output_format="triplet" if k == 1 else "n-tuple",
            batch_size=64,
            verbose=False,
            cache_folder=str(args.emb_cache),
        )
    return ds


def stock_batch_sizes(ds, batch_size: int, steps: int, seed: int) -> list[int]:
    """The rows in each of the stock recipe's ``steps`` batches, as sentence-transformers'
    ``NO_DUPLICATES`` sampler and the HF trainer make them (replayed: the trainer's own permutations
    differ, the run records the real ones as ``batch_rows``). The sampler never puts a text twice in
    a batch and does not refill one; the trainer takes ``len(sampler)`` = ceil(rows / batch) batches
    an epoch and starts the next. Where rows share texts (a query with several positives is one
    anchor on several rows) the batches come out short and the rows that collide most are the ones
    each epoch leaves out: on Cranfield's fit split 17 batches of 25, 22, 16, 10, 25, ... rows, 320
    in all (one run), not 17 x 32."""
    from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

    sampler = NoDuplicatesBatchSampler(ds, batch_size=batch_size, drop_last=False, valid_label_columns=[], seed=seed)
    sizes: list[int] = []
    epoch = 0
    while len(sizes) < steps and len(ds):
        sampler.set_epoch(epoch)
        sizes += [len(b) for b in sampler][: min(len(sampler), steps - len(sizes))]
        epoch += 1
    return sizes


def data_flow(arm: str, seed: int, src, args) -> dict:
    """What reaches training in ``arm``, counted without training: pairs / queries in, after mining
    (each row needs its negatives; positive-aware margin), after the false-negative and other
    ``score`` filters, and the rows the step budget takes (``steps x batch``: passes over the kept rows)."""
    qid_of: dict[str, str] = {}
    for p in src.pairs:
        qid_of.setdefault(p.query, p.query_key)
    flow: dict = {
        "arm": arm,
        "pairs": len(src.pairs),
        "queries": len({p.query_key for p in src.pairs}),
        "budget_rows": args.steps * args.batch_size,
    }
    if arm.startswith("st-"):
        ds = stock_rows(src, arm, args)
        kept_q = sorted({qid_of[a] for a in ds["anchor"]})
        flow.update(
            mined_pairs=len(ds),
            mined_queries=len(kept_q),
            kept_pairs=len(ds),
            kept_queries=len(kept_q),
            kept_qids=kept_q,
            filters={"no k negatives within the positive-aware margin": len(src.pairs) - len(ds)} if arm.startswith("st-mined-") else {},
            cycling="HF Trainer: max_steps over the rows, reshuffled (NO_DUPLICATES) each pass",
        )
        sizes = stock_batch_sizes(ds, args.batch_size, args.steps, seed)
        flow["budget_rows"] = sum(sizes)
        flow["batch_rows"] = sizes
    elif arm in PIPELINE_ARMS:
        from negsynth.data.shards import read_stage

        stats = run_pipeline_arm(args, seed, args.out / arm / f"seed{seed}", pipeline_extra(arm, src, args), stages=PIPELINE_DATA_STAGES)
        reg, sc, cur = stats.get("regenerate", {}), stats.get("score", {}), stats.get("curriculum", {})
        run_dir = args.out / arm / f"seed{seed}" / "run"
        mined = [r for r in read_stage(run_dir / "regenerate")]
        kept = [r for r in read_stage(run_dir / "score")]
        kept_q = sorted({r["meta"]["query_id"] for r in kept})
        rej = dict(sc.get("rejects_by_reason") or {})
        flow.update(
            mined_pairs=len(mined),
            mined_queries=len({r["meta"]["query_id"] for r in mined}),
            kept_pairs=len(kept),
            kept_queries=len(kept_q),
            kept_qids=kept_q,
            filters={
                **{
                    f"regenerate: {k}": v
                    for k, v in (reg.get("rejects_by_reason") or {"too_few_mined": len(src.pairs) - len(mined)}).items()
                },
                "regenerate: duplicate pairs": reg.get("duplicates", 0),
                **{f"score: {k}": v for k, v in rej.items()},
            },
            curriculum_rows=cur.get("rows"),
            schedule=cur.get("schedule"),
            cycling=f"curriculum total_steps: seeded passes over the kept examples ({cur.get('schedule')} rows)",
        )
        flow["budget_rows"] = cur.get("rows") or flow["budget_rows"]
        from negsynth.schemas.config_io import load_config

        tr = load_config(run_dir.parent / "pipeline.toml").train
        # a stock curriculum's rows are cycled by the trainer for the curriculum's total_steps
        steps = tr.max_steps if tr.max_steps > 0 else args.steps if cur.get("schedule") == "stock" else 0
        if (tr.batch_sampler == "shuffled" or cur.get("schedule") == "stock") and steps > 0:
            # the trainer cycles the curriculum's one pass itself, as the HF trainer does the stock recipe's rows
            from negsynth.data.curriculum_io import load_curriculum
            from negsynth.data.stock import text_columns

            ds = load_curriculum(run_dir / "curriculum")
            sizes = stock_batch_sizes(ds.select_columns(text_columns(ds.column_names)), args.batch_size, steps, seed)
            flow.update(
                budget_rows=sum(sizes), batch_rows=sizes, cycling="train max_steps: reshuffled passes (NO_DUPLICATES) over the kept rows"
            )
    else:
        return {"arm": arm, "skipped": "counts are measured for the stock and the pipeline arms"}
    flow["passes"] = round(flow["budget_rows"] / max(flow["kept_pairs"], 1), 3)
    return flow


def print_flow(flows: list[dict], args) -> None:
    flows = [f for f in flows if "skipped" not in f]
    if not flows:
        return
    stock = next((f for f in flows if f["arm"] == STOCK_ARM), None)
    print(
        f"\nWhat reaches training ({args.name}, fit split, {args.steps} steps x batch {args.batch_size}; counts from the stages, no training)\n"
    )
    print(
        "| arm | pairs (queries) in | after mining | after score filters | dropped by | rows trained | passes over kept | kept queries shared with "
        + STOCK_ARM
        + " |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for f in flows:
        why = "; ".join(f"{k} {v}" for k, v in f["filters"].items() if v) or "-"
        shared = (
            "-"
            if stock is None or f is stock
            else f"{len(set(f['kept_qids']) & set(stock['kept_qids']))} of {f['kept_queries']} / {stock['kept_queries']}"
        )
        print(
            f"| {f['arm']} | {f['pairs']} ({f['queries']}) | {f['mined_pairs']} ({f['mined_queries']}) | {f['kept_pairs']} ({f['kept_queries']}) | {why} | "
            f"{f['budget_rows']} | {f['passes']:.2f} | {shared} |"
        )
    for f in flows:
        if f.get("batch_rows") and min(f["batch_rows"]) < args.batch_size:
            b = f["batch_rows"]
            print(
                f"\n{f['arm']}: its sampler (NO_DUPLICATES) left batches short where rows share texts: {len(b)} batches of "
                f"{min(b)}-{max(b)} rows (median {statistics.median(b):.0f}), {sum(b)} rows trained instead of {len(b) * args.batch_size}"
            )
    print("\n(pairs (queries); 'passes': rows trained / kept pairs, i.e. how often the step budget cycles each kept row)")


# ------------------------------------------------------------------------------ trainers


def train_stock(src, arm: str, args, seed: int, dest: Path) -> dict:
    """sentence-transformers' own recipe: SentenceTransformerTrainer + MNRL (scale 20), NO_DUPLICATES."""
    from transformers import set_seed

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _stock import train_stock_recipe

    set_seed(seed)
    ds = stock_rows(src, arm, args)
    trainer = train_stock_recipe(
        base_model(args), ds, dest, batch_size=args.batch_size, lr=args.lr, seed=seed, max_length=args.max_length, steps=args.steps
    )
    return {
        "rows": len(ds),
        "columns": ds.column_names,
        "steps": trainer.state.global_step,
        "loss": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "queries": len(set(ds["anchor"])),
        "batch_rows": trainer.batch_rows,
    }


def train_ns(rows: list[dict], args, seed: int, dest: Path, **overrides) -> dict:
    """negsynth's trainer with its defaults (τ by model family, warmup, clipping, order-keeping sampler)."""
    from datasets import Dataset

    from negsynth.train import TrainConfig, make_trainer
    from negsynth.train.trainer import save_model

    # one pass over the planned batches: the sampler keeps every text once per batch by moving
    # colliding rows later, which can add a few partial batches; a step cap would cut the hardest phase
    cfg = TrainConfig(
        model="default",
        batch_size=args.batch_size,
        grad_accum=1,
        lr=args.lr,
        max_steps=-1,
        epochs=1,
        max_length=args.max_length,
        seed=seed,
        output_dir=str(dest / "_ckpt"),
        save_steps=10**6,
        save_total_limit=1,
        logging_steps=max(1, args.steps // 4),
        **overrides,
    )
    cols = [c for c in rows[0] if c in ("anchor", "positive", "negative", "phase", "level") or c.startswith("negative_")]
    ds = Dataset.from_dict({k: [r[k] for r in rows] for k in cols})
    trainer, model = make_trainer(ds, cfg)
    trainer.train()
    save_model(model, str(dest))  # with the base model's max_seq_length, like the stock arms
    return {"rows": len(rows), "steps": trainer.state.global_step, "loss": [e["loss"] for e in trainer.state.log_history if "loss" in e]}


# ------------------------------------------------------------------------------ driver


def run_arm(arm: str, seed: int, src, args) -> dict:
    """Train one arm at one seed and evaluate it on the selection tasks (dev, or test with no dev split)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _mem import PeakRSS

    t0 = time.time()
    with PeakRSS() as train_mem:
        info, path = train_arm(arm, seed, src, args)
    with PeakRSS() as eval_mem:
        scores, per_query = evaluate_model(path, args, args.select_tasks)
    cost = {
        "train_s": round(train_mem.seconds, 1),
        "eval_s": round(eval_mem.seconds, 1),
        "train_peak_mib": train_mem.peak_mib,
        "eval_peak_mib": eval_mem.peak_mib,
        **(
            {"train_gpu_peak_mib": train_mem.gpu_peak_mib, "eval_gpu_peak_mib": eval_mem.gpu_peak_mib}
            if (train_mem.gpu_peak_mib, eval_mem.gpu_peak_mib) != (None, None)
            else {}
        ),
    }
    same = same_input(arm, seed, src, args)
    return {
        "arm": arm,
        "seed": seed,
        "split": args.split_id,
        **({"same_input": same} if same else {}),
        "scores": scores,
        "per_query": per_query,
        "model": path,
        "seconds": round(time.time() - t0, 1),
        **cost,
        **info,
    }


def same_input(arm: str, seed: int, src, args) -> dict | None:
    """The training pairs an arm started from, as a count and a hash of their sorted source ids: for
    the stock arms the pairs they were given (``src``), for the pipeline arms the pairs ``regenerate``
    read (its records, its rejects, and the duplicate pairs it dropped), so that the stock recipe and
    negsynth's default are seen to start from the same examples (:func:`check_same_input`)."""
    import hashlib

    if arm.startswith("st-"):
        ids = sorted(p.source_id for p in src.pairs)
        dropped = 0
    elif arm in PIPELINE_ARMS:
        from negsynth.data.shards import read_stage

        reg = args.out / arm / f"seed{seed}" / "run" / "regenerate"
        rejects = [json.loads(line) for f in sorted((reg / "rejects").glob("shard-*.jsonl")) for line in f.read_text().splitlines() if line]
        ids = sorted([r["source_id"] for r in read_stage(reg)] + [(r.get("input") or {}).get("source_id", "?") for r in rejects])
        dropped = json.loads((reg / "stats.json").read_text()).get("duplicates", 0)
    else:
        return None
    return {
        "pairs": len(ids) + dropped,
        "duplicates_dropped": dropped,
        "ids_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16],
    }


def check_same_input(results: list[dict]) -> None:
    """The stock recipe and negsynth's default read the same pairs: one count for both (negsynth drops
    exact duplicate pairs before mining, counted), and the same ids when no duplicate was dropped."""
    stock = [r["same_input"] for r in results if r["arm"] == STOCK_ARM and r.get("same_input")]
    mine = [r["same_input"] for r in results if r["arm"] == DEFAULT_ARM and r.get("same_input")]
    if not stock or not mine:
        return
    s, m = stock[0], mine[0]
    if s["pairs"] != m["pairs"] or (m["duplicates_dropped"] == 0 and s["ids_sha256"] != m["ids_sha256"]):
        raise SystemExit(f"scifact_recipe: {STOCK_ARM} and {DEFAULT_ARM} did not start from the same pairs: {s} vs {m}")
    print(
        f"\nsame input: {STOCK_ARM} and {DEFAULT_ARM} read the same {s['pairs']} pairs ({m['duplicates_dropped']} exact duplicates dropped by negsynth)"
    )


def rows_digest(ds) -> tuple[int, str]:
    """``(distinct rows, sha256 of them sorted)`` over a training set's text columns (anchor, positive,
    negative_1..n, in that order): two arms with one digest train the same rows, whatever their order."""
    import hashlib

    from negsynth.data.stock import text_columns

    cols = text_columns(ds.column_names)
    rows = sorted({"\x1f".join(r[c] for c in cols) for r in ds.select_columns(cols)})
    return len(rows), hashlib.sha256("\x1e".join(rows).encode()).hexdigest()[:16]


def check_same_rows(arms: list[str], seed: int, src, args) -> None:
    """negsynth's default (and ``ns-pipeline-reordered``) train the stock recipe's own rows, tuple for
    tuple, through negsynth's stages: the benchmark refuses a table where they differ (negsynth's
    mining, cleaning or curriculum drifted from ``mine_hard_negatives``'), so the side-by-side stays a
    same-rows comparison."""
    from negsynth.data.curriculum_io import load_curriculum

    todo = [a for a in SAME_ROWS_ARMS if a in arms and (args.out / a / f"seed{seed}" / "run" / "curriculum" / "dataset").is_dir()]
    if STOCK_ARM not in arms or not todo:
        return
    stock = rows_digest(stock_rows(src, STOCK_ARM, args))
    for arm in todo:
        mine = rows_digest(load_curriculum(args.out / arm / f"seed{seed}" / "run" / "curriculum"))
        if stock != mine:
            raise SystemExit(
                f"scifact_recipe: {arm} does not train the stock recipe's rows ({mine[0]} rows, {mine[1]} vs {stock[0]}, {stock[1]}): "
                "negsynth's selection drifted from mine_hard_negatives'"
            )
        print(f"\nsame rows: {arm} trains the stock recipe's {stock[0]} rows, tuple for tuple ({stock[1]})")


def run_test(r: dict, args) -> dict:
    """The test split for an arm already evaluated on dev: its scores and per-query figures added."""
    t0 = time.time()
    scores, per_query = evaluate_model(r.get("model"), args, [test_task(args)])
    return {
        **r,
        "scores": {**r["scores"], **scores},
        "per_query": {**r.get("per_query", {}), **per_query},
        "test_s": round(time.time() - t0, 1),
    }


def choose_on_dev(results: list[dict], args) -> str | None:
    """The negsynth arm with the highest mean dev nDCG@10 (what the protocol reports on test besides its default)."""
    dev = args.dev_name
    means: dict[str, list[float]] = {}
    for r in results:
        if r["arm"].startswith("ns-") and dev in r["scores"]:
            means.setdefault(r["arm"], []).append(r["scores"][dev])
    # a tie keeps negsynth's default (another arm must beat it), then the arms' listed order
    return max(means, key=lambda a: (statistics.mean(means[a]), a == DEFAULT_ARM, -ALL_ARMS.index(a))) if means else None


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
        info = train_pipeline(args, seed, dest, pipeline_extra(arm, src, args))
        path = info["model_dir"]
    elif arm == "ns-graded-tuple":
        rows = graded_tuple_rows(src, args, seed)
        info = train_ns(rows, args, seed, dest)
        path = str(dest)
    elif arm == "ns-stockrows":
        rows = stockrows_curriculum(src, args, seed)
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
            fit = {p.query for p in src.pairs}  # the LLM run covers all of SciFact train: the dev queries stay out
            examples = [e for e in llm_examples(args.llm_run) if e["query"] in fit]
        steps = min(args.steps, len(examples) // args.batch_size)
        rows = ns_rows(examples, arm.rsplit("-", 1)[1], steps, args, seed)
        info = train_ns(rows, args, seed, dest)
        info["examples"] = len(examples)
        path = str(dest)
    return info, path


def summarise(results: list[dict], tasks: list[str]) -> list[tuple]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _table import mean_sd, seed_scores

    by_arm: dict[str, list[dict]] = {}
    for r in results:
        by_arm.setdefault(r["arm"], []).append(r)
    table = []
    for arm in ALL_ARMS:
        rs = by_arm.get(arm)
        if not rs:
            continue
        cells = [mean_sd(v) if (v := seed_scores(rs, t)) else "-" for t in tasks]

        def med(key: str, rs: list = rs) -> str:  # per seed: median over the seeds that recorded it
            v = [r[key] for r in rs if r.get(key) is not None]
            return f"{statistics.median(v):.0f}" if v else "-"

        table.append(
            (
                arm,
                len(rs),
                cells,
                round(sum(r["seconds"] for r in rs)),
                [med(k) for k in ("train_s", "eval_s", "train_peak_mib", "eval_peak_mib", "train_gpu_peak_mib", "eval_gpu_peak_mib")],
            )
        )
    return table


def paired_vs_stock(results: list[dict], arm: str, task: str, n_resamples: int = 10000) -> dict | None:
    """Per-query paired test of ``arm`` against the stock recipe on ``task`` (seeds pooled), or None."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _stock import paired_against_stock

    return paired_against_stock(results, arm, STOCK_ARM, task, n_resamples)


def _paired_cell(t: dict | None) -> tuple[str, str]:
    if t is None:
        return "-", "-"
    return f"{100 * t['mean_diff']:+.2f} [{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}]", f"{t['p_value']:.3f}"


def print_table(results: list[dict], args) -> None:
    tasks = [t for t in (args.dev_name, args.test_name) if t] + args.eval_tasks
    sp = args.split_info
    print(
        f"\nall-MiniLM-L6-v2 on {args.name} (fit split: {sp['fit_queries']} queries, {sp['fit_pairs']} pairs; dev {sp['dev_queries']} queries; "
        f"test {sp['test_queries']} queries; split seed {sp['split_seed']}), {args.steps} steps x batch {args.batch_size}, lr {args.lr}; "
        f"{args.eval_suite} evaluation\n"
    )
    gpu = any("eval_gpu_peak_mib" in r for r in results)  # GPU columns only where a GPU was used
    extra = " train GPU peak MiB | eval GPU peak MiB |" if gpu else ""
    print("| arm | seeds | " + " | ".join(tasks) + " | train s | eval s | train peak MiB | eval peak MiB |" + extra)
    print("|---|---:|" + "---:|" * len(tasks) + "---:|---:|---:|---:|" + ("---:|---:|" if gpu else ""))
    for arm, n, cells, _secs, cost in summarise(results, tasks):
        print(f"| {arm} | {n} | " + " | ".join(cells) + " | " + " | ".join(cost[: 6 if gpu else 4]) + " |")
    print(
        "\n(train / eval: seconds and peak resident memory (and GPU memory allocated, where a GPU ran) of one seed, median over seeds; '-': not evaluated there, the test split only for the reported arms)"
    )
    # the headline: every arm against the stock recipe, per query, on dev (to choose) and test (to report)
    rows = []
    for arm in ALL_ARMS:
        if arm == STOCK_ARM or not any(r["arm"] == arm for r in results):
            continue
        cells = []
        for t in (args.dev_name, args.test_name):
            if t:
                cells += _paired_cell(paired_vs_stock(results, arm, t, args.resamples))
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    if rows and any(r["arm"] == STOCK_ARM for r in results):
        heads = [h for t in (args.dev_name, args.test_name) if t for h in (f"Δ {t} vs {STOCK_ARM} [95 % CI]", f"p ({t})")]
        print(
            f"\nPer-query paired comparison with {STOCK_ARM} (nDCG@10 x 100, each query's score averaged over the arm's seeds; "
            f"CI: bootstrap over queries and seeds; p: two-sided sign-flip permutation over queries, {args.resamples} resamples)\n"
        )
        print("| arm | " + " | ".join(heads) + " |")
        print("|---|" + "---:|" * len(heads))
        print("\n".join(rows))
    if args.dev_name:
        best = choose_on_dev(results, args)
        if best:
            print(
                f"\nchosen on {args.dev_name}: {best} (highest mean dev nDCG@10 of the negsynth arms run); the test split is reported for "
                f"{', '.join(a for a in report_arms(results, args))}"
            )


def report_arms(results: list[dict], args) -> list[str]:
    """The arms whose test split is evaluated: base, the stock recipe, negsynth's default, the dev choice."""
    if not args.dev_name:
        return sorted({r["arm"] for r in results}, key=ALL_ARMS.index)
    want = {"base", STOCK_ARM, DEFAULT_ARM, choose_on_dev(results, args)}
    return [a for a in ALL_ARMS if a in want and any(r["arm"] == a for r in results)]


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
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1]
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("runs/recipe"),
        help="OUT/<dataset>/: models (one folder per arm and seed), the split files and results.json",
    )
    ap.add_argument("--data-dir", type=Path, default=None, help="evaluation data (default: NEGSYNTH_DATA_DIR or ../shared/data)")
    ap.add_argument("--dataset", type=Path, default=None, help="a BEIR folder with train and test splits (default: DATA_DIR/scifact)")
    ap.add_argument(
        "--dev-frac",
        type=float,
        default=0.2,
        help="share of the train queries held out (by query) as the dev split that settings are chosen on; 0: none",
    )
    ap.add_argument("--split-seed", type=int, default=0, help="seed of the dev split (and of --test-frac's test split)")
    ap.add_argument(
        "--test-frac",
        type=float,
        default=0.0,
        help="a folder with one labelled query set (corpus.jsonl, queries.jsonl, qrels.tsv; e.g. Cranfield): hold out this share of "
        "its queries (by query, seeded) as the test split and use the rest as train",
    )
    ap.add_argument("--no-title", action="store_true", help="embed documents as their text only (a corpus whose text repeats the title)")
    ap.add_argument(
        "--counts-only",
        action="store_true",
        help="print what reaches training in the stock and pipeline arms (mining, score filters, cycling) and stop",
    )
    ap.add_argument("--resamples", type=int, default=10000, help="bootstrap / permutation resamples of the paired per-query tests")
    ap.add_argument("--llm-run", type=Path, default=None, help="a regenerate(+score) run dir on SciFact train for the ns-llm-* arms")
    ap.add_argument("--arms", default=",".join(HEADLINE_ARMS), help=f"comma-separated, or 'all' ({','.join(ALL_ARMS)})")
    ap.add_argument(
        "--seeds", type=seed_list, default="0", help="seeds of the key arms (0,1,2 for the README's spread); other arms use the first"
    )
    ap.add_argument("--all-seeds", action="store_true", help="run every arm over every seed")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps per arm (default: one pass over the fit split's pairs, rounded down; 28 for all 919 SciFact train pairs at batch 32)",
    )
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--easy-margin", type=float, default=0.1, help="the *-noeasy arms: drop queries with cos_pos - hardest negative > this")
    ap.add_argument("--hardness-strength", type=float, default=5.0, help="alpha of the *-hw arms (MNRL hardness_mode='hard_negatives')")
    ap.add_argument("--max-length", type=int, default=128, help="training max tokens (evaluation uses the model's 256)")
    ap.add_argument(
        "--eval-tasks",
        default="STSBenchmark,TRECClustering",
        help="other sets evaluated with dev (checks that nothing else broke); 'none' for none",
    )
    ap.add_argument(
        "--eval-suite",
        choices=["full", "quick"],
        default="full",
        help="quick: SciFact's 300 test queries cut to 100 against 1,000 documents (every judged one kept), the other sets subsampled; "
        "a full SciFact evaluation embeds 5,183 abstracts (~45 min on one loaded CPU core)",
    )
    ap.add_argument(
        "--device",
        default="cpu",
        help="where mining and evaluation run: cpu (the figures in docs/benchmarks.md), cuda, or auto (a GPU when there is one; "
        "evaluation then runs in bf16/fp16, so scores move at the 3rd-4th decimal). The trainers pick the GPU on their own",
    )
    ap.add_argument("--fresh", action="store_true", help="redo arms already in OUT/results.json")
    ap.add_argument(
        "--dev-only",
        action="store_true",
        help="stop after the dev figures (choose there); a later run without it adds the test split to the arms it reports",
    )
    ap.add_argument(
        "--emb-cache",
        type=Path,
        default=None,
        help="base-model query/corpus embeddings for mining (default OUT/<dataset>/_mined/emb; shared by every arm)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.eval_tasks = [t.strip() for t in args.eval_tasks.split(",") if t.strip() and t.strip().lower() != "none"]
    if not 0 <= args.dev_frac < 1:
        sys.exit(f"scifact_recipe: --dev-frac must be in [0, 1), got {args.dev_frac}")

    from negsynth.resources import default_data_dir

    args.data_dir = args.data_dir or default_data_dir()
    dataset = args.dataset or (Path(args.data_dir) / "scifact" if args.data_dir is not None else None)
    if dataset is None or not Path(dataset).is_dir():
        sys.exit(
            "scifact_recipe: no dataset; pass --dataset DIR (a BEIR folder with train and test splits) or point NEGSYNTH_DATA_DIR "
            "(or --data-dir) at a folder with scifact/{corpus,queries}.jsonl, scifact/train/"
        )
    dataset = Path(dataset)
    args.name = dataset.resolve().name.lower()
    args.doc_title = not args.no_title
    if not 0 <= args.test_frac < 1:
        sys.exit(f"scifact_recipe: --test-frac must be in [0, 1), got {args.test_frac}")
    if args.test_frac > 0:  # one labelled query set: a seeded test split by query, the rest is train
        dataset = split_one_set(dataset, args.out / args.name / "_source", args.test_frac, args.split_seed)
        args.split_from = args.name  # its own query file is no decontamination set for its train queries
    seeds = args.seeds
    arms = select_arms(args.arms)
    if args.llm_run is None:
        dropped = [a for a in arms if a.startswith("ns-llm-")]
        arms = [a for a in arms if not a.startswith("ns-llm-")]
        if dropped:
            print(f"scifact_recipe: no --llm-run, skipping {', '.join(dropped)}", file=sys.stderr)
    llm_arms = [a for a in arms if a.startswith("ns-llm-")]
    steps_for_llm = args.steps or 28
    if llm_arms:  # a weak LLM leaves few usable examples: say so before any training
        usable = len(llm_examples(args.llm_run))
        if min(steps_for_llm, usable // args.batch_size) < 4:
            sys.exit(
                f"scifact_recipe: {args.llm_run} has {usable} scored examples with 4 negatives, {usable // args.batch_size} batch(es) of "
                f"{args.batch_size}; the {', '.join(llm_arms)} arms need >= 4 (one per curriculum phase): regenerate more pairs "
                f"(regenerate.inputs limit) or lower --batch-size"
            )
    dataset_files(dataset)  # a folder without train / test splits stops here, before anything is written
    args.out = args.out / args.name
    args.emb_cache = args.emb_cache or args.out / "_mined" / "emb"
    args.split_dir = args.out / "_split"
    args.split_info = make_splits(dataset, args.split_dir, args.dev_frac, args.split_seed)
    args.split_id = f"{args.split_info['dataset']}|dev {args.dev_frac}|seed {args.split_seed}" + (
        f"|test {args.test_frac}" if args.test_frac > 0 else ""
    )
    args.dev_name = f"{args.name}-dev" if args.dev_frac > 0 else None
    args.test_name = f"{args.name}-test"
    # select on dev; with no dev split every arm is evaluated on test (the old protocol)
    args.select_tasks = ([dev_task(args)] if args.dev_frac > 0 else [test_task(args)]) + list(args.eval_tasks)
    src = fit_source(args)
    if args.steps is None:
        args.steps = max(1, len(src.pairs) // args.batch_size)
    if args.steps < 4 and (short := [a for a in arms if a.startswith("ns-tuple-")]):  # before any mining
        sys.exit(f"scifact_recipe: --steps {args.steps}: {', '.join(short)} fill each quarter of the steps, so they need at least 4")
    sp = args.split_info
    print(
        f"{args.name}: fit {sp['fit_queries']} queries / {len(src.pairs)} pairs, dev {sp['dev_queries']} queries / {sp['dev_pairs']} pairs, "
        f"test {sp['test_queries']} queries, corpus {len(src.corpus)}; {args.steps} steps x {args.batch_size}",
        file=sys.stderr,
    )
    if args.counts_only:
        flows = [data_flow(arm, seeds[0], src, args) for arm in arms if arm.startswith("st-") or arm in PIPELINE_ARMS]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "data_flow.json").write_text(
            json.dumps({"split": sp, "steps": args.steps, "batch_size": args.batch_size, "flows": flows}, indent=1)
        )
        print_flow(flows, args)
        check_same_rows(arms, seeds[0], src, args)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    res_path = args.out / "results.json"
    results: list[dict] = [] if args.fresh or not res_path.exists() else json.loads(res_path.read_text())["results"]
    stale = [r for r in results if r.get("split") != args.split_id]
    if stale:
        sys.exit(
            f"scifact_recipe: {res_path} holds {len(stale)} result(s) of another split (dataset, --dev-frac or --split-seed); "
            "use another --out or --fresh"
        )
    done = {(r["arm"], r["seed"]) for r in results}
    t0 = time.time()
    # every arm once first, then the further seeds of the key arms: an interrupted run has the whole table
    jobs = [(arm, seeds[0]) for arm in arms] + [
        (arm, s) for s in seeds[1:] for arm in arms if arm != "base" and (arm in KEY_ARMS or args.all_seeds)
    ]
    for arm, seed in jobs:
        if (arm, seed) in done:
            continue
        r = run_arm(arm, seed, src, args)
        print(
            f"{arm} seed {seed}: " + ", ".join(f"{k} {100 * v:.2f}" for k, v in r["scores"].items()) + f" ({r['seconds']:.0f} s)",
            file=sys.stderr,
        )
        results = save_result(res_path, r, args)
    if args.dev_name and not args.dev_only:  # the test split, once per reported arm and seed, after every dev figure is in
        for arm in report_arms(results, args):
            for r in [x for x in results if x["arm"] == arm and args.test_name not in x["scores"]]:
                r = run_test(r, args)
                print(f"{arm} seed {r['seed']}: {args.test_name} {100 * r['scores'][args.test_name]:.2f}", file=sys.stderr)
                results = save_result(res_path, r, args)
    default = [r for r in results if r["arm"] == DEFAULT_ARM and r["seed"] == seeds[0] and r.get("model")]
    if default:
        import shutil

        target = args.out / "negsynth-default"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(default[0]["model"], target, ignore=shutil.ignore_patterns("_ckpt"))
        print(f"negsynth's default arm saved as {target}", file=sys.stderr)
    check_same_input(results)
    check_same_rows(arms, seeds[0], src, args)
    print_table(results, args)
    # what reached training (the stages' stats; the mining and the stages resume from this run's files)
    print_flow([data_flow(arm, seeds[0], src, args) for arm in arms if arm.startswith("st-") or arm in PIPELINE_ARMS], args)
    print(f"\nmodels under {args.out}/<arm>/seed<N>/; results in {res_path}; this invocation {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
