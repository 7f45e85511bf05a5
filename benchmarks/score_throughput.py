"""Throughput of ``negsynth score`` against a bare ``SentenceTransformer.encode`` on the same texts.

    HF_HUB_OFFLINE=1 python benchmarks/score_throughput.py --examples 2000

Synthetic examples with realistic lengths are built from the shared evaluation data
(``../shared/data``): short-long (SciFact claim -> abstract, abstracts cut to ~120 words like
generate's ``max_doc_chars``), sts (STS-B pairs), long-short (AG News text -> topic label, the
labels repeat as they do in real classification data) and short-short (SNLI premise ->
entailed hypothesis, with its contradiction as the hardest negative).

Two scenarios, both timed end to end for ``score`` (read shards, embed, measure, write shards
and stats) and as one ``model.encode(all texts)`` call for the bare baseline (all query,
positive and negative texts in example order, duplicates included, same batch size):

* ``unique``: every text made distinct by a numeric suffix — the overhead of score itself;
* ``natural``: texts as built (labels and shared sentences repeat) — what dedupe buys.

The model is loaded once and shared. Each measurement is repeated ``--repeats`` times,
alternating, and the best time is kept (the CPU is shared).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

AG_LABELS = {"1": "World", "2": "Sports", "3": "Business", "4": "Sci/Tech"}
AG_LABEL_TEXT = {
    "World": "world news and international politics",
    "Sports": "sports news",
    "Business": "business and economy news",
    "Sci/Tech": "science and technology news",
}


def _tsv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _words(s: str, n: int) -> str:
    return " ".join(s.split()[:n])


def build_examples(data: Path, n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    # short-long: SciFact
    corpus = {}
    for line in open(data / "scifact" / "corpus.jsonl", encoding="utf-8"):
        d = json.loads(line)
        corpus[d["_id"]] = _words(d["title"] + ". " + d["text"], 120)
    queries = {json.loads(line)["_id"]: json.loads(line)["text"] for line in open(data / "scifact" / "queries.jsonl", encoding="utf-8")}
    qrels = _tsv(data / "scifact" / "qrels.tsv")
    docs = list(corpus.values())
    sl = [(queries[r["query-id"]], corpus[r["corpus-id"]]) for r in qrels if r["query-id"] in queries and r["corpus-id"] in corpus]
    # sts: STS-B high-score pairs
    sts_rows = [r for r in _tsv(data / "stsb" / "train.tsv") if float(r["score"]) >= 3.5]
    sents = [r["sentence1"] for r in _tsv(data / "stsb" / "train.tsv")]
    # long-short: AG News
    ag = _tsv(data / "ag_news" / "test.tsv")
    # short-short: SNLI triples
    snli = _tsv(data / "snli" / "triples_test.tsv")
    snli_h = [r["positive"] for r in snli]
    mix = ["short-long"] * 40 + ["long-short"] * 29 + ["sts"] * 24 + ["long-long"] * 4 + ["short-short"] * 3
    for i in range(n):
        tt = mix[i % len(mix)]
        if tt in ("short-long", "long-long"):
            q, p = sl[rng.randrange(len(sl))]
            if tt == "long-long":
                q = docs[rng.randrange(len(docs))]
            negs = rng.sample(docs, 4)
        elif tt == "long-short":
            r = ag[rng.randrange(len(ag))]
            lab = AG_LABELS.get(str(r.get("label")), str(r.get("label")))
            q, p = r["text"], AG_LABEL_TEXT.get(lab, lab)
            negs = [v for v in AG_LABEL_TEXT.values() if v != p][:3] + ["general news"]
        elif tt == "sts":
            r = sts_rows[rng.randrange(len(sts_rows))]
            q, p = r["sentence1"], r["sentence2"]
            negs = rng.sample(sents, 4)
        else:
            r = snli[rng.randrange(len(snli))]
            q, p = r["anchor"], r["positive"]
            negs = [r["negative"]] + rng.sample(snli_h, 3)
        out.append({"id": f"ex-{i}", "task": f"a {tt} task", "task_type": tt, "query": q, "positive": p, "negatives": negs})
    return out


def make_unique(examples: list[dict]) -> list[dict]:
    k = 0
    out = []
    for ex in examples:
        ex = dict(ex)
        for key in ("query", "positive"):
            ex[key] = f"{ex[key]} ({k})"
            k += 1
        ex["negatives"] = []
        for neg in examples[len(out)]["negatives"]:
            ex["negatives"].append(f"{neg} ({k})")
            k += 1
        out.append(ex)
    return out


def all_texts(examples: list[dict]) -> list[str]:
    return [t for ex in examples for t in (ex["query"], ex["positive"], *ex["negatives"])]


def time_bare(model, examples, batch_size: int) -> float:
    texts = all_texts(examples)
    t0 = time.perf_counter()
    model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    return time.perf_counter() - t0


def time_score(emb, examples, shard_size: int) -> tuple[float, dict]:
    from negsynth.data.shards import write_jsonl
    from negsynth.pipeline.context import StageContext
    from negsynth.pipeline.progress import Reporter
    from negsynth.schemas.config import RunConfig
    from negsynth.stages import score

    d = Path(tempfile.mkdtemp(prefix="score-bench-"))
    try:
        for s in range(0, len(examples), shard_size):
            write_jsonl(d / "generate" / f"shard-{s // shard_size:05d}.jsonl", examples[s : s + shard_size])
        cfg = RunConfig()
        # the scoring work only: near-duplicate removal and decontamination against the local
        # evaluation sets are separate passes (on by default in the pipeline) that bare encode lacks
        cfg.score.dedup = False
        cfg.score.decontam_sets = []
        ctx = StageContext(cfg=cfg, run_dir=d, reporter=Reporter(quiet=True), embedder=emb)
        t0 = time.perf_counter()
        stats = score.run(ctx)
        return time.perf_counter() - t0, stats
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--shard-size", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()

    import torch

    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.resources import default_data_dir

    data = args.data or default_data_dir()
    if data is None:
        sys.exit("no data dir: pass --data ../shared/data or set NEGSYNTH_DATA_DIR")
    emb = SentenceTransformerEmbedder.load("default", batch_size=args.batch_size)
    model = emb.model
    natural = build_examples(data, args.examples)
    scenarios = {"unique": make_unique(natural), "natural": natural}
    model.encode(all_texts(natural[:64]), batch_size=args.batch_size)  # warm-up
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {emb.device}, batch {args.batch_size}, {args.examples} examples"
    )
    results = {}
    for name, exs in scenarios.items():
        texts = all_texts(exs)
        best_bare, best_score, stats = float("inf"), float("inf"), None
        for _ in range(args.repeats):
            best_bare = min(best_bare, time_bare(model, exs, args.batch_size))
            t, st = time_score(emb, exs, args.shard_size)
            if t < best_score:
                best_score, stats = t, st
        r = {
            "examples": len(exs),
            "texts": len(texts),
            "unique_texts": len(set(texts)),
            "bare_s": round(best_bare, 2),
            "score_s": round(best_score, 2),
            "bare_examples_per_s": round(len(exs) / best_bare, 1),
            "score_examples_per_s": round(len(exs) / best_score, 1),
            "ratio": round(best_bare / best_score, 3),
            "score_embed_s": stats["throughput"]["embed_s"],
        }
        results[name] = r
        print(
            f"{name:8s} texts {r['texts']} (unique {r['unique_texts']}): bare encode {r['bare_examples_per_s']} ex/s ({r['bare_s']} s), "
            f"score {r['score_examples_per_s']} ex/s ({r['score_s']} s, embed {r['score_embed_s']} s)  ratio {r['ratio']:.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
