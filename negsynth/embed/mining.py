"""Hard-negative mining over a corpus, positive-aware as ``mine_hard_negatives`` is (every known
positive of a query excluded; candidates within ``relative_margin`` of the positive's score dropped
as likely false negatives, NV-Retriever's TopK-PercPos):

* :func:`mine_negatives` — the ``k`` hardest survivors per query, through the library itself;
* :class:`CorpusIndex` — the same rule for one query at a time over a corpus embedded once (the
  corpus stage), streamed from disk when it is too large to hold.

``use_faiss=None`` searches with FAISS (the library's exact ``IndexFlatIP``) from
``faiss_threshold`` texts (100,000), with torch below it or when faiss is not installed
(docs/scale.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from negsynth.data.text import text_key

log = logging.getLogger(__name__)

#: corpus size (texts) from which ``use_faiss=None`` searches with FAISS
FAISS_THRESHOLD = 100_000


def load_mining_model(cfg):
    """A raw ``SentenceTransformer`` for mining (``[embedder]``, an
    :class:`~negsynth.schemas.config.EmbedderConfig`; ``default`` = the bundled all-MiniLM-L6-v2)."""
    check_mining_embedder(cfg)
    from negsynth.embed.models import load_sentence_transformer

    return load_sentence_transformer(cfg.model, device=cfg.device, max_length=cfg.max_length)


def check_mining_embedder(cfg) -> None:
    """One line unless ``cfg`` names a sentence-transformers embedder (the only kind mining loads)."""
    if cfg.kind != "sentence-transformers":
        from negsynth.errors import UserError

        raise UserError(
            '--mine needs a sentence-transformers embedder; set embedder.kind = "sentence-transformers" (decoder embedders are not supported for mining)'
        )


def resolve_use_faiss(use_faiss: bool | None, corpus_size: int, faiss_threshold: int | None = FAISS_THRESHOLD) -> bool:
    """Whether to search with FAISS: ``use_faiss`` if given, else ``corpus_size >= faiss_threshold``
    (None = never). When FAISS is wanted but not installed: one log line and exact torch search."""
    want = use_faiss if use_faiss is not None else (faiss_threshold is not None and corpus_size >= faiss_threshold)
    if not want:
        return False
    try:
        import faiss  # noqa: F401
    except ImportError:
        log.warning(
            "mining: faiss is not installed, exact torch search over %d texts instead (pip install 'negsynth[scale]' for faiss-cpu)",
            corpus_size,
        )
        return False
    return True


def mine_negatives(
    model,
    queries: dict[str, str],
    known_positives: dict[str, list[str]],
    corpus: list[str],
    k: int,
    *,
    relative_margin: float | None = 0.05,
    absolute_margin: float | None = None,
    max_score: float | None = None,
    range_min: int = 0,
    range_max: int | None = None,
    sampling: str = "top",
    batch_size: int = 64,
    cache_folder: str | Path | None = None,
    use_faiss: bool | None = None,
    faiss_threshold: int | None = FAISS_THRESHOLD,
) -> dict[str, dict[str, Any]]:
    """Up to ``k`` negatives per query key, hardest first: ``{key: {"negatives", "scores", "pos_score"}}``.

    Every known positive of a query goes to the library, which measures the margin against the
    least similar one; a candidate equal to the query or a positive after
    :func:`~negsynth.data.text.text_key` is dropped too. ``cache_folder`` keeps the library's
    embeddings."""
    import datasets
    from sentence_transformers.util import mine_hard_negatives

    rows_q, rows_p = [], []
    for key, q in queries.items():
        for pos in known_positives.get(key) or []:
            rows_q.append(q)
            rows_p.append(pos)
    found: dict[str, dict[str, Any]] = {key: {"negatives": [], "scores": [], "pos_score": None} for key in queries}
    if not rows_q:
        return found
    ds = datasets.Dataset.from_dict({"query": rows_q, "positive": rows_p})
    # ``range_max`` unset: the library's own window under a margin (10 x k candidates + the most
    # positives of one query), so a query keeps k negatives exactly where ``mine_hard_negatives``
    # alone would keep them (the stock recipe's selection)
    extra = max(len(v) for v in known_positives.values()) if known_positives else 1
    range_max = range_max or range_min + 10 * k + extra
    n_corpus = len(set(corpus) | set(rows_p))
    range_max = min(range_max, n_corpus)
    use_faiss = resolve_use_faiss(use_faiss, n_corpus, faiss_threshold)
    if range_max - range_min < 1:
        return found
    out_ds = mine_hard_negatives(
        ds,
        model,
        anchor_column_name="query",
        positive_column_name="positive",
        corpus=list(corpus),
        num_negatives=min(k, range_max - range_min),
        range_min=range_min,
        range_max=range_max,
        relative_margin=relative_margin,
        absolute_margin=absolute_margin,
        max_score=max_score,
        sampling_strategy=sampling,
        output_format="triplet",
        output_scores=True,
        batch_size=batch_size,
        verbose=False,
        use_faiss=use_faiss,
        cache_folder=str(cache_folder) if cache_folder else None,
    )
    _gather_triplets(out_ds, queries, known_positives, k, found)
    return found


def _gather_triplets(triplets, queries: dict[str, str], known_positives: dict[str, list[str]], k: int, found: dict[str, dict]) -> None:
    """Fill ``found`` from ``mine_hard_negatives``' (query, positive, negative) rows: up to ``k``
    distinct negatives per query key in the library's order (hardest first), never the query or
    one of its positives after normalisation, and the query's hardest (least similar) positive's
    score, against which the library measured the margin."""
    text_to_key: dict[str, str] = {}
    for key, q in queries.items():
        text_to_key.setdefault(q, key)
    banned = {key: {text_key(p) for p in known_positives.get(key, [])} | {text_key(queries[key])} for key in queries}
    for row in triplets:
        key = text_to_key.get(row["query"])
        if key is None:
            continue
        f = found[key]
        pos_s, neg_s = row["scores"]
        f["pos_score"] = pos_s if f["pos_score"] is None else min(f["pos_score"], pos_s)
        neg = row["negative"]
        if neg in f["negatives"] or text_key(neg) in banned[key] or len(f["negatives"]) >= k:
            continue
        f["negatives"].append(neg)
        f["scores"].append(round(float(neg_s), 6))
    for f in found.values():
        if f["pos_score"] is not None:
            f["pos_score"] = round(float(f["pos_score"]), 6)


class TextStore:
    """Texts on disk, read back one at a time: their UTF-8 bytes back to back in ``path`` and
    their offsets in ``path + ".offsets.npy"`` (memory-mapped: a lookup reads one text)."""

    def __init__(self, path: str | Path):
        import mmap

        import numpy as np

        self.path = Path(path)
        self.offsets = np.load(self._offsets(self.path), mmap_mode="r")
        with open(self.path, "rb") as f:
            self._blob = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.offsets[-1] else b""

    @staticmethod
    def _offsets(path: Path) -> Path:
        return path.with_name(path.name + ".offsets.npy")

    @classmethod
    def write(cls, path: str | Path, batches: Iterable[list[str]]) -> TextStore:
        """Write the texts of ``batches`` (in order) and open them; written under temporary names
        first, so a killed write leaves no store behind."""
        import numpy as np

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        offsets = [np.zeros(1, dtype=np.int64)]
        end = 0
        with open(tmp, "wb") as f:
            for texts in batches:
                blobs = [t.encode("utf-8") for t in texts]
                ends = np.cumsum(np.fromiter((len(b) for b in blobs), dtype=np.int64, count=len(blobs))) + end
                f.write(b"".join(blobs))
                if len(ends):
                    end = int(ends[-1])
                offsets.append(ends)
        tmp_off = tmp.with_name(tmp.name + ".offsets.npy")
        np.save(tmp_off, np.concatenate(offsets))
        tmp_off.replace(cls._offsets(path))
        tmp.replace(path)
        return cls(path)

    @classmethod
    def open(cls, path: str | Path) -> TextStore | None:
        """The store at ``path``, or None when it is missing or was left half-written."""
        path = Path(path)
        if not (path.is_file() and cls._offsets(path).is_file()):
            return None
        try:
            store = cls(path)
        except (OSError, ValueError):
            return None
        return store if int(store.offsets[-1]) == path.stat().st_size else None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        return self._blob[int(self.offsets[i]) : int(self.offsets[i + 1])].decode("utf-8")


def save_npy(path: Path, vectors: Any) -> None:
    """Write ``vectors`` to the ``.npy`` file ``path`` under a temporary name first: a killed
    write leaves no file a rerun would trust."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, vectors)
    tmp.replace(path)


def encode_order(lengths: Any, model: Any = None) -> Any:
    """The order in which ``SentenceTransformer.encode`` embeds texts of these character
    ``lengths``: longest first (``np.argsort([-len(text) for text in inputs])``, the same sort),
    then, when ``model`` flattens its inputs (``_can_flatten_inputs``: no padding), longest and
    shortest interleaved by its own ``_interleave_sorted_indices``. Cut into ``batch_size`` rows,
    these are its batches."""
    import numpy as np

    order = np.argsort(-np.asarray(lengths, dtype=np.int64))
    if callable(getattr(model, "_can_flatten_inputs", None)) and callable(getattr(model, "_interleave_sorted_indices", None)):
        if model._can_flatten_inputs():
            order = model._interleave_sorted_indices(order)
    return order


#: batches of one :func:`encode_store` window handed at once to a model that spreads batches over
#: workers (its ``encode_batches``: the Ray workers' proxy); bounds the texts held at a time
STORE_WINDOW = 64


def encode_store(model, texts: TextStore, out: Any, *, batch_size: int = 64) -> None:
    """Embed every text of ``texts`` into ``out``, one batch of texts held at a time. The batches
    are those ``model.encode`` makes of the whole list (:func:`encode_order`), so the vectors are
    those of one ``encode`` call. A model with ``encode_batches`` (the Ray workers' proxy) gets
    :data:`STORE_WINDOW` batches at a time to spread over its workers."""
    import numpy as np

    n = len(texts)
    if n == 0:
        return
    lengths = np.fromiter((len(texts[i]) for i in range(n)), dtype=np.int64, count=n)
    order = encode_order(lengths, model)  # sentence-transformers: np.argsort([-len(text) for text in inputs])
    del lengths
    spread = getattr(model, "encode_batches", None)
    if spread is not None:
        step = batch_size * STORE_WINDOW
        for start in range(0, n, step):
            rows = order[start : start + step]
            batches = [[texts[int(i)] for i in rows[a : a + batch_size]] for a in range(0, len(rows), batch_size)]
            out[rows] = np.concatenate(list(spread(batches, kind="encode", batch_size=batch_size)))
        return
    for start in range(0, n, batch_size):
        rows = order[start : start + batch_size]
        vecs = model.encode(
            [texts[int(i)] for i in rows], batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        out[rows] = np.asarray(vecs, dtype=np.float32)


class CorpusIndex:
    """A corpus embedded once, searched one query at a time (the corpus stage): the rank of a
    query's own document and its positive-aware hard negatives, by ``mine_hard_negatives``' rule.
    Each query is encoded alone, so its result depends neither on the queries beside it nor on
    where a killed run resumed. ``cache`` (a ``.npy``) keeps the corpus vectors for a rerun;
    :meth:`from_batches` streams a corpus too large to hold (vectors memory-mapped, texts read
    back from disk when needed)."""

    def __init__(self, model, texts: Sequence[str], *, batch_size: int = 64, cache: str | Path | None = None, emb: Any = None):
        import numpy as np

        self.model = model
        self.texts = texts
        path = Path(cache) if cache else None
        if emb is None and path is not None and path.is_file():
            emb = np.load(path)
        elif emb is None:
            emb = model.encode(
                list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            ).astype(np.float32)
            if path is not None:
                save_npy(path, emb)
        if emb.shape[0] != len(texts):
            raise ValueError(f"{path}: holds {emb.shape[0]} vectors for {len(texts)} texts; delete it to re-embed")
        self.emb = emb

    @classmethod
    def from_batches(
        cls, model, batches: Callable[[], Iterable[list[str]]], count: int, *, batch_size: int = 64, cache: str | Path, store: str | Path
    ) -> CorpusIndex:
        """The index of a corpus too large to hold: ``batches()`` yields its texts a batch at a time
        (called again only for what is missing). The texts go to a :class:`TextStore` at ``store``
        (a mined negative's text is read back from it), the vectors to ``cache`` (a ``.npy`` written
        row by row, then memory-mapped). Both are reused by a rerun; the vectors are the ones
        :meth:`__init__` would compute from the whole list (see :func:`encode_store`)."""
        import numpy as np

        texts = TextStore.open(store)
        if texts is None or len(texts) != count:
            texts = TextStore.write(store, batches())
        if len(texts) != count:
            raise ValueError(f"{store}: holds {len(texts)} texts, the corpus {count}; it changed while read, rerun")
        path = Path(cache)
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp.npy")
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(count, model.get_embedding_dimension()))
            encode_store(model, texts, out, batch_size=batch_size)
            out.flush()
            del out
            tmp.replace(path)
        return cls(model, texts, emb=np.load(path, mmap_mode="r"), cache=path)

    def search(
        self,
        query: str,
        positive: int,
        k: int,
        *,
        relative_margin: float | None = 0.05,
        absolute_margin: float | None = None,
        max_score: float | None = None,
        range_max: int | None = None,
        lexical: Any = None,
        order: str = "dense",
    ) -> dict[str, Any]:
        """``{"rank", "pos_score", "negatives", "scores"}`` for ``query`` whose own document is
        ``texts[positive]`` (``rank``: 1 + the documents scored above it).

        ``range_max``: negatives only from the ``range_max + 1`` nearest documents (the library's
        window); None: the whole corpus. ``lexical``: the query's BM25 scores over the same texts,
        fused with the dense ones by RRF; a candidate the fused list ranks at or above the document
        is never a negative. ``order``: the ranking negatives are taken from, ``dense`` or
        ``hybrid`` (the fused one); either way a negative passes the dense positive-aware margin."""
        import numpy as np

        q = self.model.encode([query], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False).astype(np.float32)[0]
        sims = self.emb @ q
        pos = float(sims[positive])
        rank = 1 + int(np.count_nonzero(sims > pos))
        limit = _score_limit(pos, relative_margin, absolute_margin, max_score)
        fused = None
        if lexical is not None:
            from negsynth.embed.lexical import rrf

            fused = rrf(sims, lexical)
        if order not in ("dense", "hybrid") or (order == "hybrid" and fused is None):
            raise ValueError(f"order={order!r}: 'dense', or 'hybrid' with lexical scores")
        banned = {text_key(self.texts[positive]), text_key(query)}
        negs, scores = self._nearest_below(
            sims, positive, k, limit, banned, rank=rank, range_max=range_max, fused=fused, by_fused=order == "hybrid"
        )
        return {"rank": rank, "pos_score": round(pos, 6), "negatives": negs, "scores": scores}

    def _nearest_below(
        self,
        sims,
        positive: int,
        k: int,
        limit: float,
        banned: set[str],
        *,
        rank: int,
        range_max: int | None,
        fused,
        by_fused: bool = False,
    ) -> tuple[list[str], list[float]]:
        """Up to ``k`` distinct texts nearest the query (by ``sims``, or by ``fused`` with
        ``by_fused``) at or below ``limit``, hardest first, and their scores. Only the nearest
        candidates are sorted; the whole corpus only when too many fall under the margin."""
        import numpy as np

        pos_fused = float(fused[positive]) if fused is not None else None
        negs: list[str] = []
        scores: list[float] = []
        key = fused if by_fused else sims
        key_rank = 1 + int(np.count_nonzero(fused > pos_fused)) if by_fused else rank
        m = min(len(sims), 64 + 16 * k + key_rank)  # the candidates needed, unless many fall under the margin
        if range_max is not None:
            m = min(len(sims), range_max + 1)  # the window, room for the positive: nothing further down is looked at
        while k > 0:
            top = np.argpartition(-key, m - 1)[:m] if m < len(sims) else np.arange(len(sims))
            negs, scores = [], []
            for i in top[np.lexsort((top, -key[top]))]:  # by score, ties by index: deterministic
                s = float(sims[i])
                if i == positive or s > limit or (fused is not None and fused[i] >= pos_fused):
                    continue
                text = self.texts[int(i)]
                if text_key(text) in banned or text in negs:
                    continue
                negs.append(text)
                scores.append(round(s, 6))
                if len(negs) >= k:
                    break
            if len(negs) >= k or m >= len(sims) or range_max is not None:
                break
            m = len(sims)
        return negs, scores


def _score_limit(pos: float, relative_margin: float | None, absolute_margin: float | None, max_score: float | None) -> float:
    """The highest score a negative may have: under the positive's score ``pos`` by each margin
    given, and at most ``max_score`` (``mine_hard_negatives``' positive-aware rule)."""
    import numpy as np

    limit = np.inf
    if relative_margin is not None:
        limit = min(limit, pos - relative_margin * abs(pos))
    if absolute_margin is not None:
        limit = min(limit, pos - absolute_margin)
    if max_score is not None:
        limit = min(limit, max_score)
    return limit
