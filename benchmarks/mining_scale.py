"""Mining at scale: the search over corpora of 10k-1M documents (FAISS vs exact), and ``regenerate``'s
mining on Ray workers against one process.

**Search arms** (what mining does after encoding, as ``sentence_transformers.util.mine_hard_negatives``:
every query scored against the whole corpus, the ``k`` best kept), on synthetic unit vectors
(dimension 384, as MiniLM; each query a corpus row plus noise), every (size, arm, repetition) a
fresh process so its peak memory is its own (``peak MB``: the peak RSS past the built vectors):

``exact``  the library's ``use_faiss=False`` path: torch matmul of a chunk of queries against the
           corpus + ``torch.topk`` (chunks of ~``--chunk-mb`` of scores)
``faiss``  the library's ``use_faiss=True`` path: ``faiss.IndexFlatIP`` (exact inner product)
``ivf``    an approximate ``IndexIVFFlat`` (nlist 4 sqrt(N), ``--nprobe``), k-means included: not what
           the library builds (structureless random vectors are its worst case); recall@k reported

**Mining arms**, ``negsynth regenerate`` with mined negatives (``regenerate.negatives = "mined"``: the
corpus and queries embedded, every query searched) on the first ``--docs`` SciFact abstracts and the
claims (train and test) whose abstract is among them, as a user runs it: ``local`` (one process) and
``rayN`` (``--executor ray --workers N``; the workers inherit this process's CPU affinity). Reported:
the whole command's seconds (the models' load included: the stage records no mining time of its
own), documents per second, and whether every arm wrote the same negatives.

Every arm runs ``--repeats`` times, order rotated; medians, with the machine's load::

    python benchmarks/mining_scale.py                                        # exact vs faiss at 10k and 100k documents
    python benchmarks/mining_scale.py --sizes 10000,100000,1000000 --json out.json
    taskset -c 0,1 python benchmarks/mining_scale.py --arms local,ray1,ray2,ray4 --docs 500
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import harness

SEARCH = ("exact", "faiss", "ivf")


def _rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next((int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":")), float("nan"))


def search(a) -> None:
    """The child: one search of ``a.method`` over ``a.size`` vectors; prints a JSON line, saves the top-k."""
    import numpy as np
    import torch

    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    corpus = np.empty((a.size, a.dim), dtype=np.float32)
    for i in range(0, a.size, 65536):  # in blocks: no full-size temporaries
        block = rng.standard_normal((min(65536, a.size - i), a.dim), dtype=np.float32)
        corpus[i : i + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    queries = corpus[rng.choice(a.size, size=a.queries, replace=False)] + 0.5 * rng.standard_normal(
        (a.queries, a.dim), dtype=np.float32
    ) / np.sqrt(a.dim)
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    base, t0 = _rss_mb("VmRSS"), time.perf_counter()
    if a.method == "exact":
        c, chunk = torch.from_numpy(corpus), max(1, (a.chunk_mb << 20) // (4 * a.size))
        idx = torch.cat(
            [torch.topk(torch.from_numpy(queries[i : i + chunk]) @ c.T, k=a.k, dim=1).indices for i in range(0, a.queries, chunk)]
        ).numpy()
    else:
        import faiss

        faiss.omp_set_num_threads(a.threads)
        index = faiss.IndexFlatIP(a.dim)
        if a.method == "ivf":
            nlist = max(1, int(4 * np.sqrt(a.size)))
            index = faiss.IndexIVFFlat(index, a.dim, nlist, faiss.METRIC_INNER_PRODUCT)
            index.train(corpus[np.random.default_rng(1).choice(a.size, size=min(a.size, 40 * nlist), replace=False)])
            index.nprobe = a.nprobe
        index.add(corpus)
        idx = index.search(queries, a.k)[1]
    secs, peak = time.perf_counter() - t0, _rss_mb("VmHWM") - base
    np.save(a.save, idx.astype(np.int64))
    print(json.dumps({"seconds": secs, "peak_mb": peak, "data_mb": corpus.nbytes / 2**20}))


def search_table(a, arms: list[str], tmp: Path) -> list[dict]:
    import numpy as np

    rows, out = [], []
    for size in a.sizes:

        def run(arm: str, rep: int, size=size) -> dict:
            child = [sys.executable, __file__, "--child", arm, "--size", str(size), "--save", str(tmp / f"{size}-{arm}.npy")]
            opts = [
                "--queries",
                a.queries,
                "--dim",
                a.dim,
                "--k",
                a.k,
                "--threads",
                a.threads,
                "--chunk-mb",
                a.chunk_mb,
                "--nprobe",
                a.nprobe,
            ]
            env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)}
            return json.loads(harness.measured_run([*child, *map(str, opts)], env=env)["stdout"].strip().splitlines()[-1])

        runs = harness.interleaved(["exact", *[m for m in arms if m != "exact"]], a.repeats, run)
        exact = np.load(tmp / f"{size}-exact.npy")
        for arm, rs in runs.items():
            found = np.load(tmp / f"{size}-{arm}.npy")
            recall = sum(len(set(x.tolist()) & set(y.tolist())) for x, y in zip(found, exact)) / exact.size
            med = {k: harness.median(rs, k) for k in ("seconds", "peak_mb")}
            out.append({"size": size, "arm": arm, **med, "recall": recall, "runs": rs})
            ratio = med["seconds"] / harness.median(runs["exact"], "seconds")
            rows.append(
                [
                    f"{size:,}",
                    f"{rs[0]['data_mb']:.0f} MB",
                    arm,
                    f"{med['seconds']:.2f}",
                    f"{ratio:.2f}",
                    f"{med['peak_mb']:.0f}",
                    f"{recall:.4f}",
                ]
            )
    print(f"\n{a.queries} queries, dim {a.dim}, k {a.k}, {a.threads} thread(s), medians of {a.repeats}\n")
    print(harness.table(["docs", "vectors", "arm", "s", "time vs exact", "peak MB", f"recall@{a.k}"], rows))
    return out


def scifact_subset(folder: Path, n_docs: int, dest: Path) -> int:
    """The first ``n_docs`` abstracts and the claims (train and test) citing one of them, as a BEIR
    folder with one ``train`` split; returns the number of pairs."""
    docs = harness.read_jsonl(folder / "corpus.jsonl")[:n_docs]
    ids = {str(d["_id"]) for d in docs}
    queries, rows = {}, []
    for split in (folder, folder / "train"):
        q, _, rs = harness.read_beir(folder / "corpus.jsonl", split / "queries.jsonl", split / "qrels.tsv")
        rows += [(qid, did) for qid, did, g in rs if g > 0 and did in ids and qid in q and (qid, did) not in rows]
        queries |= {qid: q[qid] for qid, _ in rows if qid in q}
    harness.write_jsonl(dest / "corpus.jsonl", docs)
    harness.write_jsonl(dest / "train" / "queries.jsonl", ({"_id": k, "text": v} for k, v in queries.items()))
    (dest / "train" / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in rows))
    return len(rows)


def mining_table(a, arms: list[str], tmp: Path) -> dict:
    pairs = scifact_subset(harness.data_dir(a.data_dir) / "scifact", a.docs, tmp / "subset")
    sets = ["regenerate.negatives=mined", f'regenerate.inputs=[{{path={json.dumps(str(tmp / "subset"))}, split="train"}}]']

    def run(arm: str, rep: int) -> dict:
        rd = tmp / f"mine-{arm}-{rep}"
        ray = ["--executor", "ray", "--workers", arm[3:]] if arm.startswith("ray") else []
        r = harness.measured_run(
            harness.negsynth_cli("regenerate", "-d", str(rd), *ray, *(x for s in sets for x in ("--set", s)), "--quiet", "--json")
        )
        st = json.loads(r.pop("stdout"))
        shards = b"".join(f.read_bytes() for f in sorted((rd / "regenerate").glob("shard-*.jsonl")))
        shutil.rmtree(rd, ignore_errors=True)
        return r | {"pairs": st["pairs"], "docs_s": a.docs / r["wall_s"], "digest": hashlib.sha256(shards).hexdigest()[:16]}

    runs = harness.interleaved(arms, a.repeats, run)
    ref = harness.median(runs[arms[0]], "wall_s")
    same = {arm: {r["digest"] for r in rs} == {runs[arms[0]][0]["digest"]} for arm, rs in runs.items()}
    rows = [
        [
            arm,
            f"{harness.median(rs, 'wall_s'):.1f}",
            f"{harness.median(rs, 'docs_s'):.1f}",
            f"{ref / harness.median(rs, 'wall_s'):.2f}",
            f"{harness.median(rs, 'peak_rss_mb'):.0f}",
            same[arm],
        ]
        for arm, rs in runs.items()
    ]
    print(f"\nregenerate's mining: {a.docs} SciFact abstracts, {pairs} (claim, abstract) pairs, MiniLM on CPU; medians of {a.repeats}\n")
    print(harness.table(["arm", "command s", "docs/s", f"vs {arms[0]}", "peak MB", f"same negatives as {arms[0]}"], rows))
    return {"docs": a.docs, "pairs": pairs, "runs": runs, "same_negatives": same}


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--arms", default="exact,faiss", help="search: exact, faiss, ivf; mining: local, rayN (comma-separated)")
    ap.add_argument("--sizes", type=harness.int_list, default="10000,100000", help="search: corpus sizes")
    ap.add_argument("--queries", type=int, default=1000, help="search: queries")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=100, help="search: candidates kept per query (mining keeps range_max + positives)")
    ap.add_argument("--threads", type=int, default=1, help="search: torch and faiss threads")
    ap.add_argument("--chunk-mb", type=int, default=256, help="search, exact: the score matrix per chunk of queries")
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--docs", type=int, default=2000, help="mining: the first N SciFact abstracts")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", choices=SEARCH, dest="method", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.method:
        return search(a)
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    if bad := [x for x in arms if x not in SEARCH and x != "local" and not re.fullmatch(r"ray\d+", x)]:
        sys.exit(f"mining_scale: unknown arm(s) {bad}; use exact, faiss, ivf, local, rayN")
    start = harness.machine()
    with tempfile.TemporaryDirectory() as td:
        found = {}
        if s := [x for x in arms if x in SEARCH]:
            found["search"] = search_table(a, s, Path(td))
        if m := [x for x in arms if x not in SEARCH]:
            found["mining"] = mining_table(a, m, Path(td))
    print(f"\nload at start {start['load']}, at end {harness.machine()['load']}; {start['cpus']} CPUs")
    harness.write_record(a.json, a, start, **found)


if __name__ == "__main__":
    main()
