"""Peak memory and loss of a few MiniLM training steps per memory setting, side by side.

Each setting runs in its own child process (a process's peak resident memory only grows, so
settings cannot share one): ``make_trainer`` + ``trainer.train()`` for ``--steps`` optimizer steps
at ``--batch-size`` rows x (anchor, positive, ``--negatives`` hard negatives), every text cut to
``--max-length`` tokens, on SciFact-like rows (claims' titles as anchors, SciFact abstracts as
positive and negatives; synthetic text when the data is missing). Reported per setting: peak
RSS of the child (sampled every 50 ms, :class:`negsynth.train.memory.PeakRSS`), seconds, the
loss of every step and its largest difference from the baseline setting.

    python benchmarks/train_memory.py                          # batch 32, 4 negatives x 128 tokens, 3 steps
    python benchmarks/train_memory.py --settings base,gc,cached8 --steps 5 --out train_memory.json
    python benchmarks/train_memory.py --settings base,gc,cached8 --repeats 3   # interleaved; medians

With ``--repeats R`` the settings run in turn R times (base, gc, cached8, base, gc, ...), and the
table reports each setting's median seconds and its ratio to the first setting's median, with the
load average before every child.

Settings: ``eager`` (eager attention), ``base`` (SDPA, plain MNRL: the default before this
benchmark), ``gc`` (gradient checkpointing), ``cachedN`` (CachedMNRL, mini-batch N), ``gc+cachedN``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ["eager", "base", "gc", "cached8", "cached16", "gc+cached8"]


def setting_config(name: str) -> dict:
    cfg: dict = {}
    for part in name.split("+"):
        if part == "eager":
            cfg["attn_implementation"] = "eager"
        elif part == "base":
            pass
        elif part == "gc":
            cfg["gradient_checkpointing"] = True
        elif part.startswith("cached"):
            cfg["mini_batch_size"] = int(part[len("cached") :])
        else:
            raise SystemExit(f"unknown setting {part!r}; use {', '.join(SETTINGS)}")
    return cfg


def make_rows(n: int, negatives: int, data_dir: str | None, seed: int = 0) -> dict[str, list[str]]:
    import random

    rnd = random.Random(seed)
    docs: list[str] = []
    corpus = Path(data_dir or os.environ.get("NEGSYNTH_DATA_DIR") or ROOT.parent / "shared" / "data") / "scifact" / "corpus.jsonl"
    if corpus.is_file():
        with corpus.open(encoding="utf-8") as f:
            for line in f:
                d = json.loads(line)
                docs.append((d.get("title", ""), d.get("text", "")))
                if len(docs) >= n * (2 + negatives):
                    break
    if len(docs) < n * (2 + negatives):  # synthetic: ~200 words each, cut to max_length tokens anyway
        vocab = "the of cell protein gene expression patients study cancer risk treatment increased mice levels response human".split()
        docs = [
            (" ".join(rnd.choice(vocab) for _ in range(10)), " ".join(rnd.choice(vocab) for _ in range(200)))
            for _ in range(n * (2 + negatives))
        ]
    rows: dict[str, list[str]] = {"anchor": [], "positive": [], **{f"negative_{k + 1}": [] for k in range(negatives)}}
    for i in range(n):
        title, text = docs[i]
        rows["anchor"].append(title)
        rows["positive"].append(text)
        for k in range(negatives):
            rows[f"negative_{k + 1}"].append(docs[n + i * negatives + k][1])
    return rows


def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from negsynth.train.config import TrainConfig
    from negsynth.train.memory import PeakRSS
    from negsynth.train.trainer import make_trainer

    rows = make_rows(args.batch_size * args.steps, args.negatives, args.data_dir)
    with tempfile.TemporaryDirectory() as out, PeakRSS() as mem:
        cfg = TrainConfig(
            model="default",
            batch_size=args.batch_size,
            grad_accum=1,
            max_steps=args.steps,
            max_length=args.max_length,
            output_dir=out,
            save_steps=10_000,
            logging_steps=1,
            warmup_ratio=0.0,
            seed=0,
            **setting_config(args.child),
        )
        t0 = time.perf_counter()
        trainer, _ = make_trainer(rows, cfg)
        trainer.train()
        seconds = time.perf_counter() - t0
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    print(
        "RESULT "
        + json.dumps(
            {
                "setting": args.child,
                "peak_rss_mib": mem.peak_mib,
                "seconds": seconds,
                "losses": losses,
                "loss_class": type(trainer.loss).__name__,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--settings", default="base,gc,cached8,gc+cached8")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--negatives", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    results = []
    for rep, s in [(rep, s) for rep in range(args.repeats) for s in args.settings.split(",")]:
        load = os.getloadavg()[0]
        cmd = [sys.executable, __file__, "--child", s] + [
            f"--{k.replace('_', '-')}={v}"
            for k, v in vars(args).items()
            if k not in ("settings", "out", "child", "repeats") and v is not None
        ]
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        }  # this checkout's negsynth
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise SystemExit(f"{s}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        r = json.loads(line[len("RESULT ") :]) | {"load1": round(load, 2), "repeat": rep}
        results.append(r)
        print(
            f"{s:<12} peak {r['peak_rss_mib']:>6} MiB  {r['seconds']:6.1f}s  load {load:4.1f}  {r['loss_class']}  losses "
            + " ".join(f"{x:.4f}" for x in r["losses"]),
            flush=True,
        )
    base = results[0]["losses"]
    for r in results:
        r["max_loss_diff_vs_first"] = max((abs(a - b) for a, b in zip(r["losses"], base)), default=None)
    print(
        f"\nbatch {args.batch_size} x (1 + 1 + {args.negatives}) texts x {args.max_length} tokens, {args.steps} steps, {args.threads} threads"
    )
    import statistics

    names = args.settings.split(",")
    med = {n: statistics.median(r["seconds"] for r in results if r["setting"] == n) for n in names}
    for n in names:
        rs = [r for r in results if r["setting"] == n]
        print(
            f"{n:<12} peak {max(r['peak_rss_mib'] for r in rs):>6} MiB  median {med[n]:6.1f}s ({med[n] / med[names[0]]:.2f}x {names[0]})"
            f"  max |loss - {names[0]}| {max(r['max_loss_diff_vs_first'] for r in rs):.2e}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
