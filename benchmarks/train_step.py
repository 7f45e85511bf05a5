"""Training cost per setting, side by side: peak memory, seconds per step and the loss of a few steps.

Each arm runs in its own child process (a process's peak memory only grows, so arms cannot share
one): ``negsynth.train.train`` for ``--steps`` optimizer steps at ``--batch-size`` rows x (anchor,
positive, ``--negatives`` hard negatives), every text cut to ``--max-length`` tokens, on SciFact-like
rows (claims' titles as anchors, abstracts as positives and negatives; synthetic text without the
data). An arm is settings joined by ``+``:

``base``       the model's defaults (SDPA attention, plain MNRL)
``eager``      eager attention
``gc``         gradient checkpointing
``cachedN``    GradCache (``mini_batch_size = N``: the same loss, N rows' activations at a time)
``mean``, ``ata``   the pooling (ATA: MGH's attention-weighted pooling)

``--model smollm2`` trains the bundled SmolLM2-135M with LoRA and every layer bidirectional (the
decoder recipe). Reported per arm, medians over ``--repeats`` (arms interleaved, order rotated): the
child's peak resident memory, the trainer's seconds per step, the ratio to the first arm, and the
largest difference of a step's loss from the first arm's (GradCache's differs by dropout noise: it draws the masks in another order)::

    python benchmarks/train_step.py --arms base,gc,cached8,gc+cached8 --steps 3        # the memory settings
    python benchmarks/train_step.py --arms mean,ata --steps 6 --batch-size 8 --max-length 64 --negatives 1
    python benchmarks/train_step.py --arms mean,ata --model smollm2 --steps 6 --batch-size 8 --max-length 64 --negatives 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import harness


def settings(arm: str) -> dict:
    """An arm's ``TrainConfig`` keys; an unknown part stops the run in one line."""
    cfg: dict = {}
    for part in arm.split("+"):
        if part == "eager":
            cfg["attn_implementation"] = "eager"
        elif part == "gc":
            cfg["gradient_checkpointing"] = True
        elif part.startswith("cached") and part[6:].isdigit():
            cfg["mini_batch_size"] = int(part[6:])
        elif part in ("mean", "ata"):
            cfg["pooling"] = part
        elif part != "base":
            sys.exit(f"train_step: unknown setting {part!r}; use base, eager, gc, cachedN, mean, ata (joined by +)")
    return cfg


def make_rows(n: int, negatives: int, data: Path | None) -> dict[str, list[str]]:
    """``n`` rows of SciFact titles and abstracts (synthetic ~200-word texts where the data is missing)."""
    need, docs = n * (2 + negatives), []
    corpus = data / "scifact" / "corpus.jsonl" if data else None
    if corpus and corpus.is_file():
        docs = [(d.get("title", ""), d.get("text", "")) for d in harness.read_jsonl(corpus)[:need]]
    if len(docs) < need:
        rnd = random.Random(0)
        vocab = "the of cell protein gene expression patients study cancer risk treatment increased mice levels response human".split()
        docs = [(" ".join(rnd.choices(vocab, k=10)), " ".join(rnd.choices(vocab, k=200))) for _ in range(need)]
    rows: dict[str, list[str]] = {"anchor": [d[0] for d in docs[:n]], "positive": [d[1] for d in docs[:n]]}
    for k in range(negatives):
        rows[f"negative_{k + 1}"] = [docs[n + i * negatives + k][1] for i in range(n)]
    return rows


def child(a) -> None:
    """One arm in this process: ``RESULT {json}`` on stdout."""
    import torch

    from negsynth.train import TrainConfig, train

    torch.set_num_threads(a.threads)
    decoder = {"lora": {"enabled": True}, "bidirectional": "all"} if a.model == "smollm2" else {}
    rows = make_rows(a.batch_size * a.steps, a.negatives, a.data_dir)
    with tempfile.TemporaryDirectory() as out, harness.PeakRSS() as mem:
        cfg = TrainConfig(
            model=a.model,
            batch_size=a.batch_size,
            grad_accum=1,
            max_steps=a.steps,
            max_length=a.max_length,
            output_dir=out,
            save_steps=10_000,
            logging_steps=1,
            warmup_ratio=0.0,
            seed=0,
            **decoder,
            **settings(a.child),
        )
        log = json.loads((Path(train(rows, cfg)) / "train_log.json").read_text())
    end = next(e for e in log["log_history"] if "train_runtime" in e)
    losses = [e["loss"] for e in log["log_history"] if "loss" in e]
    print(
        "RESULT "
        + json.dumps(
            {"peak_rss_mib": mem.peak_mib, "step_s": end["train_runtime"] / a.steps, "losses": losses, "loss_class": log["loss"]["class"]}
        )
    )


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--arms", default="base,gc,cached8,gc+cached8", help="the first is the reference")
    ap.add_argument("--model", default="minilm", help="minilm (the bundled all-MiniLM-L6-v2) or smollm2 (LoRA, bidirectional)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--negatives", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, default=None, help="the shared data (SciFact's abstracts)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a)
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    for arm in arms:
        settings(arm)
    data = a.data_dir or os.environ.get("NEGSYNTH_DATA_DIR") or harness.ROOT.parent / "shared" / "data"
    opts = [
        f"--{k.replace('_', '-')}={v}"
        for k, v in vars(a).items()
        if k in ("model", "steps", "batch_size", "negatives", "max_length", "threads")
    ]
    start = harness.machine()

    def run(arm: str, rep: int) -> dict:
        r = harness.measured_run([sys.executable, __file__, "--child", arm, f"--data-dir={data}", *opts])
        return json.loads(next(x for x in r["stdout"].splitlines() if x.startswith("RESULT "))[7:])

    runs = harness.interleaved(arms, a.repeats, run)
    first = runs[arms[0]][0]["losses"]
    rows = []
    for arm, rs in runs.items():
        diff = max(abs(x - y) for r in rs for x, y in zip(r["losses"], first))
        step = harness.median(rs, "step_s")
        ratio = step / harness.median(runs[arms[0]], "step_s")
        rows.append([arm, rs[0]["loss_class"], max(r["peak_rss_mib"] for r in rs), f"{step:.2f}", f"{ratio:.2f}x", f"{diff:.2e}"])
    print(f"\n{a.model}, batch {a.batch_size} x (2 + {a.negatives}) texts x {a.max_length} tokens, {a.steps} steps, {a.threads} threads\n")
    print(harness.table(["arm", "loss", "peak MiB", "s per step", f"vs {arms[0]}", f"max |loss - {arms[0]}|"], rows))
    print(f"\nload at start {start['load']}, at end {harness.machine()['load']}")
    harness.write_record(a.json, a, start, runs=runs)


if __name__ == "__main__":
    main()
