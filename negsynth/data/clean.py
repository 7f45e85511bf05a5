"""Data cleaning for ``score``: near-duplicate examples and overlap with evaluation sets.

Both compare the texts as written, by :func:`~negsynth.data.text.text_key` equality or by the
cosine of the ``score`` embedder's unit vectors (``>= threshold``):

* **Near-duplicates** (:class:`Deduplicator`): two examples are duplicates when their queries
  match AND their positives match (one query with two relevant documents is kept); the first in
  input order stays. The kept vectors are float16; with a ``spill_dir`` all but the last
  :data:`SPILL_ROWS` go to a file read back in chunks, so memory stays flat. Each new example is
  screened against every kept one: O(N^2 * dim), fine to ~1M examples.
* **Decontamination** (:class:`Decontaminator`): an example whose query, positive or any negative
  matches a text ``negsynth evaluate`` scores (:func:`load_eval_texts`) is dropped.

Determinism: vectors are rounded to float16 (their stored form) before any comparison, float32
products only *screen* candidates (``>= threshold - SCREEN_MARGIN``), and each decision is a
float64 dot product rounded to 6 decimals, so it does not depend on block sizes or on where a run
resumed.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from negsynth.data.text import text_key
from negsynth.errors import NegsynthError

#: float32 screening may be off by ~1e-6 for unit float16 vectors; candidates within this margin are re-checked in float64
SCREEN_MARGIN = 1e-4
#: cells of one screening product (rows x columns), ~256 MB of float32
SCREEN_CELLS = 1 << 26
#: kept examples held in memory before their vectors go to the spill file (96 MB of float16 query + positive at 384 dims)
SPILL_ROWS = 1 << 16


def quantize(v: np.ndarray) -> np.ndarray:
    """Unit vectors as float16 (the stored form)."""
    return np.asarray(v, dtype=np.float32).astype(np.float16)


def exact_key(query: str, positive: str) -> bytes:
    """16-byte key of an example's identity after :func:`text_key`."""
    return hashlib.blake2b(f"{text_key(query)}\x00{text_key(positive)}".encode(), digest_size=16).digest()


def _dot64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise float64 dot products of two ``[n, d]`` float16 arrays, rounded to 6 decimals."""
    return np.round(np.einsum("nd,nd->n", a.astype(np.float64), b.astype(np.float64)), 6)


def _screen(a: np.ndarray, b: np.ndarray, thr: float, *, lower_only: bool = False, b_offset: int = 0):
    """Candidate pairs ``(i, j)`` with ``a[i] . b[j] >= thr - SCREEN_MARGIN`` (float16 inputs).

    ``lower_only``: only ``j + b_offset < i`` (``a`` and ``b`` index the same rows).
    Yields ``(ii, jj)`` arrays chunk by chunk, ``jj`` offset by ``b_offset``.
    """
    if len(a) == 0 or len(b) == 0:
        return
    cols = max(1, min(len(b), SCREEN_CELLS // 1024))
    rows = max(1, SCREEN_CELLS // cols)
    for c0 in range(0, len(b), cols):
        bc = b[c0 : c0 + cols].astype(np.float32)
        for r0 in range(0, len(a), rows):
            if lower_only and r0 + rows <= c0 + b_offset:
                continue
            s = a[r0 : r0 + rows].astype(np.float32) @ bc.T
            ii, jj = np.nonzero(s >= thr - SCREEN_MARGIN)
            ii = ii + r0
            jj = jj + c0 + b_offset
            if lower_only:
                keep = jj < ii
                ii, jj = ii[keep], jj[keep]
            if len(ii):
                yield ii, jj


# ---------------------------------------------------------------------------- near-duplicates


@dataclass
class DupMatch:
    kept_id: str
    cos_query: float | None  # None: exact match after normalisation
    cos_positive: float | None

    def detail(self) -> str:
        if self.cos_query is None:
            return f"duplicate of {self.kept_id} (query and positive equal after normalisation)"
        return f"near-duplicate of {self.kept_id} (query cos {self.cos_query:.4f}, positive cos {self.cos_positive:.4f})"


class _Kept:
    """float16 rows ``[n, width]`` appended in order. With ``spill`` (a file path) every full
    :data:`SPILL_ROWS` rows go to that file and only the tail stays in memory; :meth:`chunks`
    reads the file back piece by piece (no mapping stays resident)."""

    def __init__(self, width: int, spill: Path | None = None):
        self.width, self.spill = width, spill
        self.on_disk = 0  # rows in the file
        self.tail = np.zeros((0, width), dtype=np.float16)
        if spill is not None:
            spill.unlink(missing_ok=True)  # left by a killed run: appends start from nothing

    def append(self, rows: np.ndarray) -> None:
        self.tail = np.concatenate([self.tail, rows.astype(np.float16)])
        if self.spill is not None and len(self.tail) >= SPILL_ROWS:
            self.spill.parent.mkdir(parents=True, exist_ok=True)
            with open(self.spill, "ab") as f:
                f.write(self.tail.tobytes())
            self.on_disk += len(self.tail)
            self.tail = self.tail[:0]

    def chunks(self, rows: int):
        """``(first row, float16 [<= rows, width])`` over every row in order."""
        if self.on_disk:
            with open(self.spill, "rb") as f:
                for c0 in range(0, self.on_disk, rows):
                    n = min(rows, self.on_disk - c0)
                    yield c0, np.fromfile(f, dtype=np.float16, count=n * self.width).reshape(n, self.width)
        for c0 in range(0, len(self.tail), rows):
            yield self.on_disk + c0, self.tail[c0 : c0 + rows]

    def close(self) -> None:
        if self.spill is not None:
            self.spill.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.spill.parent.rmdir()


class Deduplicator:
    """The kept examples so far (exact keys, ids, float16 query and positive vectors side by side)
    and the check. ``spill_dir``: where kept vectors beyond :data:`SPILL_ROWS` go (removed by
    :meth:`close`)."""

    def __init__(self, threshold: float | None, dim: int, spill_dir: Path | None = None):
        self.threshold = threshold
        self.dim = dim
        self.keys: dict[bytes, int] = {}
        self.ids: list[str] = []
        self._kept = _Kept(2 * dim, spill_dir / "kept.f16" if spill_dir is not None else None)
        self.n = 0

    @property
    def uses_vectors(self) -> bool:
        return self.threshold is not None

    def add(self, ids: list[str], keys: list[bytes], q: np.ndarray | None, p: np.ndarray | None) -> None:
        """Append kept examples in input order (``q``/``p``: float16 ``[n, dim]``, or None without a threshold)."""
        for i, key in enumerate(keys):
            self.keys.setdefault(key, self.n + i)
        if self.uses_vectors:
            self._kept.append(np.hstack([q, p]))
        self.ids += ids
        self.n += len(ids)

    def close(self) -> None:
        """Remove the spill file (the kept state is gone; the shards' ``kept.npy`` keep it)."""
        self._kept.close()

    def check_block(
        self, ids: list[str], keys: list[bytes], q: np.ndarray | None, p: np.ndarray | None, exact_only: Sequence[bool] | None = None
    ) -> list[DupMatch | None]:
        """Decide a block of candidate examples in input order; the kept ones are added.

        An example is a duplicate of the earliest kept example (earlier blocks, or earlier in this
        block) whose key is equal, or whose query AND positive cosines are ``>= threshold``.
        ``exact_only[i]``: row ``i`` is a duplicate only by its key (a pair a dataset labelled on
        purpose, such as SciFact's claim and its altered copy); once kept, its vectors still screen
        the rows after it.
        """
        n = len(ids)
        out: list[DupMatch | None] = [None] * n
        prior: dict[int, tuple[int, float, float]] = {}  # block row -> earliest (kept row, cq, cp) before this block
        intra: dict[int, list[int]] = {}  # block row -> earlier block rows whose query passed the screen
        thr = self.threshold
        if thr is not None and n:
            d = self.dim
            for c0, kept in self._kept.chunks(max(1, SCREEN_CELLS // 2048)):  # from the spill file, then memory
                for ii, jj in _screen(q, kept[:, :d], thr, b_offset=c0):
                    cq = _dot64(q[ii], kept[jj - c0, :d])
                    cp = _dot64(p[ii], kept[jj - c0, d:])
                    ok = (cq >= thr) & (cp >= thr)
                    for i, j, a, b in zip(ii[ok], jj[ok], cq[ok], cp[ok]):
                        i, j = int(i), int(j)
                        if i not in prior or j < prior[i][0]:
                            prior[i] = (j, float(a), float(b))
            for ii, jj in _screen(q, q, thr, lower_only=True):
                for i, j in zip(ii.tolist(), jj.tolist()):
                    intra.setdefault(i, []).append(j)
        row_of: dict[int, int] = {}  # block row -> kept row, for the rows kept in this block
        block_keys: dict[bytes, int] = {}  # exact keys of the rows kept in this block
        kept_rows: list[int] = []
        for i in range(n):
            k = self.keys.get(keys[i])
            if k is None and keys[i] in block_keys:
                out[i] = DupMatch(ids[block_keys[keys[i]]], None, None)
                continue
            if k is not None:
                out[i] = DupMatch(self.ids[k], None, None)
                continue
            near = exact_only is None or not exact_only[i]
            if near and i in prior:
                j, a, b = prior[i]
                out[i] = DupMatch(self.ids[j], a, b)
                continue
            for j in sorted(intra.get(i, ())) if near else ():
                if j in row_of:
                    a = float(_dot64(q[i : i + 1], q[j : j + 1])[0])
                    b = float(_dot64(p[i : i + 1], p[j : j + 1])[0])
                    if a >= thr and b >= thr:
                        out[i] = DupMatch(ids[j], a, b)
                        break
            if out[i] is not None:
                continue
            row_of[i] = self.n + len(kept_rows)
            kept_rows.append(i)
            block_keys.setdefault(keys[i], i)
        self.add(
            [ids[i] for i in kept_rows],
            [keys[i] for i in kept_rows],
            q[kept_rows] if thr is not None else None,
            p[kept_rows] if thr is not None else None,
        )
        return out


def pack_kept(ids: list[str], keys: list[bytes], q: np.ndarray | None, p: np.ndarray | None) -> bytes:
    """One shard's kept examples as ``.npy`` bytes of a structured array (``id``, ``key`` and,
    with a threshold, float16 ``q`` / ``p``), read back by :func:`unpack_kept` on resume.
    Plain ``.npy`` (no zip timestamps), so the same examples give the same bytes."""
    width = max([len(i) for i in ids] + [1])
    fields: list[tuple] = [("id", f"<U{width}"), ("key", "V16")]
    if q is not None:
        fields += [("q", "<f2", (q.shape[1],)), ("p", "<f2", (p.shape[1],))]
    arr = np.zeros(len(ids), dtype=fields)
    arr["id"] = ids
    arr["key"] = np.frombuffer(b"".join(keys), dtype="V16") if keys else arr["key"]
    if q is not None:
        arr["q"], arr["p"] = q, p
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def unpack_kept(path: Path) -> tuple[list[str], list[bytes], np.ndarray | None, np.ndarray | None]:
    arr = np.load(path, allow_pickle=False)
    names = arr.dtype.names or ()
    ids = [str(x) for x in arr["id"]]
    keys = [bytes(x) for x in arr["key"]]
    if "q" in names:
        return ids, keys, np.ascontiguousarray(arr["q"]), np.ascontiguousarray(arr["p"])
    return ids, keys, None, None


# ---------------------------------------------------------------------------- evaluation texts


@dataclass
class EvalTexts:
    """Distinct evaluation texts with the set (data folder) and id of their first occurrence."""

    data_dir: Path | None
    sets: list[str] = field(default_factory=list)  # the sets read, in order
    texts: list[str] = field(default_factory=list)
    set_of: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    per_set: dict[str, int] = field(default_factory=dict)  # distinct texts contributed per set
    skipped: str | None = None  # why there is nothing to check against

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for t, s, i in zip(self.texts, self.set_of, self.ids, strict=True):
            h.update(f"{s}\x00{i}\x00{t}\x01".encode())
        return h.hexdigest()


class EvalSetError(NegsynthError, ValueError):
    """A named evaluation set is unknown (message lists the known ones)."""


def _set_of(path: str) -> str:
    return path.split("/", 1)[0]


def select_eval_files(sets: str | list[str], tasks: Sequence[Any]) -> list[tuple[str, Any]]:
    """``(set, TaskSpec)`` pairs to read out of ``tasks`` (the evaluator's task table):
    ``"auto"`` = every default task; a list names data folders (``stsb``, ``scifact``: their
    default tasks) or task names (``STSBenchmark-dev``: that task even if not default),
    case-insensitive."""
    if sets == "auto":
        return [(_set_of(t.files[0]), t) for t in tasks if t.default]
    out: list[tuple[str, Any]] = []
    folders = sorted({_set_of(f) for t in tasks for f in t.files})
    for raw in sets:
        key = raw.strip().lower()
        by_task = [t for t in tasks if t.name.lower() == key]
        by_folder = [t for t in tasks if _set_of(t.files[0]).lower() == key]
        if by_folder:
            chosen = [t for t in by_folder if t.default] or by_folder
        elif by_task:
            chosen = by_task
        else:
            names = ", ".join(folders)
            raise EvalSetError(
                f'score.decontam_sets: unknown evaluation set {raw!r}; use "auto", [] or names from: {names} (or an evaluate task name)'
            )
        out += [(_set_of(t.files[0]), t) for t in chosen if (_set_of(t.files[0]), t) not in out]
    return out


_TEXT_ROLES = ("text1", "text2", "text", "anchor", "positive", "negative")


def _read_tsv_texts(path: Path, columns: list[str]):
    """``(column, line number, text)`` for the named columns of a headed TSV."""
    from negsynth.data.readers import EvalDataError  # also lifts csv's field size limit

    try:
        with path.open(encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = next(reader, None) or []
            missing = [c for c in columns if c not in header]
            if missing:
                raise EvalDataError(f"{path}: header {header!r} lacks column(s) {missing}; the first line must name the columns")
            idx = [header.index(c) for c in columns]
            for row in reader:
                if not row:
                    continue
                for c, i in zip(columns, idx):
                    if i < len(row) and row[i].strip():
                        yield c, reader.line_num, row[i]
    except UnicodeDecodeError as e:
        raise EvalDataError(f"{path}: not UTF-8 ({e.reason}); re-encode the file as UTF-8") from None


def load_eval_texts(data_dir: Path | None, tasks: Sequence[Any], sets: str | list[str] = "auto", retrieval_docs: str = "none") -> EvalTexts:
    """The evaluation texts to decontaminate against, read in place from ``data_dir``.

    ``tasks``: the evaluator's task table (``negsynth.evaluate.TASKS``: name, files, columns,
    default); ``sets`` picks from it (:func:`select_eval_files`).

    Per task: the text columns of its files (STS / pair / classification / clustering / triplet
    sets: every sentence of the files ``evaluate`` reads, which are test splits — plus TREC's
    train questions, which TRECClustering scores). Retrieval sets (BEIR folders): the test
    queries (those with a positive qrel); ``retrieval_docs = "judged"`` adds the documents judged
    relevant for them, ``"corpus"`` the whole corpus. The corpus is left out by default because
    SciFact's train and test queries share one corpus: decontaminating against it would drop
    every example built from SciFact train. Ids: ``file:line:column`` or ``file:_id``.
    """
    from negsynth.data.readers import read_beir

    out = EvalTexts(data_dir=data_dir)
    if sets != "auto" and not sets:
        out.skipped = "score.decontam_sets = []"
        return out
    specs = select_eval_files(sets, tasks)
    if data_dir is None or not Path(data_dir).is_dir():
        out.skipped = (
            f"no evaluation data at {data_dir}"
            if data_dir is not None
            else "no evaluation data found (set evaluate.data_dir or NEGSYNTH_DATA_DIR)"
        )
        return out
    data_dir = Path(data_dir)
    seen: dict[str, int] = {}
    done_files: set[tuple[str, str]] = set()

    def add(text: str, set_name: str, tid: str) -> None:
        if text in seen:
            return
        seen[text] = len(out.texts)
        out.texts.append(text)
        out.set_of.append(set_name)
        out.ids.append(tid)
        out.per_set[set_name] = out.per_set.get(set_name, 0) + 1

    for set_name, spec in specs:
        if any(not (data_dir / f).exists() for f in spec.files):
            continue
        if set_name not in out.sets:
            out.sets.append(set_name)
            out.per_set.setdefault(set_name, 0)
        if spec.category == "Retr":
            rel = spec.files[0]
            if (rel, "beir") in done_files:
                continue
            done_files.add((rel, "beir"))
            queries, corpus, qrels = read_beir(data_dir / rel, doc_title=spec.doc_title)
            for qid, text in queries.items():
                add(text, set_name, f"{rel}/queries.jsonl:{qid}")
            if retrieval_docs == "judged":
                for did in dict.fromkeys(d for q in queries for d in qrels.get(q, {})):
                    add(corpus[did], set_name, f"{rel}/corpus.jsonl:{did}")
            elif retrieval_docs == "corpus":
                for did, text in corpus.items():
                    add(text, set_name, f"{rel}/corpus.jsonl:{did}")
            continue
        cols = [spec.columns[r] for r in _TEXT_ROLES if r in spec.columns]
        for rel in spec.files:
            if (rel, ",".join(cols)) in done_files:
                continue
            done_files.add((rel, ",".join(cols)))
            for col, line, text in _read_tsv_texts(data_dir / rel, cols):
                add(text, set_name, f"{rel}:{line}:{col}")
    if not out.texts:
        out.skipped = f"no evaluation set of {sets!r} found under {data_dir}"
    return out


# ---------------------------------------------------------------------------- decontamination


@dataclass
class EvalMatch:
    row: int  # evaluation text row
    cos: float | None  # None: equal after normalisation


class Decontaminator:
    """Matches texts against the evaluation texts: normalised-equal, or cosine ``>= threshold``."""

    def __init__(self, ev: EvalTexts, threshold: float | None, vecs: np.ndarray | None):
        self.ev = ev
        self.threshold = threshold
        self.vecs = vecs  # float16 [T, dim] or None
        self.exact: dict[str, int] = {}
        for i, t in enumerate(ev.texts):
            self.exact.setdefault(text_key(t), i)

    @property
    def uses_vectors(self) -> bool:
        return self.threshold is not None and self.vecs is not None

    def match(self, texts: list[str], vecs: np.ndarray | None) -> list[EvalMatch | None]:
        """Per text: its match (exact first, else the highest cosine ``>= threshold``; ties: first row)."""
        out: list[EvalMatch | None] = [None] * len(texts)
        for i, t in enumerate(texts):
            r = self.exact.get(text_key(t))
            if r is not None:
                out[i] = EvalMatch(r, None)
        if self.uses_vectors and vecs is not None and len(texts):
            thr = self.threshold
            best: dict[int, tuple[float, int]] = {}
            for ii, jj in _screen(vecs, self.vecs, thr):
                c = _dot64(vecs[ii], self.vecs[jj])
                ok = c >= thr
                for i, j, x in zip(ii[ok].tolist(), jj[ok].tolist(), c[ok].tolist()):
                    if out[i] is not None and out[i].cos is None:
                        continue
                    b = best.get(i)
                    if b is None or x > b[0] or (x == b[0] and j < b[1]):
                        best[i] = (x, j)
            for i, (x, j) in best.items():
                out[i] = EvalMatch(j, x)
        return out

    def describe(self, m: EvalMatch) -> tuple[str, str]:
        """(eval set, detail) of a match."""
        how = "equal after normalisation" if m.cos is None else f"cos {m.cos:.4f}"
        return self.ev.set_of[m.row], f"{self.ev.set_of[m.row]} {self.ev.ids[m.row]} ({how})"


def eval_vectors(
    embedder, ev: EvalTexts, cache_dir: Path, embedder_fp: Any, *, batch_size: int, progress=None, encode_parts=None
) -> tuple[np.ndarray, bool]:
    """float16 unit vectors of the evaluation texts (as documents), cached in ``cache_dir``.

    ``encode_parts(parts)``: the vectors of each ``("documents", texts, None)`` part, in order (the
    score stage passes :func:`negsynth.embed.base.encode_parts`, which may spread them over Ray
    workers); without it each part is ``embedder.encode_documents``.

    The cache file is named by a hash of the embedder settings and the texts, so a resumed or
    repeated run (even after ``--overwrite``, which keeps ``RUN_DIR/cache``) embeds them once.
    ``progress(label, total)``: a context manager yielding a bar with ``update(advance=n)``.
    Returns ``(vectors, from_cache)``.
    """
    from contextlib import nullcontext

    from negsynth.data.shards import atomic_write_bytes, atomic_write_json

    key = hashlib.sha256(json.dumps({"embedder": embedder_fp, "texts": ev.fingerprint()}, sort_keys=True).encode()).hexdigest()[:20]
    path = Path(cache_dir) / f"decontam-{key}.npy"
    if path.exists():
        try:
            v = np.load(path, allow_pickle=False)
            if v.shape == (len(ev.texts), embedder.dim) and v.dtype == np.float16:
                return v, True
        except (OSError, ValueError):
            pass
    order = sorted(range(len(ev.texts)), key=lambda i: -len(ev.texts[i]))
    out = np.zeros((len(ev.texts), embedder.dim), dtype=np.float16)
    chunk = max(1, 8 * batch_size)
    with progress("score: embedding evaluation texts (once per run dir)", len(order)) if progress else nullcontext() as bar:
        chunks = [order[c0 : c0 + chunk] for c0 in range(0, len(order), chunk)]
        parts = [("documents", [ev.texts[j] for j in rows], None) for rows in chunks]
        vectors = (
            encode_parts(parts) if encode_parts else (embedder.encode_documents(texts, batch_size=batch_size) for _, texts, _ in parts)
        )
        for rows, v in zip(chunks, vectors, strict=True):
            out[rows] = quantize(v)
            if bar is not None:
                bar.update(advance=len(rows))
    buf = io.BytesIO()
    np.save(buf, out, allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())
    atomic_write_json(
        path.with_suffix(".json"),
        {
            "embedder": embedder_fp,
            "texts": len(ev.texts),
            "texts_sha256": ev.fingerprint(),
            "sets": ev.per_set,
            "data_dir": str(ev.data_dir),
        },
    )
    return out, False
