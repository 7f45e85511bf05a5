"""``negsynth score`` at scale: time and peak memory on N examples (6 texts each) beside a bare
``SentenceTransformer.encode`` of the same texts, each measured in its own process.

    HF_HUB_OFFLINE=1 python benchmarks/score_scale.py --examples 100000 --layers 1
    HF_HUB_OFFLINE=1 python benchmarks/score_scale.py --examples 2000 4000 8000    # full MiniLM

Examples are synthetic and written shard by shard (never all in memory): queries, positives and
negatives are real sentences from the shared data (STS-B, SNLI) with a running number appended,
so every one of the 6 N texts is distinct — nothing is saved by deduplication, every example is
kept, and near-duplicate removal (on, threshold 0.95, as by default) has to hold or spill the
vectors of all of them. Decontamination is off (it is a fixed cost per run, not per example).

Drivers, each a fresh process (``/usr/bin/time`` gives its peak resident memory):

``score``  ``negsynth score -d RUN --quiet --json`` as a user runs it (read shards, embed, measure,
           near-duplicate removal, write shards and stats);
``bare``   one ``model.encode(texts)`` over every text of the run, read from the same shards — what a
           hand-written script does (it holds all texts and all vectors).

``--layers K`` scores with the first K of MiniLM's 6 transformer layers (a copy saved in a temp
folder): the embedding work shrinks ~6/K times, so score's own costs (I/O, measuring, dedup,
memory) weigh more, and 600k texts fit in minutes on a laptop CPU. Runs alternate score / bare,
``--repeats`` times (default 2); medians.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _child import measured_run  # benchmarks/ is on sys.path when a script runs

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARD = 1000


def sentences(data: Path) -> list[str]:
    out: list[str] = []
    for name in ("stsb/train.tsv", "snli/triples_test.tsv"):
        with open(data / name, encoding="utf-8", newline="") as f:
            for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                out += [v for k, v in r.items() if k in ("sentence1", "sentence2", "anchor", "positive", "negative") and v]
    return out


def write_run(run: Path, n: int, data: Path) -> None:
    from negsynth.data.shards import write_jsonl

    sents = sentences(data)
    m = len(sents)
    k = 0
    for s in range(0, n, SHARD):
        rows = []
        for i in range(s, min(n, s + SHARD)):
            t = [f"{sents[(k + j * 7919) % m]} ({k + j})" for j in range(6)]
            k += 6
            rows.append({"id": f"ex-{i}", "task": "a sts task", "task_type": "sts", "query": t[0], "positive": t[1], "negatives": t[2:]})
        write_jsonl(run / "generate" / f"shard-{s // SHARD:05d}.jsonl", rows)


def truncated_model(layers: int, out: Path) -> str:
    from sentence_transformers import SentenceTransformer

    from negsynth.resources import minilm_path

    m = SentenceTransformer(str(minilm_path()), device="cpu")
    enc = m[0].auto_model
    enc.encoder.layer = enc.encoder.layer[:layers]
    enc.config.num_hidden_layers = layers
    m.save(str(out))
    return str(out)


def bare(run: Path, model: str, batch_size: int) -> None:
    """The child: every text of the run's generate shards through one ``encode`` call."""
    from sentence_transformers import SentenceTransformer

    texts = []
    for p in sorted((run / "generate").glob("shard-*.jsonl")):
        for line in open(p, encoding="utf-8"):
            ex = json.loads(line)
            texts += [ex["query"], ex["positive"], *ex["negatives"]]
    m = SentenceTransformer(model, device="cpu")
    v = m.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    print(json.dumps({"texts": len(texts), "dim": int(v.shape[1])}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, nargs="+", default=[2000])
    ap.add_argument("--layers", type=int, default=6, help="MiniLM layers to keep (6 = the full model)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    ap.add_argument("--_bare", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._bare:
        return bare(Path(a._bare[0]), a._bare[1], int(a._bare[2]))

    from negsynth.resources import default_data_dir, minilm_path

    data = a.data or default_data_dir()
    if data is None:
        sys.exit("no data dir: pass --data ../shared/data or set NEGSYNTH_DATA_DIR")
    tmp = Path(tempfile.mkdtemp(prefix="score-scale-"))
    results = []
    try:
        model = "default" if a.layers == 6 else truncated_model(a.layers, tmp / f"minilm-l{a.layers}")
        st_model = model if model != "default" else str(minilm_path())
        load = os.getloadavg()
        for n in a.examples:
            base = tmp / f"base-{n}"
            write_run(base, n, data)
            runs: dict[str, list[dict]] = {"score": [], "bare": []}
            for rep in range(a.repeats):
                rd = tmp / f"run-{n}-{rep}"
                shutil.copytree(base, rd)
                cmd = [
                    sys.executable,
                    "-m",
                    "negsynth.cli",
                    "score",
                    "-d",
                    str(rd),
                    "--quiet",
                    "--json",
                    "--set",
                    f"embedder.model={model}",
                    "--set",
                    f"embedder.batch_size={a.batch_size}",
                    "--set",
                    "score.decontam_sets=[]",
                ]
                r = measured_run(cmd, ROOT)
                st = json.loads(r.pop("stdout"))
                r["kept"] = st.get("valid", st.get("kept"))
                runs["score"].append(r)
                shutil.rmtree(rd, ignore_errors=True)
                r = measured_run([sys.executable, str(Path(__file__).resolve()), "--_bare", str(base), st_model, str(a.batch_size)], ROOT)
                r.update(json.loads(r.pop("stdout").strip().splitlines()[-1]))
                runs["bare"].append(r)
                print(
                    f"  n={n} rep {rep}: score {runs['score'][-1]['wall_s']:.1f} s {runs['score'][-1]['peak_rss_mb']:.0f} MB | "
                    f"bare {r['wall_s']:.1f} s {r['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
            shutil.rmtree(base, ignore_errors=True)
            med = {d: {k: statistics.median(x[k] for x in rs) for k in ("wall_s", "cpu_s", "peak_rss_mb")} for d, rs in runs.items()}
            results.append({"examples": n, "texts": 6 * n, "median": med, "runs": runs})
        end = os.getloadavg()
        print(
            f"\nMiniLM with {a.layers} of 6 layers, batch {a.batch_size}, CPU; medians of {a.repeats}; texts = 6 x examples, all distinct"
        )
        print(
            f"{'examples':>9s} {'texts':>8s} | {'score s':>8s} {'texts/s':>8s} {'peak MB':>8s} | {'bare s':>8s} {'texts/s':>8s} {'peak MB':>8s} | {'bare/score':>10s}"
        )
        for r in results:
            s, b = r["median"]["score"], r["median"]["bare"]
            print(
                f"{r['examples']:9d} {r['texts']:8d} | {s['wall_s']:8.1f} {r['texts'] / s['wall_s']:8.0f} {s['peak_rss_mb']:8.0f} | "
                f"{b['wall_s']:8.1f} {r['texts'] / b['wall_s']:8.0f} {b['peak_rss_mb']:8.0f} | {b['wall_s'] / s['wall_s']:10.2f}"
            )
        print(f"load average at start {load[0]:.2f}, at end {end[0]:.2f}; {os.cpu_count()} CPUs")
        if a.json_out:
            a.json_out.write_text(
                json.dumps(
                    {"args": {k: str(v) for k, v in vars(a).items()}, "results": results, "load_start": load, "load_end": end}, indent=1
                )
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
