"""Readers of (query, positive[, instruction][, negatives]) pairs from public datasets, for ``regenerate``.

One :class:`~negsynth.schemas.config.SourceSpec` becomes :class:`Pair` s. ``format``: ``beir`` (a
folder with ``corpus.jsonl``, ``queries.jsonl`` and ``qrels.tsv``, or ``qrels/<split>.tsv``, or
``<split>/`` with the corpus one level up: one pair per qrel with score > 0), ``hf`` (a
``save_to_disk`` folder or, online, a hub name), ``jsonl`` (``.json``: an array), ``parquet``,
``csv`` / ``tsv`` (``.gz`` too), or ``auto`` from the path. Table columns are mapped by
``columns = {query, positive, instruction, negatives, id}`` or guessed from common names
(:data:`COLUMN_GUESSES`); ``filter = {label = "entailment"}`` keeps matching rows (an NLI file
becomes premise -> entailed hypothesis pairs).

A source's own negatives are kept (``meta.source_negatives``) but never shown to the LLM. Reading
is polars and ``datasets``; a ``limit`` on a large file reads it in bounded batches
(:func:`read_tabular_stream`). A missing column, an empty cell or a binary file is one
:class:`~negsynth.errors.UserError` naming the file, the row and the fix.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from negsynth.data.tables import iter_frames, read_frame, resolve_columns, sniff, streamable
from negsynth.errors import UserError

SPLIT_NAMES = {"train", "test", "dev", "validation", "val", "eval"}

#: names tried, in order, for a role whose column is not given explicitly
COLUMN_GUESSES: dict[str, tuple[str, ...]] = {
    "query": ("query", "anchor", "question", "premise", "text1", "sentence1", "s1", "input", "claim", "title"),
    "positive": ("positive", "pos", "document", "answer", "hypothesis", "text2", "sentence2", "s2", "passage", "response", "context"),
    "instruction": ("instruction", "task"),
    "negatives": ("negatives", "negative", "hard_negatives", "neg"),
    "id": ("id", "_id", "pair_id", "row_id"),
}
#: the roles regenerate names with --ROLE-col
_FLAGS = {"query", "positive", "instruction", "negatives"}


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
        if is_hf_folder(p):
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


def is_hf_folder(p: Path) -> bool:
    """Whether folder ``p`` is a dataset saved by ``datasets``' ``save_to_disk``."""
    return any((p / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json"))


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
    if v is None or isinstance(v, (list, dict)):
        return None
    s = str(v).strip()
    return s or None


def _invalid_row(where: str, row: int, line_offset: int, cols: dict[str, str], bad: str) -> UserError:
    """The one line for a row whose ``bad`` column (query or positive) is empty."""
    loc = f"{where}: row {row + 1}" + (f" (line {row + line_offset})" if line_offset else "")
    flag = "--query-col" if bad == "query" else "--positive-col"
    return UserError(
        f"{loc}: column {cols[bad]!r} ({bad}) is empty or missing; fill or delete that row, map another column with {flag}, or set skip_invalid = true"
    )


def read_tabular(spec, fmt: str, name: str, split: str) -> SourceData:
    """Read a jsonl / parquet / csv / tsv / hf source into pairs, the whole table at once."""
    table = _Table(spec, fmt, name, split, whole=True)
    _, pairs, skipped = table.scan(keep=None)
    return SourceData(name, split, pairs, *_known_positives(pairs), len(pairs), dict(table.cols), skipped)


def _known_positives(pairs: Iterable[Pair]) -> tuple[list[str], dict[str, list[str]]]:
    """The mining corpus (every distinct positive, in order) and each query's known positives."""
    corpus: dict[str, None] = {}
    by_q: dict[str, list[str]] = {}
    for p in pairs:
        corpus[p.positive] = None
        known = by_q.setdefault(p.query_key, [])
        if p.positive not in known:
            known.append(p.positive)
    return list(corpus), by_q


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


def select(items: list, limit: int | None, seed: int | None) -> list:
    """At most ``limit`` of ``items`` (pairs, or their file rows): a seeded random sample kept in
    order (``seed`` None or < 0: the first ones)."""
    if limit is None or limit >= len(items):
        return list(items)
    if seed is None or seed < 0:
        return items[:limit]
    idx = sorted(random.Random(f"{seed}:select").sample(range(len(items)), limit))
    return [items[i] for i in idx]


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
    The mining corpus is read again only when mining asks for it."""
    p = Path(spec.path)
    if not p.is_file():
        raise UserError(f"{p}: file not found; check --input")
    sniff(p, fmt)
    table = _Table(spec, fmt, name, split)
    first = spec.seed < 0
    valid, pairs, skipped = table.scan(keep=spec.limit if first else 0)
    if not first:
        pairs = table.read_rows(select(valid, spec.limit, spec.seed))  # the rows of the pairs select picks: valid is in file order
    # total_rows: the valid pairs of the file (with seed < 0, those read before the limit was met)
    return SourceData(name, split, pairs, None, None, len(valid), dict(table.cols), skipped, mining_loader=table.mining)


class _Table:
    """One table file of pairs, read as often as needed: in batches (``whole``: at once, any
    format), its columns resolved from the first, the filter applied to each."""

    def __init__(self, spec, fmt: str, name: str, split: str, whole: bool = False):
        self.spec, self.fmt, self.name, self.split, self.whole = spec, fmt, name, split, whole
        self.where = spec.path
        self.line_offset = {"csv": 2, "tsv": 2, "jsonl": 1}.get(fmt, 0)
        self.cols: dict[str, str] | None = None  # role -> column, from the first batch

    def frames(self) -> Iterator[Any]:
        if self.whole:
            df, self.line_offset = read_frame(self.spec.path, self.fmt, self.spec.split)
            yield df
        else:
            yield from iter_frames(Path(self.spec.path), self.fmt)

    def batches(self) -> Iterator[Any]:
        """Per batch of the file: its rows kept by the filter, with ``__row__`` (the file row) and
        ``__ok__`` (query and positive both non-empty), in file order."""
        import polars as pl

        offset = 0
        for df in self.frames():
            height = df.height
            df = df.with_row_index("__row__", offset=offset)
            offset += height
            if self.cols is None:
                names = [c for c in df.columns if c != "__row__"]
                self.cols = resolve_columns(names, dict(self.spec.columns), COLUMN_GUESSES, ("query", "positive"), _FLAGS, self.where)
            cols = self.cols
            df = _apply_filter(df, dict(self.spec.filter), self.where)
            keep = ["__row__"] + sorted(set(cols.values()))
            for c in keep:  # a column absent from this batch's rows: empty cells
                if c not in df.columns:
                    df = df.with_columns(pl.lit(None).alias(c))
            df = df.select([pl.col(c) for c in keep])
            yield df.with_columns((_present(df, cols["query"]) & _present(df, cols["positive"])).alias("__ok__"))

    def pair(self, row: int, rec: dict) -> Pair:
        """The pair of one table row (``row``: 0-based file row)."""
        cols = self.cols
        q = _text(rec[cols["query"]])
        rid = _text(rec[cols["id"]]) if "id" in cols else None
        return Pair(
            query=q,
            positive=_text(rec[cols["positive"]]),
            source=self.name,
            source_id=f"{self.name}:{self.split}:{rid if rid is not None else row}",
            query_key=q,
            row=row,
            instruction=_text(rec[cols["instruction"]]) if "instruction" in cols else None,
            negatives=_as_list(rec[cols["negatives"]]) if "negatives" in cols else [],
            meta={"row": row},
        )

    def scan(self, keep: int | None) -> tuple[list[int], list[Pair], int]:
        """The file rows of the valid pairs, in order, the pairs built (``keep``: all of them with
        None, none with 0, else the first ``keep``, and reading stops there) and the rows skipped
        as invalid (an invalid row is an error unless ``skip_invalid``)."""
        import polars as pl

        spec = self.spec
        valid: list[int] = []
        pairs: list[Pair] = []
        skipped = seen = 0
        for df in self.batches():
            seen += df.height
            bad = df.filter(~pl.col("__ok__"))
            if bad.height:
                if not spec.skip_invalid:
                    rec = bad.row(0, named=True)
                    cols = self.cols
                    bad_role = "query" if _text(rec[cols["query"]]) is None else "positive"
                    raise _invalid_row(self.where, int(rec["__row__"]), self.line_offset, cols, bad_role)
                skipped += bad.height
            good = df.filter(pl.col("__ok__"))
            if keep:
                good = good.head(keep - len(pairs))
            if keep != 0:
                pairs += [self.pair(int(rec["__row__"]), rec) for rec in good.iter_rows(named=True)]
            valid.extend(good["__row__"].to_list())
            if keep and len(pairs) >= keep:
                break  # the first `keep` pairs: the rest of the file is never read
        if seen == 0:
            if spec.filter:
                raise UserError(
                    f"{self.where}: no rows left after filter {dict(spec.filter)}; check the filter values (e.g. --filter label=entailment)"
                )
            raise UserError(f"{self.where}: holds no rows; check --input")
        return valid, pairs, skipped

    def read_rows(self, wanted: list[int]) -> list[Pair]:
        """The second pass: the pairs of the ``wanted`` file rows (sorted), reading no further
        than the last of them."""
        import polars as pl

        last = wanted[-1] if wanted else -1
        pairs = []
        for df in self.batches():
            for rec in df.filter(pl.col("__row__").is_in(wanted) & pl.col("__ok__")).iter_rows(named=True):
                pairs.append(self.pair(int(rec["__row__"]), rec))
            if df.height and df["__row__"][-1] >= last:
                break
        return pairs

    def mining(self) -> tuple[list[str], dict[str, list[str]]]:
        """The mining corpus (every distinct positive) and each query's known positives, read
        from the whole file again: only when mining asks for them."""
        return _known_positives(
            self.pair(int(rec["__row__"]), rec) for df in self.batches() for rec in df.iter_rows(named=True) if rec["__ok__"]
        )
