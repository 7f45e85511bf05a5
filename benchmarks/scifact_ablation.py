"""SciFact ablation: which negatives help fine-tune all-MiniLM-L6-v2 on the SciFact train pairs?

Arms (same examples, same steps, same batch size, same order of (query, positive) pairs as far
as the curriculum builder allows):

    base        the untouched all-MiniLM-L6-v2
    (a) in-batch  MultipleNegativesRanking on (query, positive) only: the other positives of the batch
    (b) mined     + one mined negative per row (``regenerate --mine 4``: MiniLM top-4 from the SciFact
                  corpus with the 95% positive-aware margin), level drawn at random per row
    (c) LLM curriculum  + one LLM-graded negative per row, levels 4 -> 3 -> 2 -> 1 (25% of steps each)
    (d) LLM random      + one LLM-graded negative per row, level drawn at random per row

(b) and (d) use the same ``random`` schedule, so they differ only in where the negatives come
from; (c) and (d) use the same negatives and differ only in their order. Every arm is evaluated
with nDCG@10 on the SciFact *test* split (``negsynth.evaluate``; ``--eval-suite quick`` = 100
queries against a 1000-document corpus that holds every judged document, ``full`` = 300 against
all 5183).

Steps:

1. ``regenerate`` on ``scifact/train`` (``--pairs`` pairs, seeded sample, ``mine = 4``) with the LLM
   of ``--config`` (default: the embedded SmolLM2-135M-Instruct on port 8771). Resumable: rerun
   the script and finished shards and cached requests are reused.
2. Keep the examples that have 4 LLM negatives and 4 mined negatives; build the rows of each arm
   with :func:`negsynth.data.curriculum.build_curriculum` (anchors are the bare claims: MiniLM
   was not trained with instructions, and the evaluator does not add them either).
3. Train each arm with :func:`negsynth.train.make_trainer` (``--steps`` optimizer steps,
   ``--batch-size``, ``--lr``, ``--temperature``, ``--max-length``) and evaluate.

Prints a Markdown table and writes ``RESULTS/ablation.json``.

    python benchmarks/scifact_ablation.py --run-dir /tmp/scifact-ablation --pairs 64 --steps 24
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EMBEDDED_CONFIG = """
[llm]
base_url = "embedded"
model = "smollm2-135m-instruct"
structured_output = "json_object"
max_concurrency = 2
temperature = 0.7
max_tokens = 700
max_attempts = 3
timeout = 300
[serve]
port = 8771
n_ctx = 4096
[pipeline]
shard_size = 16
[regenerate]
max_doc_chars = 400
prompt_positive_chars = 1200
"""


def data_dir() -> Path:
    from negsynth.resources import default_data_dir

    d = default_data_dir()
    if d is None or not (d / "scifact" / "train" / "qrels.tsv").exists():
        sys.exit("scifact_ablation: no shared data with scifact/train (set NEGSYNTH_DATA_DIR)")
    return d


def regenerate(args, run_dir: Path) -> dict:
    """Run (or resume) the regenerate stage on the SciFact train pairs."""
    from negsynth.pipeline.context import StageContext
    from negsynth.pipeline.progress import Reporter
    from negsynth.pipeline.stage import run_stage
    from negsynth.schemas.config import SourceSpec
    from negsynth.schemas.config_io import load_config
    from negsynth.stages import get

    if args.config:
        cfg = load_config(args.config, args.set or [])
    else:
        p = run_dir / "ablation-llm.toml"
        run_dir.mkdir(parents=True, exist_ok=True)
        p.write_text(EMBEDDED_CONFIG)
        cfg = load_config(p, args.set or [])
    cfg.regenerate.inputs = [SourceSpec(path=str(data_dir() / "scifact"), split="train", limit=args.pairs, seed=args.seed)]
    cfg.regenerate.mine = 4
    ctx = StageContext(cfg=cfg, run_dir=run_dir, reporter=Reporter(quiet=True))
    return run_stage(get("regenerate"), ctx)


def load_examples(run_dir: Path) -> list[dict]:
    from negsynth.data.shards import read_stage

    ex = [r for r in read_stage(run_dir / "regenerate") if r.get("source") == "scifact"]
    return [r for r in ex if len(r["negatives"]) == 4 and len(r.get("mined_negatives") or []) >= 4]


def arm_rows(examples: list[dict], arm: str, args) -> list[dict]:
    from negsynth.data.curriculum import build_curriculum

    kw = dict(batch_size=args.batch_size, total_steps=args.steps, seed=args.seed, homogeneous_batches=False, instruction_template=None)
    if arm == "mined":
        return list(build_curriculum(examples, schedule="random", use_mined=True, **kw))
    if arm == "llm_curriculum":
        return list(build_curriculum(examples, schedule="curriculum", **kw))
    if arm in ("llm_random", "in_batch"):
        return list(build_curriculum(examples, schedule="random", **kw))
    raise ValueError(arm)


def train_arm(rows: list[dict], arm: str, out: Path, args) -> str:
    """Fine-tune MiniLM on ``rows`` in order; ``in_batch`` drops the negative column."""
    from datasets import Dataset

    from negsynth.train import TrainConfig, make_trainer

    cfg = TrainConfig(
        model="default",
        batch_size=args.batch_size,
        grad_accum=1,
        lr=args.lr,
        temperature=args.temperature,
        max_steps=args.steps,
        max_length=args.max_length,
        seed=args.seed,
        output_dir=str(out / arm),
        save_steps=10**6,
        save_total_limit=1,
        logging_steps=max(1, args.steps // 4),
    )
    cols = {k: [r[k] for r in rows] for k in ("anchor", "positive", "negative", "phase", "level")}
    trainer, model = make_trainer(Dataset.from_dict(cols), cfg)
    if arm == "in_batch":
        # identical trainer, sampler, loss and row order; only the hard-negative column is removed,
        # so MultipleNegativesRankingLoss sees in-batch positives as the only negatives
        trainer.train_dataset = trainer.train_dataset.select_columns(["anchor", "positive"])
    trainer.train()
    final = out / arm / "final"
    model.save(str(final))
    return str(final)


def ndcg(model_path: str | None, args) -> tuple[float, dict]:
    from negsynth.embed import load_embedder
    from negsynth.evaluate import evaluate
    from negsynth.schemas.config import EmbedderConfig

    emb = load_embedder(EmbedderConfig(model=model_path or "default", device="cpu"))
    rep = evaluate(emb, suite=args.eval_suite, tasks=["SciFact"], progress=False, seed=args.seed)
    t = rep["tasks"]["SciFact"]
    return float(t["metrics"]["ndcg_at_10"] if "ndcg_at_10" in t["metrics"] else t["main_score"]), t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", type=Path, default=Path("runs/scifact-ablation"))
    ap.add_argument("--config", type=Path, default=None, help="TOML with [llm]/[serve] for regenerate (default: embedded SmolLM2 on :8771)")
    ap.add_argument("--set", action="append", help="config override KEY=VALUE (repeatable)")
    ap.add_argument("--pairs", type=int, default=64, help="SciFact train pairs to regenerate (seeded sample of 919)")
    ap.add_argument("--steps", type=int, default=24, help="optimizer steps per arm (a multiple of 4)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=0.05, help="InfoNCE temperature (MiniLM was trained with scale 20 = 0.05)")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--eval-suite", choices=["quick", "full"], default="quick")
    ap.add_argument("--arms", default="base,in_batch,mined,llm_curriculum,llm_random")
    ap.add_argument("--skip-regenerate", action="store_true", help="use RUN_DIR/regenerate as it is")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    t0 = time.time()
    run_dir = args.run_dir
    if not args.skip_regenerate:
        st = regenerate(args, run_dir)
        print(
            f"regenerate: {st['valid']} valid, {st['rejected']} rejected {st['rejects_by_reason']} ({st['wall_time_s']:.0f} s)",
            file=sys.stderr,
        )
    regen_stats = json.loads((run_dir / "regenerate" / "stats.json").read_text())
    examples = load_examples(run_dir)
    if len(examples) < args.batch_size:
        sys.exit(
            f"scifact_ablation: only {len(examples)} usable examples (4 LLM + 4 mined negatives); regenerate more --pairs or lower --batch-size"
        )
    print(f"{len(examples)} examples with 4 LLM and 4 mined negatives", file=sys.stderr)

    results: dict[str, dict] = {}
    out = run_dir / "ablation"
    for arm in [a.strip() for a in args.arms.split(",") if a.strip()]:
        t = time.time()
        if arm == "base":
            path, n_rows = None, 0
        else:
            rows = arm_rows(examples, arm, args)
            n_rows = len(rows)
            path = train_arm(rows, arm, out, args)
        score, task = ndcg(path, args)
        results[arm] = {"ndcg_at_10": score, "rows": n_rows, "seconds": round(time.time() - t, 1), "eval_n_queries": task["n"]}
        print(f"{arm}: nDCG@10 = {100 * score:.2f} ({n_rows} rows, {time.time() - t:.0f} s)", file=sys.stderr)

    report = {
        "generator": regen_stats.get("model"),
        "regenerate": {k: regen_stats.get(k) for k in ("valid", "rejected", "rejects_by_reason")},
        "examples": len(examples),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
        "seconds": round(time.time() - t0, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.json").write_text(json.dumps(report, indent=2))
    names = {
        "base": "base all-MiniLM-L6-v2",
        "in_batch": "(a) in-batch negatives only",
        "mined": "(b) mined negatives (random level)",
        "llm_curriculum": "(c) LLM-graded, curriculum 4→1",
        "llm_random": "(d) LLM-graded, random level",
    }
    print(
        f"\nSciFact test nDCG@10 ({args.eval_suite} eval), generator {report['generator']}, {len(examples)} train examples, "
        f"{args.steps} steps x {args.batch_size}\n"
    )
    print("| arm | nDCG@10 | rows | time (s) |\n|---|---:|---:|---:|")
    for arm, r in results.items():
        print(f"| {names.get(arm, arm)} | {100 * r['ndcg_at_10']:.2f} | {r['rows']} | {r['seconds']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
