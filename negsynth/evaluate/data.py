"""Readers for the benchmark file formats (see ``shared/data/README.md``).

Every reader checks the header and the field count of each line and raises
:class:`EvalDataError` (a ``ValueError``) with one line naming the file, the line or column
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


class EvalDataError(NegsynthError, ValueError):
    """A benchmark file is unreadable or malformed (message: file, line/field, fix)."""


def read_tsv(path: Path, required: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """Read a headed TSV into ``{column: [values]}`` for the ``required`` header names.

    Fields are split on tabs only (``QUOTE_NONE``: quotes are part of the text).
    """
    path = Path(path)
    try:
        fh = path.open(encoding="utf-8", newline="")
    except OSError as e:
        raise EvalDataError(f"{path}: cannot open ({e.strerror}); check the data dir") from None
    with fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            header = next(reader)
        except StopIteration:
            raise EvalDataError(f"{path}: empty file; expected a header line with {'/'.join(required)}") from None
        except UnicodeDecodeError as e:
            raise EvalDataError(f"{path}: not UTF-8 ({e.reason}); re-encode the file as UTF-8") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise EvalDataError(
                f"{path}: header {header!r} lacks column(s) {missing}; the first line must name the columns (tab-separated)"
            )
        idx = [header.index(c) for c in required]
        out: dict[str, list[str]] = {c: [] for c in required}
        try:
            for lineno, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) != len(header):
                    raise EvalDataError(
                        f"{path}:{lineno}: {len(row)} tab-separated fields, the header has {len(header)}; "
                        "remove stray tabs inside the text"
                    )
                for c, i in zip(required, idx):
                    out[c].append(row[i])
        except UnicodeDecodeError as e:
            raise EvalDataError(f"{path}: not UTF-8 ({e.reason}); re-encode the file as UTF-8") from None
    return out


def parse_floats(path: Path, column: str, values: list[str]) -> np.ndarray:
    """Column values -> float64 array; a non-number names its line (header = line 1)."""
    out = np.empty(len(values), dtype=np.float64)
    for i, v in enumerate(values):
        try:
            out[i] = float(v)
        except ValueError:
            raise EvalDataError(f"{path}:{i + 2}: column {column!r} holds {v!r}, not a number; fix or drop that line") from None
    return out


def read_jsonl(path: Path, required: tuple[str, ...]) -> list[dict]:
    path = Path(path)
    rows: list[dict] = []
    try:
        fh = path.open(encoding="utf-8")
    except OSError as e:
        raise EvalDataError(f"{path}: cannot open ({e.strerror}); check the data dir") from None
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise EvalDataError(f"{path}:{lineno}: invalid JSON ({e.msg}); each line must be one JSON object") from None
            if not isinstance(obj, dict) or any(k not in obj for k in required):
                raise EvalDataError(f"{path}:{lineno}: needs the fields {list(required)}; add them to that line")
            rows.append(obj)
    return rows


def read_beir(folder: Path, *, doc_title: bool = True):
    """Load a BEIR folder -> ``(queries {qid: text}, corpus {did: text}, qrels {qid: {did: gain}})``.

    Document text is ``title + " " + text`` (the BEIR / sentence-transformers convention) when
    ``doc_title`` and the title is non-empty. Only qrels with gain > 0 are kept, and only
    queries that have one are returned. A qrels document missing from the corpus is an error.
    """
    folder = Path(folder)
    corpus: dict[str, str] = {}
    for d in read_jsonl(folder / "corpus.jsonl", ("_id", "text")):
        title = (d.get("title") or "").strip() if doc_title else ""
        corpus[str(d["_id"])] = f"{title} {d['text']}".strip() if title else str(d["text"])
    queries = {str(q["_id"]): str(q["text"]) for q in read_jsonl(folder / "queries.jsonl", ("_id", "text"))}
    cols = read_tsv(folder / "qrels.tsv", ("query-id", "corpus-id", "score"))
    gains = parse_floats(folder / "qrels.tsv", "score", cols["score"])
    qrels: dict[str, dict[str, float]] = {}
    for i, (qid, did, g) in enumerate(zip(cols["query-id"], cols["corpus-id"], gains)):
        if g <= 0:
            continue
        if did not in corpus:
            raise EvalDataError(f"{folder / 'qrels.tsv'}:{i + 2}: corpus-id {did!r} is not in corpus.jsonl; fix the qrels or the corpus")
        if qid in queries:
            qrels.setdefault(qid, {})[did] = float(g)
    queries = {q: t for q, t in queries.items() if q in qrels}
    if not queries:
        raise EvalDataError(f"{folder}: no query in queries.jsonl has a qrel with score > 0; check qrels.tsv query-ids")
    return queries, corpus, qrels
