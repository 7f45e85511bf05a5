"""A lexical (BM25) index over a corpus and its fusion with dense scores: a teacher that needs no label.

BM25 ranks above a small dense model on many technical domains, and the two fused by reciprocal
rank fusion (RRF, Cormack et al. 2009: ``sum 1 / (k + rank)``, ``k = 60``, nothing to tune) rank
well above either. :func:`rrf` fuses one query's dense and lexical scores over a whole corpus;
:class:`LexicalIndex` is ``bm25s`` (English stop words, no stemming) over texts read once, its
index saved to a folder and loaded on the next run.

RRF's scores are ranks in disguise: they order candidates but carry no scale a student could
learn from. :func:`minmax_sum` is the teacher's *score* for distillation: each query's dense and
lexical scores min-max normalised over the same texts and summed, in ``[0, 2]`` (the stronger of
the two fusions on the domains measured; RRF stays the ranking and the filter).

    index = LexicalIndex.build(texts, cache="runs/x/corpus/_index/bm25")
    fused = rrf(dense_scores, index.scores("a query"))
    label = minmax_sum(dense_scores, index.scores("a query"))
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from negsynth.errors import UserError

#: RRF's constant (Cormack et al.): the weight of rank r is 1 / (RRF_K + r)
RRF_K = 60


def _bm25s():
    try:
        import bm25s
    except ImportError:
        raise UserError("the hybrid teacher needs bm25s: pip install 'negsynth[embed]' (or pip install bm25s)") from None
    return bm25s


class LexicalIndex:
    """BM25 scores of a query against every text of a corpus (in corpus order)."""

    def __init__(self, retriever: Any):
        self.retriever = retriever

    @classmethod
    def build(cls, texts: Iterable[str], cache: str | Path | None = None) -> LexicalIndex:
        """Index ``texts`` (read once), or load the index saved in ``cache`` by an earlier build."""
        bm25s = _bm25s()
        cache = Path(cache) if cache else None
        if cache is not None and (cache / "done").is_file():
            return cls(bm25s.BM25.load(str(cache)))
        tokens = bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        if cache is not None:
            tmp = cache.with_name(cache.name + ".tmp")
            retriever.save(str(tmp))
            (tmp / "done").write_text("")
            if cache.exists():
                import shutil

                shutil.rmtree(cache)
            tmp.replace(cache)
        return cls(retriever)

    def scores(self, query: str):
        """BM25 score of ``query`` against each text (0 where no query term occurs)."""
        import numpy as np

        tokens = _bm25s().tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        vocab = self.retriever.vocab_dict
        known = [t for t in tokens if t in vocab]
        if not known:
            return np.zeros(self.retriever.scores["num_docs"], dtype=np.float32)
        return np.asarray(self.retriever.get_scores(known), dtype=np.float32)


def ranks(scores) -> Any:
    """1-based rank of each item by descending score, ties broken by position (deterministic)."""
    import numpy as np

    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores)))
    out = np.empty(len(scores), dtype=np.int64)
    out[order] = np.arange(1, len(scores) + 1)
    return out


def rrf(dense, lexical, k: int = RRF_K) -> Any:
    """Reciprocal rank fusion of one query's dense and lexical scores over the same texts. A text
    with no lexical score (no query term in it) gets nothing from the lexical list."""
    import numpy as np

    lexical = np.asarray(lexical)
    fused = 1.0 / (k + ranks(dense))
    return fused + np.where(lexical > 0, 1.0 / (k + ranks(lexical)), 0.0)


def rrf_over(*score_lists, k: int = 60) -> list[float]:
    """Reciprocal rank fusion of several scorings of the same candidates: ``sum 1 / (k + rank)``
    per candidate, rank 1 the best of each list (ties share the better rank). The fusion of the
    lists' orders, not of their scales, so scores of any range combine."""
    n = len(score_lists[0])
    if any(len(s) != n for s in score_lists):
        raise ValueError("rrf_over: every list must score the same candidates")
    fused = [0.0] * n
    for scores in score_lists:
        for i, x in enumerate(scores):
            fused[i] += 1.0 / (k + 1 + sum(y > x for y in scores))
    return fused


def minmax_sum(dense, lexical) -> Any:
    """One query's dense and lexical scores over the same texts, each min-max normalised over
    those texts (the query's whole candidate pool) and summed: in ``[0, 2]``, 2 for a text that
    tops both lists. A list with one value throughout (no query term anywhere) adds 0 to every text."""
    import numpy as np

    def norm(x):
        x = np.asarray(x, dtype=np.float64)
        lo, hi = float(x.min()), float(x.max())
        return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)

    return norm(dense) + norm(lexical)
