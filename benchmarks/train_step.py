"""Training-step time of mean vs ATA vs latent pooling on identical batches, and sampler overhead.

One "step" = tokenize + forward of (anchor, positive, negative) + InfoNCE (MNRL, τ=0.02) + backward
+ AdamW step: the work the SentenceTransformerTrainer does per micro-batch, without its logging.
Poolings are timed round-robin (step k of mean, ata, latent, then step k+1 ...) so a load spike on
the shared CPU hits all of them alike; we report the median.

    python benchmarks/train_step.py                    # MiniLM + SmolLM2 (LoRA, bidirectional=all)
    python benchmarks/train_step.py --models minilm --steps 10 --batch-size 16

Goal (MGH: 32.45 h with ATA vs 32.40 h without): ATA <= 1.05 x mean.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def make_batches(n_batches: int, batch_size: int, seed: int = 0):
    import random

    rnd = random.Random(seed)
    vocab = "the of river ancient model learns query passage retrieval negative hard curriculum token anchor attention layer weight mountain city data".split()

    def text(k):
        return " ".join(rnd.choice(vocab) for _ in range(k))

    return [
        (
            [f"Instruct: Retrieve relevant passages\nQuery: {text(12)}" for _ in range(batch_size)],
            [text(40) for _ in range(batch_size)],
            [text(40) for _ in range(batch_size)],
        )
        for _ in range(n_batches)
    ]


def time_model(model_name: str, poolings: list[str], batches, extra: dict, max_length: int) -> dict[str, list[float]]:
    import torch

    from negsynth.train.config import TrainConfig
    from negsynth.train.loss import make_loss
    from negsynth.train.trainer import build_model

    setups = {}
    for p in poolings:
        torch.manual_seed(0)
        cfg = TrainConfig(model=model_name, pooling=p, max_length=max_length, latent_num=512, **extra)
        m = build_model(cfg, device="cpu")
        m.train()
        loss = make_loss(m, cfg.temperature)
        opt = torch.optim.AdamW([q for q in m.parameters() if q.requires_grad], lr=1e-5)
        setups[p] = (m, loss, opt)
    times: dict[str, list[float]] = {p: [] for p in poolings}
    for bi, (a, pos, neg) in enumerate(batches):
        for p, (m, loss, opt) in setups.items():
            t0 = time.perf_counter()
            feats = [m.preprocess(x) for x in (a, pos, neg)]
            value = loss(feats, None)
            value.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            if bi > 0:  # first batch = warm-up
                times[p].append(dt)
    return times


def sampler_overhead(n_rows: int, batch_size: int) -> dict[str, float]:
    import torch
    from torch.utils.data import BatchSampler, RandomSampler

    from negsynth.train.sampler import OrderedBatchSampler, check_batches

    data = range(n_rows)
    out = {}
    t0 = time.perf_counter()
    n = sum(1 for _ in OrderedBatchSampler(data, batch_size=batch_size, drop_last=False))
    out["ordered_iter_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    n2 = sum(1 for _ in BatchSampler(RandomSampler(data, generator=torch.Generator().manual_seed(0)), batch_size, False))
    out["st_default_random_iter_s"] = time.perf_counter() - t0
    assert n == n2
    cols = {c: [f"{c} text {i}" for i in range(n_rows)] for c in ("anchor", "positive", "negative")}
    cols["phase"] = [i * 4 // n_rows for i in range(n_rows)]
    t0 = time.perf_counter()
    check_batches(cols, batch_size)
    out["check_batches_s"] = time.perf_counter() - t0
    out["rows"], out["batches"] = n_rows, n
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="minilm,smollm2")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per pooling (plus one warm-up)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--out", default=None, help="write the JSON results here")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    batches = make_batches(args.steps + 1, args.batch_size)
    results: dict = {
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "steps": args.steps,
        "torch_threads": torch.get_num_threads(),
    }
    for name in args.models.split(","):
        extra = {"lora": {"enabled": True}, "bidirectional": "all"} if name == "smollm2" else {}
        times = time_model(name, ["mean", "ata", "latent"], batches, extra, args.max_length)
        med = {p: statistics.median(v) for p, v in times.items()}
        results[name] = {
            "setup": extra or "full fine-tune",
            "median_step_s": med,
            "ata_over_mean": med["ata"] / med["mean"],
            "latent_over_mean": med["latent"] / med["mean"],
        }
        print(
            f"{name}: "
            + ", ".join(f"{p} {t:.3f}s" for p, t in med.items())
            + f"  ATA/mean {med['ata'] / med['mean']:.3f}  latent/mean {med['latent'] / med['mean']:.3f}",
            flush=True,
        )
    results["sampler"] = sampler_overhead(1_000_000, 64)
    print("sampler:", json.dumps(results["sampler"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
