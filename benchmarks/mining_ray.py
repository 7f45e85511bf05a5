"""Mining throughput on Ray workers (``--executor ray``) against the one-process path.

    HF_HUB_OFFLINE=1 python benchmarks/mining_ray.py --docs 2000 --repeats 3

What is timed is one call of :func:`negsynth.embed.mining.mine_negatives` (what regenerate's
mining runs; ``mine_graded`` adds only the band picking): the corpus and the queries embedded,
then every query searched over the corpus (exact torch top-k, positive-aware margin), no
embedding cache. Corpus: the first ``--docs`` SciFact abstracts (``title + " " + text``, as
regenerate reads a BEIR corpus); queries: the SciFact claims (train and test qrels) whose relevant
abstract is among them. Model: ``[embedder]``'s default, the bundled all-MiniLM-L6-v2, on CPU.

``local``  the ``SentenceTransformer`` loaded in this process (the one-process path: what
           ``negsynth regenerate`` does without ``--executor``), torch at its default threads;
``rayN``   :class:`~negsynth.pipeline.ray_executor.RaySentenceModel` over N Ray workers (each a
           1-CPU actor holding its own MiniLM, torch at one thread: Ray's default), the search in
           this process.

Every model is made once before the timing (start-up, MiniLM's load included, is reported apart),
then all are timed in turn, ``--repeats`` times, the order rotated each rep; medians are reported
with the load average (``os.getloadavg()``) before, after and at each rep. Throughput = corpus
documents / seconds of the whole call (embedding queries and documents, and the search). Each rep
is refused past ``--max-rep-s``: lower ``--docs`` on a slow machine.

The Ray workers inherit this process's CPU affinity (``taskset``): N workers on fewer free cores
than N share them, which measures the fan-out's overhead, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def scifact(folder: Path, n_docs: int) -> tuple[list[str], dict[str, str], dict[str, list[str]]]:
    """The first ``n_docs`` abstracts, and the claims whose relevant abstract is among them."""
    docs: dict[str, str] = {}
    with open(folder / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            docs[d["_id"]] = f"{(d.get('title') or '').strip()} {d['text']}".strip()
            if len(docs) >= n_docs:
                break
    claims: dict[str, str] = {}
    for path in (folder / "queries.jsonl", folder / "train" / "queries.jsonl"):
        if path.is_file():
            with open(path, encoding="utf-8") as f:
                for line in f:
                    q = json.loads(line)
                    claims.setdefault(q["_id"], q["text"])
    positives: dict[str, list[str]] = {}
    for qrels in (folder / "qrels.tsv", folder / "train" / "qrels.tsv"):
        if not qrels.is_file():
            continue
        for line in qrels.read_text(encoding="utf-8").splitlines()[1:]:
            qid, did, score = line.split("\t")
            if did in docs and qid in claims and int(score) > 0 and docs[did] not in positives.get(qid, []):
                positives.setdefault(qid, []).append(docs[did])
    queries = {q: claims[q] for q in positives}
    return list(docs.values()), queries, positives


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=2000, help="the first N SciFact abstracts")
    ap.add_argument("--workers", default="1,2,4", help="Ray worker counts to time")
    ap.add_argument("--k", type=int, default=4, help="negatives per query")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-rep-s", type=float, default=240.0)
    ap.add_argument("--data", type=Path, default=None, help="the SciFact BEIR folder (default: $NEGSYNTH_DATA_DIR/scifact)")
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    a = ap.parse_args()

    import ray
    import torch

    from negsynth.embed.mining import load_mining_model, mine_negatives
    from negsynth.pipeline.ray_executor import RayEmbedder, RaySentenceModel
    from negsynth.resources import default_data_dir
    from negsynth.schemas.config import EmbedderConfig

    folder = a.data or ((default_data_dir() or Path("/nonexistent")) / "scifact")
    if not (folder / "corpus.jsonl").is_file():
        sys.exit(f"{folder}/corpus.jsonl: not found; pass --data PATH/scifact or set NEGSYNTH_DATA_DIR")
    corpus, queries, positives = scifact(folder, a.docs)
    counts = [int(x) for x in a.workers.split(",") if x]
    cfg = EmbedderConfig(device="cpu", batch_size=a.batch_size)
    load_start = os.getloadavg()
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    # one logical CPU per worker of every proxy: they all stay up side by side (idle ones cost no
    # CPU); the processes run where this one's affinity lets them
    ray.init(num_cpus=sum(counts), include_dashboard=False, log_to_driver=False, configure_logging=False)
    runs: dict[str, list[dict]] = {}
    start_s: dict[str, float] = {}
    try:
        made: dict[str, object] = {}
        t0 = time.perf_counter()
        made["local"] = load_mining_model(cfg)
        start_s["local"] = time.perf_counter() - t0
        for n in counts:
            t0 = time.perf_counter()
            dealer = RayEmbedder.start(cfg, workers=n, raw=True)
            made[f"ray{n}"] = RaySentenceModel(dealer, dealer.info)
            start_s[f"ray{n}"] = time.perf_counter() - t0
        names = list(made)
        runs = {k: [] for k in names}
        found: dict[str, dict] = {}
        for rep in range(a.repeats):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                t0 = time.perf_counter()
                found[name] = mine_negatives(made[name], queries, positives, corpus, a.k, batch_size=a.batch_size, use_faiss=False)
                wall = time.perf_counter() - t0
                runs[name].append({"s": wall, "load1": os.getloadavg()[0]})
                print(
                    f"  rep {rep} {name:6s}: {len(corpus)} docs, {len(queries)} queries in {wall:.1f} s "
                    f"({len(corpus) / wall:.1f} docs/s), load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                if wall > a.max_rep_s:
                    sys.exit(f"a rep took {wall:.0f} s > --max-rep-s {a.max_rep_s:.0f}: lower --docs")
        same = {k: found[k] == found["local"] for k in names}
        for m in made.values():
            if isinstance(m, RaySentenceModel):
                m.dealer.close()
    finally:
        ray.shutdown()
    load_end = os.getloadavg()
    med = {k: statistics.median(r["s"] for r in rs) for k, rs in runs.items()}
    print(
        f"\nMiniLM on CPU, {len(corpus)} SciFact abstracts, {len(queries)} claims, k={a.k}, batch {a.batch_size}; "
        f"medians of {a.repeats}; torch threads here {torch.get_num_threads()}, CPU affinity {affinity}"
    )
    print(
        f"{'model':7s} {'workers':>7s} {'start s':>8s} {'median s':>9s} {'docs/s':>7s} {'/worker':>8s} {'vs local':>9s} {'same negatives':>15s}"
    )
    for k in runs:
        n = int(k[3:]) if k.startswith("ray") else 0
        rate = len(corpus) / med[k]
        print(
            f"{k:7s} {n or '-':>7} {start_s[k]:8.1f} {med[k]:9.2f} {rate:7.1f} {(rate / n if n else rate):8.1f} "
            f"{med['local'] / med[k]:9.2f} {str(same[k]):>15s}"
        )
    print(f"load average (1, 5, 15 min) at start {load_start}, at end {load_end}; {os.cpu_count()} CPUs")
    if a.json_out:
        from _record import write_record

        write_record(
            a.json_out,
            a,
            {"docs": len(corpus), "queries": len(queries), "start_s": start_s, "median_s": med, "runs": runs, "same_negatives": same},
            load_start=load_start,
            load_end=load_end,
            affinity=affinity,
        )


if __name__ == "__main__":
    main()
