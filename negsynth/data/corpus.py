"""Readers of a user's documents: a corpus with no queries.

The ``corpus`` stage turns documents into training examples; this module turns one
:class:`~negsynth.schemas.config.CorpusSpec` into a list of :class:`Document`, whatever the
storage: a BEIR folder (its ``corpus.jsonl``: ``_id``, ``title``, ``text``), JSONL / parquet /
CSV / TSV with named text, title and id columns, or a saved HF dataset. A document's text is
``title + " " + text`` (as BEIR retrieval reads it), so the positive the model is trained on is
the document it will be asked to find.

Reading goes through the same polars / ``datasets`` readers as :mod:`negsynth.data.sources`;
an unreadable file, a missing column or a corpus with no document raises
:class:`~negsynth.errors.UserError` naming the file and the fix.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from negsynth.errors import UserError

T = TypeVar("T")

#: names tried, in order, for a role whose column is not given in ``columns``
COLUMN_GUESSES: dict[str, tuple[str, ...]] = {
    "text": ("text", "body", "content", "document", "passage", "abstract", "contents"),
    "title": ("title", "heading", "name"),
    "id": ("_id", "id", "doc_id", "docid", "corpus_id"),
}


@dataclass(frozen=True)
class Document:
    """One document: ``id`` is unique within its corpus; ``text`` already holds the title."""

    id: str
    text: str
    title: str = ""


@dataclass
class CorpusData:
    name: str
    documents: list[Document]
    path: str
    columns: dict[str, str]
    empty_skipped: int = 0  # rows with no text
    duplicate_ids: int = 0  # rows whose id was seen before (the first one is kept)


def _columns(cols: list[str], mapping: dict[str, str], where: str) -> dict[str, str]:
    lower = {c.lower(): c for c in cols}
    out: dict[str, str] = {}
    for role, names in COLUMN_GUESSES.items():
        if role in mapping:
            if mapping[role] not in cols:
                raise UserError(f"{where}: no column {mapping[role]!r} for {role} (columns: {', '.join(cols)}); fix columns.{role}")
            out[role] = mapping[role]
            continue
        found = next((lower[n] for n in names if n in lower), None)
        if found is not None:
            out[role] = found
    if "text" not in out:
        raise UserError(f'{where}: no text column (columns: {", ".join(cols)}); name it with --text-col or columns = {{text = "..."}}')
    return out


def read_corpus(spec) -> CorpusData:
    """Every document of one corpus spec, in file order."""
    from negsynth.data.sources import _read_frame, default_name, detect_format

    fmt = spec.format if spec.format != "auto" else _corpus_format(spec.path)
    path = spec.path
    if fmt == "beir":
        path = str(Path(spec.path) / "corpus.jsonl")
        if not Path(path).is_file():
            raise UserError(f"{spec.path}: a BEIR folder needs corpus.jsonl; fix corpus.inputs path")
        file_fmt = "jsonl"
    else:
        file_fmt = fmt if fmt != "auto" else detect_format(path)
    name = spec.name or default_name(spec.path, "beir" if fmt == "beir" else file_fmt)
    df, _ = _read_frame(path, file_fmt, spec.split)
    cols = _columns(list(df.columns), spec.columns, path)
    texts = df[cols["text"]].to_list()
    titles = df[cols["title"]].to_list() if "title" in cols else [None] * len(texts)
    ids = df[cols["id"]].to_list() if "id" in cols else list(range(len(texts)))
    docs: list[Document] = []
    seen: set[str] = set()
    empty = dup = 0
    for i, t, body in zip(ids, titles, texts):
        body = "" if body is None else str(body).strip()
        title = "" if t is None else str(t).strip()
        if not body and not title:
            empty += 1
            continue
        did = str(i)
        if did in seen:
            dup += 1
            continue
        seen.add(did)
        # the BEIR convention, as evaluation reads it: "title text", or the text alone where it
        # already opens with its title (Cranfield)
        text = f"{title} {body}".strip() if title and not body.lower().startswith(title.lower()) else body
        docs.append(Document(did, text, title))
    if not docs:
        raise UserError(f"{path}: holds no document with text; check the file or columns.text")
    return CorpusData(name, docs, spec.path, cols, empty, dup)


def _corpus_format(path: str) -> str:
    p = Path(path)
    if p.is_dir() and (p / "corpus.jsonl").is_file():
        return "beir"
    from negsynth.data.sources import detect_format

    return detect_format(path)


def sample_documents(docs: list[T], max_docs: int | None, seed: int) -> list[T]:
    """At most ``max_docs`` documents (or anything standing for them): a seeded random sample kept in corpus order."""
    if max_docs is None or max_docs >= len(docs):
        return list(docs)
    idx = sorted(random.Random(f"{seed}:corpus").sample(range(len(docs)), max_docs))
    return [docs[i] for i in idx]
