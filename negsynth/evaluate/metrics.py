"""Metrics on L2-normalised embeddings (a row-wise dot product is the cosine), by library
functions, on a 0-1 scale: STS Spearman (scipy, MTEB's ``cosine_spearman``); Pair AP (scikit-learn,
``cosine_ap``); retrieval by exact dense search, nDCG@10 with graded gains (``ndcg_score``, ties
averaged as trec_eval) and MRR@10 / Recall@100 from sentence-transformers'
``InformationRetrievalEvaluator``; classification by logistic regression (train/test, else
stratified 5-fold CV); clustering by k-means V-measure over 3 seeds (full k-means where MTEB uses
mini-batches: affordable on these sets).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two equally long sets of L2-normalised vectors."""
    return np.einsum("ij,ij->i", a, b).astype(np.float64)


def sts_scores(e1: np.ndarray, e2: np.ndarray, gold: Sequence[float]) -> dict[str, float]:
    from scipy.stats import pearsonr, spearmanr

    cos = cosine_rows(e1, e2)
    gold = np.asarray(gold, dtype=np.float64)
    return {"spearman": float(spearmanr(cos, gold).statistic), "pearson": float(pearsonr(cos, gold).statistic)}


def pair_scores(e1: np.ndarray, e2: np.ndarray, labels: Sequence[int]) -> dict[str, float]:
    from sklearn.metrics import average_precision_score, roc_auc_score

    cos = cosine_rows(e1, e2)
    y = np.asarray(labels, dtype=np.int64)
    return {"ap": float(average_precision_score(y, cos)), "auc": float(roc_auc_score(y, cos))}


def triplet_scores(ea: np.ndarray, ep: np.ndarray, en: np.ndarray) -> dict[str, float]:
    """Share of triplets with cos(anchor, positive) > cos(anchor, negative) (ties count as wrong)."""
    pos, neg = cosine_rows(ea, ep), cosine_rows(ea, en)
    return {"accuracy": float(np.mean(pos > neg)), "margin": float(np.mean(pos - neg))}


def retrieval_scores(
    q_emb: np.ndarray,
    d_emb: np.ndarray,
    qids: Sequence[str],
    dids: Sequence[str],
    qrels: dict[str, dict[str, float]],
    *,
    ndcg_k: int = 10,
    mrr_k: int = 10,
    recall_k: int = 100,
    query_chunk: int = 256,
    per_query: bool = False,
) -> dict:
    """Exact dense search of every query against the whole corpus, then nDCG / MRR / Recall.

    Memory is ``query_chunk x len(corpus)`` floats at a time. Only queries with at least one
    relevant (gain > 0) document count, as in BEIR / MTEB. ``per_query``: also return
    ``"per_query": {query id: nDCG@k}`` (:func:`negsynth.evaluate.paired_test` needs it;
    the mean of these is the ``ndcg@k`` returned).
    """
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
    from sklearn.metrics import ndcg_score

    qids = [str(q) for q in qids]
    dids = [str(d) for d in dids]
    keep = [i for i, q in enumerate(qids) if any(g > 0 for g in qrels.get(q, {}).values())]
    if not keep:
        raise ValueError("retrieval: no query has a relevant document (gain > 0) in qrels")
    q_emb = np.asarray(q_emb, dtype=np.float32)[keep]
    qids = [qids[i] for i in keep]
    d_emb = np.asarray(d_emb, dtype=np.float32)
    pos = {d: j for j, d in enumerate(dids)}
    top = min(max(mrr_k, recall_k, ndcg_k), len(dids))

    ndcg_q: list[float] = []
    results: list[list[dict]] = []
    for s in range(0, len(qids), query_chunk):
        scores = q_emb[s : s + query_chunk] @ d_emb.T  # [chunk, n_docs]
        gains = np.zeros_like(scores, dtype=np.float64)
        for r, q in enumerate(qids[s : s + query_chunk]):
            for d, g in qrels[q].items():
                if g > 0 and d in pos:
                    gains[r, pos[d]] = g
        if len(dids) > 1:  # one row at a time: the per-query values (ties averaged, as in the batch call)
            s64 = scores.astype(np.float64)
            ndcg_q += [float(ndcg_score(gains[r : r + 1], s64[r : r + 1], k=ndcg_k)) for r in range(len(scores))]
        else:  # sklearn needs >1 document; one document is trivially ranked first
            ndcg_q += [float(g > 0) for g in gains[:, 0]]
        idx = np.argpartition(-scores, top - 1, axis=1)[:, :top] if top < len(dids) else np.tile(np.arange(len(dids)), (len(scores), 1))
        for r in range(len(scores)):
            results.append([{"corpus_id": dids[j], "score": float(scores[r, j])} for j in idx[r]])

    relevant = {q: {d for d, g in qrels[q].items() if g > 0} for q in qids}
    ir = InformationRetrievalEvaluator(
        queries={q: "" for q in qids},
        corpus={d: "" for d in dids},
        relevant_docs=relevant,
        mrr_at_k=[mrr_k],
        ndcg_at_k=[ndcg_k],
        accuracy_at_k=[1],
        precision_recall_at_k=[recall_k],
        map_at_k=[recall_k],
        write_csv=False,
    )
    m = ir.compute_metrics(results)
    out: dict = {
        f"ndcg@{ndcg_k}": float(np.mean(ndcg_q)),
        f"mrr@{mrr_k}": float(m["mrr@k"][mrr_k]),
        f"recall@{recall_k}": float(m["recall@k"][recall_k]),
        "queries": len(qids),
        "corpus": len(dids),
    }
    if per_query:
        out["per_query"] = dict(zip(qids, ndcg_q))
    return out


def classification_scores(
    x_train: np.ndarray | None,
    y_train: Sequence[str] | None,
    x_test: np.ndarray,
    y_test: Sequence[str],
    *,
    folds: int = 5,
    seed: int = 0,
) -> dict[str, float]:
    """Logistic regression on embeddings: train/test when a train split is given, else
    stratified ``folds``-fold CV (shuffled with ``seed``) on the test split, mean over folds."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score
    from sklearn.model_selection import StratifiedKFold, cross_validate

    def clf():
        return LogisticRegression(max_iter=1000, random_state=seed)

    if x_train is not None:
        model = clf().fit(x_train, list(y_train))
        pred = model.predict(x_test)
        return {"accuracy": float(accuracy_score(y_test, pred)), "f1_macro": float(f1_score(y_test, pred, average="macro"))}
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    res = cross_validate(clf(), x_test, list(y_test), cv=cv, scoring=("accuracy", "f1_macro"))
    return {"accuracy": float(np.mean(res["test_accuracy"])), "f1_macro": float(np.mean(res["test_f1_macro"])), "folds": folds}


def clustering_scores(x: np.ndarray, labels: Sequence[str], *, seeds: Sequence[int] = (0, 1, 2)) -> dict[str, float]:
    """V-measure of KMeans(k = #labels), mean and std over ``seeds``."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import v_measure_score

    k = len(set(labels))
    vals = []
    for s in seeds:
        km = KMeans(n_clusters=k, n_init=3, random_state=s)
        vals.append(v_measure_score(list(labels), km.fit_predict(x)))
    return {"v_measure": float(np.mean(vals)), "v_measure_std": float(np.std(vals)), "k": k}
