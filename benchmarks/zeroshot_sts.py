"""Zero-shot STS with SmolLM2-135M: classical pooling vs PromptEOL, echo, ReBA and EmbedFilter.

For every STS test set in the shared data folder (stsb, sts12-16, sickr; TSV with a header
``sentence1\\tsentence2\\tscore``) a fixed random subsample of ``--max-pairs`` pairs is embedded
with each method; the score is the Spearman correlation (x100) between the cosine of the two
embeddings and the gold score, per set and averaged. Throughput is texts/s of the forward pass
behind each row.

Methods sharing a forward pass are computed from one pass (mean+last; echo-mean, echo-last and
EmbedFilter-on-echo; PromptEOL and EmbedFilter-on-PromptEOL; ReBA mean/last), so rows that share a
pass report the same throughput. Prints a markdown table (and optionally writes it / JSON).

    python benchmarks/zeroshot_sts.py --max-pairs 100 --out-md /tmp/zs.md
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

SETS = ["stsb", "sts12", "sts13", "sts14", "sts15", "sts16", "sickr"]


def load_sts(data_dir: Path, name: str, max_pairs: int | None, seed: int) -> tuple[list[str], list[str], np.ndarray]:
    """Read ``<data_dir>/<name>/test.tsv`` -> (sentences1, sentences2, gold), subsampled with ``seed``."""
    path = data_dir / name / "test.tsv"
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader)
        if header[:3] != ["sentence1", "sentence2", "score"]:
            raise ValueError(f"{path}: unexpected header {header}")
        rows = [r for r in reader if len(r) >= 3]
    if max_pairs and len(rows) > max_pairs:
        idx = np.sort(np.random.default_rng(seed).choice(len(rows), max_pairs, replace=False))
        rows = [rows[i] for i in idx]
    return [r[0] for r in rows], [r[1] for r in rows], np.array([float(r[2]) for r in rows])


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).correlation)


def cosines(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    u = u / np.linalg.norm(u, axis=1, keepdims=True)
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    return (u * v).sum(1)


def main(argv: list[str] | None = None) -> dict:
    from negsynth.resources import default_data_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=None, help="folder with stsb/, sts12/ ... (default: negsynth.resources.default_data_dir())")
    ap.add_argument("--model", default="default", help="decoder model folder (default: bundled SmolLM2-135M-Instruct)")
    ap.add_argument("--max-pairs", type=int, default=200, help="pairs per set (random, fixed seed); 0 = all")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=128, help="tokens per copy of a text")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = leave)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--groups", default="plain,prompteol,echo,reba", help="which forward passes to run")
    ap.add_argument("--out-md", type=Path, default=None)
    ap.add_argument("--out-json", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import torch

    from negsynth.embed.decoder import DecoderEmbedder
    from negsynth.embed.hf import load_decoder

    if args.threads:
        torch.set_num_threads(args.threads)
    data_dir = args.data_dir or default_data_dir()
    if data_dir is None:
        raise SystemExit("no data folder: pass --data-dir or set NEGSYNTH_DATA_DIR")
    sets = [s for s in args.sets.split(",") if s]
    data = {s: load_sts(Path(data_dir), s, args.max_pairs or None, args.seed) for s in sets}
    texts = sorted({t for s1, s2, _ in data.values() for t in s1 + s2})
    pos = {t: i for i, t in enumerate(texts)}
    log.info("%d sets, %d pairs, %d unique texts", len(sets), sum(len(g) for *_, g in data.values()), len(texts))

    model, tok = load_decoder(args.model, causal_lm=True, attn_implementation="eager")
    common = dict(max_length=args.max_length, batch_size=args.batch_size, model_name=args.model)

    def emb(method, **kw):
        return DecoderEmbedder(model, tok, method=method, **common, **kw)

    # group -> (embedder running the pass, [(row label, pooling, projector or None)])
    groups = {
        "plain": (emb("mean"), [("mean", "mean", None), ("last", "last", None)]),
        "prompteol": (emb("prompteol"), [("prompteol (last)", "last", None)]
                      + [(f"embedfilter τ={t} on prompteol", "last", emb("embedfilter", base="prompteol", filter_ratio=t)) for t in (2, 4)]),
        "echo": (emb("echo"), [("echo-mean", "mean", None), ("echo-last", "last", None)]
                 + [(f"embedfilter τ={t} on echo-mean", "mean", emb("embedfilter", base="echo", filter_ratio=t)) for t in (2, 4)]),
        "reba": (emb("reba", repeat=2), [("reba2-mean", "mean", None), ("reba2-last (paper e_n)", "last:paper", None),
                                         ("reba2-last (code: final row)", "last:code", None)]),
    }
    results = []
    for g in args.groups.split(","):
        e, rows = groups[g]
        if e.method != "reba":  # eager attention costs time; only ReBA reads the probabilities
            model.set_attn_implementation("sdpa")
        else:
            model.set_attn_implementation("eager")
        poolings = sorted({p for _, p, _ in rows})
        t0 = time.perf_counter()
        raw = e.encode_raw(texts, poolings)
        dt = time.perf_counter() - t0
        tput = len(texts) / dt
        n_tok = sum(len(e.tokenize(t).ids) for t in texts) / len(texts)
        log.info("%s: %.1f texts/s, %.0f tokens/text", g, tput, n_tok)
        for label, p, proj in rows:
            vecs = proj.project(raw[p]) if proj is not None else raw[p]
            per = {}
            for s, (s1, s2, gold) in data.items():
                cs = cosines(vecs[[pos[t] for t in s1]], vecs[[pos[t] for t in s2]])
                per[s] = 100 * spearman(cs, gold)
            results.append({"method": label, "dim": vecs.shape[1], "per_set": per, "avg": float(np.mean(list(per.values()))),
                            "texts_per_s": tput, "tokens_per_text": n_tok})

    head = "| method | dim | " + " | ".join(sets) + " | avg | texts/s | tok/text |"
    lines = [head, "|" + "---|" * (len(sets) + 5)]
    for r in results:
        cells = " | ".join(f"{r['per_set'][s]:.1f}" for s in sets)
        lines.append(f"| {r['method']} | {r['dim']} | {cells} | **{r['avg']:.1f}** | {r['texts_per_s']:.1f} | {r['tokens_per_text']:.0f} |")
    table = "\n".join(lines)
    meta = (f"SmolLM2-135M-Instruct ({args.model}), Spearman x100 of cosine vs gold, {args.max_pairs or 'all'} random pairs per set "
            f"(seed {args.seed}), {len(texts)} unique texts, max {args.max_length} tokens per copy, torch threads {torch.get_num_threads()}.")
    print(meta)
    print(table)
    if args.out_md:
        args.out_md.write_text(meta + "\n\n" + table + "\n")
    if args.out_json:
        args.out_json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return {"meta": meta, "results": results}


if __name__ == "__main__":
    main()
