"""What the evaluation results cache saves a user: ``negsynth evaluate`` of a newly trained model
against its base model, with the base's results already stored by an earlier run, and with
``--no-cache``, side by side.

The "trained" model is MiniLM with every weight moved by seeded noise (std ``--noise``) and saved
to a temp folder: a new model by content, as every training makes. Before the reps, one run
stores the base model's results in a folder W. Each rep then runs, interleaved (the order rotates):

``no-cache``  ``negsynth evaluate --model TRAINED --baseline MINILM --no-cache`` (both models scored);
``cache``     the same command with ``NEGSYNTH_EVAL_CACHE_DIR`` = a fresh copy of W (the base's
              results stored, the trained model's not: as after a new training).

Reported: the command's wall time (process start and model loads included), medians over
``--reps``, the speed-up, and whether both arms' reports hold the same scores for every task
(they must: a hit is the stored result). The load average is printed at each run.

    python benchmarks/eval_cache.py                                   # the demo's 8 quick sets
    python benchmarks/eval_cache.py --suite full --tasks SciFact,STSBenchmark,TRECClustering --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEMO_TASKS = "STSBenchmark,SICK-R,STS12,SciFact,MRPC,SICK-E,TREC,TRECClustering"


def perturbed_model(dest: Path, noise: float, seed: int) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer

    from negsynth.resources import minilm_path

    m = SentenceTransformer(str(minilm_path()), device="cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    m.save(str(dest))
    return dest


def evaluate_cmd(run_dir: Path, model: Path, base: str, args, *, cache_dir: Path | None) -> tuple[float, dict]:
    cmd = [
        sys.executable,
        "-m",
        "negsynth",
        "evaluate",
        "-d",
        str(run_dir),
        "--model",
        str(model),
        "--baseline",
        base,
        "--suite",
        args.suite,
        "--tasks",
        args.tasks,
        "--quiet",
    ]
    env = dict(os.environ)
    if cache_dir is None:
        cmd.append("--no-cache")
    else:
        env["NEGSYNTH_EVAL_CACHE_DIR"] = str(cache_dir)
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    d = run_dir / "evaluate"
    scores = {}
    for name in ("baseline.json", "report.json"):
        if not (d / name).is_file():  # no baseline asked for
            continue
        rep = json.loads((d / name).read_text())
        scores[name] = {t: r["main_score"] for t, r in rep["tasks"].items()}
        scores[name + ":cached"] = sorted(t for t, r in rep["tasks"].items() if r.get("cached"))
    return wall, scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="quick", choices=["quick", "full"])
    ap.add_argument("--tasks", default=DEMO_TASKS)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--noise", type=float, default=1e-3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from negsynth.resources import minilm_path

    base = str(minilm_path())
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        model = perturbed_model(tmp / "trained", args.noise, seed=0)
        warm = tmp / "warm"
        evaluate_cmd(tmp / "run-warm", base, "", args, cache_dir=warm)  # stores the base model's results
        load0 = os.getloadavg()
        runs: dict[str, list[dict]] = {"no-cache": [], "cache": []}
        arms = list(runs)
        for rep in range(args.reps):
            for arm in arms[rep % 2 :] + arms[: rep % 2]:
                run_dir = tmp / f"run-{arm}-{rep}"
                cache_dir = None
                if arm == "cache":
                    cache_dir = tmp / f"cache-{rep}"
                    shutil.copytree(warm, cache_dir)
                la = os.getloadavg()[0]
                wall, scores = evaluate_cmd(run_dir, model, base, args, cache_dir=cache_dir)
                runs[arm].append({"wall": wall, "load1": la, "scores": scores})
                print(f"rep {rep + 1} {arm:9s} {wall:7.1f} s  load {la:.2f}  cached: {scores['baseline.json:cached'] or '-'}", flush=True)
        load1 = os.getloadavg()
    ref = runs["no-cache"][0]["scores"]
    same = all(r["scores"][k] == ref[k] for rs in runs.values() for r in rs for k in ("baseline.json", "report.json"))
    med = {arm: statistics.median(r["wall"] for r in rs) for arm, rs in runs.items()}
    print(
        f"\n{args.suite} suite, {args.tasks}; {args.reps} reps interleaved, medians; {len(os.sched_getaffinity(0))} CPUs; "
        f"load average {load0[0]:.2f} before / {load1[0]:.2f} after\n"
    )
    print("| arm | wall s (reps) | median s | speed-up | same scores as no-cache |")
    print("|---|---|---:|---:|---|")
    for arm, rs in runs.items():
        reps = " / ".join(f"{r['wall']:.1f}" for r in rs)
        print(f"| {arm} | {reps} | {med[arm]:.1f} | {med['no-cache'] / med[arm]:.2f}x | {'yes' if same else 'NO'} |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "runs": runs,
                    "median_s": med,
                    "same_scores": same,
                    "load_before": load0,
                    "load_after": load1,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
