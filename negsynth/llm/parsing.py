"""Turn an LLM's text into a JSON object, tolerating what models commonly wrap it in."""

from __future__ import annotations

import json
import re

from negsynth.data import jsonfast
from negsynth.llm.errors import ValidationFailure

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)


class ParseError(ValidationFailure):
    """The answer holds no JSON value (``empty_output``, ``invalid_json``)."""


def extract_json(text: str | None) -> object:
    """The JSON value in ``text``: bare, inside a markdown fence, or after some prose (control
    characters inside strings accepted); else :class:`ParseError` (``empty_output``, ``invalid_json``)."""
    if text is None or not text.strip():
        raise ParseError("empty_output", "the answer was empty")
    s = text.strip()
    try:
        return jsonfast.loads(s)  # the common case, fast; control characters in strings fall through
    except ValueError:
        pass
    try:
        return json.loads(s, strict=False)
    except json.JSONDecodeError as first:
        err = first
    m = _FENCE.search(s)
    if m:
        try:
            return json.loads(m.group(1).strip(), strict=False)
        except json.JSONDecodeError as e:
            err = e
    start = min((i for i in (s.find("{"), s.find("[")) if i >= 0), default=-1)
    if start >= 0:
        try:
            obj, _ = json.JSONDecoder(strict=False).raw_decode(s[start:])
            return obj
        except json.JSONDecodeError as e:
            err = e
    raise ParseError("invalid_json", f"the answer is not valid JSON ({err.msg} at char {err.pos})")
