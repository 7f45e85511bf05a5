"""A lexical (BM25) index over a corpus and its fusion with dense scores, for hybrid candidates
(``corpus.candidates = "hybrid"``: negatives BM25 finds that the embedder alone ranks low).

:func:`rrf` fuses one query's dense and lexical scores over a whole corpus by reciprocal rank
fusion (Cormack et al. 2009: ``sum 1 / (k + rank)``, ``k = 60``); :class:`LexicalIndex` is
``bm25s`` (English stop words, no stemming), its index saved to a folder and loaded on the next run.

    index = LexicalIndex.build(texts, cache="runs/x/corpus/_index/bm25")
    fused = rrf(dense_scores, index.scores("a query"))
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
        raise UserError("corpus.candidates = 'hybrid' needs bm25s: pip install 'negsynth[embed]' (or pip install bm25s)") from None
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
    from scipy.stats import rankdata

    return rankdata(-np.asarray(scores), method="ordinal")


def rrf(dense, lexical, k: int = RRF_K) -> Any:
    """Reciprocal rank fusion of one query's dense and lexical scores over the same texts. A text
    with no lexical score (no query term in it) gets nothing from the lexical list."""
    import numpy as np

    lexical = np.asarray(lexical)
    fused = 1.0 / (k + ranks(dense))
    return fused + np.where(lexical > 0, 1.0 / (k + ranks(lexical)), 0.0)
