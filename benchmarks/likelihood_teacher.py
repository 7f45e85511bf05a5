"""Is the embedded LLM's query likelihood a teacher? Re-rank the student's candidates on dev data.

A teacher for data without labels must rank better than the student it teaches, or distilling it
teaches the student its mistakes. This measures UPR-style query likelihood (``log p(query |
document)`` from the embedded SmolLM2-135M, :class:`negsynth.embed.likelihood.QueryLikelihood`)
as a re-ranker of the base embedder's top ``--k`` candidates, beside the teacher negsynth already
has (the hybrid: BM25 and the embedder fused by reciprocal rank, :mod:`negsynth.embed.lexical`):

=================  ==============================================================================
order              what ranks the top-k candidates
=================  ==============================================================================
dense              the base embedder (all-MiniLM-L6-v2): the student before training
hybrid             RRF of dense and BM25 (``corpus.teacher = "hybrid"``), over the whole corpus
likelihood         the LLM's mean log p(query | document) per query token
dense+likelihood   RRF of dense and likelihood (k = 60)
hybrid+likelihood  RRF of the hybrid and likelihood
=================  ==============================================================================

Data: **dev only** — SciFact's *train* claims (``DATA/scifact/train``; never the test claims),
a seeded sample of ``--queries`` against all 5,183 abstracts; or any BEIR folder with
``--dataset`` (e.g. Cranfield's one query set). nDCG@10 over the re-ranked list (the documents
below ``--k`` keep the dense order), mean over queries ×100, per-query paired test against dense.
Also: how often each order puts a judged document above all of the 4 hardest unjudged candidates
(the teacher's veto in the corpus stage: a candidate ranked above the document is no negative).

    python benchmarks/likelihood_teacher.py --queries 200 --k 20 --out runs/lik
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def ndcg_at_10(order: list[str], rel: dict[str, float]) -> float:
    """nDCG@10 of a ranking of the whole corpus, as :mod:`negsynth.evaluate.metrics` computes it
    (``sklearn.metrics.ndcg_score``, linear gains): the position is the score."""
    from sklearn.metrics import ndcg_score

    gains = np.array([[rel.get(d, 0.0) for d in order]])
    return float(ndcg_score(gains, np.arange(len(order), 0, -1, dtype=np.float64)[None, :], k=10))


def rrf_order(*orders: list[str], k: int = 60) -> list[str]:
    score: dict[str, float] = {}
    for order in orders:
        for r, d in enumerate(order, 1):
            score[d] = score.get(d, 0.0) + 1.0 / (k + r)
    return sorted(score, key=lambda d: (-score[d], orders[0].index(d)))


def main() -> None:
    from negsynth.resources import default_data_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", type=Path, default=None, help="BEIR folder (default: DATA/scifact/train, the dev claims)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=20, help="candidates re-ranked per query")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-doc-tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path("runs/likelihood-teacher"))
    args = ap.parse_args()

    from negsynth.data.readers import read_beir
    from negsynth.embed.lexical import LexicalIndex, rrf
    from negsynth.embed.likelihood import QueryLikelihood
    from negsynth.evaluate.stats import paired_test

    folder = args.dataset or default_data_dir() / "scifact" / "train"
    queries, corpus, qrels = read_beir(folder)
    qids = sorted(queries)
    random.Random(args.seed).shuffle(qids)
    qids = qids[: args.queries]
    dids = list(corpus)
    args.out.mkdir(parents=True, exist_ok=True)

    from negsynth.embed.models import load_sentence_transformer

    model = load_sentence_transformer("default", device="cpu")
    cache = args.out / f"corpus-{folder.parent.name}-{len(dids)}.npy"
    if cache.exists():
        doc_emb = np.load(cache)
    else:
        doc_emb = model.encode([corpus[d] for d in dids], batch_size=64, normalize_embeddings=True, show_progress_bar=True)
        np.save(cache, doc_emb)
    q_emb = model.encode([queries[q] for q in qids], normalize_embeddings=True)
    bm25 = LexicalIndex.build([corpus[d] for d in dids])
    lm = QueryLikelihood.load(max_doc_tokens=args.max_doc_tokens)

    orders = ("dense", "hybrid", "likelihood", "dense+likelihood", "hybrid+likelihood")
    per_query: dict[str, list[float]] = {o: [] for o in orders}
    veto: dict[str, list[int]] = {o: [] for o in orders}
    t0 = time.time()
    for n, (qid, qe) in enumerate(zip(qids, q_emb, strict=True), 1):
        sims = doc_emb @ qe
        dense_full = [dids[i] for i in np.argsort(-sims, kind="stable")]
        lex = bm25.scores(queries[qid])
        fused = rrf(sims, lex)
        hybrid_full = [dids[i] for i in np.argsort(-fused, kind="stable")]
        top = dense_full[: args.k]
        lik = lm.scores(queries[qid], [corpus[d] for d in top])
        lik_order = [d for _, d in sorted(zip(lik, top, strict=True), key=lambda x: -x[0])]
        hybrid_top = [d for d in hybrid_full if d in set(top)]
        ranked = {
            "dense": top,
            "hybrid": hybrid_top,
            "likelihood": lik_order,
            "dense+likelihood": rrf_order(top, lik_order),
            "hybrid+likelihood": rrf_order(hybrid_top, lik_order),
        }
        rel = qrels[qid]
        judged_in_top = [d for d in top if d in rel]
        hard = [d for d in top if d not in rel][:4]
        for o in orders:
            per_query[o].append(ndcg_at_10(ranked[o] + dense_full[args.k :], rel))
            if judged_in_top and len(hard) == 4:
                pos = {d: i for i, d in enumerate(ranked[o])}
                veto[o].append(int(min(pos[d] for d in judged_in_top) < min(pos[d] for d in hard)))
        if n % 20 == 0:
            rate = n / (time.time() - t0)
            print(f"{n}/{len(qids)} queries, {rate:.2f}/s, ETA {(len(qids) - n) / rate:.0f} s", file=sys.stderr)
    base = np.array(per_query["dense"])
    rows = []
    for o in orders:
        a = np.array(per_query[o])
        test = paired_test(a, base, n_resamples=10000, seed=0) if o != "dense" else None
        rows.append(
            {
                "order": o,
                "ndcg@10": round(100 * a.mean(), 2),
                "vs_dense": None
                if test is None
                else {"mean": test["mean_diff"], "ci_low": test["ci_low"], "ci_high": test["ci_high"], "p": test["p_value"]},
                "judged_above_4_hardest": round(float(np.mean(veto[o])), 3) if veto[o] else None,
                "veto_queries": len(veto[o]),
            }
        )
    res = {
        "data": str(folder),
        "queries": len(qids),
        "k": args.k,
        "seed": args.seed,
        "max_doc_tokens": args.max_doc_tokens,
        "seconds": round(time.time() - t0, 1),
        "rows": rows,
    }
    (args.out / f"results-{folder.parent.name}-{folder.name}-q{len(qids)}-k{args.k}-seed{args.seed}.json").write_text(
        json.dumps(res, indent=1)
    )
    print(f"{folder}: {len(qids)} queries, top {args.k} re-ranked, {res['seconds']} s")
    print(f"{'order':<20} {'nDCG@10':>8} {'vs dense':>24} {'judged>4 hardest':>17}")
    for r in rows:
        vs = r["vs_dense"]
        vs_s = f"{100 * vs['mean']:+.2f} [{100 * vs['ci_low']:+.2f},{100 * vs['ci_high']:+.2f}] p{vs['p']:.3f}" if vs else "-"
        print(
            f"{r['order']:<20} {r['ndcg@10']:>8.2f} {vs_s:>24} {r['judged_above_4_hardest'] if r['judged_above_4_hardest'] is not None else '-':>17}"
        )


if __name__ == "__main__":
    main()
