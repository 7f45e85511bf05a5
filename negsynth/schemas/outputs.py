"""What the LLM must return, per task type, as pydantic models (and their JSON schemas).

``negatives`` are ordered hardest -> easiest. :func:`output_schema` adds length bounds
(``maxLength``) so that grammar-constrained servers such as llama.cpp cannot run away.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from negsynth.schemas.records import NUM_NEGATIVES


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ShortLongOut(_Out):
    user_query: str
    positive_document: str
    hard_negative_documents: list[str]


class LongShortOut(_Out):
    input_text: str
    label: str
    misleading_labels: list[str]


class MatchingOut(_Out):
    input: str
    positive_document: str
    hard_negative_documents: list[str]


class STSOut(_Out):
    S1: str
    S2: str
    negatives: list[str]


class TaskListOut(_Out):
    tasks: list[str] = Field(default_factory=list)


class NegativesOut(_Out):
    hard_negative_documents: list[str]


class QueriesOut(_Out):
    """The corpus stage's answer: queries for one document."""

    queries: list[str]


# (model, query key, positive key, negatives key) per task type
OUTPUTS: dict[str, tuple[type[_Out], str, str, str]] = {
    "short-long": (ShortLongOut, "user_query", "positive_document", "hard_negative_documents"),
    "long-short": (LongShortOut, "input_text", "label", "misleading_labels"),
    "short-short": (MatchingOut, "input", "positive_document", "hard_negative_documents"),
    "long-long": (MatchingOut, "input", "positive_document", "hard_negative_documents"),
    "sts": (STSOut, "S1", "S2", "negatives"),
}


def _string(max_len: int | None, min_len: int = 1) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string", "minLength": min_len}
    if max_len:
        s["maxLength"] = max_len
    return s


def output_schema(task_type: str, *, max_query: int | None, max_doc: int | None) -> dict[str, Any]:
    """JSON schema for one example of ``task_type`` with exactly 4 negatives and length bounds."""
    _, qk, pk, nk = OUTPUTS[task_type]
    # minLength keeps a grammar-constrained model from ending a string at once ("" or "a")
    if task_type == "long-short":
        q, d = _string(max_doc, 20), _string(min(max_query or 100, 100), 3)
    elif task_type in ("short-short", "sts"):
        q = d = _string(max_query, 5)
    elif task_type == "long-long":
        q = d = _string(max_doc, 20)
    else:
        q, d = _string(max_query, 5), _string(max_doc, 20)
    return {
        "type": "object",
        "properties": {
            qk: q,
            pk: d,
            nk: {"type": "array", "items": d, "minItems": NUM_NEGATIVES, "maxItems": NUM_NEGATIVES},
        },
        "required": [qk, pk, nk],
    }


def task_list_schema(n: int, *, max_chars: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"tasks": {"type": "array", "items": _string(max_chars, 10), "minItems": 1, "maxItems": n}},
        "required": ["tasks"],
    }


def negatives_schema(max_doc: int | None) -> dict[str, Any]:
    d = _string(max_doc)
    return {
        "type": "object",
        "properties": {"hard_negative_documents": {"type": "array", "items": d, "minItems": NUM_NEGATIVES, "maxItems": NUM_NEGATIVES}},
        "required": ["hard_negative_documents"],
    }


def queries_schema(n: int, *, max_query: int | None, min_query: int = 8) -> dict[str, Any]:
    """``{"queries": [n strings]}``."""
    props: dict[str, Any] = {"queries": {"type": "array", "items": _string(max_query, min_query), "minItems": n, "maxItems": n}}
    return {"type": "object", "properties": props, "required": list(props)}
