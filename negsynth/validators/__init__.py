"""Checks that return a :class:`Verdict` (keep, reason, detail); they never call a model. Reason
codes are stable strings, counted in ``stats.json`` and written to rejects shards.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from negsynth.data.text import text_key
from negsynth.schemas.records import NUM_NEGATIVES


class Verdict(NamedTuple):
    keep: bool
    reason: str | None = None
    detail: str = ""


KEEP = Verdict(True)

#: every reason a validator here can return, with what it means
REASONS = {
    "wrong_negative_count": "not exactly 4 negatives",
    "empty_text": "a query, positive or negative is empty",
    "too_short": "a text is shorter than the minimum length",
    "too_long": "a text is longer than the maximum length",
    "duplicate_negatives": "two negatives are the same after normalisation",
    "negative_equals_positive": "a negative is the positive after normalisation",
    "negative_equals_query": "a negative is the query after normalisation",
    "positive_equals_query": "the positive is the query after normalisation",
    "meta_commentary": "a text talks about its own relevance instead of being a document",
    "placeholder_text": "a text is a template placeholder such as '...' or 'document 1'",
    "meta_query": "a written query talks about the document ('This document...', 'Query:') instead of asking",
    "copied_document": "a written query copies a run of the document instead of asking about it",
    "off_language": "a written query is not in the document's script (Latin, Cyrillic, CJK ...)",
}

_META = re.compile(
    r"(\b(this|the) (document|passage|text|answer|label|sentence) (is|does) not (relevant|answer|address|satisf|match)"
    r"|\bnot relevant to the (query|question|task)"
    r"|\bhard[- ]negative\b"
    r"|\b(irrelevant|negative) (document|passage|example)\b"
    r"|\bas an ai\b"
    r"|\b(less|least|most) (relevant|similar) (document|passage|negative)\b)",
    re.I,
)
_PLACEHOLDER = re.compile(r"^(\.\.\.|…|n/?a|none|null|tbd|todo|(document|doc|negative|passage|text|label|string)\s*\d*)$", re.I)


def check_nonempty(fields: dict[str, str]) -> Verdict:
    for name, text in fields.items():
        if not isinstance(text, str) or not text.strip():
            return Verdict(False, "empty_text", f"{name} is empty")
    return KEEP


def check_placeholder(fields: dict[str, str]) -> Verdict:
    for name, text in fields.items():
        if _PLACEHOLDER.match(text.strip()):
            return Verdict(False, "placeholder_text", f"{name} is a placeholder ({text.strip()!r}); write real text")
    return KEEP


def check_lengths(fields: dict[str, str], min_chars: int, max_chars: int) -> Verdict:
    for name, text in fields.items():
        n = len(text.strip())
        if n < min_chars:
            return Verdict(False, "too_short", f"{name} has {n} characters, fewer than {min_chars}")
        if n > max_chars:
            return Verdict(False, "too_long", f"{name} has {n} characters, more than {max_chars}")
    return KEEP


def check_distinct(query: str, positive: str, negatives: Sequence[str]) -> Verdict:
    nq, np_ = text_key(query), text_key(positive)
    if np_ == nq:
        return Verdict(False, "positive_equals_query", "the positive repeats the query; write a different text")
    seen: dict[str, int] = {}
    for i, neg in enumerate(negatives):
        nn = text_key(neg)
        if nn == np_:
            return Verdict(False, "negative_equals_positive", f"negative {i + 1} repeats the positive")
        if nn == nq:
            return Verdict(False, "negative_equals_query", f"negative {i + 1} repeats the query")
        if nn in seen:
            return Verdict(False, "duplicate_negatives", f"negatives {seen[nn] + 1} and {i + 1} are the same; make all 4 different")
        seen[nn] = i
    return KEEP


#: every match of _META contains one of these (lower-cased); ASCII text holding none cannot match
_META_NEEDS = ("not ", "negative", "relevant", "similar", "as an ai")


def check_meta(fields: dict[str, str]) -> Verdict:
    # one search over all fields (no pattern spans the newline), skipped for ASCII text without a
    # word it needs; non-ASCII text always goes to the regex (re.I folds "ſ" onto "s")
    joined = "\n".join(fields.values())
    if joined.isascii():
        low = joined.lower()
        if not any(w in low for w in _META_NEEDS):
            return KEEP
    if not _META.search(joined):
        return KEEP
    for name, text in fields.items():
        m = _META.search(text)
        if m:
            return Verdict(False, "meta_commentary", f"{name} comments on relevance ({m.group(0)!r}); write only the text itself")
    return KEEP


def check_example(query: str, positive: str, negatives: Sequence[str], *, min_chars: int = 2, max_chars: int = 6000) -> Verdict:
    """All example checks in order; the first failure wins."""
    if len(negatives) != NUM_NEGATIVES:
        return Verdict(False, "wrong_negative_count", f"'negatives' must hold exactly {NUM_NEGATIVES} items, got {len(negatives)}")
    fields = {"query": query, "positive": positive, **{f"negative {i + 1}": n for i, n in enumerate(negatives)}}
    for v in (
        check_nonempty(fields),
        check_placeholder(fields),
        check_lengths(fields, min_chars, max_chars),
        check_distinct(query, positive, negatives),
        check_meta(fields),
    ):
        if not v.keep:
            return v
    return KEEP


def check_text(name: str, text: str, *, min_chars: int, max_chars: int) -> Verdict:
    """One written text (a task, a query): non-empty, not a placeholder, within bounds."""
    t = text.strip() if isinstance(text, str) else ""
    if not t:
        return Verdict(False, "empty_text", f"{name} is empty")
    if _PLACEHOLDER.match(t):
        return Verdict(False, "placeholder_text", f"{name} is a placeholder ({t!r})")
    if len(t) < min_chars:
        return Verdict(False, "too_short", f"{name} has {len(t)} characters, fewer than {min_chars}")
    if len(t) > max_chars:
        return Verdict(False, "too_long", f"{name} has {len(t)} characters, more than {max_chars}")
    return KEEP


# -- queries written for a document (the corpus stage) ----------------------------------------
#: a query that talks about the document or labels itself: "This document shows ...", "Query: ..."
_META_QUERY = re.compile(
    r"^\W*(?:(?:query|question|claim|keywords?|search(?: query)?|answer)\s*\d*\s*[:\-]"
    r"|here (?:is|are)\b|sure\b|(?:this|the|that) (?:document|passage|text|article|abstract|paper)\b"
    r"|(?:according to|based on|in) (?:this|the) (?:document|passage|text|article|abstract)\b)",
    re.I,
)
_WORD = re.compile(r"\w+", re.U)


def _script(ch: str) -> str:
    o = ord(ch)
    if o < 0x250:
        return "latin"
    if 0x370 <= o < 0x400:
        return "greek"
    if 0x400 <= o < 0x530:
        return "cyrillic"
    if 0x590 <= o < 0x700:
        return "rtl"
    if 0x3040 <= o < 0xA000 or 0xAC00 <= o < 0xD7B0:
        return "cjk"
    return "other"


def dominant_script(text: str) -> str | None:
    """The Unicode script most of ``text``'s letters are written in (None: no letter)."""
    counts: dict[str, int] = {}
    for ch in text:
        if ch.isalpha():
            k = _script(ch)
            counts[k] = counts.get(k, 0) + 1
    return max(counts, key=counts.__getitem__) if counts else None


def check_query(query: str, document: str, *, min_chars: int, max_chars: int, copy_words: int = 12) -> Verdict:
    """A query written for ``document``: a valid text, no meta phrasing, no copied run of
    ``copy_words`` words of it, in its script."""
    v = check_text("the query", query, min_chars=min_chars, max_chars=max_chars)
    if not v.keep:
        return v
    q = query.strip()
    m = _META_QUERY.match(q)
    if m:
        return Verdict(
            False,
            "meta_query",
            f"the query starts with {m.group(0).strip()!r}; write the query itself, as a user would type it, without mentioning the document",
        )
    qw = [w.lower() for w in _WORD.findall(q)]
    dw = [w.lower() for w in _WORD.findall(document)]
    if qw and (" ".join(qw) == " ".join(dw) or (len(qw) >= copy_words and _has_run(qw, dw, copy_words))):
        return Verdict(
            False,
            "copied_document",
            f"the query copies {copy_words} or more words of the document in a row; ask about it in your own words",
        )
    ds, qs = dominant_script(document), dominant_script(q)
    if ds is not None and qs is not None and ds != qs:
        return Verdict(
            False, "off_language", f"the query is written in {qs} script but the document in {ds}; write it in the document's language"
        )
    return KEEP


def _has_run(qw: list[str], dw: list[str], n: int) -> bool:
    """Whether ``n`` consecutive words of ``qw`` occur consecutively in ``dw``."""
    grams = {tuple(dw[i : i + n]) for i in range(len(dw) - n + 1)}
    return any(tuple(qw[i : i + n]) in grams for i in range(len(qw) - n + 1))
