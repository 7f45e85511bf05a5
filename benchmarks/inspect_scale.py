"""``negsynth inspect`` on large runs: time and peak memory, each run in its own process.

    python benchmarks/inspect_scale.py --rows 100000 1000000

Builds a run dir per size with ``generate`` and ``score`` stage folders of N example records each
(10,000 per shard, written shard by shard): texts of generate's length (a ~60-character query,
~300-character positive and negatives), the score block a real run writes (cosines, Kendall τ,
flags, the LLM's order, policy), stats.json files. Scores are drawn from a seeded RNG, so the
per-level table has real work to do. Then times, in a fresh process each (``/usr/bin/time`` for
the peak resident memory):

``report``  ``negsynth inspect RUN --json`` (every stage's counts, reject reasons, task types, the
            per-level table, flags, Kendall τ);
``sample``  ``negsynth inspect RUN --json --sample 5 --flag false_negative --task-type short-long``
            (a filtered selection, five examples' texts read back).

``--repeats`` runs each (default 3), medians. The run dirs are removed afterwards (1M rows take
~3.5 GB on disk).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _child import measured_run  # benchmarks/ is on sys.path when a script runs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARD = 10_000
TYPES = ["short-long", "long-short", "long-long", "short-short", "sts"]
WORDS = "vaccine immune cell protein gene model data network energy market policy climate river city history music".split()


def text(rng: random.Random, chars: int, i: int) -> str:
    out, n = [], 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return f"{' '.join(out)} {i}"


def record(i: int, rng: random.Random, scored: bool) -> dict:
    tt = TYPES[i % len(TYPES)]
    r = {
        "id": f"ex-{i:08d}",
        "task_id": f"task-{i % 5000:05d}",
        "task": f"Given a {tt} query, retrieve the matching document ({i % 5000})",
        "task_type": tt,
        "attributes": {"query_length": "less than 5 words", "difficulty": "college"},
        "query": text(rng, 60, i),
        "positive": text(rng, 300, i),
        "negatives": [text(rng, 300, i) for _ in range(4)],
        "model": "bench",
        "usage": {"prompt_tokens": 1000, "completion_tokens": 240, "attempts": 1},
        "source": "generate",
        "source_id": None,
        "mined_negatives": [],
        "meta": {},
    }
    if scored:
        cos_pos = rng.uniform(0.3, 0.9)
        cos_neg = sorted((rng.uniform(0.0, 0.95) for _ in range(4)), reverse=rng.random() < 0.6)
        order = list(range(4))
        rng.shuffle(order)
        conc = sum((cos_neg[a] > cos_neg[b]) - (cos_neg[a] < cos_neg[b]) for a in range(4) for b in range(a + 1, 4))
        r["score"] = {
            "embedder": "st:bench",
            "cos_pos": round(cos_pos, 6),
            "cos_neg": [round(c, 6) for c in cos_neg],
            "kendall_tau": round(conc / 6, 6),
            "monotonic": conc == 6,
            "false_negative": [c > 0.95 * cos_pos for c in cos_neg],
            "too_easy": [c < 0.1 for c in cos_neg],
            "policy": "measured",
            "llm_order": order,
        }
    return r


def build(run: Path, rows: int) -> None:
    from negsynth.data.shards import write_jsonl

    for stage, scored in (("generate", False), ("score", True)):
        rng = random.Random(0)
        d = run / stage
        for s in range(0, rows, SHARD):
            n = min(SHARD, rows - s)
            write_jsonl(d / f"shard-{s // SHARD:05d}.jsonl", [record(i, rng, scored) for i in range(s, s + n)])
        shards = (rows + SHARD - 1) // SHARD
        stats = {
            "stage": stage,
            "items": rows,
            "valid": rows,
            "rejected": 0,
            "rejects_by_reason": {},
            "shards_done": shards,
            "shards_total": shards,
            "complete": True,
            "tokens": {"prompt": 1000 * rows, "completion": 240 * rows},
            "wall_time_s": 1.0,
        }
        (d / "stats.json").write_text(json.dumps(stats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to build the runs (default: a temp folder)")
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="inspect-scale-", dir=a.dir))
    results = []
    try:
        for n in a.rows:
            run = tmp / f"run-{n}"
            t0 = time.perf_counter()
            build(run, n)
            size = sum(p.stat().st_size for p in run.rglob("*.jsonl")) / 2**30
            print(f"built {n:,} rows x 2 stages ({size:.2f} GiB) in {time.perf_counter() - t0:.0f} s", flush=True)
            cli = [sys.executable, "-m", "negsynth.cli", "inspect", str(run), "--json"]
            runs: dict[str, list[dict]] = {"report": [], "sample": []}
            for rep in range(a.repeats):
                for name, extra in (("report", []), ("sample", ["--sample", "5", "--flag", "false_negative", "--task-type", "short-long"])):
                    r = measured_run(cli + extra, ROOT)
                    rep_json = json.loads(r.pop("stdout"))
                    if name == "report":
                        assert rep_json["stages"]["score"]["records"] == n, rep_json["stages"]["score"]
                    else:
                        assert len(rep_json["samples"]) == 5
                    runs[name].append(r)
                    print(
                        f"  {n:,} rows rep {rep} {name}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, {r['peak_rss_mb']:.0f} MB peak",
                        flush=True,
                    )
            shutil.rmtree(run, ignore_errors=True)
            med = {k: {m: statistics.median(x[m] for x in v) for m in ("wall_s", "cpu_s", "peak_rss_mb")} for k, v in runs.items()}
            results.append({"rows": n, "gib": round(size, 2), "median": med, "runs": runs})
        print(f"\nmedians of {a.repeats}; load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")
        print(
            f"{'rows':>10s} {'GiB':>5s} | {'report s':>9s} {'CPU s':>6s} {'peak MB':>8s} | {'sample s':>9s} {'CPU s':>6s} {'peak MB':>8s}"
        )
        for r in results:
            a1, b1 = r["median"]["report"], r["median"]["sample"]
            print(
                f"{r['rows']:10,d} {r['gib']:5.2f} | {a1['wall_s']:9.1f} {a1['cpu_s']:6.1f} {a1['peak_rss_mb']:8.0f} | {b1['wall_s']:9.1f} {b1['cpu_s']:6.1f} {b1['peak_rss_mb']:8.0f}"
            )
        if a.json_out:
            a.json_out.write_text(json.dumps({"rows": a.rows, "results": results}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
