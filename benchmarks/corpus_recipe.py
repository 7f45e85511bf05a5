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
==============  ===========================================================================

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
}
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
    if args.llm_threads:
        llm += f"[serve]\nn_threads = {args.llm_threads}\n"
    arm = dict(arm)
    cur = {"epochs": 1} if args.steps is None else {"total_steps": args.steps}
    cur.update(arm.pop("curriculum", {}))
    train = "".join(f"{k} = {json.dumps(v)}\n" for k, v in arm.pop("train", {}).items())
    # whole documents, as the published figures were measured (and their run dirs' config hashes
    # made); an arm may set chunk_tokens to measure passages
    arm.setdefault("chunk_tokens", 0)
    corpus = f"[corpus]\nmax_docs = {args.max_docs}\nseed = 0\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in arm.items())
    corpus += f"[[corpus.inputs]]\npath = {json.dumps(str(corpus_dir))}\n"
    return (
        llm + "[pipeline]\nshard_size = 100\n" + corpus + '[score]\ninputs = ["corpus"]\n'
        f"[curriculum]\nseed = {seed}\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in cur.items())
        + f"[train]\nbatch_size = {args.batch_size}\ngrad_accum = 1\nlr = {args.lr}\nmax_length = {args.max_length}\nseed = {seed}\n"
        + train
    )


def evaluate_model(path: str | None, tasks: list[str], args) -> dict:
    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.evaluate import evaluate

    emb = SentenceTransformerEmbedder.load(path or "default", device="cpu", batch_size=64)
    rep = evaluate(emb, suite="full", tasks=tasks, progress=False, data_dir=args.data_dir, seed=0)
    return {name: float(t["main_score"]) for name, t in rep["tasks"].items()}


def train_arm(dataset: str, arm: str, seed: int, args) -> dict:
    """negsynth's stages on the corpus (the LLM's answers shared through the dataset's cache)."""
    from negsynth.pipeline.config_io import load_config
    from negsynth.stages import run_pipeline

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
            scores = evaluate_model(prior.get("model_dir"), todo, args)
        return {**prior, "scores": {**prior["scores"], **scores}, "eval_s": round(prior.get("eval_s", 0) + eval_mem.seconds, 1)}
    info: dict = {}
    path = None
    with PeakRSS() as train_mem:
        if ARMS[arm] is not None:
            info = train_arm(dataset, arm, seed, args)
            path = info.get("model_dir")
    with PeakRSS() as eval_mem:
        scores = evaluate_model(path, tasks, args) if "no_model" not in info else {}
    return {
        "dataset": dataset,
        "arm": arm,
        "seed": seed,
        "scores": scores,
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


def print_table(results: list[dict], datasets: list[str]) -> None:
    for d in datasets:
        _, tasks = DATASETS[d]
        print(f"\n### {d} (x100; mean ± sd over seeds, (Δ vs base))\n")
        print("| arm | seeds | " + " | ".join(tasks) + " | examples kept |")
        print("|---|---|" + "---:|" * (len(tasks) + 1))
        for row in summarise(results, d):
            print("| " + " | ".join(row) + " |")
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
    results = [x for x in load_results(path) if (x["dataset"], x["arm"], x["seed"]) != (r["dataset"], r["arm"], r["seed"])] + [r]
    tmp = path.with_suffix(".tmp")
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
    ap.add_argument("--data-dir", default=str(default_data_dir() or "../shared/data"))
    ap.add_argument("--fresh", action="store_true", help="redo arms already in results.json")
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
    arms = list(ARMS) if args.arms.strip() == "all" else [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        ap.error(f"--arms: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(ARMS)} or all")
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
        if not tasks:
            print(f"corpus_recipe: {d} has no dev split; --select skips it", file=sys.stderr)
            continue
        prior = next((r for r in results if (r["dataset"], r["arm"], r["seed"]) == key), None)
        if prior and all(t in prior["scores"] for t in tasks):
            continue
        print(f"corpus_recipe: {d} {a} seed {key[2]} ({', '.join(tasks)}) ...", file=sys.stderr, flush=True)
        r = run_one(d, a, key[2], args, tasks, prior)
        results = save_result(res_path, r)
        print(json.dumps({k: r[k] for k in ("dataset", "arm", "seed", "scores", "train_s", "eval_s")}), file=sys.stderr, flush=True)
    print_table(results, datasets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
