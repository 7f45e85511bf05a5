"""Labelled pairs: does negsynth's data make all-MiniLM-L6-v2 better than sentence-transformers' stock recipe?

Train split: SciFact **train** (809 claims, all 919 (claim, abstract) pairs, corpus of 5,183
abstracts), or any BEIR folder with a train and a test split (``--dataset``). Evaluation: the
held-out split's nDCG@10, STS-B test (1,379 pairs, Spearman) and TREC clustering (V-measure)
through ``negsynth.evaluate_model``. Every trained arm uses the same base model, batch size,
optimizer steps and learning rate; only the data (negatives, order) and the trainer differ:

=====================  ==========================================================================
arm                    what it is
=====================  ==========================================================================
base                   the untouched all-MiniLM-L6-v2
st-inbatch             sentence-transformers' own trainer + MNRL on (claim, abstract), its
                       ``NO_DUPLICATES`` sampler: what a user writes without negsynth
st-mined-1             the same + ``mine_hard_negatives`` (1 negative, TopK-PercPos 95 %, top)
st-mined-4             the same with 4 mined negatives per row (n-tuple): **the stock recipe** every
                       arm is tested against
ns-pipeline            negsynth's own stages with their defaults, end to end: ``regenerate.negatives
                       = "mined"`` (no LLM: the 4 hardest positive-aware candidates in the library's
                       window) -> ``score`` -> ``curriculum`` (``schedule = "auto"`` -> ``stock``: the
                       rows in input order, once) -> ``train`` (the stock sampler, plain MNRL, the
                       curriculum's ``total_steps``); only batch, steps, lr, length, seed and the mining
                       length set as for every arm. It trains the stock recipe's rows tuple for tuple
                       (checked: the table is refused otherwise) and, where ``score`` drops nothing, its
                       model bit for bit
ns-pipeline-reordered  the default's rows and trainer, the rows in the ``tuple`` builder's seeded order
ns-pipeline-tuple      the default before ``stock``: the ``tuple`` builder (seeded passes in planned
                       batches, the order-keeping sampler, GradCache on CPU) and its wider window
ns-pipeline-wide       ``regenerate.mining.range_max = 340`` instead of the library's ~44-60 candidates
ns-pipeline-gc8        ``train.mini_batch_size = 8`` (GradCache: the same loss in 8-row chunks)
ns-pipeline-b12        12 rows a batch (fewer than the stock sampler leaves on multi-positive queries)
ns-pipeline-llm        LLM-graded negatives (``regenerate.negatives = "llm"``, the ``--llm-*`` options:
                       the embedded SmolLM2-135M by default) for ``--llm-pairs`` fit pairs, curriculum
                       4 -> 1: the method itself; hours of LLM time on a CPU
=====================  ==========================================================================

**Protocol: choose on dev, report test once.** A seeded slice of the *train* queries (``--dev-frac``,
by query, ``--split-seed``) is held out as the dev split; every arm trains on the rest (``fit``) and is
evaluated on dev, where settings are compared and chosen. The test split is evaluated only for base,
the stock recipe, negsynth's default and the negsynth arm best on dev, once each per seed, after every
dev figure is in (``--dev-frac 0``: every arm on test). ``--test-frac F`` holds out F of a folder with
one labelled query set (Cranfield) as its test split. The split files are written under
``OUT/<dataset>/_split/``. Each arm is compared with the stock recipe **per query** (mean difference,
95 % bootstrap CI over queries and seeds, two-sided sign-flip p). The stock recipe and the default must
start from the same pairs and train the same rows, or the table is refused. ``--counts-only`` prints
what survives mining and the filters in the stock and pipeline arms, without training.

The key arms (``st-mined-4``, ``ns-pipeline``) run over ``--seeds``; the others over the first
(``--all-seeds`` for every arm); every arm runs once before any second seed. ``OUT/<dataset>/results.json``
is written after every arm (a rerun skips what it holds; ``--fresh`` redoes); every model is saved under
``OUT/<dataset>/<arm>/`` and the default's also as ``OUT/<dataset>/negsynth-default/``. One trained arm
took 25-48 min on this project's loaded 2-core CPU (the full SciFact evaluation most of it)::

    python benchmarks/scifact_recipe.py --out runs/recipe                                   # the headline, seed 0
    python benchmarks/scifact_recipe.py --out runs/recipe --seeds 0,1,2                     # + the key arms' spread
    python benchmarks/scifact_recipe.py --out runs/recipe --arms ARMS --dev-only            # dev figures only
    python benchmarks/scifact_recipe.py --out runs/recipe --dataset path/to/beir-folder --counts-only
    python benchmarks/scifact_recipe.py --out runs/cran --dataset ../shared/data/cranfield --test-frac 0.3 --no-title
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import harness

STOCK_ARM = "st-mined-4"  # the stock recipe every arm is tested against
DEFAULT_ARM = "ns-pipeline"  # negsynth's defaults, through its own stages
KEY_ARMS = (STOCK_ARM, DEFAULT_ARM)
HEADLINE_ARMS = ("base", STOCK_ARM, DEFAULT_ARM)  # the default invocation (~1-1.5 h on 2 CPU cores)
LLM_ARM = "ns-pipeline-llm"
# the pipeline arms: negsynth's stages with their defaults, plus these run-file lines
PIPELINE_ARMS = {
    DEFAULT_ARM: "",
    "ns-pipeline-reordered": (
        '[curriculum]\nschedule = "tuple"\nepochs = 1\n[train]\nmax_steps = {steps}\nbatch_sampler = "shuffled"\nmini_batch_size = "off"\n'
    ),
    # the default before the stock schedule: the tuple builder and its window (10 x 4 + 4 x the most positives of a query)
    "ns-pipeline-tuple": '[curriculum]\nschedule = "tuple"\n[regenerate.mining]\nrange_max = {tuple_range_max}\n',
    "ns-pipeline-wide": "[regenerate.mining]\nrange_max = 340\n",
    "ns-pipeline-gc8": "[train]\nmini_batch_size = 8\n",
    "ns-pipeline-b12": "[train]\nbatch_size = 12\n",
    LLM_ARM: '[regenerate]\nnegatives = "llm"\nmax_doc_chars = 400\nprompt_positive_chars = 1200\n[curriculum]\nschedule = "curriculum"\n',
}
ALL_ARMS = ("base", STOCK_ARM, DEFAULT_ARM, "st-inbatch", "st-mined-1", *[a for a in PIPELINE_ARMS if a != DEFAULT_ARM])
SAME_ROWS_ARMS = (DEFAULT_ARM, "ns-pipeline-reordered")  # must train the stock recipe's rows, tuple for tuple
DATA_STAGES = ["regenerate", "score", "curriculum"]


class Pair(NamedTuple):
    query: str
    positive: str
    query_key: str
    source_id: str


class Source(NamedTuple):
    pairs: list[Pair]
    corpus: list[str]


def pipeline_extra(arm: str, src: Source, args=None) -> str:
    """An arm's run-file lines, ``{tuple_range_max}`` and ``{steps}`` filled in for the fit split."""
    most = max(Counter(p.query for p in src.pairs).values(), default=1)
    return PIPELINE_ARMS[arm].format(tuple_range_max=40 + 4 * most, steps=getattr(args, "steps", None))


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


def _link(target: Path, name: Path) -> None:
    if name.is_symlink() or name.exists():
        name.unlink()
    name.symlink_to(target.resolve())


def _write_split(d: Path, ids: list[str], queries: dict, rows: list) -> None:
    d.mkdir(parents=True, exist_ok=True)
    kept = set(ids)
    harness.write_jsonl(d / "queries.jsonl", ({"_id": q, "text": queries[q]} for q in ids))
    (d / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t{g:g}\n" for q, c, g in rows if q in kept))


def _held_out(qids: list[str], frac: float, rng: random.Random, what: str, least: tuple[int, int]) -> set[str]:
    order = qids[:]
    rng.shuffle(order)
    n = round(frac * len(qids))
    if frac > 0 and (n < least[0] or len(qids) - n < least[1]):
        sys.exit(
            f"scifact_recipe: {what} {frac} holds out {n} of {len(qids)} queries; choose a fraction that leaves >= {least[0]} held out and >= {least[1]} to train on"
        )
    return set(order[:n])


def split_one_set(root: Path, dest: Path, test_frac: float, split_seed: int) -> Path:
    """A labelled folder with one query set (``{corpus,queries}.jsonl`` + ``qrels.tsv``, e.g.
    Cranfield): ``test_frac`` of its judged queries (seeded) as ``dest/test``, the rest ``dest/train``
    (a judged document with no text is no training positive: its train qrels are left out)."""
    if not all((root / f).is_file() for f in ("corpus.jsonl", "queries.jsonl", "qrels.tsv")):
        sys.exit(f"scifact_recipe: --test-frac needs {root}/corpus.jsonl, queries.jsonl and qrels.tsv (one labelled query set to split)")
    queries, corpus, rows = harness.read_beir(root / "corpus.jsonl", root / "queries.jsonl", root / "qrels.tsv")
    qids = sorted({q for q, _, g in rows if g > 0 and queries.get(q)})
    test = _held_out(qids, test_frac, random.Random(f"test-split-{split_seed}"), "--test-frac", (10, 20))
    dropped = [r for r in rows if r[0] not in test and not corpus.get(r[1])]
    if dropped:
        print(f"scifact_recipe: {len(dropped)} train qrel(s) point at empty documents and are left out of train", file=sys.stderr)
    rows = [r for r in rows if r[0] in test or corpus.get(r[1])]
    dest.mkdir(parents=True, exist_ok=True)
    _link(root / "corpus.jsonl", dest / "corpus.jsonl")
    _write_split(dest / "train", [q for q in qids if q not in test], queries, rows)
    _write_split(dest / "test", [q for q in qids if q in test], queries, rows)
    return dest


def make_splits(root: Path, dest: Path, dev_frac: float, split_seed: int) -> dict:
    """``dev_frac`` of the train queries (by query id, seeded) as ``dest/dev``, the rest ``dest/fit``
    (what every arm trains on); ``dest/test`` links the test split; the corpus is a link. Returns the
    split's sizes and seed."""
    f = dataset_files(root)
    queries, _, rows = harness.read_beir(f["corpus"], f["train_queries"], f["train_qrels"])
    qids = sorted({q for q, _, g in rows if g > 0 and queries.get(q)})
    dev = _held_out(qids, dev_frac, random.Random(split_seed), "--dev-frac", (10, 1))
    dest.mkdir(parents=True, exist_ok=True)
    _link(f["corpus"], dest / "corpus.jsonl")
    _write_split(dest / "fit", [q for q in qids if q not in dev], queries, rows)
    _write_split(dest / "dev", [q for q in qids if q in dev], queries, rows)
    (dest / "test").mkdir(exist_ok=True)
    _link(f["test_queries"], dest / "test" / "queries.jsonl")
    _link(f["test_qrels"], dest / "test" / "qrels.tsv")
    _, _, test_rows = harness.read_beir(f["corpus"], f["test_queries"], f["test_qrels"])
    info = {
        "dataset": str(root.resolve()),
        "dev_frac": dev_frac,
        "split_seed": split_seed,
        "train_queries": len(qids),
        "fit_queries": len(qids) - len(dev),
        "dev_queries": len(dev),
        "test_queries": len({q for q, _, g in test_rows if g > 0}),
        "fit_pairs": sum(1 for q, _, g in rows if g > 0 and q in queries and q not in dev),
        "dev_pairs": sum(1 for q, _, g in rows if g > 0 and q in dev),
    }
    (dest / "split.json").write_text(json.dumps(info, indent=1))
    return info


def fit_source(args) -> Source:
    """The fit split's pairs as negsynth reads a BEIR folder (one per qrel with gain > 0, documents
    ``title + " " + text``), and its corpus: what the stock arms are given."""
    d = args.split_dir
    queries, corpus, rows = harness.read_beir(d / "corpus.jsonl", d / "fit" / "queries.jsonl", d / "fit" / "qrels.tsv")
    corpus = {k: t for k, t in corpus.items() if t}
    pairs = [Pair(queries[q], corpus[c], q, f"{args.name}:fit:{q}:{c}") for q, c, g in rows if g > 0 and queries.get(q) and c in corpus]
    return Source(pairs, list(corpus.values()))


def dev_task(args):
    from negsynth.evaluate import retrieval_task

    return retrieval_task(f"{args.name}-dev", args.split_dir / "dev", doc_title=args.doc_title, note="held-out train queries: for choosing")


def test_task(args):
    from negsynth.evaluate import retrieval_task

    return retrieval_task(f"{args.name}-test", args.split_dir / "test", doc_title=args.doc_title, note="the test split: reported once")


# ------------------------------------------------------------------------------ the stock recipe and negsynth's stages


def stock_rows(src: Source, arm: str, args):
    """The stock recipe's rows: (anchor, positive), + ``mine_hard_negatives`` for st-mined-K."""
    from datasets import Dataset

    ds = Dataset.from_dict({"anchor": [p.query for p in src.pairs], "positive": [p.positive for p in src.pairs]})
    if arm.startswith("st-mined-"):
        model = harness.base_model(args.device, args.max_length)
        ds = harness.mine_stock(ds, model, src.corpus, int(arm.rsplit("-", 1)[1]), args.out / "_mined" / "emb")
    return ds


def stock_batch_sizes(ds, batch_size: int, steps: int, seed: int) -> list[int]:
    """The rows in each of the stock recipe's ``steps`` batches as its ``NO_DUPLICATES`` sampler and
    the HF trainer make them (replayed; the run records the real ones as ``batch_rows``): no text
    twice in a batch, no refill, ``ceil(rows / batch)`` batches an epoch; where rows share a text (a
    query with several positives) the batches come out short."""
    from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

    sampler = NoDuplicatesBatchSampler(ds, batch_size=batch_size, drop_last=False, valid_label_columns=[], seed=seed)
    sizes: list[int] = []
    epoch = 0
    while len(sizes) < steps and len(ds):
        sampler.set_epoch(epoch)
        sizes += [len(b) for b in sampler][: min(len(sampler), steps - len(sizes))]
        epoch += 1
    return sizes


def pipeline_toml(src_dir: Path, args, seed: int, extra_toml: str = "", split: str = "train", name: str | None = None) -> dict:
    """A pipeline arm's run file: mined negatives for the training split, the shared protocol, and the
    arm's own lines merged over it key by key. ``src_dir``: the data dir holding ``scifact/`` (``name``
    None), else the BEIR folder itself."""
    import tomllib

    arm = tomllib.loads(extra_toml)
    llm = arm.get("regenerate", {}).get("negatives") == "llm"
    source = {"path": str(src_dir / "scifact" if name is None else src_dir), "split": split, **({"name": name} if name else {})}
    cfg: dict = {
        "regenerate": {"negatives": "mined", "inputs": [source | ({"limit": args.llm_pairs, "seed": 0} if llm else {})]},
        "curriculum": {"seed": seed, "total_steps": args.steps},
        "train": {"batch_size": args.batch_size, "grad_accum": 1, "lr": args.lr, "max_length": args.max_length, "seed": seed},
        "embedder": {"max_length": args.max_length},  # mined at the training length, as the stock arm mines
        **(harness.llm_tables(args, max_tokens=700) if llm else {}),
    }
    if getattr(args, "split_from", None):
        # --test-frac: the dataset's own query file holds the train queries too; decontaminate against every other set
        from negsynth.evaluate import TASKS

        cfg["score"] = {"decontam_sets": sorted({t.files[0].split("/")[0] for t in TASKS if t.default} - {args.split_from})}
    merged = harness.layered(cfg, arm)
    if "epochs" in merged["curriculum"]:  # an arm that sizes the curriculum by passes, not steps
        merged["curriculum"].pop("total_steps", None)
    return merged


def run_pipeline_arm(args, seed: int, dest: Path, extra_toml: str = "", stages: list[str] | None = None) -> dict:
    """negsynth's stages on the fit split in ``dest/run`` (the data stages alone for ``--counts-only``,
    which a later run resumes). Another seed's (or another arm's) finished regenerate and score are
    copied in first and reused by the stages' own resume check, as they do not depend on the seed."""
    import shutil

    run_dir = dest / "run"
    done = [d for d in sorted(dest.parent.glob("seed*/run")) if d != run_dir and (d / "score" / "stats.json").is_file()]
    skip = ("curriculum", "train", "evaluate")
    if not done and "[regenerate" not in extra_toml:
        done = [args.out / a / dest.name / "run" for a, extra in PIPELINE_ARMS.items() if "[regenerate" not in extra]
        done = [d for d in done if d != run_dir and (d / "regenerate" / "stats.json").is_file()]
        skip = ("score", *skip)
    if done and not run_dir.exists():
        shutil.copytree(done[0], run_dir, ignore=lambda folder, names: [n for n in names if n in skip] if Path(folder) == done[0] else [])
    cfg = pipeline_toml(args.split_dir, args, seed, extra_toml, split="fit", name=args.name)
    return harness.run_stages(cfg, run_dir, stages or [*DATA_STAGES, "train"])


def data_flow(arm: str, seed: int, src: Source, args) -> dict | None:
    """What reaches training in ``arm``, counted without training: pairs / queries in, after mining,
    after ``score``'s filters, and the rows the step budget takes. None for the other arms."""
    qid_of = {p.query: p.query_key for p in reversed(src.pairs)}
    flow: dict = {"arm": arm, "pairs": len(src.pairs), "queries": len({p.query_key for p in src.pairs})}
    if arm.startswith("st-"):
        ds = stock_rows(src, arm, args)
        kept_q = sorted({qid_of[a] for a in ds["anchor"]})
        sizes = stock_batch_sizes(ds, args.batch_size, args.steps, seed)
        dropped = {"no k negatives within the positive-aware margin": len(src.pairs) - len(ds)} if arm.startswith("st-mined-") else {}
        flow.update(mined_pairs=len(ds), mined_queries=len(kept_q), kept_pairs=len(ds), kept_queries=len(kept_q), filters=dropped)
        flow.update(kept_qids=kept_q, budget_rows=sum(sizes), batch_rows=sizes)
    elif arm in PIPELINE_ARMS and arm != LLM_ARM:  # (the LLM arm's hours are not spent on counts)
        dest = args.out / arm / f"seed{seed}"
        stats = run_pipeline_arm(args, seed, dest, pipeline_extra(arm, src, args), stages=DATA_STAGES)
        reg, sc, cur = stats.get("regenerate", {}), stats.get("score", {}), stats.get("curriculum", {})
        mined, kept = harness.records(dest / "run" / "regenerate"), harness.records(dest / "run" / "score")
        kept_q = sorted({r["meta"]["query_id"] for r in kept})
        filters = {
            f"regenerate: {k}": v for k, v in (reg.get("rejects_by_reason") or {"too_few_mined": len(src.pairs) - len(mined)}).items()
        }
        filters |= {"regenerate: duplicate pairs": reg.get("duplicates", 0)} | {
            f"score: {k}": v for k, v in (sc.get("rejects_by_reason") or {}).items()
        }
        flow.update(mined_pairs=len(mined), mined_queries=len({r["meta"]["query_id"] for r in mined}), kept_pairs=len(kept))
        flow.update(
            kept_queries=len(kept_q), kept_qids=kept_q, filters=filters, budget_rows=cur.get("rows") or args.steps * args.batch_size
        )
        import negsynth

        tr = negsynth.load_config(dest / "pipeline.toml").train
        steps = tr.max_steps if tr.max_steps > 0 else args.steps if cur.get("schedule") == "stock" else 0
        if (tr.batch_sampler == "shuffled" or cur.get("schedule") == "stock") and steps > 0:
            # the trainer cycles the curriculum's one pass itself, as the HF trainer does the stock recipe's rows
            from negsynth.data.curriculum import load_curriculum

            ds = load_curriculum(dest / "run" / "curriculum")
            sizes = stock_batch_sizes(ds.select_columns(harness.text_columns(ds.column_names)), args.batch_size, steps, seed)
            flow.update(budget_rows=sum(sizes), batch_rows=sizes)
    else:
        return None
    flow["passes"] = round(flow["budget_rows"] / max(flow["kept_pairs"], 1), 3)
    return flow


def print_flow(flows: list[dict], args) -> None:
    flows = [f for f in flows if f]
    stock = next((f for f in flows if f["arm"] == STOCK_ARM), None)
    if not flows:
        return
    print(f"\nWhat reaches training ({args.name}, fit split, {args.steps} steps x batch {args.batch_size}; counts from the stages)\n")
    head = [
        "arm",
        "pairs (queries) in",
        "after mining",
        "after score filters",
        "dropped by",
        "rows trained",
        "passes",
        f"kept queries shared with {STOCK_ARM}",
    ]
    rows = []
    for f in flows:
        shared = (
            "-"
            if stock is None or f is stock
            else f"{len(set(f['kept_qids']) & set(stock['kept_qids']))} of {f['kept_queries']} / {stock['kept_queries']}"
        )
        why = "; ".join(f"{k} {v}" for k, v in f["filters"].items() if v) or "-"
        rows.append(
            [
                f["arm"],
                f"{f['pairs']} ({f['queries']})",
                f"{f['mined_pairs']} ({f['mined_queries']})",
                f"{f['kept_pairs']} ({f['kept_queries']})",
                why,
                f["budget_rows"],
                f"{f['passes']:.2f}",
                shared,
            ]
        )
    print(harness.table(head, rows))
    for f in flows:
        if (b := f.get("batch_rows")) and min(b) < args.batch_size:
            print(
                f"\n{f['arm']}: NO_DUPLICATES left batches short where rows share texts: {len(b)} batches of {min(b)}-{max(b)} rows, {sum(b)} trained instead of {len(b) * args.batch_size}"
            )


def train_arm(arm: str, seed: int, src: Source, args) -> tuple[dict, str | None]:
    """Train one arm: ``(its info, the model folder)``; the base arm trains nothing (None)."""
    dest = args.out / arm / f"seed{seed}"
    if arm == "base":
        return {}, None
    if arm.startswith("st-"):
        ds = stock_rows(src, arm, args)
        t = harness.train_stock_recipe(
            harness.base_model(args.device),
            ds,
            dest,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=seed,
            max_length=args.max_length,
            steps=args.steps,
        )
        losses = [e["loss"] for e in t.state.log_history if "loss" in e]
        return {
            "rows": len(ds),
            "steps": t.state.global_step,
            "loss": losses,
            "queries": len(set(ds["anchor"])),
            "batch_rows": t.batch_rows,
        }, str(dest)
    import shutil

    stats = run_pipeline_arm(args, seed, dest, pipeline_extra(arm, src, args))
    shutil.rmtree(dest / "model", ignore_errors=True)
    shutil.copytree(dest / "run" / "train" / "final", dest / "model")
    cur, tr = stats.get("curriculum", {}), stats.get("train", {})
    examples = stats.get("score", {}).get("kept", stats.get("regenerate", {}).get("valid"))
    info = {"rows": cur.get("rows"), "schedule": cur.get("schedule"), "examples": examples, "steps": tr.get("steps")}
    return info | {"loss": [tr.get("loss_first"), tr.get("loss_last")]}, str(dest / "model")


def same_input(arm: str, seed: int, src: Source, args) -> dict | None:
    """The pairs an arm started from, as a count and a hash of their sorted source ids: the stock arms'
    ``src``, the pipeline arms' what ``regenerate`` read (its records, rejects and dropped duplicates)."""
    if arm.startswith("st-"):
        ids, dropped = sorted(p.source_id for p in src.pairs), 0
    elif arm in PIPELINE_ARMS:
        reg = args.out / arm / f"seed{seed}" / "run" / "regenerate"
        rej = [(r.get("input") or {}).get("source_id", "?") for r in harness.records(reg, rejects=True)]
        ids = sorted([r["source_id"] for r in harness.records(reg)] + rej)
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
    exact duplicate pairs before mining, counted), the same ids when none was dropped."""
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
    """``(distinct rows, sha256 of them sorted)`` over a training set's text columns: two arms with one
    digest train the same rows, whatever their order."""
    cols = harness.text_columns(ds.column_names)
    rows = sorted({"\x1f".join(r[c] for c in cols) for r in ds.select_columns(cols)})
    return len(rows), hashlib.sha256("\x1e".join(rows).encode()).hexdigest()[:16]


def check_same_rows(arms: list[str], seed: int, src: Source, args) -> None:
    """negsynth's default (and ``ns-pipeline-reordered``) train the stock recipe's own rows, tuple for
    tuple: the table is refused where they differ (negsynth's mining, cleaning or curriculum drifted
    from ``mine_hard_negatives``'), so the side-by-side stays a same-rows comparison."""
    from negsynth.data.curriculum import load_curriculum

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


# ------------------------------------------------------------------------------ driver


def run_arm(arm: str, seed: int, src: Source, args) -> dict:
    """Train one arm at one seed and evaluate it on the selection tasks (dev, or test with no dev split)."""
    t0 = time.time()
    with harness.PeakRSS() as train_mem:
        info, path = train_arm(arm, seed, src, args)
    with harness.PeakRSS() as eval_mem:
        scores, per_query = harness.evaluate(path, args.select_tasks, args, args.eval_suite)
    cost = {"train_s": round(train_mem.seconds, 1), "eval_s": round(eval_mem.seconds, 1)}
    cost |= {"train_peak_mib": train_mem.peak_mib, "eval_peak_mib": eval_mem.peak_mib}
    if (train_mem.gpu_peak_mib, eval_mem.gpu_peak_mib) != (None, None):
        cost |= {"train_gpu_peak_mib": train_mem.gpu_peak_mib, "eval_gpu_peak_mib": eval_mem.gpu_peak_mib}
    same = same_input(arm, seed, src, args)
    head = {"arm": arm, "seed": seed, "split": args.split_id, **({"same_input": same} if same else {})}
    return head | {"scores": scores, "per_query": per_query, "model": path, "seconds": round(time.time() - t0, 1), **cost, **info}


def run_test(r: dict, args) -> dict:
    """The test split for an arm already evaluated on dev: its scores and per-query figures added."""
    t0 = time.time()
    scores, per_query = harness.evaluate(r.get("model"), [test_task(args)], args, args.eval_suite)
    return {
        **r,
        "scores": {**r["scores"], **scores},
        "per_query": {**r.get("per_query", {}), **per_query},
        "test_s": round(time.time() - t0, 1),
    }


def choose_on_dev(results: list[dict], args) -> str | None:
    """The negsynth arm with the highest mean dev nDCG@10 (a tie keeps the default, then the listed order)."""
    means: dict[str, list[float]] = {}
    for r in results:
        if r["arm"].startswith("ns-") and args.dev_name in r["scores"]:
            means.setdefault(r["arm"], []).append(r["scores"][args.dev_name])
    return max(means, key=lambda a: (statistics.mean(means[a]), a == DEFAULT_ARM, -ALL_ARMS.index(a))) if means else None


def report_arms(results: list[dict], args) -> list[str]:
    """The arms whose test split is evaluated: base, the stock recipe, negsynth's default, the dev choice."""
    want = {"base", STOCK_ARM, DEFAULT_ARM, choose_on_dev(results, args)} if args.dev_name else set(ALL_ARMS)
    return [a for a in ALL_ARMS if a in want and any(r["arm"] == a for r in results)]


def print_table(results: list[dict], args) -> None:
    tasks = [t for t in (args.dev_name, args.test_name) if t] + args.eval_tasks
    sp = args.split_info
    print(
        f"\nall-MiniLM-L6-v2 on {args.name} (fit: {sp['fit_queries']} queries, {sp['fit_pairs']} pairs; dev {sp['dev_queries']} queries; "
        f"test {sp['test_queries']} queries; split seed {sp['split_seed']}), {args.steps} steps x batch {args.batch_size}, lr {args.lr}; "
        f"{args.eval_suite} evaluation\n"
    )
    gpu = any("eval_gpu_peak_mib" in r for r in results)  # GPU columns only where a GPU was used
    costs = ["train_s", "eval_s", "train_peak_mib", "eval_peak_mib"] + (["train_gpu_peak_mib", "eval_gpu_peak_mib"] if gpu else [])
    rows = []
    for arm in ALL_ARMS:
        if rs := [r for r in results if r["arm"] == arm]:
            cells = [harness.mean_sd(v) if (v := harness.seed_scores(rs, t)) else "-" for t in tasks]
            rows.append([arm, len(rs), *cells, *(f"{m:.0f}" if (m := harness.median(rs, k)) is not None else "-" for k in costs)])
    print(harness.table(["arm", "seeds", *tasks, *costs], rows))
    print("\n(costs: one seed's seconds and peak memory (MiB), median over seeds; '-': not evaluated there)")
    split = [t for t in (args.dev_name, args.test_name) if t]
    paired = [[a, *(harness.paired_cell(harness.paired(results, a, STOCK_ARM, t, args.resamples)) for t in split)] for a, *_ in rows]
    if any(r["arm"] == STOCK_ARM for r in results):
        print(
            f"\nPer query against {STOCK_ARM} (nDCG@10 x 100, seeds pooled; 95 % bootstrap CI; two-sided sign-flip p, {args.resamples} resamples)\n"
        )
        print(harness.table(["arm", *(f"Δ {t}" for t in split)], [r for r in paired if r[0] != STOCK_ARM]))
    if args.dev_name and (best := choose_on_dev(results, args)):
        print(f"\nchosen on {args.dev_name}: {best}; the test split is reported for {', '.join(report_arms(results, args))}")


def build_parser():
    ap = harness.parser(__doc__)
    ap.add_argument("--out", type=Path, default=Path("runs/recipe"), help="OUT/<dataset>/: models, the split files and results.json")
    ap.add_argument("--data-dir", type=Path, default=None, help="evaluation data (default: NEGSYNTH_DATA_DIR or ../shared/data)")
    ap.add_argument("--dataset", type=Path, default=None, help="a BEIR folder with train and test splits (default: DATA_DIR/scifact)")
    ap.add_argument("--dev-frac", type=float, default=0.2, help="share of the train queries held out as the dev split; 0: none")
    ap.add_argument("--split-seed", type=int, default=0, help="seed of the dev split (and of --test-frac's test split)")
    ap.add_argument("--test-frac", type=float, default=0.0, help="a folder with one labelled query set: hold out this share as test")
    ap.add_argument("--no-title", action="store_true", help="evaluate documents as their text only (a corpus whose text repeats the title)")
    ap.add_argument("--counts-only", action="store_true", help="print what reaches training in the stock and pipeline arms and stop")
    ap.add_argument("--resamples", type=int, default=10000, help="bootstrap / permutation resamples of the paired per-query tests")
    ap.add_argument("--arms", default=",".join(HEADLINE_ARMS), help=f"comma-separated, or 'all' ({','.join(ALL_ARMS)})")
    ap.add_argument("--seeds", type=harness.int_list, default="0", help="seeds of the key arms; the other arms use the first")
    ap.add_argument("--all-seeds", action="store_true", help="run every arm over every seed")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per arm (default: one pass over the fit pairs, rounded down)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--max-length", type=int, default=128, help="training max tokens (evaluation uses the model's 256)")
    ap.add_argument("--eval-tasks", default="STSBenchmark,TRECClustering", help="other sets evaluated with dev; 'none' for none")
    ap.add_argument("--eval-suite", choices=["full", "quick"], default="full", help="quick: SciFact cut to 100 queries x 1,000 documents")
    ap.add_argument("--device", default="cpu", help="mining and evaluation: cpu (the documented figures), cuda or auto")
    ap.add_argument("--fresh", action="store_true", help="redo arms already in results.json")
    ap.add_argument("--dev-only", action="store_true", help="stop after the dev figures; a later run without it adds the test split")
    ap.add_argument("--llm-pairs", type=int, default=128, help="ns-pipeline-llm: fit pairs the LLM grades negatives for (seeded sample)")
    harness.add_llm_args(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.eval_tasks = [t.strip() for t in args.eval_tasks.split(",") if t.strip() and t.strip().lower() != "none"]
    for flag, v in (("--dev-frac", args.dev_frac), ("--test-frac", args.test_frac)):
        if not 0 <= v < 1:
            sys.exit(f"scifact_recipe: {flag} must be in [0, 1), got {v}")
    arms = harness.names(args.arms, ALL_ARMS)
    if args.dataset is None:
        args.data_dir = harness.data_dir(args.data_dir)
    dataset = args.dataset or args.data_dir / "scifact"
    args.name = Path(dataset).resolve().name.lower()
    args.doc_title = not args.no_title
    if args.test_frac > 0:  # one labelled query set: a seeded test split by query, the rest is train
        dataset = split_one_set(Path(dataset), args.out / args.name / "_source", args.test_frac, args.split_seed)
        args.split_from = args.name  # its own query file is no decontamination set for its train queries
    dataset_files(Path(dataset))  # a folder without train / test splits stops here, before anything is written
    args.out = args.out / args.name
    args.split_dir = args.out / "_split"
    sp = args.split_info = make_splits(Path(dataset), args.split_dir, args.dev_frac, args.split_seed)
    args.split_id = f"{sp['dataset']}|dev {args.dev_frac}|seed {args.split_seed}" + (
        f"|test {args.test_frac}" if args.test_frac > 0 else ""
    )
    args.dev_name = f"{args.name}-dev" if args.dev_frac > 0 else None
    args.test_name = f"{args.name}-test"
    args.select_tasks = [dev_task(args) if args.dev_name else test_task(args), *args.eval_tasks]
    src = fit_source(args)
    args.steps = args.steps or max(1, len(src.pairs) // args.batch_size)
    print(
        f"{args.name}: fit {sp['fit_queries']} queries / {len(src.pairs)} pairs, dev {sp['dev_queries']} queries, "
        f"test {sp['test_queries']} queries, corpus {len(src.corpus)}; {args.steps} steps x {args.batch_size}",
        file=sys.stderr,
    )
    if args.counts_only:
        flows = [f for arm in arms if (f := data_flow(arm, args.seeds[0], src, args))]
        (args.out / "data_flow.json").write_text(
            json.dumps({"split": sp, "steps": args.steps, "batch_size": args.batch_size, "flows": flows}, indent=1)
        )
        print_flow(flows, args)
        check_same_rows(arms, args.seeds[0], src, args)
        return 0
    res_path = args.out / "results.json"
    results = [] if args.fresh else harness.load_results(res_path)
    if stale := [r for r in results if r.get("split") != args.split_id]:
        sys.exit(
            f"scifact_recipe: {res_path} holds {len(stale)} result(s) of another split (dataset, --dev-frac or --split-seed); use another --out or --fresh"
        )
    done = {(r["arm"], r["seed"]) for r in results}
    t0 = time.time()
    for arm, seed in harness.jobs(arms, args.seeds, lambda a: a != "base" and (a in KEY_ARMS or args.all_seeds)):
        if (arm, seed) not in done:
            r = run_arm(arm, seed, src, args)
            print(
                f"{arm} seed {seed}: " + ", ".join(f"{k} {100 * v:.2f}" for k, v in r["scores"].items()) + f" ({r['seconds']:.0f} s)",
                file=sys.stderr,
            )
            results = harness.save_result(res_path, r, ("arm", "seed"), args)
    if args.dev_name and not args.dev_only:  # the test split, once per reported arm and seed, after every dev figure is in
        for arm in report_arms(results, args):
            for r in [x for x in results if x["arm"] == arm and args.test_name not in x["scores"]]:
                results = harness.save_result(res_path, run_test(r, args), ("arm", "seed"), args)
    if default := [r for r in results if r["arm"] == DEFAULT_ARM and r["seed"] == args.seeds[0] and r.get("model")]:
        import shutil

        shutil.rmtree(args.out / "negsynth-default", ignore_errors=True)
        shutil.copytree(default[0]["model"], args.out / "negsynth-default", ignore=shutil.ignore_patterns("_ckpt"))
    check_same_input(results)
    check_same_rows(arms, args.seeds[0], src, args)
    print_table(results, args)
    print_flow([data_flow(arm, args.seeds[0], src, args) for arm in arms], args)
    print(f"\nmodels under {args.out}/<arm>/seed<N>/; results in {res_path}; this invocation {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
