"""Readers of a user's documents (a corpus with no queries), for the ``corpus`` stage.

One :class:`~negsynth.schemas.config.CorpusSpec` becomes :class:`Document` s, whatever the storage:
a BEIR folder's ``corpus.jsonl`` or a saved HF dataset; a JSONL / CSV / TSV (``.gz`` too) or
parquet file, one document per record (text, title and id columns named or guessed); a ``.txt`` /
``.md`` / ``.rst`` / ``.html`` / ``.pdf`` file, one document (title: its first heading or
``<title>``, else the file name); or a folder of any of these (recursive, sorted, ``glob`` picks a
subset; ids are paths, ``path:id`` for a table's records). A document's text is ``title + " " +
text``, as BEIR retrieval reads it.

``ids``: ``column`` (a repeated id is an error), ``first`` (later repeats left out), ``row`` or
``hash`` (identical texts kept once). A document longer than ``chunk_tokens`` proxy tokens
(``\\w+|[^\\w\\s]``, no model tokenizer) is split into overlapping passages ``<id>#chunk<N>``, each
headed by the title (:func:`~negsynth.data.documents.split_document`).

Memory stays bounded: :func:`read_corpus` streams the input once to count the documents (keeping
the skipped rows and, while it reads, the ids), and :meth:`CorpusData.batches` /
:meth:`CorpusData.documents_at` read it again when documents are wanted. A binary file given as
text, a missing column, repeated ids or an empty corpus is one :class:`~negsynth.errors.UserError`
naming the file and the fix.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from negsynth.data.documents import Document, n_chunks, need_extra, read_document_file, split_document
from negsynth.data.sources import default_name, detect_format, is_hf_folder
from negsynth.data.tables import resolve_columns
from negsynth.errors import UserError

#: names tried, in order, for a role whose column is not given in ``columns``
COLUMN_GUESSES: dict[str, tuple[str, ...]] = {
    "text": ("text", "body", "content", "document", "passage", "abstract", "contents"),
    "title": ("title", "heading", "name"),
    "id": ("_id", "id", "doc_id", "docid", "corpus_id"),
}

#: a file that is one document: suffix -> its format
DOCUMENT_SUFFIXES = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".markdown": "text",
    ".rst": "text",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
}
#: a file whose records are documents: suffix -> its format (``.gz`` of the text ones too)
TABLE_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
#: a folder's document files read per batch
_FILES_PER_BATCH = 64
_SUPPORTED = ".txt, .md, .rst, .html, .pdf, .jsonl(.gz), .csv(.gz), .tsv(.gz), .parquet"
_UNSUPPORTED_FIX = "convert it to JSONL with a 'text' field (or .txt / .md / .pdf), or narrow the glob"


def file_format(p: Path) -> str | None:
    """The format of one file of a folder (or given alone) from its name; None: not a corpus file."""
    name = p.name.lower()
    if name.endswith(".gz"):
        inner = Path(name[:-3]).suffix
        return TABLE_SUFFIXES.get(inner) if inner in (".jsonl", ".ndjson", ".csv", ".tsv", ".tab") else None
    suffix = p.suffix.lower()
    return DOCUMENT_SUFFIXES.get(suffix) or TABLE_SUFFIXES.get(suffix)


def _kind(p: Path) -> str:
    """What a file's name says it is, for messages: ``.jsonl.gz``, ``.docx``, or its name."""
    return "".join(p.suffixes[-2:]).lower() if p.suffix.lower() == ".gz" else (p.suffix.lower() or p.name)


# -- the corpus ---------------------------------------------------------------------------------
@dataclass
class Part:
    """One file of a corpus: ``rel`` is its path in a folder input ('' for a single input)."""

    file: str
    fmt: str
    rel: str = ""


@dataclass
class CorpusData:
    """One corpus, counted but not held: its documents are read again, in batches, when asked for.

    ``count`` documents (passages, where long documents are chunked); a document's index is its
    place among them (input order, rows with no text and rows left out for their id skipped).
    ``positions`` maps the id of each sampled document to its index (filled by the corpus stage's
    plan: the index rows of the mined search).
    """

    name: str
    path: str
    columns: dict[str, str]
    count: int
    empty_skipped: int = 0  # rows with no text
    duplicate_ids: int = 0  # rows left out as a repeat of an earlier id (ids "first", "hash")
    file: str = ""  # the file read (a BEIR folder's corpus.jsonl; the folder of a folder input)
    fmt: str = ""  # its format ("folder": a folder of files)
    split: str | None = None
    mapping: dict[str, str] = field(default_factory=dict)  # the spec's columns
    skipped_rows: frozenset[int] = frozenset()  # rows that are not documents (no text, or a repeated id)
    positions: dict[str, int] = field(default_factory=dict)
    ids: str = "column"  # how ids are made: column, first, row or hash (module docstring)
    chunk_tokens: int = 0  # documents longer than this many proxy tokens are split (0: never)
    chunk_overlap: int = 0
    rows: int = 0  # rows read (documents before chunking, with the skipped ones)
    chunked: int = 0  # documents split into passages
    parts: list[Part] = field(default_factory=list)  # the files read, in order
    skipped_files: dict[str, int] = field(default_factory=dict)  # a folder's files of no corpus type, by kind

    def _part_frames(self, part: Part) -> Iterator[Any]:
        """Polars frames of one table file: JSONL / CSV / TSV / parquet in bounded batches, a
        ``.json`` array or an HF dataset whole."""
        from negsynth.data.tables import iter_frames, read_frame, sniff, streamable

        if streamable(part.file, part.fmt):
            p = Path(part.file)
            if not p.is_file():
                raise UserError(f"{p}: file not found; check --input")
            sniff(p, part.fmt)  # NUL bytes, a PDF, or a parquet file without its magic: one line, after 64 KiB
            yield from iter_frames(p, part.fmt)
        else:
            yield read_frame(part.file, part.fmt, self.split)[0]

    def _cells(self) -> Iterator[tuple[int, list, list, list]]:
        """``(row of the first, ids, titles, texts)`` per batch of the input, in order; an id is
        None where the text's hash makes it (ids "hash")."""
        row = 0
        files: list[Part] = []

        def flush() -> Iterator[tuple[int, list, list, list]]:
            nonlocal row
            if not files:
                return
            read = [read_document_file(Path(f.file), f.fmt) for f in files]
            ids = [None if self.ids == "hash" else (f.rel or Path(f.file).name) for f in files]
            yield row, ids, [t for t, _ in read], [b for _, b in read]
            row += len(files)
            files.clear()

        for part in self.parts:
            if part.fmt in DOCUMENT_SUFFIXES.values():
                files.append(part)
                if len(files) >= _FILES_PER_BATCH:
                    yield from flush()
                continue
            yield from flush()
            cols: dict[str, str] | None = None
            local = 0  # the row in this file
            for df in self._part_frames(part):
                if cols is None:
                    cols = resolve_columns(list(df.columns), self.mapping, COLUMN_GUESSES, ("text",), set(COLUMN_GUESSES), part.file)
                    if not self.columns:
                        self.columns = cols
                n = df.height

                def get(role: str, df=df, n=n, cols=cols) -> list:
                    return df[cols[role]].to_list() if role in cols and cols[role] in df.columns else [None] * n

                if self.ids == "hash":
                    ids: list = [None] * n
                elif self.ids == "row" or "id" not in cols:
                    ids = [str(r) for r in range(local, local + n)] if part.rel else [str(r) for r in range(row, row + n)]
                else:
                    raw = get("id")
                    if self.ids == "column" and None in raw:
                        at = local + raw.index(None) + 1
                        raise UserError(
                            f"{part.file}: row {at} has no id in column {cols['id']!r}; fill it, or make ids another way: --ids row | hash | first"
                        )
                    ids = [str(i) for i in raw]
                if part.rel and self.ids != "hash":
                    ids = [f"{part.rel}:{i}" for i in ids]
                yield row, ids, get("title"), get("text")
                row += n
                local += n
        yield from flush()

    def _documents(self, i: Any, t: Any, body: Any) -> list[Document]:
        d = _document(i, t, body)
        if d is None:
            return []
        if i is None:
            d = Document(text_id(d.text), d.text, d.title)
        return split_document(d, self.chunk_tokens, self.chunk_overlap)

    def batches(self) -> Iterator[tuple[int, list[Document]]]:
        """``(index of the first, documents)`` per batch of the input: every document, in order."""
        index = 0
        for row0, ids, titles, texts in self._cells():
            docs: list[Document] = []
            for j, (i, t, body) in enumerate(zip(ids, titles, texts)):
                if row0 + j in self.skipped_rows:
                    continue
                made = self._documents(i, t, body)
                if not made:
                    raise UserError(f"{self.file}: changed while it was read (row {row0 + j + 1} has no text now); rerun")
                docs.extend(made)
            if docs:
                yield index, docs
            index += len(docs)

    def documents(self) -> Iterator[Document]:
        """Every document, in input order (read again from the input)."""
        for _, docs in self.batches():
            yield from docs

    def documents_at(self, wanted: Sequence[int]) -> list[tuple[int, Document]]:
        """``(index, document)`` of the documents at the sorted indices ``wanted``; the input is
        read up to the last of them."""
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


def text_id(text: str) -> str:
    """The id ``ids = "hash"`` gives a document: the first 16 hex digits of its text's SHA-256."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


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


def folder_parts(folder: Path, glob: str | None) -> tuple[list[Part], dict[str, int]]:
    """The corpus files of a folder (recursive, sorted by path; hidden files and folders left out)
    and the count of the other files by kind. ``glob`` (``**/*.md``) picks the files; one it
    picks that no reader knows is an error."""
    parts: list[Part] = []
    other: Counter = Counter()
    paths = folder.glob(glob) if glob else folder.rglob("*")
    for p in sorted(paths, key=lambda q: q.relative_to(folder).as_posix()):
        rel = p.relative_to(folder)
        if not p.is_file() or any(x.startswith(".") for x in rel.parts):
            continue
        fmt = file_format(p)
        if fmt is None:
            if glob:
                raise UserError(f"{p}: picked by glob {glob!r} but {_kind(p)!r} is no corpus file type; {_UNSUPPORTED_FIX}")
            other[_kind(p)] += 1
            continue
        parts.append(Part(str(p), fmt, rel.as_posix()))
    return parts, dict(sorted(other.items()))


def read_corpus(spec, chunk_tokens: int = 0, chunk_overlap: int = 0) -> CorpusData:
    """Count the documents of one corpus spec in one streamed read: kept are the column map, the
    count and the rows that are not documents, never the texts. Documents longer than
    ``chunk_tokens`` proxy tokens count as their passages (0: never split)."""
    fmt, path, file_fmt = _input_format(spec)
    name = spec.name or default_name(spec.path, "beir" if fmt in ("beir", "folder") else file_fmt)
    data = CorpusData(
        name,
        spec.path,
        {},
        0,
        file=path,
        fmt=file_fmt,
        split=spec.split,
        mapping=dict(spec.columns),
        ids=spec.ids,
        chunk_tokens=chunk_tokens,
        chunk_overlap=chunk_overlap,
    )
    data.parts, data.skipped_files = _input_parts(spec, fmt, path, file_fmt)
    for f in sorted({p.fmt for p in data.parts}):
        need_extra(f, spec.path)
    tally = _count_rows(data)
    data.rows = tally.rows
    if tally.rows == 0:
        raise UserError(f"{path}: holds no document with text; check the file or columns.text")
    _leave_out_repeats(data, tally)
    if data.count <= 0:
        hint = " (a scanned PDF has no text layer: run OCR on it first)" if any(p.fmt == "pdf" for p in data.parts) else ""
        raise UserError(f"{path}: holds no document with text{hint}; check the file or columns.text")
    return data


def _input_format(spec) -> tuple[str, str, str]:
    """``(format of the input, the file read, format of that file)``: a BEIR folder is read as its
    ``corpus.jsonl``, a folder of files as ``folder``; a glob on anything but a folder is refused."""
    fmt = spec.format if spec.format != "auto" else _corpus_format(spec.path)
    if spec.glob and fmt != "folder":
        raise UserError(f"{spec.path}: glob {spec.glob!r} picks files of a folder of documents, and this input is {fmt}; drop the glob")
    if fmt != "beir":
        return fmt, spec.path, fmt
    path = str(Path(spec.path) / "corpus.jsonl")
    if not Path(path).is_file():
        raise UserError(f"{spec.path}: a BEIR folder needs corpus.jsonl; fix corpus.inputs path")
    return fmt, path, "jsonl"


def _input_parts(spec, fmt: str, path: str, file_fmt: str) -> tuple[list[Part], dict[str, int]]:
    """The files of the input (a folder's corpus files, else the one file) and a folder's other
    files by kind; one line when there is nothing to read."""
    if fmt != "folder":
        if file_fmt in DOCUMENT_SUFFIXES.values() and not Path(path).is_file():
            raise UserError(f"{path}: file not found; check --input")
        return [Part(path, file_fmt)], {}
    folder, glob = Path(spec.path), spec.glob
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder; check --input")
    parts, skipped_files = folder_parts(folder, glob)
    if not parts:
        found = ", ".join(f"{k} ×{v}" for k, v in skipped_files.items()) or "no files"
        raise UserError(
            f"{folder}: no corpus files here ({found}{f' for glob {glob!r}' if glob else ''}); it reads {_SUPPORTED}: convert the documents to one of them, e.g. JSONL with a 'text' field"
        )
    return parts, skipped_files


@dataclass
class _RowTally:
    """What the counting read of :func:`read_corpus` keeps: row numbers, ids and passage counts in
    compact per-batch arrays, never the texts."""

    empty: list[int] = field(default_factory=list)  # rows with no text
    ids: list[Any] = field(default_factory=list)  # per batch, the ids of its rows with text (polars strings), for the duplicate check
    id_rows: list[Any] = field(default_factory=list)  # per batch, the rows of those ids
    multi_rows: list[Any] = field(default_factory=list)  # per batch, the rows of documents split into passages
    multi_n: list[Any] = field(default_factory=list)  # and how many passages each
    rows: int = 0
    chunks: int = 0  # passages (a document that fits: one)


def _count_rows(data: CorpusData) -> _RowTally:
    """Read the input once: each row's document (None: no text), its passages and, where ids can
    repeat, its id."""
    import numpy as np
    import polars as pl

    tally = _RowTally()
    keep_ids_of = data.ids in ("column", "first", "hash")
    for row0, row_ids, titles, texts in data._cells():
        keep_ids: list[str] = []
        keep_rows: list[int] = []
        split_rows: list[int] = []
        split_n: list[int] = []
        for j, (i, t, body) in enumerate(zip(row_ids, titles, texts)):
            d = _document(i, t, body)
            if d is None:
                tally.empty.append(row0 + j)
                continue
            if i is None:
                d = Document(text_id(d.text), d.text, d.title)
            n = n_chunks(d, data.chunk_tokens, data.chunk_overlap)
            tally.chunks += n
            if n > 1:
                split_rows.append(row0 + j)
                split_n.append(n)
            if keep_ids_of and (i is None or "id" in data.columns or data.fmt == "folder"):
                keep_ids.append(d.id)
                keep_rows.append(row0 + j)
        if keep_ids:
            tally.ids.append(pl.Series(keep_ids, dtype=pl.String))
            tally.id_rows.append(np.asarray(keep_rows, dtype=np.int64))
        if split_rows:
            tally.multi_rows.append(np.asarray(split_rows, dtype=np.int64))
            tally.multi_n.append(np.asarray(split_n, dtype=np.int64))
        tally.rows += len(texts)
    return tally


def _leave_out_repeats(data: CorpusData, tally: _RowTally) -> None:
    """Set ``data``'s skipped rows and counts: a later row whose id was seen before is left out
    (ids ``first`` / ``hash``; an error with ids ``column``), and so are its passages."""
    import numpy as np
    import polars as pl

    dup = np.zeros(0, dtype=np.int64)
    if tally.ids:  # a later row whose id was seen before
        all_ids = pl.concat(tally.ids)
        first = all_ids.is_first_distinct().to_numpy()
        rows_of = np.concatenate(tally.id_rows)
        dup = rows_of[~first]
        if len(dup) and data.ids == "column":
            raise _repeated_ids(data, all_ids, rows_of, first)
    data.skipped_rows = frozenset(tally.empty) | frozenset(dup.tolist())
    data.empty_skipped, data.duplicate_ids = len(tally.empty), len(dup)
    # a left-out repeat counted its passages above: take them out again
    split_at = np.concatenate(tally.multi_rows) if tally.multi_rows else np.zeros(0, dtype=np.int64)
    split_n_all = np.concatenate(tally.multi_n) if tally.multi_n else np.zeros(0, dtype=np.int64)
    left_out = np.isin(split_at, dup)
    data.chunked = int((~left_out).sum())
    data.count = tally.chunks - len(dup) - int((split_n_all[left_out] - 1).sum())


def _repeated_ids(data: CorpusData, all_ids: Any, rows_of: Any, first: Any) -> UserError:
    """The one line for ids that repeat: how many, the first three with the rows they are on."""
    import numpy as np

    repeats = all_ids.filter(~first).unique(maintain_order=True)
    shown = []
    arr = all_ids.to_numpy()
    for rid in repeats.head(3).to_list():
        at = rows_of[np.flatnonzero(arr == rid)][:3]
        shown.append(f"{rid!r} at rows {' and '.join(str(int(r) + 1) for r in at)}" if data.fmt != "folder" else repr(rid))
    col = data.columns.get("id")
    where = f"column {col!r}" if col else "ids"
    return UserError(
        f"{data.file}: {int((~first).sum())} of {len(arr)} documents repeat an earlier id in {where} (first: {', '.join(shown)}); "
        'make the ids unique, or say how to make them: --ids first (keep the first of each) | row (the row number) | hash (the text\'s hash), ids = "..." in [[corpus.inputs]]'
    )


def _corpus_format(path: str) -> str:
    p = Path(path)
    if p.is_dir():
        if (p / "corpus.jsonl").is_file():
            return "beir"
        if is_hf_folder(p):
            return "hf"
        return "folder"
    fmt = file_format(p)
    if fmt in DOCUMENT_SUFFIXES.values():
        return fmt
    if p.exists() and fmt is None and p.suffix.lower() not in (".json",):
        raise UserError(f"{p}: unknown file type {_kind(p)!r}; the corpus stage reads {_SUPPORTED} or a folder of them; {_UNSUPPORTED_FIX}")
    return detect_format(path)


def sample_indices(total: int, max_docs: int | None, seed: int) -> Sequence[int]:
    """The indices of at most ``max_docs`` of ``total`` documents: a seeded random sample, sorted
    (``random.sample`` of a ``range`` holds only the sample, whatever ``total``)."""
    if max_docs is None or max_docs >= total:
        return range(total)
    return sorted(random.Random(f"{seed}:corpus").sample(range(total), max_docs))
