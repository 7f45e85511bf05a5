"""Readers of a user's documents: a corpus with no queries.

The ``corpus`` stage turns documents into training examples; this module reads one
:class:`~negsynth.schemas.config.CorpusSpec` as :class:`Document` s, whatever the storage: a BEIR
folder (its ``corpus.jsonl``: ``_id``, ``title``, ``text``), JSONL / parquet / CSV / TSV with
named text, title and id columns, or a saved HF dataset. A document's text is
``title + " " + text`` (as BEIR retrieval reads it), so the positive the model is trained on is
the document it will be asked to find.

**Bounded memory.** A JSONL / CSV / TSV / parquet corpus is never held whole: it is read in
batches (those of :mod:`negsynth.data.sources`' streamed reader, about 8 MiB of text or 65,536
parquet rows), once by :func:`read_corpus` to count the documents (what is kept: the file rows
that are not documents, and while that read lasts the ids, for the duplicate check), and again
by whoever wants documents: :meth:`CorpusData.documents_at` (a sample: the file is read up to
its last document) or :meth:`CorpusData.batches` (every document, a batch at a time). A
``.json`` array and a saved HF dataset are read whole, as before. A text file with NUL bytes in
its first 64 KiB, or a "parquet" file without its magic, is refused in one line before any parse.

Reading goes through the same polars / ``datasets`` readers as :mod:`negsynth.data.sources`;
an unreadable file, a missing column or a corpus with no document raises
:class:`~negsynth.errors.UserError` naming the file and the fix.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

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
    """One corpus, counted but not held: its documents are read again, in batches, when asked for.

    ``count`` documents; a document's index is its place among them (file order, rows with no
    text and later rows with a seen id left out). ``positions`` maps the id of each sampled
    document to its index (filled by the corpus stage's plan: the index rows of the mined search).
    """

    name: str
    path: str
    columns: dict[str, str]
    count: int
    empty_skipped: int = 0  # rows with no text
    duplicate_ids: int = 0  # rows whose id was seen before (the first one is kept)
    file: str = ""  # the file read (a BEIR folder's corpus.jsonl)
    fmt: str = ""  # its format
    split: str | None = None
    mapping: dict[str, str] = field(default_factory=dict)  # the spec's columns
    skipped_rows: frozenset[int] = frozenset()  # file rows that are not documents (no text, or a seen id)
    positions: dict[str, int] = field(default_factory=dict)

    def _frames(self) -> Iterator[tuple[int, Any]]:
        """``(file row of the first row, polars frame)`` per batch of the file, in order: a
        JSONL / CSV / TSV / parquet file in bounded batches, a ``.json`` array or an HF dataset whole."""
        from negsynth.data.sources import iter_frames, read_frame, sniff, streamable

        if streamable(self.file, self.fmt):
            p = Path(self.file)
            if not p.is_file():
                raise UserError(f"{p}: file not found; check --input")
            sniff(p, self.fmt)  # NUL bytes or a parquet file without its magic: one line, after 64 KiB
            frames: Iterable[Any] = iter_frames(p, self.fmt)
        else:
            frames = [read_frame(self.file, self.fmt, self.split)[0]]
        row = 0
        for df in frames:
            if not self.columns:
                self.columns = _columns(list(df.columns), self.mapping, self.file)
            yield row, df
            row += df.height

    def _cells(self, df: Any, row0: int) -> tuple[list, list, Any]:
        """The text, title and id cells of one frame (a column absent from it: empty cells; no id
        column: the file row)."""
        n = df.height
        cols = self.columns

        def get(role: str) -> list:
            return df[cols[role]].to_list() if role in cols and cols[role] in df.columns else [None] * n

        return get("text"), get("title"), (get("id") if "id" in cols else range(row0, row0 + n))

    def batches(self) -> Iterator[tuple[int, list[Document]]]:
        """``(index of the first, documents)`` per batch of the file: every document, in order."""
        index = 0
        for row0, df in self._frames():
            texts, titles, ids = self._cells(df, row0)
            docs: list[Document] = []
            for j, (i, t, body) in enumerate(zip(ids, titles, texts)):
                if row0 + j in self.skipped_rows:
                    continue
                d = _document(i, t, body)
                if d is None:
                    raise UserError(f"{self.file}: changed while it was read (row {row0 + j + 1} has no text now); rerun")
                docs.append(d)
            if docs:
                yield index, docs
            index += len(docs)

    def documents(self) -> Iterator[Document]:
        """Every document, in file order (read again from the file)."""
        for _, docs in self.batches():
            yield from docs

    def documents_at(self, wanted: Sequence[int]) -> list[tuple[int, Document]]:
        """``(index, document)`` of the documents at the sorted indices ``wanted``; the file is read
        up to the last of them."""
        out: list[tuple[int, Document]] = []
        if not wanted:
            return out
        k = 0
        for index, docs in self.batches():
            while k < len(wanted) and wanted[k] < index + len(docs):
                out.append((wanted[k], docs[wanted[k] - index]))
                k += 1
            if k >= len(wanted):
                break
        return out


def _has_text(title: Any, body: Any) -> bool:
    return bool(("" if body is None else str(body)).strip() or ("" if title is None else str(title)).strip())


def _document(i: Any, t: Any, body: Any) -> Document | None:
    """The document of one row (None: no text)."""
    body = "" if body is None else str(body).strip()
    title = "" if t is None else str(t).strip()
    if not body and not title:
        return None
    # the BEIR convention, as evaluation reads it: "title text", or the text alone where it
    # already opens with its title (Cranfield)
    text = f"{title} {body}".strip() if title and not body.lower().startswith(title.lower()) else body
    return Document(str(i), text, title)


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
    """Count the documents of one corpus spec in one streamed read: kept are the column map, the
    count and the file rows that are not documents, never the texts."""
    import numpy as np
    import polars as pl

    from negsynth.data.sources import default_name, detect_format

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
    data = CorpusData(name, spec.path, {}, 0, file=path, fmt=file_fmt, split=spec.split, mapping=dict(spec.columns))
    empty: list[int] = []
    ids: list[Any] = []  # per batch, the ids of its rows with text (polars strings: compact), for the duplicate check
    id_rows: list[Any] = []
    rows = 0
    for row0, df in data._frames():
        texts, titles, row_ids = data._cells(df, row0)
        with_id = "id" in data.columns
        keep_ids: list[str] = []
        keep_rows: list[int] = []
        for j, (i, t, body) in enumerate(zip(row_ids, titles, texts)):
            if not _has_text(t, body):
                empty.append(row0 + j)
            elif with_id:
                keep_ids.append(str(i))
                keep_rows.append(row0 + j)
        if keep_ids:
            ids.append(pl.Series(keep_ids, dtype=pl.String))
            id_rows.append(np.asarray(keep_rows, dtype=np.int64))
        rows += df.height
    if not data.columns:  # no row at all
        raise UserError(f"{path}: holds no document with text; check the file or columns.text")
    dup = np.zeros(0, dtype=np.int64)
    if ids:  # a later row whose id was seen before is left out (the first one is kept)
        first = pl.concat(ids).is_first_distinct().to_numpy()
        dup = np.concatenate(id_rows)[~first]
    data.skipped_rows = frozenset(empty) | frozenset(dup.tolist())
    data.empty_skipped, data.duplicate_ids = len(empty), len(dup)
    data.count = rows - len(data.skipped_rows)
    if data.count <= 0:
        raise UserError(f"{path}: holds no document with text; check the file or columns.text")
    return data


def _corpus_format(path: str) -> str:
    p = Path(path)
    if p.is_dir() and (p / "corpus.jsonl").is_file():
        return "beir"
    from negsynth.data.sources import detect_format

    return detect_format(path)


def sample_indices(total: int, max_docs: int | None, seed: int) -> Sequence[int]:
    """The indices of at most ``max_docs`` of ``total`` documents: a seeded random sample, sorted
    (``random.sample`` of a ``range`` holds only the sample, whatever ``total``)."""
    if max_docs is None or max_docs >= total:
        return range(total)
    return sorted(random.Random(f"{seed}:corpus").sample(range(total), max_docs))


def sample_documents(docs: list[T], max_docs: int | None, seed: int) -> list[T]:
    """At most ``max_docs`` documents (or anything standing for them): a seeded random sample kept in corpus order."""
    return [docs[i] for i in sample_indices(len(docs), max_docs, seed)]
