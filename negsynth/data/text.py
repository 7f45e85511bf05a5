"""What "the same text" means everywhere in negsynth: one key, used by validation (a negative
equal to the positive), pair dedup, near-duplicate cleaning, decontamination and the trainer's
no-text-twice-per-batch sampler, so that they never disagree on identity."""

from __future__ import annotations

import re
import unicodedata

_WS = re.compile(r"\s+")
_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$", re.U)


def text_key(text: str) -> str:
    """The key under which two texts count as the same: NFKC, casefolded, whitespace collapsed,
    punctuation stripped at both ends ("The cat." and "the  cat" are one text)."""
    t = _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()
    return _EDGE_PUNCT.sub("", t)
