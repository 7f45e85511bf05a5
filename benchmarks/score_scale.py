"""``negsynth score`` at scale: time and peak memory on N examples (6 texts each) beside a bare
``SentenceTransformer.encode`` of the same texts, on Ray workers, resumed, and ``negsynth inspect``
of the scored run, each measured in its own process (``/usr/bin/time``: wall, CPU, peak RSS).

Arms (``--arms``), per size of ``--examples``, interleaved over ``--repeats`` (order rotated), medians:

``score``    ``negsynth score -d RUN --quiet --json`` as a user runs it (read shards, embed, measure,
             near-duplicate removal, write shards and stats)
``rayN``     the same with ``--executor ray --workers N``: the embedding on N Ray workers (they inherit
             this process's CPU affinity: N workers on fewer free cores measure the fan-out's overhead)
``bare``     one ``model.encode(texts)`` over every text of the run: what a hand-written script does
``resume``   a scored run's last output shard and ``stats.json`` deleted, then ``score`` again: what a
             resumed score pays (the shard's whole block is embedded again, so the rerun is bit-identical)
``inspect``  ``negsynth inspect RUN --json`` on the scored run (counts, per-level table, flags)

Examples are synthetic, written shard by shard as a ``generate`` stage's output (``--texts distinct``:
real STS-B / SNLI sentences with a running number appended, so all 6 N texts differ and nothing is
saved by deduplication; ``natural``: the same sentences without it, so texts repeat). Decontamination
is off (a fixed cost per run). ``--layers K`` scores with the first K of MiniLM's 6 layers (the
embedding work shrinks ~6/K times, so score's own costs weigh more); ``--set KEY=VALUE`` goes to
every score command (``score.dedup=false``: the scoring work alone)::

    python benchmarks/score_scale.py --examples 2000 --arms score,bare
    python benchmarks/score_scale.py --examples 10000 100000 --layers 1 --repeats 1
    taskset -c 0,1 python benchmarks/score_scale.py --examples 300 --arms score,ray1,ray2 --repeats 3
    python benchmarks/score_scale.py --examples 600 --arms score,resume --set score.block_examples=600
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import harness

SHARD = 1000


def write_run(run: Path, n: int, data: Path, distinct: bool) -> None:
    """``n`` synthetic examples as a ``generate`` stage's shards, ``SHARD`` a shard."""
    sents: list[str] = []
    for name in ("stsb/train.tsv", "snli/triples_test.tsv"):
        with open(data / name, encoding="utf-8", newline="") as f:
            for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                sents += [v for k, v in r.items() if k in ("sentence1", "sentence2", "anchor", "positive", "negative") and v]
    k = 0
    for s in range(0, n, SHARD):
        rows = []
        for i in range(s, min(n, s + SHARD)):
            t = [sents[(k + j * 7919) % len(sents)] + (f" ({k + j})" if distinct else "") for j in range(6)]
            k += 6
            rows.append({"id": f"ex-{i}", "task": "a sts task", "task_type": "sts", "query": t[0], "positive": t[1], "negatives": t[2:]})
        harness.write_jsonl(run / "generate" / f"shard-{s // SHARD:05d}.jsonl", rows)


def truncated_model(layers: int, out: Path) -> str:
    """MiniLM with its first ``layers`` transformer layers, saved to ``out``."""
    m = harness.base_model("cpu")
    enc = m[0].auto_model
    enc.encoder.layer = enc.encoder.layer[:layers]
    enc.config.num_hidden_layers = layers
    m.save(str(out))
    return str(out)


def bare(run: Path, model: str, batch_size: int) -> None:
    """The child: every text of the run's generate shards through one ``encode`` call."""
    from sentence_transformers import SentenceTransformer

    texts = [t for ex in harness.records(run / "generate") for t in (ex["query"], ex["positive"], *ex["negatives"])]
    v = SentenceTransformer(model, device="cpu").encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
    print(json.dumps({"texts": len(texts), "dim": int(v.shape[1])}))


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--examples", type=int, nargs="+", default=[2000])
    ap.add_argument("--arms", default="score,bare", help="score, rayN, bare, resume, inspect (comma-separated; the first the reference)")
    ap.add_argument("--texts", choices=["distinct", "natural"], default="distinct")
    ap.add_argument("--layers", type=int, default=6, help="MiniLM layers to keep (6 = the full model)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE for every score command (repeatable)")
    ap.add_argument("--data-dir", type=Path, default=None, help="the shared data (STS-B and SNLI sentences)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--_bare", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._bare:
        return bare(Path(a._bare[0]), a._bare[1], int(a._bare[2]))
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    if bad := [x for x in arms if x not in ("score", "bare", "resume", "inspect") and not re.fullmatch(r"ray\d+", x)]:
        sys.exit(f"score_scale: unknown arm(s) {bad}; use score, rayN, bare, resume, inspect")
    data, start = harness.data_dir(a.data_dir), harness.machine()
    tmp = Path(tempfile.mkdtemp(prefix="score-scale-"))
    try:
        import negsynth

        model = "default" if a.layers == 6 else truncated_model(a.layers, tmp / f"minilm-l{a.layers}")
        sets = [f"embedder.model={model}", f"embedder.batch_size={a.batch_size}", "score.decontam_sets=[]", *a.sets]
        score = [*(x for s in sets for x in ("--set", s)), "--quiet", "--json"]
        results = []
        for n in a.examples:
            base, scored = tmp / f"base-{n}", tmp / f"scored-{n}"
            write_run(base, n, data, a.texts == "distinct")
            if {"resume", "inspect"} & set(arms):  # one scored run for them, untimed
                shutil.copytree(base, scored)
                harness.measured_run(harness.negsynth_cli("score", "-d", str(scored), *score))

            def run(arm: str, rep: int, n=n, base=base, scored=scored) -> dict:
                rd = tmp / f"run-{n}-{arm}-{rep}"
                shutil.copytree(scored if arm == "resume" else base, rd)
                if arm == "bare":
                    r = harness.measured_run(
                        [sys.executable, __file__, "--_bare", str(base), negsynth.model_path(model), str(a.batch_size)]
                    )
                    r.update(json.loads(r.pop("stdout").strip().splitlines()[-1]))
                elif arm == "inspect":
                    r = harness.measured_run(harness.negsynth_cli("inspect", str(scored), "--json"))
                    r["records"] = json.loads(r.pop("stdout"))["stages"]["score"]["records"]
                else:
                    if arm == "resume":
                        max(rd.glob("score/shard-*.jsonl")).unlink()
                        (rd / "score" / "stats.json").unlink()
                    ray = ["--executor", "ray", "--workers", arm[3:]] if arm.startswith("ray") else []
                    r = harness.measured_run(harness.negsynth_cli("score", "-d", str(rd), *ray, *score))
                    st = json.loads(r.pop("stdout"))
                    r |= {
                        "kept": st.get("kept"),
                        "embed_s": (st.get("throughput") or {}).get("embed_s"),
                        "embedded": (st.get("throughput") or {}).get("examples"),
                    }
                shutil.rmtree(rd, ignore_errors=True)
                return r

            runs = harness.interleaved(arms, a.repeats, run)
            med = {arm: {k: harness.median(rs, k) for k in ("wall_s", "cpu_s", "peak_rss_mb", "embed_s")} for arm, rs in runs.items()}
            results.append({"examples": n, "texts": 6 * n, "median": med, "runs": runs})
            shutil.rmtree(base, ignore_errors=True)
            shutil.rmtree(scored, ignore_errors=True)
        print(
            f"\nMiniLM with {a.layers} of 6 layers, batch {a.batch_size}, CPU; {a.texts} texts; medians of {a.repeats}; {start['cpus']} CPUs\n"
        )
        rows = []
        for r in results:
            for arm, m in r["median"].items():
                ratio = r["median"][arms[0]]["wall_s"] / m["wall_s"]
                embed = "-" if m["embed_s"] is None else f"{m['embed_s']:.1f}"
                rows.append(
                    [
                        r["examples"],
                        arm,
                        f"{m['wall_s']:.1f}",
                        f"{m['cpu_s']:.1f}",
                        embed,
                        f"{r['texts'] / m['wall_s']:.0f}" if arm != "inspect" else "-",
                        f"{m['peak_rss_mb']:.0f}",
                        f"{ratio:.2f}",
                    ]
                )
        print(harness.table(["examples", "arm", "wall s", "CPU s", "embed s", "texts/s", "peak MB", f"speed vs {arms[0]}"], rows))
        print(f"\nload at start {start['load']}, at end {harness.machine()['load']}")
        harness.write_record(a.json, a, start, results=results)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
