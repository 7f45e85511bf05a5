"""Embedding the examples in blocks, with progress."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from negsynth.embed.base import encode_parts, shares_query_pool


def embed_block(
    embedder, examples: list[dict], *, batch_size: int, reporter, label: str, raw: bool = False
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Embed the texts of ``examples``, each distinct text once -> (cos_pos [N], cos_neg list per example, info).
    Texts are sorted longest first over the whole block, then fed in chunks of ``8 * batch_size``.
    ``raw``: also embed each query as written (as a document) and return ``info["pool"]`` (pool
    texts, vectors, per-example rows ``q``, ``p``, ``n``) for :mod:`negsynth.data.clean`."""
    shared = shares_query_pool(embedder)
    # pools: key -> row; a query key is its formatted text (shared pool) or ("q", text, task)
    doc_index: dict[Any, int] = {}
    q_index: dict[Any, int] = doc_index if shared else {}
    instructions: list[str | None] = []  # per pool row: a query's instruction (non-shared pools), else None
    pool_texts: list[str] = []
    is_query: list[bool] = []

    def add(key, text: str, query: bool, instr: str | None = None) -> int:
        idx = q_index if (query and not shared) else doc_index
        j = idx.get(key)
        if j is None:
            j = idx[key] = len(pool_texts)
            pool_texts.append(text)
            is_query.append(query and not shared)
            instructions.append(instr if query and not shared else None)
        return j

    qi = np.empty(len(examples), dtype=np.int64)
    pi = np.empty(len(examples), dtype=np.int64)
    ni: list[list[int]] = []
    for e, ex in enumerate(examples):
        if shared:
            qt = embedder.format_query(ex["query"], ex.get("task"))
            qi[e] = add(qt, qt, True)
        else:
            qi[e] = add(("q", ex["query"], ex.get("task")), ex["query"], True, ex.get("task"))
        pi[e] = add(ex["positive"], ex["positive"], False)
        ni.append([add(n, n, False) for n in ex["negatives"]])
    qr = np.array([add(ex["query"], ex["query"], False) for ex in examples], dtype=np.int64) if raw else None
    n_texts = sum(2 + len(ex["negatives"]) for ex in examples)

    dim = embedder.dim
    vecs = np.zeros((len(pool_texts), dim), dtype=np.float32)
    calls = _encode_calls(pool_texts, is_query, instructions, shared, chunk=max(1, 8 * batch_size))
    t0 = time.perf_counter()
    with reporter.progress(label, len(pool_texts), status="texts") as bar:
        for (rows, _), v in zip(calls, encode_parts(embedder, [c for _, c in calls], batch_size=batch_size), strict=True):
            vecs[rows] = v
            bar.update(advance=len(rows))
    embed_s = time.perf_counter() - t0

    cos_pos = np.einsum("nd,nd->n", vecs[qi], vecs[pi])
    cos_neg = [vecs[ni[e]] @ vecs[qi[e]] for e in range(len(examples))] if examples else []
    info: dict[str, Any] = {"texts": n_texts, "unique_texts": len(pool_texts), "embed_s": embed_s}
    if raw:
        info["pool"] = {"texts": pool_texts, "vecs": vecs, "q": qr, "p": pi, "n": ni}
    return cos_pos, cos_neg, info


def _encode_calls(
    pool_texts: list[str], is_query: list[bool], instructions: list[str | None], shared: bool, *, chunk: int
) -> list[tuple[list[int], tuple]]:
    """The embedder calls for the pool, in order, each with the pool rows it fills: the rows
    sorted longest first and cut into chunks of ``chunk``; per chunk one ``encode`` call (queries
    share the documents' pool) or its queries (with their ``instructions``, one per pool row) then
    its documents."""
    order = sorted(range(len(pool_texts)), key=lambda j: -len(pool_texts[j]))
    calls: list[tuple[list[int], tuple]] = []
    for c0 in range(0, len(order), chunk):
        rows = order[c0 : c0 + chunk]
        if shared:
            calls.append((rows, ("encode", [pool_texts[j] for j in rows], None)))
            continue
        qrows = [j for j in rows if is_query[j]]
        drows = [j for j in rows if not is_query[j]]
        if qrows:
            calls.append((qrows, ("queries", [pool_texts[j] for j in qrows], [instructions[j] for j in qrows])))
        if drows:
            calls.append((drows, ("documents", [pool_texts[j] for j in drows], None)))
    return calls
