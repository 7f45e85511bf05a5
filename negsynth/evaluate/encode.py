"""What the two evaluation engines (:mod:`~negsynth.evaluate.runner`,
:mod:`~negsynth.evaluate.mteb_engine`) share: embedding texts, and reading STS and pair files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from negsynth.data.readers import EvalDataError, parse_floats, read_tsv
from negsynth.evaluate.suite import TaskSpec


def encode_texts(embedder, texts: list[str], instruction: str | None, *, query: bool, cache: dict | None = None) -> np.ndarray:
    """Embed each distinct text once (STS / NLI sets repeat sentences; AG News and TREC feed
    both a classification and a clustering task), then scatter back. ``cache`` lives for one
    :func:`evaluate` call and is keyed by (query?, instruction, text), so an embedder that
    treats instructions specially (e.g. masks them out of pooling) still gets them."""
    cache = {} if cache is None else cache
    # an embedder that ignores instructions (instruct_queries off) sees the same input either way
    ins_key = instruction if query and getattr(embedder, "instruct_queries", True) else None
    keys = [(query, ins_key, t) for t in texts]
    todo = list(dict.fromkeys(k for k in keys if k not in cache))
    if todo:
        new = [k[2] for k in todo]
        emb = embedder.encode_queries(new, instruction) if query else embedder.encode_documents(new)
        for k, v in zip(todo, np.asarray(emb, dtype=np.float32)):
            cache[k] = v
    if not keys:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    return np.stack([cache[k] for k in keys])


def sts_pairs(spec: TaskSpec, path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """An STS file as (texts 1, texts 2, gold scores)."""
    c = spec.columns
    cols = read_tsv(path, (c["text1"], c["text2"], c["score"]))
    return cols[c["text1"]], cols[c["text2"]], parse_floats(path, c["score"], cols[c["score"]])


def pair_labels(spec: TaskSpec, path: Path) -> tuple[list[str], list[str], list[int]]:
    """A pair-classification file as (texts 1, texts 2, 0/1 labels): ``spec.positive_labels`` -> 1,
    ``negative_labels`` -> 0, other labels (SICK-E's neutral) left out."""
    c = spec.columns
    cols = read_tsv(path, (c["text1"], c["text2"], c["label"]))
    pos = {p.lower() for p in spec.positive_labels}
    neg = {n.lower() for n in spec.negative_labels}
    t1, t2, y = [], [], []
    for a, b, lab in zip(cols[c["text1"]], cols[c["text2"]], cols[c["label"]], strict=True):
        key = lab.strip().lower()
        if key in pos:
            y.append(1)
        elif key in neg:
            y.append(0)
        else:
            continue
        t1.append(a)
        t2.append(b)
    if len(set(y)) < 2:
        raise EvalDataError(
            f"{path}: column {c['label']!r} needs both positive {spec.positive_labels} and negative {spec.negative_labels} labels; check the label values"
        )
    return t1, t2, y
