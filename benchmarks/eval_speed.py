"""Evaluation speed and score of the encoder backends side by side (torch / ONNX / OpenVINO).

Each backend's embedder is loaded once (its ONNX export, cached after the first run, is timed
apart), then the evaluation runs ``--reps`` times per backend, interleaved (rep k of every backend,
in a rotated order, before rep k+1) so a load spike on a shared CPU hits them alike. Reported per
backend: median / min seconds, the speed-up over torch, the main score (nDCG@10 for retrieval) and
its difference from torch, and the 1-minute load average before each rep (os.getloadavg).

    python benchmarks/eval_speed.py                                   # SciFact quick (100 q x 1,000 docs)
    python benchmarks/eval_speed.py --suite full --reps 3 --out eval_speed.json   # 300 q x 5,183 docs
    python benchmarks/eval_speed.py --backends torch,onnx --tasks SciFact,STSBenchmark
    python benchmarks/eval_speed.py --queries 40 --docs 200           # a smaller SciFact cut (loaded machine)

A backend may replace torch as the default only when its score equals torch's to the 4th decimal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--backends",
        default="torch,onnx,onnx-int8,openvino",
        help="arms, the first the reference: BACKEND[@DEVICE[:DTYPE]] (device cpu unless named; e.g. torch,torch@cuda,torch@cuda:float32)",
    )
    ap.add_argument("--suite", default="quick", choices=["quick", "full"])
    ap.add_argument("--tasks", default="SciFact")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--queries", type=int, default=None, help="retrieval: queries kept (quick suite's cut, overrides its cap)")
    ap.add_argument("--docs", type=int, default=None, help="retrieval: corpus kept (judged documents of the kept queries + random others)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch / runtime threads")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", default=None, help="write the JSON results here")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.evaluate import evaluate

    backends = args.backends.split(",")
    tasks = args.tasks.split(",")
    if args.queries or args.docs:  # a smaller cut through the quick suite's own subsampling (same seed)
        from negsynth.evaluate.suite import TASKS_BY_NAME

        args.suite = "quick"
        for t in tasks:
            spec = TASKS_BY_NAME[t]
            object.__setattr__(
                spec,
                "quick",
                {**spec.quick, **({"queries": args.queries} if args.queries else {}), **({"corpus": args.docs} if args.docs else {})},
            )
    embs, setup = {}, {}
    for b in backends:
        t0 = time.perf_counter()
        backend, _, where = b.partition("@")  # an arm: BACKEND[@DEVICE[:DTYPE]], e.g. torch@cuda or torch@cuda:float32
        device, dtype = where or "cpu", "auto"
        if ":" in device and not device.rsplit(":", 1)[1].isdigit():  # cuda:float32, cuda:1:float32
            device, dtype = device.rsplit(":", 1)
        embs[b] = SentenceTransformerEmbedder.load("default", device=device, dtype=dtype, batch_size=args.batch_size, backend=backend)
        embs[b].encode(["warm-up text"])
        setup[b] = time.perf_counter() - t0
        print(f"{b}: loaded (+ export if first run) in {setup[b]:.1f}s", flush=True)

    runs: dict[str, list[dict]] = {b: [] for b in backends}
    for rep in range(args.reps):
        order = backends[rep % len(backends) :] + backends[: rep % len(backends)]
        for b in order:
            load = os.getloadavg()[0]
            rep_ = evaluate(embs[b], suite=args.suite, data_dir=args.data_dir, tasks=tasks, progress=False, announce=True)
            if not rep_["tasks"]:
                raise SystemExit("no evaluation data: " + "; ".join(rep_["notes"]))
            row = {
                "seconds": rep_["seconds"],
                "cpu_seconds": rep_["cpu_seconds"],
                "load1": round(load, 2),
                "scores": {t: r["main_score"] for t, r in rep_["tasks"].items()},
                "ndcg@10": {t: r["metrics"].get("ndcg@10") for t, r in rep_["tasks"].items()},
            }
            runs[b].append(row)
            print(
                f"rep {rep + 1} {b}: {row['seconds']:.1f}s (load {load:.1f}) "
                + " ".join(f"{t}={100 * s:.4f}" for t, s in row["scores"].items()),
                flush=True,
            )

    ref = runs[backends[0]][0]["scores"]
    t_ref = statistics.median(r["seconds"] for r in runs[backends[0]])
    summary = {}
    cut = f" ({args.queries or '-'} queries x {args.docs or '-'} docs)" if args.queries or args.docs else ""
    print(
        f"\n{args.suite}{cut} {','.join(tasks)}; {args.reps} reps, interleaved; threads {args.threads}; load1 range "
        f"{min(r['load1'] for v in runs.values() for r in v):.1f}-{max(r['load1'] for v in runs.values() for r in v):.1f}"
    )
    w = max(10, *(len(b) for b in backends))
    print(f"{'backend':<{w}} {'median s':>9} {'min s':>7} {'speed-up':>8}  scores (delta vs {backends[0]})")
    for b in backends:
        med = statistics.median(r["seconds"] for r in runs[b])
        scores = runs[b][0]["scores"]
        deltas = {t: scores[t] - ref[t] for t in scores}
        summary[b] = {
            "median_s": med,
            "min_s": min(r["seconds"] for r in runs[b]),
            "speedup": t_ref / med,
            "scores": scores,
            "delta": deltas,
            "same_to_4_decimals": all(round(scores[t], 4) == round(ref[t], 4) for t in scores),
            "setup_s": setup[b],
        }
        print(
            f"{b:<{w}} {med:>9.1f} {summary[b]['min_s']:>7.1f} {t_ref / med:>7.2f}x  "
            + " ".join(f"{t} {100 * s:.4f} ({100 * deltas[t]:+.4f})" for t, s in scores.items())
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "summary": summary, "torch_threads": torch.get_num_threads()}, f, indent=1)


if __name__ == "__main__":
    main()
