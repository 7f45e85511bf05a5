"""How close evaluation on this CPU already is to what float32 arithmetic allows.

An exact backend (the same vectors to ~1e-7, so the same scores) does the same float32
arithmetic as torch; it can only be faster by wasting less. This script states the waste:

1. the texts the evaluation embeds (recorded through the real embedder with its encoder swapped
   for a stub, so exactly the distinct texts, instructions and order ``evaluate`` sends), cut into
   batches as sentence-transformers does (sorted by length, ``--batch-size`` per batch, each padded
   to its longest text, at most ``max_seq_length`` tokens);
2. the floating-point work of one MiniLM-style encoder forward over those batches, counted from
   the model's config: the linear layers (4 h² + 2 h·ffn multiply-adds per token and layer) and
   attention (2 L h per token and layer), 2 FLOPs a multiply-add;
3. this machine's float32 matmul rate at the encoder's own shapes (a (B·L) x h by h x ffn GEMM, the
   bulk of the work), through torch with ``--threads`` threads: the best the arithmetic can go;
4. with ``--time``, the real encoder over the same texts (``--reps`` times, median), and the rate
   it reached.

    python benchmarks/eval_roofline.py --tasks SciFact,STSBenchmark,TRECClustering --suite full --time

The floor (work / matmul rate) is what no exact float32 backend can beat on this machine; the
ratio measured / floor bounds the speed-up left to an exact one. Only lower precision (bf16,
int8) does less work per FLOP's worth of result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def record_texts(emb, suite: str, tasks: list[str], data_dir: str | None) -> list[list[str]]:
    """The calls ``evaluate`` makes to the encoder, each as its list of (formatted) texts."""
    from negsynth.evaluate import evaluate

    calls: list[list[str]] = []
    real = emb._encode

    def stub(texts, *, batch_size=None, show_progress=False):
        import numpy as np

        calls.append(list(texts))
        return np.random.default_rng(len(calls)).standard_normal((len(texts), emb.dim)).astype(np.float32)

    emb._encode = stub
    try:
        evaluate(emb, suite=suite, data_dir=data_dir, tasks=tasks, progress=False, announce=False)
    finally:
        emb._encode = real
    return calls


def batch_shapes(tokenizer, calls: list[list[str]], batch_size: int, max_len: int) -> list[tuple[int, int, int]]:
    """(rows, padded length, real tokens) per batch, batched as ``SentenceTransformer.encode``
    does: each call's distinct texts sorted by character length, longest first."""
    out = []
    for texts in calls:
        texts = list(dict.fromkeys(texts))
        order = sorted(texts, key=lambda t: -len(t))
        for i in range(0, len(order), batch_size):
            chunk = order[i : i + batch_size]
            lens = [len(ids) for ids in tokenizer(chunk, truncation=True, max_length=max_len)["input_ids"]]
            out.append((len(chunk), max(lens), sum(lens)))
    return out


def forward_flops(shapes, hidden: int, ffn: int, layers: int) -> dict[str, float]:
    lin = att = 0.0
    for rows, length, _ in shapes:
        tokens = rows * length
        lin += 2 * tokens * layers * (4 * hidden * hidden + 2 * hidden * ffn)
        att += 2 * tokens * layers * (2 * length * hidden)
    return {"linear": lin, "attention": att, "total": lin + att}


def matmul_rate(rows: int, hidden: int, ffn: int, threads: int, seconds: float = 3.0) -> float:
    """float32 GFLOP/s of a (rows x hidden) @ (hidden x ffn) GEMM, best of runs over ``seconds``."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(rows, hidden), torch.randn(hidden, ffn)
    for _ in range(3):
        a @ b
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        for _ in range(5):
            a @ b
        best = min(best, (time.perf_counter() - t0) / 5)
    return 2 * rows * hidden * ffn / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="SciFact,STSBenchmark,TRECClustering")
    ap.add_argument("--suite", default="full", choices=["quick", "full"])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--time", action="store_true", help="also time the real torch encoder over the same texts")
    ap.add_argument("--reps", type=int, default=1, help="with --time: encoder runs (median)")
    ap.add_argument("--out", default=None, help="write the JSON results here")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from negsynth.embed.st import SentenceTransformerEmbedder

    emb = SentenceTransformerEmbedder.load("default", device="cpu", batch_size=a.batch_size)
    st = emb.model
    conf = st[0].auto_model.config
    hidden, ffn, layers = conf.hidden_size, conf.intermediate_size, conf.num_hidden_layers
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    calls = record_texts(emb, a.suite, tasks, a.data_dir)
    shapes = batch_shapes(st.tokenizer, calls, a.batch_size, st.max_seq_length)
    fl = forward_flops(shapes, hidden, ffn, layers)
    texts = sum(r for r, _, _ in shapes)
    padded = sum(r * length for r, length, _ in shapes)
    real = sum(t for _, _, t in shapes)
    rows = a.batch_size * max(1, round(statistics.median(length for _, length, _ in shapes)))
    rate = matmul_rate(rows, hidden, ffn, a.threads)
    floor_s = fl["total"] / (rate * 1e9)
    res = {
        "tasks": tasks,
        "suite": a.suite,
        "threads": a.threads,
        "load1_before": round(os.getloadavg()[0], 2),
        "texts": texts,
        "batches": len(shapes),
        "tokens_real": real,
        "tokens_padded": padded,
        "gflop": {k: round(v / 1e9, 1) for k, v in fl.items()},
        "matmul_gflops": round(rate, 1),
        "floor_s": round(floor_s, 1),
    }
    print(
        f"{a.suite} {','.join(tasks)}: {texts:,} distinct texts in {len(shapes):,} batches of {a.batch_size}; "
        f"{real:,} tokens ({padded:,} padded, {padded / real - 1:.1%} padding)"
    )
    print(f"work: {res['gflop']['total']:,.0f} GFLOP ({res['gflop']['linear']:,.0f} linear, {res['gflop']['attention']:,.0f} attention)")
    print(f"float32 matmul, {rows} x {hidden} @ {hidden} x {ffn}, {a.threads} threads: {rate:.1f} GFLOP/s -> floor {floor_s:.1f} s")
    if a.time:
        times = []
        for _ in range(a.reps):
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            for texts_ in calls:
                emb._encode(texts_, batch_size=a.batch_size, show_progress=False)
            times.append(time.perf_counter() - t0)
            print(f"torch encoder: {times[-1]:.1f} s (load {load:.1f})", flush=True)
        med = statistics.median(times)
        res.update(encode_s=[round(t, 1) for t in times], encode_median_s=round(med, 1))
        res["reached_gflops"] = round(fl["total"] / med / 1e9, 1)
        res["fraction_of_matmul_rate"] = round(floor_s / med, 3)
        print(
            f"torch encoder median {med:.1f} s = {res['reached_gflops']:.1f} GFLOP/s, {floor_s / med:.0%} of the matmul rate: "
            f"an exact float32 backend can be at most {med / floor_s:.2f}x faster here"
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
