"""score's embedding throughput on Ray workers (``--executor ray``) against the one-process path.

    HF_HUB_OFFLINE=1 python benchmarks/score_ray.py --examples 500 --repeats 3

What is timed is score's own embedding of one block (:func:`negsynth.stages.score.embedding.embed_block`:
the distinct texts sorted by length, cut into parts of ``8 x batch_size``), texts per second of
distinct texts, with these embedders:

``local``  MiniLM loaded in this process (the one-process path, what ``negsynth score`` does);
``rayN``   :class:`~negsynth.pipeline.ray_executor.RayEmbedder` over N Ray workers, for each N of
           ``--workers`` (default 1,2; each part goes whole to the next free worker).

Each embedder is made once, before the timing (a worker's start, MiniLM's load included, is
reported apart); then all are timed in turn, ``--repeats`` times, interleaved, and medians
are reported with the load average (``os.getloadavg()``) before and after. Examples are synthetic:
6 distinct texts each (STS-B / SNLI sentences with a running number), as in ``score_scale.py``.
Each rep is refused past ``--max-rep-s`` (60 s): lower ``--examples`` on a slow machine.

The Ray workers inherit this process's CPU affinity: run under ``taskset -c 0`` and both workers
share core 0, which measures the fan-out's overhead, not a speed-up.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sentences(data: Path) -> list[str]:
    out: list[str] = []
    for name in ("stsb/train.tsv", "snli/triples_test.tsv"):
        p = data / name
        if not p.is_file():
            continue
        with open(p, encoding="utf-8", newline="") as f:
            for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                out += [v for k, v in r.items() if k in ("sentence1", "sentence2", "anchor", "positive", "negative") and v]
    return out


def examples(n: int, sents: list[str]) -> list[dict]:
    m, rows = len(sents), []
    for i in range(n):
        t = [f"{sents[(6 * i + j) * 7919 % m]} ({6 * i + j})" for j in range(6)]
        rows.append({"id": f"ex-{i}", "task": "a sts task", "task_type": "sts", "query": t[0], "positive": t[1], "negatives": t[2:]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=500, help="6 distinct texts each")
    ap.add_argument("--workers", default="1,2", help="Ray worker counts to time (e.g. 1,2,4)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-rep-s", type=float, default=60.0)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    a = ap.parse_args()

    import ray
    import torch

    from negsynth.embed import load_embedder
    from negsynth.pipeline.progress import Reporter
    from negsynth.pipeline.ray_executor import RayEmbedder
    from negsynth.resources import default_data_dir
    from negsynth.schemas.config import EmbedderConfig
    from negsynth.stages.score.embedding import embed_block

    data = a.data or default_data_dir()
    if data is None:
        sys.exit("no data dir: pass --data ../shared/data or set NEGSYNTH_DATA_DIR")
    rows = examples(a.examples, sentences(data))
    cfg = EmbedderConfig(device="cpu", batch_size=a.batch_size)
    quiet = Reporter(quiet=True)
    load_start = os.getloadavg()
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    counts = [int(x) for x in a.workers.split(",") if x]
    # one logical CPU per worker of every embedder: they all stay up side by side (each worker
    # takes one); the processes run where this one's affinity lets them
    ray.init(num_cpus=sum(counts), include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        made, start_s = {}, {}
        t0 = time.perf_counter()
        made["local"] = load_embedder(cfg)
        start_s["local"] = time.perf_counter() - t0
        for n in counts:
            t0 = time.perf_counter()
            made[f"ray{n}"] = RayEmbedder.start(cfg, workers=n)
            start_s[f"ray{n}"] = time.perf_counter() - t0
        runs: dict[str, list[dict]] = {k: [] for k in made}
        for rep in range(a.repeats):
            for name, emb in made.items():
                t0 = time.perf_counter()
                _, _, info = embed_block(emb, rows, batch_size=a.batch_size, reporter=quiet, label=name)
                wall = time.perf_counter() - t0
                runs[name].append({"embed_s": info["embed_s"], "unique_texts": info["unique_texts"], "load1": os.getloadavg()[0]})
                print(
                    f"  rep {rep} {name:5s}: {info['unique_texts']} texts in {info['embed_s']:.1f} s "
                    f"({info['unique_texts'] / info['embed_s']:.0f} texts/s), load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                if wall > a.max_rep_s:
                    sys.exit(f"a rep took {wall:.0f} s > --max-rep-s {a.max_rep_s:.0f}: lower --examples")
        for emb in made.values():
            if isinstance(emb, RayEmbedder):
                emb.close()
    finally:
        ray.shutdown()
    load_end = os.getloadavg()
    texts = runs["local"][0]["unique_texts"]
    med = {k: statistics.median(r["embed_s"] for r in rs) for k, rs in runs.items()}
    print(
        f"\nMiniLM on CPU, {texts} distinct texts ({a.examples} examples), batch {a.batch_size}, parts of {8 * a.batch_size} texts; "
        f"medians of {a.repeats}; torch threads here {torch.get_num_threads()}, CPU affinity {affinity}"
    )
    print(f"{'embedder':8s} {'start s':>8s} {'median s':>9s} {'texts/s':>8s} {'vs local':>9s}")
    for k in runs:
        print(f"{k:8s} {start_s[k]:8.1f} {med[k]:9.2f} {texts / med[k]:8.0f} {med['local'] / med[k]:9.2f}")
    print(f"load average (1, 5, 15 min) at start {load_start}, at end {load_end}; {os.cpu_count()} CPUs")
    if a.json_out:
        from _record import write_record

        write_record(
            a.json_out,
            a,
            {"texts": texts, "start_s": start_s, "median_s": med, "runs": runs},
            load_start=load_start,
            load_end=load_end,
            affinity=affinity,
        )


if __name__ == "__main__":
    main()
