"""Mining search at corpus scale: FAISS vs exact torch top-k, on precomputed synthetic embeddings.

What negsynth's mining does after encoding (``sentence_transformers.util.mine_hard_negatives``):
score every query against the whole corpus and keep the ``k`` best per query. Two ways:

* ``exact``   — the library's ``use_faiss=False`` path: torch matmul of a chunk of queries against
  the corpus + ``torch.topk`` (chunks bounded to ~256 MB of scores, see ``--chunk-mb``);
* ``faiss``   — the library's ``use_faiss=True`` path: ``faiss.IndexFlatIP`` (exact inner product,
  BLAS + a heap), index build included;
* ``ivf``     — an approximate ``IndexIVFFlat`` (nlist = 4·√N, nprobe = ``--nprobe``), k-means
  training included: not what the library builds; opt-in (``--methods exact,faiss,ivf``) to show
  the recall/time trade-off (structureless random vectors are its worst case).

No model: corpus vectors are random normal rows normalised to unit length (dimension 384, as
MiniLM); each query is a corpus row plus noise, so every query has a near "positive". Every
(size, method, repetition) runs in a fresh subprocess, so its peak memory is its own: ``peak MB``
is the process's peak RSS (VmHWM) minus its RSS once the embeddings were built, i.e. what the
search itself adds. Recall@k: share of the exact top-k found by the method (first repetition).

    python benchmarks/mining_scale.py                      # 10k and 100k docs, 3 reps, ~2-4 min on one core
    python benchmarks/mining_scale.py --large              # + 1M docs (~1.5 GB of vectors; several minutes)
    python benchmarks/mining_scale.py --sizes 20000 --reps 1 --methods exact,faiss,ivf --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METHODS = ("exact", "faiss", "ivf")


def _rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make_data(n_docs: int, n_queries: int, dim: int, seed: int = 0):
    """Unit-norm float32 corpus [n_docs, dim] (built in chunks: no full-size temporaries) and
    queries = corpus rows + noise, renormalised."""
    import numpy as np

    rng = np.random.default_rng(seed)
    corpus = np.empty((n_docs, dim), dtype=np.float32)
    step = 65536
    for i in range(0, n_docs, step):
        block = rng.standard_normal((min(step, n_docs - i), dim), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        corpus[i : i + len(block)] = block
    rows = rng.choice(n_docs, size=n_queries, replace=False)
    queries = corpus[rows] + 0.5 * rng.standard_normal((n_queries, dim), dtype=np.float32) / np.sqrt(dim)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return corpus, queries.astype(np.float32)


def search_exact(corpus, queries, k: int, chunk_mb: int):
    import numpy as np
    import torch

    c = torch.from_numpy(corpus)
    q = torch.from_numpy(queries)
    chunk = max(1, (chunk_mb << 20) // (4 * len(corpus)))
    idx = []
    for i in range(0, len(q), chunk):
        scores = q[i : i + chunk] @ c.T
        idx.append(torch.topk(scores, k=k, dim=1).indices)
        del scores
    return torch.cat(idx).numpy().astype(np.int64)


def search_faiss(corpus, queries, k: int):
    import faiss

    index = faiss.IndexFlatIP(corpus.shape[1])
    index.add(corpus)
    return index.search(queries, k)[1]


def search_ivf(corpus, queries, k: int, nprobe: int):
    import faiss
    import numpy as np

    n, d = corpus.shape
    nlist = max(1, int(4 * np.sqrt(n)))
    quant = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFFlat(quant, d, nlist, faiss.METRIC_INNER_PRODUCT)
    train = corpus[np.random.default_rng(1).choice(n, size=min(n, 40 * nlist), replace=False)]
    index.train(train)
    index.add(corpus)
    index.nprobe = nprobe
    return index.search(queries, k)[1]


def child(args) -> None:
    """One measurement in this process: prints a JSON line, saves the top-k indices if asked."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    try:
        import faiss

        faiss.omp_set_num_threads(args.threads)
    except ImportError:
        if args.method != "exact":
            raise
    corpus, queries = make_data(args.size, args.queries, args.dim)
    base = _rss_mb("VmRSS")
    t0 = time.perf_counter()
    if args.method == "exact":
        idx = search_exact(corpus, queries, args.k, args.chunk_mb)
    elif args.method == "faiss":
        idx = search_faiss(corpus, queries, args.k)
    else:
        idx = search_ivf(corpus, queries, args.k, args.nprobe)
    secs = time.perf_counter() - t0
    peak = _rss_mb("VmHWM") - base
    if args.save:
        np.save(args.save, idx)
    print(json.dumps({"size": args.size, "method": args.method, "seconds": secs, "peak_mb": peak, "data_mb": corpus.nbytes / 2**20}))


def recall_at_k(found, exact) -> float:
    return sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(found, exact)) / exact.size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="corpus sizes, comma-separated")
    ap.add_argument("--large", action="store_true", help="add the 1,000,000-document corpus")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=100, help="candidates kept per query (mining keeps range_max + positives)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--methods",
        default="exact,faiss",
        help="exact, faiss, ivf (ivf: approximate, opt-in; near-useless recall on structureless random vectors)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch and faiss threads (same for both)")
    ap.add_argument("--chunk-mb", type=int, default=256, help="exact search: score matrix per query chunk")
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--json", type=Path, default=None)
    # internal: one measurement
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--method", help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    import numpy as np

    sizes = [int(s) for s in args.sizes.split(",") if s] + ([1_000_000] if args.large else [])
    methods = [m for m in args.methods.split(",") if m]
    if "exact" not in methods:
        methods.insert(0, "exact")  # the reference for recall and the ratios
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            row = {"size": size}
            for method in methods:
                runs = []
                for rep in range(args.reps):
                    save = str(Path(tmp) / f"{size}-{method}.npy") if rep == 0 else None
                    cmd = [
                        sys.executable,
                        __file__,
                        "--child",
                        "--size",
                        str(size),
                        "--method",
                        method,
                        "--queries",
                        str(args.queries),
                        "--dim",
                        str(args.dim),
                        "--k",
                        str(args.k),
                        "--threads",
                        str(args.threads),
                        "--chunk-mb",
                        str(args.chunk_mb),
                        "--nprobe",
                        str(args.nprobe),
                    ] + (["--save", save] if save else [])
                    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
                    if out.returncode:
                        raise SystemExit(
                            f"{method} at {size}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
                        )
                    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                row[method] = {
                    "seconds_median": statistics.median(r["seconds"] for r in runs),
                    "seconds": [round(r["seconds"], 3) for r in runs],
                    "peak_mb_median": statistics.median(r["peak_mb"] for r in runs),
                }
                row["data_mb"] = runs[0]["data_mb"]
                exact = np.load(Path(tmp) / f"{size}-exact.npy")
                row[method]["recall_at_k"] = recall_at_k(np.load(Path(tmp) / f"{size}-{method}.npy"), exact)
                print(
                    f"  {size:>9,} docs  {method:<5}  {row[method]['seconds_median']:8.2f} s  peak +{row[method]['peak_mb_median']:7.0f} MB  recall@{args.k} {row[method]['recall_at_k']:.4f}",
                    file=sys.stderr,
                )
            results.append(row)

    print(
        f"\n{args.queries} queries, dim {args.dim}, k {args.k}, {args.threads} thread(s), median of {args.reps}; load average {os.getloadavg()[0]:.1f}\n"
    )
    head = "| docs | vectors | " + " | ".join(f"{m} s" for m in methods) + " | " + " | ".join(f"{m}/exact time" for m in methods[1:])
    head += " | " + " | ".join(f"{m} peak MB" for m in methods) + " | " + " | ".join(f"{m} recall@{args.k}" for m in methods[1:]) + " |"
    print(head)
    print("|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|")
    for r in results:
        cells = [f"{r['size']:,}", f"{r['data_mb']:.0f} MB"]
        cells += [f"{r[m]['seconds_median']:.2f}" for m in methods]
        cells += [f"{r[m]['seconds_median'] / r['exact']['seconds_median']:.2f}" for m in methods[1:]]
        cells += [f"{r[m]['peak_mb_median']:.0f}" for m in methods]
        cells += [f"{r[m]['recall_at_k']:.4f}" for m in methods[1:]]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: v for k, v in vars(args).items() if k not in ("child", "size", "method", "save", "json")},
                    "load_average": os.getloadavg(),
                    "results": results,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
