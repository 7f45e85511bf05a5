"""Readers of (query, positive[, instruction][, existing negatives]) pairs from public datasets.

``regenerate`` asks the LLM for fresh graded negatives for pairs that already exist. This
module turns one *source spec* (:class:`negsynth.schemas.config.SourceSpec`) into a list of
:class:`Pair` objects, whatever the storage:

========  ===============================================================================
format    what ``path`` is
========  ===============================================================================
beir      a folder with ``corpus.jsonl``, ``queries.jsonl`` and ``qrels.tsv`` (or
          ``qrels/<split>.tsv``, or ``<split>/queries.jsonl`` + ``<split>/qrels.tsv`` with
          the corpus one level up). One pair per qrel with score > 0, so a query with three
          relevant documents yields three pairs. Document text = ``title + " " + text``.
hf        a ``datasets.save_to_disk`` folder (``split`` picks one of a DatasetDict), or a
          hub name such as ``sentence-transformers/natural-questions`` when online.
jsonl     one JSON object per line (``.jsonl``/``.ndjson``, gzipped as ``.jsonl.gz``; ``.json``
          = a JSON array).
parquet   a parquet file.
csv, tsv  a delimited text file with a header row (TSV: no quoting, tabs separate fields);
          ``.csv.gz`` / ``.tsv.gz`` are decompressed as they are read.
========  ===============================================================================

``auto`` (the default) picks the format from the path. For every format except ``beir`` the
columns are mapped by ``columns = {query = "...", positive = "...", instruction = "...",
negatives = "...", id = "..."}``; unmapped roles are looked up under common names (``query``,
``anchor``, ``question``, ``premise``, ``text1``, ``sentence1`` / ``positive``, ``document``,
``answer``, ``hypothesis``, ``text2``, ...). ``filter = {label = "entailment"}`` keeps only the
rows whose column equals the value (or one of a list of values), which turns an NLI file
into (premise, entailed hypothesis) pairs.

Negatives already in the source are kept as ``Pair.negatives`` (they end up in the record's
``meta.source_negatives``) but never shown to the LLM. A missing column or an empty cell
raises :class:`~negsynth.errors.UserError` naming the file, the row and the fix.

Reading is done with polars (``csv``/``tsv``/``jsonl``/``parquet``) and ``datasets`` (``hf``);
there is no hand-written parsing of delimited text. A file whose first bytes say it is something
else (a PDF, a ZIP archive such as a .docx, gzip without ``.gz``, an image) is refused in one line
naming what it is and what to do (:data:`MAGIC`).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from negsynth.errors import UserError

FORMATS = ("auto", "hf", "jsonl", "parquet", "csv", "tsv", "beir")
ROLES = ("query", "positive", "instruction", "negatives", "id")
SPLIT_NAMES = {"train", "test", "dev", "validation", "val", "eval"}

#: names tried, in order, for a role whose column is not given explicitly
COLUMN_GUESSES: dict[str, tuple[str, ...]] = {
    "query": ("query", "anchor", "question", "premise", "text1", "sentence1", "s1", "input", "claim", "title"),
    "positive": ("positive", "pos", "document", "answer", "hypothesis", "text2", "sentence2", "s2", "passage", "response", "context"),
    "instruction": ("instruction", "task"),
    "negatives": ("negatives", "negative", "hard_negatives", "neg"),
    "id": ("id", "_id", "pair_id", "row_id"),
}


@dataclass
class Pair:
    """One (query, positive) pair read from a source, before any LLM call.

    ``source_id`` is ``"<name>:<split>:<row or qid:docid>"`` and is unique within a source;
    ``query_key`` groups the pairs of one query, so that every known positive of a query can be
    excluded when mining negatives; ``row`` is the 0-based data row (after nothing is dropped)
    so errors and metadata can point back into the file.
    """

    query: str
    positive: str
    source: str
    source_id: str
    query_key: str
    row: int
    instruction: str | None = None
    negatives: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class SourceData:
    """Everything read from one source: the pairs and, for mining, a corpus and known positives.

    ``corpus`` and ``positives_by_query`` are only needed to mine negatives: a source read as a
    stream (a ``limit`` on a file) builds them on first use, by reading the file once more."""

    name: str
    split: str
    pairs: list[Pair]
    _corpus: list[str] | None  # candidate documents for --mine (BEIR corpus, or every positive of the source)
    _positives_by_query: dict[str, list[str]] | None  # query_key -> all positive texts the source knows
    total_rows: int  # pairs before limit
    columns: dict[str, str] = field(default_factory=dict)  # role -> column actually used
    skipped_rows: int = 0  # rows dropped by skip_invalid
    #: builds ``(corpus, positives_by_query)`` when they were not read up front
    mining_loader: Callable[[], tuple[list[str], dict[str, list[str]]]] | None = None
    extra_corpus: str | None = None  # a separate mining corpus (SourceSpec.corpus), merged in on use

    def _mining(self) -> None:
        if self._corpus is None or self._positives_by_query is None:
            self._corpus, self._positives_by_query = self.mining_loader()  # type: ignore[misc]
        if self.extra_corpus is not None:
            self._corpus = list(dict.fromkeys(_mining_corpus(self.extra_corpus) + self._corpus))
            self.extra_corpus = None

    @property
    def corpus(self) -> list[str]:
        self._mining()
        return self._corpus  # type: ignore[return-value]

    @corpus.setter
    def corpus(self, value: list[str]) -> None:
        self._corpus = value

    @property
    def positives_by_query(self) -> dict[str, list[str]]:
        self._mining()
        return self._positives_by_query  # type: ignore[return-value]


# -- format and name detection --------------------------------------------------------------
def detect_format(path: str) -> str:
    """Pick the format of ``path`` from its shape: folder layout or file suffix."""
    p = Path(path)
    if p.is_dir():
        if (p / "qrels.tsv").exists() or (p / "qrels").is_dir() or any((p / s / "qrels.tsv").exists() for s in SPLIT_NAMES):
            return "beir"
        if (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            return "hf"
        raise UserError(
            f"{p}: cannot tell the format of this folder (no qrels.tsv for BEIR, no dataset_info.json/dataset_dict.json for a saved HF dataset); pass --format"
        )
    gz = p.suffix.lower() == ".gz"
    suffix = (Path(p.stem).suffix if gz else p.suffix).lower()
    for fmt, sufs in (
        ("jsonl", (".jsonl", ".ndjson") if gz else (".jsonl", ".ndjson", ".json")),
        ("parquet", () if gz else (".parquet", ".pq")),
        ("csv", (".csv",)),
        ("tsv", (".tsv", ".tab")),
    ):
        if suffix in sufs:
            return fmt
    if p.exists():
        kind = "".join(p.suffixes[-2:]) if gz else p.suffix
        raise UserError(
            f"{p}: unknown file type {kind!r}; convert it to JSONL, CSV or parquet (.gz for JSONL / CSV), or pass --format jsonl|parquet|csv|tsv"
        )
    if "/" in path and not path.startswith(("/", ".", "~")) and path.count("/") == 1:
        return "hf"  # looks like a hub name: owner/dataset
    raise UserError(f"{p}: no such file or folder; check the path (hub datasets are given as owner/name)")


def default_name(path: str, fmt: str) -> str:
    """Source name from the path: the folder or file stem, skipping split-like names (``snli/test.tsv`` -> ``snli``)."""
    p = Path(path)
    parts = [p.name if (fmt in ("beir", "hf") or p.is_dir()) else p.stem.split(".")[0]]
    parent = p.parent
    while parts[-1].lower() in SPLIT_NAMES | {"qrels", "data", ""} and parent.name:
        parts.append(parent.name)
        parent = parent.parent
    return parts[-1].lower()


def default_split(path: str, fmt: str, split: str | None) -> str:
    if split:
        return split
    p = Path(path)
    if fmt == "beir":
        return p.name if p.name.lower() in SPLIT_NAMES else "test"
    stem = p.stem.split(".")[0].lower()
    return stem if stem in SPLIT_NAMES else "all"


# -- tabular sources (jsonl / parquet / csv / tsv / hf) ---------------------------------------
def read_frame(path: str, fmt: str, split: str | None):
    """Return ``(polars.DataFrame, line_offset)``: line_offset turns a 0-based row into a file line."""
    import polars as pl

    p = Path(path)
    if fmt != "hf" and not p.is_file():
        raise UserError(f"{p}: file not found; check --input")
    sniff(p, fmt)
    if is_gzip(p) and fmt in ("jsonl", "csv", "tsv"):  # the same batched reader, gathered
        frames = list(iter_frames(p, fmt))
        return (pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()), (1 if fmt == "jsonl" else 2)
    try:
        if fmt == "csv":
            return pl.read_csv(p, infer_schema=False), 2
        if fmt == "tsv":
            return pl.read_csv(p, separator="\t", quote_char=None, infer_schema=False), 2
        if fmt == "parquet":
            return pl.read_parquet(p), 0
        if fmt == "jsonl":
            if p.suffix.lower() == ".json":
                return pl.read_json(p), 0
            return pl.read_ndjson(p, infer_schema_length=None), 1
        if fmt == "hf":
            return _read_hf(path, split), 0
    except UserError:
        raise
    except Exception as e:  # polars raises many error types; keep the first line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{p}: cannot read as {fmt} ({msg}); check the file or pass the right --format") from None
    raise UserError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")


_SNIFF = 64 * 1024

#: the opening bytes of files that are not text tables, and what to do with each
MAGIC: tuple[tuple[bytes, str, str], ...] = (
    (b"%PDF-", "a PDF file", "name it .pdf (the corpus stage reads PDF text: pip install 'negsynth[pdf]')"),
    (b"PK\x03\x04", "a ZIP archive (.zip, .docx, .xlsx, .odt?)", "convert it to JSONL with a 'text' field, or to .txt / .md files"),
    (b"\x1f\x8b", "gzip-compressed", "name it .jsonl.gz / .csv.gz / .tsv.gz so it is decompressed"),
    (b"PAR1", "a parquet file", "name it .parquet or pass --format parquet"),
    (b"\xd0\xcf\x11\xe0", "an old Office document (.doc, .xls?)", "convert it to JSONL with a 'text' field, or to CSV"),
    (b"\x89PNG", "a PNG image", "remove it from the input"),
    (b"\xff\xd8\xff", "a JPEG image", "remove it from the input"),
)


def is_gzip(p: Path) -> bool:
    return p.suffix.lower() == ".gz"


def open_text_file(p: Path):
    """``p`` opened for binary reading, decompressed when its name ends in ``.gz``."""
    if is_gzip(p):
        import gzip

        return gzip.open(p, "rb")
    return open(p, "rb")


def sniff(p: Path, fmt: str) -> None:
    """Refuse, after reading at most 64 KiB, a file that cannot be what ``fmt`` says: a PDF, a ZIP
    archive (a .docx), an image or any file whose magic bytes say what it is, NUL bytes in a text
    format (a binary file, a zeroed disk), a parquet file without its magic."""
    if fmt not in ("jsonl", "csv", "tsv", "parquet"):
        return
    try:
        with open_text_file(p) as f:
            head = f.read(_SNIFF)
    except OSError as e:  # gzip's BadGzipFile is an OSError too
        raise UserError(f"{p}: cannot read it ({getattr(e, 'strerror', None) or e}); check --input") from None
    except EOFError:
        raise UserError(f"{p}: the gzip stream ends early (a truncated file?); check --input") from None
    if fmt == "parquet":
        if head[:4] != b"PAR1":
            raise UserError(f"{p}: not a parquet file (it does not start with PAR1); pass the right --format or fix --input")
        return
    for magic, what, fix in MAGIC:
        if head.startswith(magic):
            raise UserError(f"{p}: is {what}, not {fmt} text; {fix}")
    if b"\x00" in head:
        raise UserError(
            f"{p}: holds NUL bytes in its first 64 KiB, so it is not {fmt} text (a binary file?); pass the right --format or fix --input"
        )


def _read_hf(path: str, split: str | None):
    import datasets
    import polars as pl

    p = Path(path)
    if p.exists():
        try:
            ds = datasets.load_from_disk(str(p))
        except FileNotFoundError as e:
            raise UserError(f"{p}: not a datasets.save_to_disk folder ({e}); pass --format for other files") from None
    else:
        if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
            raise UserError(
                f"{path}: not a local path and the hub is offline (HF_HUB_OFFLINE=1); save the dataset with datasets.save_to_disk and pass that folder"
            )
        try:
            ds = datasets.load_dataset(path, split=split or "train")
        except Exception as e:
            raise UserError(
                f"{path}: cannot load from the hub ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check the name and --split"
            ) from None
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds.keys())
        if split is None and len(names) == 1:
            split = names[0]
        if split not in ds:
            raise UserError(f'{p}: has splits {", ".join(names)}; pick one with --split (or split = "..." in the source spec)')
        ds = ds[split]
    return pl.from_arrow(ds.data.table)


def _resolve_columns(df_cols: Sequence[str], mapping: dict[str, str], where: str) -> dict[str, str]:
    """Role -> column: explicit mapping first, then the common names; query and positive are required."""
    out: dict[str, str] = {}
    lower = {c.lower(): c for c in df_cols}
    for role in ROLES:
        want = mapping.get(role)
        if want:
            if want not in df_cols:
                flag = {"query": "--query-col", "positive": "--positive-col", "instruction": "--instruction-col"}.get(
                    role, f"columns.{role}"
                )
                raise UserError(f"{where}: no column {want!r} for the {role} (columns: {', '.join(df_cols)}); fix {flag}")
            out[role] = want
            continue
        for guess in COLUMN_GUESSES[role]:
            if guess in lower and lower[guess] not in out.values():
                out[role] = lower[guess]
                break
    for role, flag in (("query", "--query-col"), ("positive", "--positive-col")):
        if role not in out:
            raise UserError(
                f"{where}: no {role} column found (columns: {', '.join(df_cols)}); name it with {flag} COLUMN (or columns.{role} in the source spec)"
            )
    return out


def _apply_filter(df, flt: dict[str, Any], where: str):
    import polars as pl

    for col, val in flt.items():
        if col not in df.columns:
            cols = ", ".join(c for c in df.columns if c != "__row__")  # our row number is not the user's column
            raise UserError(f"{where}: filter column {col!r} does not exist (columns: {cols}); fix --filter / filter")
        vals = val if isinstance(val, list) else [val]
        df = df.filter(pl.col(col).cast(pl.Utf8).is_in([str(v) for v in vals]))
    return df


def _as_list(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        s = v.strip()
        if s.startswith("["):
            try:
                parsed = json.loads(s)
                if isinstance(parsed, list):
                    return [str(x) for x in parsed if x is not None and str(x).strip()]
            except json.JSONDecodeError:
                pass
        return [s] if s else []
    if isinstance(v, (list, tuple)):
        return [str(x) for x in v if x is not None and str(x).strip()]
    return [str(v)]


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, (list, dict)):
        return None
    s = str(v).strip()
    return s or None


def _row_pair(rec: dict, cols: dict[str, str], name: str, split: str, row: int, q: str, pos: str) -> Pair:
    """The pair of one table row (``row``: 0-based file row) with its query ``q`` and positive ``pos``."""
    rid = _text(rec[cols["id"]]) if "id" in cols else None
    return Pair(
        query=q,
        positive=pos,
        source=name,
        source_id=f"{name}:{split}:{rid if rid is not None else row}",
        query_key=q,
        row=row,
        instruction=_text(rec[cols["instruction"]]) if "instruction" in cols else None,
        negatives=_as_list(rec[cols["negatives"]]) if "negatives" in cols else [],
        meta={"row": row},
    )


def _invalid_row(where: str, row: int, line_offset: int, cols: dict[str, str], bad: str) -> UserError:
    """The one line for a row whose ``bad`` column (query or positive) is empty."""
    loc = f"{where}: row {row + 1}" + (f" (line {row + line_offset})" if line_offset else "")
    flag = "--query-col" if bad == "query" else "--positive-col"
    return UserError(
        f"{loc}: column {cols[bad]!r} ({bad}) is empty or missing; fill or delete that row, map another column with {flag}, or set skip_invalid = true"
    )


def read_tabular(spec, fmt: str, name: str, split: str) -> SourceData:
    """Read a jsonl / parquet / csv / tsv / hf source into pairs (see the module docstring)."""
    where = spec.path
    df, line_offset = read_frame(spec.path, fmt, spec.split)
    # filtering would renumber rows: keep the original 0-based row number for error messages
    import polars as pl

    df = df.with_row_index("__row__")
    cols = _resolve_columns([c for c in df.columns if c != "__row__"], dict(spec.columns), where)
    df = _apply_filter(df, dict(spec.filter), where)
    if df.height == 0:
        raise UserError(f"{where}: no rows left after filter {dict(spec.filter)}; check the filter values (e.g. --filter label=entailment)")
    pairs: list[Pair] = []
    skipped = 0
    keep = ["__row__"] + sorted(set(cols.values()))
    for rec in df.select([pl.col(c) for c in keep]).iter_rows(named=True):
        row = int(rec["__row__"])
        q, pos = _text(rec[cols["query"]]), _text(rec[cols["positive"]])
        bad = "query" if q is None else "positive" if pos is None else None
        if bad:
            if spec.skip_invalid:
                skipped += 1
                continue
            raise _invalid_row(where, row, line_offset, cols, bad)
        pairs.append(_row_pair(rec, cols, name, split, row, q, pos))
    by_q: dict[str, list[str]] = {}
    for p in pairs:
        by_q.setdefault(p.query_key, [])
        if p.positive not in by_q[p.query_key]:
            by_q[p.query_key].append(p.positive)
    corpus = list(dict.fromkeys(p.positive for p in pairs))
    return SourceData(name, split, pairs, corpus, by_q, len(pairs), cols, skipped)


# -- BEIR -----------------------------------------------------------------------------------
def _beir_paths(folder: Path, split: str | None) -> tuple[Path, Path, Path]:
    """(corpus.jsonl, queries.jsonl, qrels.tsv) for a BEIR folder and optional split."""
    cands: list[tuple[Path, Path, Path]] = []
    if split:
        cands += [
            (folder / "corpus.jsonl", folder / split / "queries.jsonl", folder / split / "qrels.tsv"),
            (folder / "corpus.jsonl", folder / "queries.jsonl", folder / "qrels" / f"{split}.tsv"),
        ]
    cands += [
        (folder / "corpus.jsonl", folder / "queries.jsonl", folder / "qrels.tsv"),
        (folder.parent / "corpus.jsonl", folder / "queries.jsonl", folder / "qrels.tsv"),  # path = <beir>/<split>
    ]
    for c in cands:
        if all(p.is_file() for p in c):
            return c
    tried = "; ".join(f"{c[1]} + {c[2]}" for c in cands[:2])
    raise UserError(
        f"{folder}: not a BEIR folder for split {split or '(none)'}: need corpus.jsonl, queries.jsonl and qrels.tsv (tried {tried}); fix --input or --split"
    )


def read_beir_pairs(spec, name: str, split: str) -> SourceData:
    """One pair per (query, relevant document) with qrels score > 0 (files parsed by the shared
    :func:`negsynth.data.readers.read_beir_files`; empty documents are left out)."""
    from negsynth.data.readers import read_beir_files

    corpus_p, queries_p, qrels_p = _beir_paths(Path(spec.path), spec.split)
    queries, all_docs, rows = read_beir_files(corpus_p, queries_p, qrels_p)
    corpus = {d: t for d, t in all_docs.items() if t}
    queries = {q: t.strip() for q, t in queries.items()}
    pairs: list[Pair] = []
    by_q: dict[str, list[str]] = {}
    skipped = 0
    for i, (qid, did, gain, line) in enumerate(rows):
        loc = f"{qrels_p}: row {i + 1} (line {line})"
        if gain <= 0:
            continue
        if qid not in queries or not queries[qid]:
            if spec.skip_invalid:
                skipped += 1
                continue
            raise UserError(f"{loc}: query-id {qid!r} has no text in {queries_p}; add it there, drop the qrel, or set skip_invalid = true")
        if did not in corpus:
            if spec.skip_invalid:
                skipped += 1
                continue
            raise UserError(f"{loc}: corpus-id {did!r} has no text in {corpus_p}; add it there, drop the qrel, or set skip_invalid = true")
        by_q.setdefault(qid, []).append(corpus[did])
        pairs.append(
            Pair(
                query=queries[qid],
                positive=corpus[did],
                source=name,
                source_id=f"{name}:{split}:{qid}:{did}",
                query_key=qid,
                row=i,
                meta={"query_id": qid, "doc_id": did, "qrel_score": gain},
            )
        )
    if not pairs:
        raise UserError(f"{qrels_p}: no qrel with score > 0 whose query and document exist; check the ids")
    return SourceData(name, split, pairs, list(corpus.values()), by_q, len(pairs), {}, skipped)


# -- entry point ----------------------------------------------------------------------------
def _mining_corpus(path: str) -> list[str]:
    """A separate mining corpus: JSONL with ``text`` (and optional ``title``), or plain text, one document a line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: corpus file not found; fix corpus in the source spec")
    if p.suffix.lower() in (".jsonl", ".ndjson"):
        from negsynth.data.readers import read_jsonl_frame

        df = read_jsonl_frame(p, ("text",))
        titles = df["title"].to_list() if "title" in df.columns else [None] * df.height
        return [f"{(t or '').strip()} {x}".strip() if (t or "").strip() else str(x) for t, x in zip(titles, df["text"].to_list()) if x]
    return [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]


def select(pairs: list[Pair], limit: int | None, seed: int | None) -> list[Pair]:
    """At most ``limit`` pairs: a seeded random sample kept in file order (``seed`` None or < 0: the first ones)."""
    if limit is None or limit >= len(pairs):
        return list(pairs)
    if seed is None or seed < 0:
        return pairs[:limit]
    idx = sorted(random.Random(f"{seed}:select").sample(range(len(pairs)), limit))
    return [pairs[i] for i in idx]


def load_source(spec) -> SourceData:
    """Read one :class:`~negsynth.schemas.config.SourceSpec`; ``pairs`` is already limited."""
    fmt = spec.format if spec.format != "auto" else detect_format(spec.path)
    name = spec.name or default_name(spec.path, fmt)
    split = default_split(spec.path, fmt, spec.split)
    if fmt == "beir":
        if spec.columns or spec.filter:
            raise UserError(
                f"{spec.path}: columns/filter do not apply to BEIR folders (pairs come from qrels.tsv); drop them or use --format jsonl"
            )
        data = read_beir_pairs(spec, name, split)
    elif spec.limit is not None and streamable(spec.path, fmt):
        data = read_tabular_stream(spec, fmt, name, split)
    else:
        data = read_tabular(spec, fmt, name, split)
    if spec.corpus:
        data.extra_corpus = spec.corpus
    data.pairs = select(data.pairs, spec.limit, spec.seed)
    return data


# -- streaming: a limit on a large file -------------------------------------------------------
#: bytes of a text file parsed at a time; one line may be at most _MAX_LINE
_CHUNK = 8 << 20
_MAX_LINE = 64 << 20


def streamable(path: str, fmt: str) -> bool:
    """A file read in bounded batches: JSON lines, CSV/TSV, parquet (not a ``.json`` array, not hf)."""
    return fmt in ("jsonl", "csv", "tsv", "parquet") and not (fmt == "jsonl" and Path(path).suffix.lower() == ".json")


def _text_blocks(p: Path) -> Iterator[bytes]:
    """The file in blocks of whole lines (about _CHUNK bytes each), never holding more than one
    block and one line: a file without line breaks is refused instead of read whole."""
    with open_text_file(p) as f:
        carry = b""
        while True:
            block = f.read(_CHUNK)
            if not block:
                if carry.strip():
                    yield carry
                return
            data = carry + block
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > _MAX_LINE:
                    raise UserError(
                        f"{p}: a line longer than {_MAX_LINE >> 20} MiB; not a line-per-record file, check --input and --format"
                    )
                carry = data
                continue
            carry = data[cut + 1 :]
            yield data[: cut + 1]


def _check_utf8(p: Path, block: bytes, line: int) -> None:
    """One line naming the file line of the first byte of ``block`` (which starts on ``line``)
    that is not UTF-8, if there is one."""
    try:
        block.decode("utf-8")
    except UnicodeDecodeError as e:
        at = line + block.count(b"\n", 0, e.start)
        col = e.start - (block.rfind(b"\n", 0, e.start) + 1) + 1
        raise UserError(
            f"{p}:{at}: not UTF-8 (byte 0x{block[e.start]:02x} at column {col}); re-encode the file as UTF-8 "
            "(e.g. iconv -f latin1 -t utf-8)"
        ) from None


def iter_frames(p: Path, fmt: str) -> Iterator[Any]:
    """polars DataFrames of consecutive rows of the file, each of bounded size."""
    import io

    import polars as pl

    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(p).iter_batches(batch_size=65536):
                yield pl.from_arrow(batch)
            return
        header = b""
        line = 1  # the file line the block starts on
        for i, block in enumerate(_text_blocks(p)):
            start, line = line, line + block.count(b"\n")
            try:
                if fmt == "jsonl":
                    df = pl.read_ndjson(io.BytesIO(block), infer_schema_length=None)
                else:
                    if i == 0:  # CSV/TSV: the header line goes with every block
                        nl = block.find(b"\n")
                        header, block, start = block[: nl + 1], block[nl + 1 :], start + 1
                        if not block.strip():
                            continue
                    sep = {"separator": "\t", "quote_char": None} if fmt == "tsv" else {}
                    df = pl.read_csv(io.BytesIO(header + block), infer_schema=False, **sep)
            except Exception:
                _check_utf8(p, block, start)  # polars names no line (or a wrong one) for a bad byte
                raise
            yield df
    except UserError:
        raise
    except Exception as e:  # polars/pyarrow raise many error types; keep the first line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{p}: cannot read as {fmt} ({msg}); check the file or pass the right --format") from None


def _present(df: Any, col: str) -> Any:
    """Where ``col`` holds what :func:`_text` accepts: a non-blank string or a scalar, vectorised."""
    import polars as pl

    dt = df.schema[col]
    c = pl.col(col)
    if dt == pl.String:
        return c.is_not_null() & (c.str.strip_chars() != "")
    if dt == pl.Null or dt.is_nested() or isinstance(dt, pl.Struct):
        return pl.lit(False)
    return c.is_not_null()


def read_tabular_stream(spec, fmt: str, name: str, split: str) -> SourceData:
    """:func:`read_tabular` with ``spec.limit`` in bounded memory: the file is read in batches,
    once to find the valid rows (the ``limit`` of them ``select`` would pick: the same pairs) and
    once more up to the last picked row; with ``seed < 0`` (the first pairs) reading stops there.
    Only the picked pairs are kept; the mining corpus is read again only when mining asks for it."""
    p = Path(spec.path)
    if not p.is_file():
        raise UserError(f"{p}: file not found; check --input")
    sniff(p, fmt)
    where = spec.path
    line_offset = {"csv": 2, "tsv": 2, "jsonl": 1}.get(fmt, 0)
    state: dict[str, Any] = {}

    def batches() -> Iterator[Any]:
        """Per batch of the file: its rows kept by the filter, with ``__row__`` (the file row) and
        ``__ok__`` (query and positive both non-empty), in file order."""
        import polars as pl

        offset = 0
        for df in iter_frames(p, fmt):
            height = df.height
            df = df.with_row_index("__row__", offset=offset)
            offset += height
            if "cols" not in state:
                state["cols"] = _resolve_columns([c for c in df.columns if c != "__row__"], dict(spec.columns), where)
            cols = state["cols"]
            df = _apply_filter(df, dict(spec.filter), where)
            keep = ["__row__"] + sorted(set(cols.values()))
            for c in keep:  # a column absent from this batch's rows: empty cells
                if c not in df.columns:
                    df = df.with_columns(pl.lit(None).alias(c))
            df = df.select([pl.col(c) for c in keep])
            yield df.with_columns((_present(df, cols["query"]) & _present(df, cols["positive"])).alias("__ok__"))

    def rows() -> Iterator[tuple[int, dict, bool]]:
        for df in batches():
            for rec in df.iter_rows(named=True):
                yield int(rec["__row__"]), rec, bool(rec["__ok__"])

    def pair(row: int, rec: dict) -> Pair:
        cols = state["cols"]
        q, pos = _text(rec[cols["query"]]), _text(rec[cols["positive"]])
        return _row_pair(rec, cols, name, split, row, q, pos)

    def invalid(row: int, rec: dict) -> None:
        cols = state["cols"]
        raise _invalid_row(where, row, line_offset, cols, "query" if _text(rec[cols["query"]]) is None else "positive")

    import polars as pl

    limit = spec.limit
    valid: list[int] = []  # file rows of the valid pairs, in order
    first: list[Pair] = []
    skipped = seen = 0
    for df in batches():
        seen += df.height
        bad = df.filter(~pl.col("__ok__"))
        if bad.height:
            if not spec.skip_invalid:
                rec = bad.row(0, named=True)
                invalid(int(rec["__row__"]), rec)
            skipped += bad.height
        good = df.filter(pl.col("__ok__"))
        if spec.seed < 0:
            for rec in good.head(limit - len(first)).iter_rows(named=True):
                first.append(pair(int(rec["__row__"]), rec))
                valid.append(int(rec["__row__"]))
            if len(first) >= limit:
                break  # the first `limit` pairs: the rest of the file is never read
        else:
            valid.extend(good["__row__"].to_list())
    if seen == 0:
        if spec.filter:
            raise UserError(
                f"{where}: no rows left after filter {dict(spec.filter)}; check the filter values (e.g. --filter label=entailment)"
            )
        raise UserError(f"{where}: holds no rows; check --input")
    if spec.seed < 0:
        pairs = first
    else:
        picked = {
            valid[i]
            for i in (range(len(valid)) if limit >= len(valid) else random.Random(f"{spec.seed}:select").sample(range(len(valid)), limit))
        }
        last = max(picked) if picked else -1
        wanted = sorted(picked)
        pairs = []
        for df in batches():
            for rec in df.filter(pl.col("__row__").is_in(wanted) & pl.col("__ok__")).iter_rows(named=True):
                pairs.append(pair(int(rec["__row__"]), rec))
            if df.height and df["__row__"][-1] >= last:
                break

    def mining() -> tuple[list[str], dict[str, list[str]]]:
        corpus: dict[str, None] = {}
        by_q: dict[str, list[str]] = {}
        for row, rec, ok in rows():
            if not ok:
                continue
            pr = pair(row, rec)
            corpus[pr.positive] = None
            lst = by_q.setdefault(pr.query_key, [])
            if pr.positive not in lst:
                lst.append(pr.positive)
        return list(corpus), by_q

    # total_rows: the valid pairs of the file (with seed < 0, those read before the limit was met)
    return SourceData(name, split, pairs, None, None, len(valid), dict(state["cols"]), skipped, mining_loader=mining)


# -- per-source instructions (spec §1.5; MGH Table 7 = LLM2Vec's E5_EMBEDDING_PROMPTS) --------
@dataclass(frozen=True)
class SourceKind:
    """How one public source is framed: its instruction(s), symmetry and task type.

    Symmetric sources (NLI, Quora duplicates) list two instructions that alternate by row
    (row ``i`` uses ``instructions[i % 2]``, as LLM2Vec's E5 loader does) and get the task type
    ``"sts"`` so that curriculum/trainer group them with the other symmetric data.
    """

    instructions: tuple[str, ...]
    symmetric: bool = False
    task_type: str = "short-long"


_WIKI = "Given a question, retrieve Wikipedia passages that answer the question"
INSTRUCTION_TABLE: dict[str, SourceKind] = {
    "nli": SourceKind(
        ("Given a premise, retrieve a hypothesis that is entailed by the premise", "Retrieve semantically similar text"), True, "sts"
    ),
    "quora": SourceKind(
        (
            "Given a question, retrieve questions that are semantically equivalent to the given question",
            "Find questions that have the same meaning as the input question",
        ),
        True,
        "sts",
    ),
    "dureader": SourceKind(("Given a Chinese search query, retrieve web passages that answer the question",)),
    "t2ranking": SourceKind(("Given a Chinese search query, retrieve web passages that answer the question",)),
    "eli5": SourceKind(("Provided a user question, retrieve the highest voted answers on Reddit ELI5 forum",)),
    "fever": SourceKind(("Given a claim, retrieve documents that support or refute the claim",)),
    "hotpotqa": SourceKind(("Given a multi-hop question, retrieve documents that can help answer the question",)),
    "miracl": SourceKind((_WIKI,)),
    "mrtydi": SourceKind((_WIKI,)),
    "nq": SourceKind((_WIKI,)),
    "msmarco_passage": SourceKind(("Given a web search query, retrieve relevant passages that answer the query",)),
    "msmarco_document": SourceKind(("Given a web search query, retrieve relevant documents that answer the query",)),
    "squad": SourceKind(("Retrieve Wikipedia passages that answer the question",)),
    "triviaqa": SourceKind(("Retrieve Wikipedia passages that answer the question",)),
    # not in Table 7: the instruction E5-mistral uses for SciFact in its BEIR evaluation
    "scifact": SourceKind(("Given a scientific claim, retrieve documents that support or refute the claim",)),
}
#: other spellings of the table's keys
ALIASES = {
    "snli": "nli",
    "mnli": "nli",
    "allnli": "nli",
    "multinli": "nli",
    "sick": "nli",
    "quora_duplicates": "quora",
    "qqp": "quora",
    "quora_duplicate_questions": "quora",
    "msmarco": "msmarco_passage",
    "ms_marco": "msmarco_passage",
    "msmarco_doc": "msmarco_document",
    "natural_questions": "nq",
    "naturalquestions": "nq",
    "mr_tydi": "mrtydi",
    "trivia_qa": "triviaqa",
    "hotpot_qa": "hotpotqa",
    "squad_v2": "squad",
}
DEFAULT_KIND = SourceKind(("Given a query, retrieve relevant documents that answer the query",))


def source_key(name: str) -> str:
    k = name.lower().replace("-", "_").replace(" ", "_")
    return ALIASES.get(k, k)


def source_kind(name: str, overrides: dict[str, Any] | None = None, default: SourceKind = DEFAULT_KIND) -> tuple[SourceKind, bool]:
    """The :class:`SourceKind` of a source name and whether it came from the table (else ``default``).

    ``overrides`` (``regenerate.instructions`` in the run file) maps a source name to one
    instruction or a list of instructions that alternate; it wins over the table.
    """
    key = source_key(name)
    base = INSTRUCTION_TABLE.get(key)
    found = base is not None
    base = base or default
    if overrides:
        for k, v in overrides.items():
            if source_key(k) == key:
                ins = (v,) if isinstance(v, str) else tuple(v)
                return SourceKind(ins, base.symmetric, base.task_type), True
    return base, found
