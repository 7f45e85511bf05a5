"""Readers for the file formats negsynth reads data from: headed TSV, JSONL and BEIR folders
(``corpus.jsonl`` + ``queries.jsonl`` + ``qrels.tsv``; see ``shared/data/README.md``).

The one BEIR reader: evaluation (:func:`read_beir`: queries, corpus, qrels), regenerate's sources
(:func:`negsynth.data.sources.read_beir_pairs`: one pair per relevant document) and decontamination (:mod:`negsynth.data.clean`) all parse BEIR
files through :func:`read_beir_files` and apply their own policy on top (what to do with a
qrel whose query or document is missing).

Every reader checks the header and the field count of each line and raises
:class:`DataFileError` (a ``ValueError``) with one line naming the file, the line or column
and the fix — never a bare ``KeyError`` / ``IndexError`` from deep inside.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np

from negsynth.errors import NegsynthError

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


class DataFileError(NegsynthError, ValueError):
    """A data file is unreadable or malformed (message: file, line/field, fix)."""


#: the name evaluation code has always used
EvalDataError = DataFileError


def read_tsv(path: Path, required: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """Read a headed TSV into ``{column: [values]}`` for the ``required`` header names.

    Fields are split on tabs only (``QUOTE_NONE``: quotes are part of the text).
    """
    path = Path(path)
    try:
        fh = path.open(encoding="utf-8", newline="")
    except OSError as e:
        raise DataFileError(f"{path}: cannot open ({e.strerror}); check the data dir") from None
    with fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            header = next(reader)
        except StopIteration:
            raise DataFileError(f"{path}: empty file; expected a header line with {'/'.join(required)}") from None
        except UnicodeDecodeError as e:
            raise DataFileError(f"{path}: not UTF-8 ({e.reason}); re-encode the file as UTF-8") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise DataFileError(
                f"{path}: header {header!r} lacks column(s) {missing}; the first line must name the columns (tab-separated)"
            )
        idx = [header.index(c) for c in required]
        out: dict[str, list[str]] = {c: [] for c in required}
        try:
            for lineno, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) != len(header):
                    raise DataFileError(
                        f"{path}:{lineno}: {len(row)} tab-separated fields, the header has {len(header)}; remove stray tabs inside the text"
                    )
                for c, i in zip(required, idx):
                    out[c].append(row[i])
        except UnicodeDecodeError as e:
            raise DataFileError(f"{path}: not UTF-8 ({e.reason}); re-encode the file as UTF-8") from None
    return out


def parse_floats(path: Path, column: str, values: list[str]) -> np.ndarray:
    """Column values -> float64 array; a non-number names its line (header = line 1)."""
    out = np.empty(len(values), dtype=np.float64)
    for i, v in enumerate(values):
        try:
            out[i] = float(v)
        except ValueError:
            raise DataFileError(f"{path}:{i + 2}: column {column!r} holds {v!r}, not a number; fix or drop that line") from None
    return out


def read_jsonl(path: Path, required: tuple[str, ...]) -> list[dict]:
    path = Path(path)
    rows: list[dict] = []
    try:
        fh = path.open(encoding="utf-8")
    except OSError as e:
        raise DataFileError(f"{path}: cannot open ({e.strerror}); check the data dir") from None
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFileError(f"{path}:{lineno}: invalid JSON ({e.msg}); each line must be one JSON object") from None
            if not isinstance(obj, dict) or any(k not in obj for k in required):
                raise DataFileError(f"{path}:{lineno}: needs the fields {list(required)}; add them to that line")
            rows.append(obj)
    return rows


def read_jsonl_frame(path: Path, required: tuple[str, ...]):
    """A polars frame of a JSONL file (fast on large corpora). When polars cannot read it, or a
    required field is missing or null, the line-by-line reader names the line and the fix."""
    import polars as pl

    path = Path(path)
    try:
        df = pl.read_ndjson(path, infer_schema_length=None)
        if all(c in df.columns and df.get_column(c).null_count() == 0 for c in required):
            return df
    except Exception:  # noqa: BLE001 - the precise error comes from the line reader below
        pass
    return pl.from_dicts(read_jsonl(path, required), infer_schema_length=None)


def read_id_texts(path: Path, *, with_title: bool = False) -> dict[str, str]:
    """``{_id: text}`` of a BEIR ``corpus.jsonl`` / ``queries.jsonl`` (``title + " " + text`` when
    ``with_title`` and the title is non-empty, the BEIR / sentence-transformers convention)."""
    import polars as pl

    df = read_jsonl_frame(path, ("_id", "text"))
    ids = df.get_column("_id").cast(pl.Utf8).to_list()
    texts = df.get_column("text").cast(pl.Utf8).to_list()
    titles = df.get_column("title").cast(pl.Utf8).to_list() if with_title and "title" in df.columns else [None] * len(ids)
    out: dict[str, str] = {}
    for did, title, text in zip(ids, titles, texts):
        t = (title or "").strip()
        out[did] = f"{t} {text}".strip() if t else text.strip()
    return out


def read_beir_files(corpus: Path, queries: Path, qrels: Path, *, doc_title: bool = True):
    """Parse a BEIR triple -> ``(queries {qid: text}, corpus {did: text}, rows)`` where ``rows`` are
    the qrels as ``(qid, did, gain, line)`` in file order (line 1 = the header). No policy: the
    caller decides what a qrel with a missing query or document means."""
    corpus_d = read_id_texts(corpus, with_title=doc_title)
    queries_d = read_id_texts(queries)
    cols = read_tsv(qrels, ("query-id", "corpus-id", "score"))
    gains = parse_floats(qrels, "score", cols["score"])
    rows = [(q, d, float(g), i + 2) for i, (q, d, g) in enumerate(zip(cols["query-id"], cols["corpus-id"], gains))]
    return queries_d, corpus_d, rows


def read_beir(folder: Path, *, doc_title: bool = True):
    """Load a BEIR evaluation folder -> ``(queries {qid: text}, corpus {did: text}, qrels {qid: {did: gain}})``.

    Only qrels with gain > 0 are kept, and only queries that have one are returned. A qrels
    document missing from the corpus is an error.
    """
    folder = Path(folder)
    corpus_p = folder / "corpus.jsonl"
    if not corpus_p.is_file() and (folder.parent / "corpus.jsonl").is_file():
        corpus_p = folder.parent / "corpus.jsonl"  # a split folder (scifact/train) shares its parent's corpus
    queries, corpus, rows = read_beir_files(corpus_p, folder / "queries.jsonl", folder / "qrels.tsv", doc_title=doc_title)
    qrels: dict[str, dict[str, float]] = {}
    for qid, did, g, line in rows:
        if g <= 0:
            continue
        if did not in corpus:
            raise DataFileError(f"{folder / 'qrels.tsv'}:{line}: corpus-id {did!r} is not in corpus.jsonl; fix the qrels or the corpus")
        if qid in queries:
            qrels.setdefault(qid, {})[did] = g
    queries = {q: t for q, t in queries.items() if q in qrels}
    if not queries:
        raise DataFileError(f"{folder}: no query in queries.jsonl has a qrel with score > 0; check qrels.tsv query-ids")
    return queries, corpus, qrels
