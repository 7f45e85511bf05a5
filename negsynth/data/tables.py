"""Table files read into polars frames, whole or in bounded batches: JSON lines, CSV/TSV
(``.gz`` too), parquet and saved Hugging Face datasets. The pair sources
(:mod:`negsynth.data.sources`) and the corpus reader (:mod:`negsynth.data.corpus`) share them, and
the check that a file's first bytes do not say it is something else (:data:`MAGIC`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from negsynth.errors import UserError

#: the formats a source may name (``auto``: from the path; ``beir``: read by :mod:`negsynth.data.sources`)
FORMATS = ("auto", "hf", "jsonl", "parquet", "csv", "tsv", "beir")


def resolve_columns(
    cols: list[str], mapping: dict[str, str], guesses: dict[str, tuple[str, ...]], required: tuple[str, ...], flags: set[str], where: str
) -> dict[str, str]:
    """Role -> column of a table: the ``mapping`` given first, else the first of the role's
    ``guesses`` present (case-insensitive; a column serves one role). A named column that is
    absent, or a ``required`` role not found, is one line; ``flags``: the roles the command names
    with ``--ROLE-col``."""

    def fix(role: str) -> str:
        return f"--{role}-col or columns.{role}" if role in flags else f"columns.{role}"

    lower = {c.lower(): c for c in cols}
    out: dict[str, str] = {}
    for role, names in guesses.items():
        if mapping.get(role):
            if mapping[role] not in cols:
                raise UserError(f"{where}: no column {mapping[role]!r} for {role} (columns: {', '.join(cols)}); fix {fix(role)}")
            out[role] = mapping[role]
            continue
        found = next((lower[n] for n in names if n in lower and lower[n] not in out.values()), None)
        if found is not None:
            out[role] = found
    for role in required:
        if role not in out:
            raise UserError(f"{where}: no {role} column (columns: {', '.join(cols)}); name it with {fix(role)}")
    return out


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
