"""Curriculum ablation (MGH Fig. 3): the same model and data under each negative schedule.

Trains the same base model with ``curriculum`` (level 4 -> 1), ``reverse`` (1 -> 4), ``random``
and ``fixed:1..4`` on the same scored examples, evaluates each (and the untrained base) on the
offline suite, and prints one markdown table. Every run uses the same seed, batch size, steps and
learning rate; only the order / level of the hard negatives differs.

    python benchmarks/curriculum_ablation.py --run-dir runs/demo            # examples from a run
    python benchmarks/curriculum_ablation.py --run-dir runs/big --tasks STS,SciFact --epochs 2

Read the table with its n: with a few dozen examples (the CPU demo) the differences are noise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

SCHEDULES = ["curriculum", "reverse", "random", "fixed:1", "fixed:2", "fixed:3", "fixed:4"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True, help="a run dir with score/ (or generate/) shards")
    p.add_argument("--input", default="score", help="stage folder holding the examples")
    p.add_argument("--out", default=None, help="working folder (default RUN_DIR/ablation_curriculum)")
    p.add_argument("--schedules", default=",".join(SCHEDULES))
    p.add_argument("--model", default="default")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.02)
    p.add_argument("--suite", default="quick")
    p.add_argument("--tasks", default="STSBenchmark,SICK-R,SciFact,MRPC,TREC")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    from negsynth.data.curriculum import build_curriculum
    from negsynth.data.shards import read_stage
    from negsynth.embed import embedder_for
    from negsynth.evaluate import evaluate
    from negsynth.train import TrainConfig, train

    run_dir = Path(a.run_dir)
    examples = list(read_stage(run_dir / a.input))
    if not examples:
        print(f"error: no examples in {run_dir / a.input}; run `negsynth run -d {run_dir}` first", file=sys.stderr)
        return 2
    out = Path(a.out or run_dir / "ablation_curriculum")
    out.mkdir(parents=True, exist_ok=True)
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]

    def score(model_path: str) -> dict:
        rep = evaluate(embedder_for(model_path), suite=a.suite, tasks=tasks, progress=False, seed=a.seed)
        return {"average": rep["average"], **{k: v["main_score"] for k, v in rep["tasks"].items()}}

    rows = []
    t0 = time.time()
    base = score(a.model)
    rows.append(("base (no training)", 0, 0, base))
    print(f"base: {base['average']:.4f} ({time.time() - t0:.0f} s)", file=sys.stderr)
    for sched in [s.strip() for s in a.schedules.split(",") if s.strip()]:
        t1 = time.time()
        cur = build_curriculum(examples, schedule=sched, batch_size=a.batch_size, epochs=a.epochs, seed=a.seed, homogeneous_batches=False)
        if not cur:
            print(f"{sched}: no full batch of {a.batch_size}; skipped", file=sys.stderr)
            continue
        cols = {k: [r[k] for r in cur] for k in ("anchor", "positive", "negative", "level", "phase")}
        cfg = TrainConfig(
            model=a.model,
            batch_size=a.batch_size,
            grad_accum=1,
            lr=a.lr,
            epochs=1.0,
            max_length=a.max_length,
            temperature=a.temperature,
            seed=a.seed,
            save_steps=10**6,
            output_dir=str(out / sched.replace(":", "_")),
        )
        path = train(cols, cfg)
        res = score(path)
        rows.append((sched, len(cur), len(cur) // a.batch_size, res))
        print(f"{sched}: {res['average']:.4f} ({time.time() - t1:.0f} s)", file=sys.stderr)

    names = tasks
    print(
        f"\nexamples: {len(examples)} from {run_dir / a.input}; model {a.model}; batch {a.batch_size}; lr {a.lr}; tau {a.temperature}; suite {a.suite}"
    )
    print("| schedule | rows | steps | " + " | ".join(names) + " | average |")
    print("|---|---:|---:|" + "---:|" * (len(names) + 1))
    for sched, n, steps, res in rows:
        cells = " | ".join(f"{100 * res[t]:.2f}" if t in res else "-" for t in names)
        print(f"| {sched} | {n} | {steps} | {cells} | {100 * res['average']:.2f} |")
    (out / "results.json").write_text(json.dumps([{"schedule": s, "rows": n, "steps": k, **r} for s, n, k, r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
