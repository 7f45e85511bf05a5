"""Checks that return keep/reason. They never call a model.

Each check takes plain values and returns a :class:`Verdict`; :func:`check_example` runs the
example checks in a fixed order and returns the first failure (or keep). Reason codes are
stable strings: they are counted in ``stats.json`` and written to rejects shards.
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
}

#: the one definition of "the same text" (see negsynth.data.text)
normalize = text_key


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


def check_count(negatives: Sequence[str], k: int = NUM_NEGATIVES) -> Verdict:
    if len(negatives) != k:
        return Verdict(False, "wrong_negative_count", f"'negatives' must hold exactly {k} items, got {len(negatives)}")
    return KEEP


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
    nq, np_ = normalize(query), normalize(positive)
    if np_ == nq:
        return Verdict(False, "positive_equals_query", "the positive repeats the query; write a different text")
    seen: dict[str, int] = {}
    for i, neg in enumerate(negatives):
        nn = normalize(neg)
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
    # one search over all fields (no pattern can span the newline), then find the field: six
    # searches per example were ~4 % of generate's client CPU. The regex (case-insensitive, a
    # dozen alternatives tried at every position) is skipped for ASCII text without any word it
    # needs: most examples; non-ASCII text always goes to the regex (re.I folds some non-ASCII
    # letters onto ASCII ones, e.g. "ſ" matches "s").
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
    v = check_count(negatives)
    if not v.keep:
        return v
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


def check_task(task: str, *, min_chars: int, max_chars: int) -> Verdict:
    """A brainstormed task: non-empty, within bounds, not a placeholder or meta talk."""
    t = task.strip() if isinstance(task, str) else ""
    if not t:
        return Verdict(False, "empty_text", "task is empty")
    if _PLACEHOLDER.match(t):
        return Verdict(False, "placeholder_text", f"task is a placeholder ({t!r})")
    if len(t) < min_chars:
        return Verdict(False, "too_short", f"task has {len(t)} characters, fewer than {min_chars}")
    if len(t) > max_chars:
        return Verdict(False, "too_long", f"task has {len(t)} characters, more than {max_chars}")
    return KEEP
