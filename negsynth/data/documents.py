"""One document of a user's corpus (:mod:`negsynth.data.corpus`): the :class:`Document` record,
reading a file that is one document (text, Markdown, reStructuredText, HTML, PDF; extracted PDF
and HTML text kept in a bounded cache), and splitting a long document into passages by a cheap
token proxy (docs/corpus.md, "Long documents become passages")."""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from negsynth.errors import UserError

#: the extra that reads a format, and the module it installs
EXTRAS = {"html": ("html", "bs4", "BeautifulSoup"), "pdf": ("pdf", "pypdf", "pypdf")}
#: the token proxy chunks are counted in
_TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class Document:
    """One document: ``id`` is unique within its corpus; ``text`` already holds the title."""

    id: str
    text: str
    title: str = ""


def need_extra(fmt: str, where: Any) -> None:
    """Raise the one line that names the extra to install when the library reading ``fmt`` is missing."""
    if fmt not in EXTRAS:
        return
    extra, module, lib = EXTRAS[fmt]
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UserError(f"{where}: reading {fmt.upper()} needs {lib}: pip install 'negsynth[{extra}]'")


# -- chunks -----------------------------------------------------------------------------------
_WORD_BYTES = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
_SPACE_BYTES = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"  # what \s matches in ASCII (str.isspace)
#: ASCII bytes that are neither word nor space (each one token), and the table that blanks them
_OTHER_BYTES = bytes(b for b in range(128) if b not in _WORD_BYTES and b not in _SPACE_BYTES)
_BLANK = bytes.maketrans(_OTHER_BYTES + _SPACE_BYTES, b" " * (len(_OTHER_BYTES) + len(_SPACE_BYTES)))


def count_tokens(text: str) -> int:
    """Tokens of ``text`` by the proxy chunks are counted in (see the module docstring). ASCII text
    is counted with two byte translations in C (its other characters, plus the word runs left when
    they are blanked), the same count as the regex, several times faster; other text by the regex."""
    if text.isascii():
        b = text.encode("ascii")
        return len(b.translate(None, _WORD_BYTES + _SPACE_BYTES)) + len(b.translate(_BLANK).split())
    return len(_TOKEN.findall(text))


def chunk_spans(n: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """``[start, end)`` token spans covering ``n`` tokens: one span when ``n <= size``, else the
    fewest spans of at most ``size`` tokens that overlap by at least ``overlap``, all of one length
    (give or take one) and evenly spaced, so no passage is a short tail."""
    if n <= size:
        return [(0, n)]
    k = math.ceil((n - overlap) / (size - overlap))
    length = math.ceil((n + (k - 1) * overlap) / k)
    return [(s, s + length) for s in (round(i * (n - length) / (k - 1)) for i in range(k))]


def split_document(d: Document, size: int, overlap: int) -> list[Document]:
    """``d`` as passages of at most ``size`` proxy tokens (``[d]`` when it fits): passage N has id
    ``<id>#chunkN`` and opens with the document's title (the first already does)."""
    if size <= 0 or len(d.text) <= size or count_tokens(d.text) <= size:  # a token is at least one character
        return [d]
    spans = [m.span() for m in _TOKEN.finditer(d.text)]
    head = _title_tokens(d, size)
    body = spans[head:]
    out: list[Document] = []
    for k, (a, b) in enumerate(chunk_spans(len(body), size - head, min(overlap, (size - head) // 2))):
        lo, hi = (0 if a == 0 else body[a][0]), body[b - 1][1]
        text = d.text[lo:hi] if lo == 0 or not head else f"{d.title} {d.text[lo:hi]}"
        out.append(Document(f"{d.id}#chunk{k + 1}", text, d.title))
    return out


def _title_tokens(d: Document, size: int) -> int:
    """The tokens of the title that heads each passage: the text opens with its title (a corpus
    row's document), which is repeated and the rest split; 0 where there is none, or it is too
    long to repeat (then the whole text is split)."""
    head = count_tokens(d.title) if d.title and d.text.lower().startswith(d.title.lower()) else 0
    return head if head <= size // 2 else 0


def n_chunks(d: Document, size: int, overlap: int) -> int:
    """How many passages :func:`split_document` makes of ``d`` (without making them)."""
    if size <= 0 or len(d.text) <= size:
        return 1
    n = count_tokens(d.text)
    if n <= size:
        return 1
    head = _title_tokens(d, size)
    return len(chunk_spans(n - head, size - head, min(overlap, (size - head) // 2)))


# -- document files -----------------------------------------------------------------------------
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)", re.S)
_FM_TITLE = re.compile(r"^title\s*:\s*(.+?)\s*$", re.M)
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)  # Markdown: # Title
#: a title underlined (Markdown: === or ---; reStructuredText: a line of one punctuation character)
_UNDERLINED = {
    ".md": re.compile(r"^(\S[^\n]*?)[ \t]*\n([=-])\2{2,}[ \t]*$", re.M),
    ".rst": re.compile(r"^(\S[^\n]*?)[ \t]*\n([=\-~^*#+`'\"])\2{2,}[ \t]*$", re.M),
}


#: PDF / HTML text already extracted: (path, size, mtime) -> (title, body), oldest first, at most
#: _EXTRACTED_BYTES of text, so the stage's three reads (count, sample, index) parse a small
#: folder's PDFs once and a large one's within bounded memory
_EXTRACTED: OrderedDict[tuple, tuple[str, str]] = OrderedDict()
_EXTRACTED_BYTES = 64 << 20
_extracted_held = 0  # characters in _EXTRACTED


def read_document_file(p: Path, fmt: str) -> tuple[str, str]:
    """``(title, body)`` of a file that is one document (``fmt``: text, html or pdf)."""
    if fmt not in ("pdf", "html"):
        return _read_document_file(p, fmt)
    try:
        st = p.stat()
    except OSError as e:
        raise UserError(f"{p}: cannot read it ({e.strerror or e}); check --input") from None
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key in _EXTRACTED:
        _EXTRACTED.move_to_end(key)
        return _EXTRACTED[key]
    global _extracted_held
    out = _EXTRACTED[key] = _read_document_file(p, fmt)
    _extracted_held += len(out[0]) + len(out[1])
    while _extracted_held > _EXTRACTED_BYTES and len(_EXTRACTED) > 1:
        _, (t, b) = _EXTRACTED.popitem(last=False)
        _extracted_held -= len(t) + len(b)
    return out


def _read_document_file(p: Path, fmt: str) -> tuple[str, str]:
    try:
        if fmt == "pdf":
            return _read_pdf(p)
        raw = p.read_bytes()
    except OSError as e:
        raise UserError(f"{p}: cannot read it ({e.strerror or e}); check --input") from None
    from negsynth.data.tables import MAGIC

    for magic, what, fix in MAGIC:
        if raw.startswith(magic):
            raise UserError(f"{p}: is {what}, not {fmt} text; {fix}")
    if b"\x00" in raw[: 64 * 1024]:
        raise UserError(f"{p}: holds NUL bytes, so it is not {fmt} text (a binary file?); remove it or fix its name")
    if fmt == "html":
        return _read_html(p, raw)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(
            f"{p}: not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start}); convert it to UTF-8 (iconv -t UTF-8)"
        ) from None
    title = ""
    kind = {".markdown": ".md"}.get(p.suffix.lower(), p.suffix.lower())
    if kind in (".md", ".rst"):
        fm = _FRONT_MATTER.match(text) if kind == ".md" else None
        if fm:
            t = _FM_TITLE.search(fm.group(1))
            title = t.group(1).strip("'\"") if t else ""
            text = text[fm.end() :]
        if not title:  # the first heading, # or underlined
            found = [m for m in (_HEADING.search(text) if kind == ".md" else None, _UNDERLINED[kind].search(text)) if m]
            if found:
                h = min(found, key=lambda m: m.start())
                title = h.group(1).strip()
                text = text[: h.start()] + text[h.end() :]  # the heading is the title, not also the text
    return title or _file_title(p), text


def _file_title(p: Path) -> str:
    return p.name.split(".")[0].replace("_", " ").strip()


def _read_html(p: Path, raw: bytes) -> tuple[str, str]:
    need_extra("html", p)
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(raw, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup(["script", "style", "noscript", "template", "head", "svg"]):
        tag.decompose()
    body = re.sub(r"\s+", " ", soup.get_text(" ", strip=True)).strip()
    return title or _file_title(p), body


def _read_pdf(p: Path) -> tuple[str, str]:
    need_extra("pdf", p)
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(p)
        if reader.is_encrypted and not reader.decrypt(""):
            raise UserError(f"{p}: an encrypted PDF; decrypt it (qpdf --decrypt) or remove it from the input")
        pages = [page.extract_text() or "" for page in reader.pages]
    except UserError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"{p}: cannot read this PDF ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check the file"
        ) from None
    text = re.sub(r"[ \t]+", " ", "\n".join(pages))
    return _file_title(p), re.sub(r"\n\s*\n\s*", "\n\n", text).strip()
