"""Records that flow between stages. Each is one JSON line in a shard.

A record's walk: :class:`Task` (brainstorm) -> :class:`Example` with 4 graded negatives
(generate / regenerate) -> the same :class:`Example` with :class:`ExampleScore` (score)
-> curriculum rows (anchor, positive, negative, level, phase, ...) -> model -> report.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

TaskType = Literal["short-long", "long-short", "long-long", "short-short", "sts"]
TASK_TYPES: tuple[str, ...] = ("short-long", "long-short", "long-long", "short-short", "sts")
BRAINSTORM_TYPES: tuple[str, ...] = ("short-long", "long-short", "long-long", "short-short")
STS_TASK = "Retrieve semantically similar text."
NUM_NEGATIVES = 4


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


def first_problem(e: ValidationError, whole: str) -> tuple[str, str]:
    """The first problem of a failed validation: its field as a dotted path (``whole`` when it is
    the record as a whole) and pydantic's message."""
    err = e.errors()[0]
    return ".".join(str(x) for x in err["loc"]) or whole, err["msg"]


class Usage(Record):
    """Token usage summed over every attempt (re-asks included) of one item."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0  # attempts in the re-ask loop (1 = valid at first try)
    # Whether an attempt was served from the cache is run state, not data: it is counted in
    # stats.json ("this_run") so that a rerun from the cache writes byte-identical records.

    def add(self, other: Usage) -> Usage:
        return Usage(**{k: getattr(self, k) + getattr(other, k) for k in Usage.model_fields})


class Task(Record):
    """One embedding task invented by brainstorm (or the fixed STS task)."""

    id: str
    task_type: TaskType
    task: str
    model: str = ""
    usage: Usage = Field(default_factory=Usage)


class ExampleScore(Record):
    """What `score` adds: cosines measured by a local embedder and flags per negative.

    The lists are aligned with ``Example.negatives`` as written (after any reorder / filter);
    ``kendall_tau`` and ``monotonic`` always judge the LLM's own order (before the policy), so
    they say whether the LLM graded well even when ``reorder`` has fixed the order. Cosines are
    rounded to 6 decimals and the flags are computed from the rounded values (reproducible).
    """

    embedder: str
    cos_pos: float
    cos_neg: list[float]  # aligned with Example.negatives (after any reorder / filter)
    kendall_tau: float | None  # tau-b, LLM's claimed order vs measured cosines; None if all cosines tie
    monotonic: bool  # the LLM's order had strictly decreasing cosines
    false_negative: list[bool]  # cos_neg >= fn_ratio * cos_pos (or the judge's verdict, below)
    too_easy: list[bool]  # cos_neg < too_easy_floor
    policy: Literal["annotate", "reorder", "filter", "measured"] = "annotate"
    # with `reorder` / `filter`: LLM rank (0 = claimed hardest = level 1) of each negative as written
    llm_order: list[int] | None = None
    # with score.judge_model: the cross-encoder's scores in [0, 1] and its verdicts (aligned like
    # cos_neg); false_negative then holds the cosine rule OR the judge's verdict
    judge: str | None = None
    judge_pos: float | None = None
    judge_neg: list[float] | None = None
    judged_false_negative: list[bool] | None = None


#: ``Example.source`` of LLM-generated examples; any other value names the dataset a pair was read from
SYNTHETIC_SOURCE = "synthetic"


class Example(Record):
    """One training example: a query, its positive and 4 negatives ordered hardest -> easiest.

    ``negatives[0]`` is level 1 (hardest, most similar to the query) and ``negatives[3]`` is
    level 4 (easiest). For long-short (classification) the query is the input text and the
    positive and negatives are labels; for STS the query is S1 and the positive S2.
    """

    id: str
    task_id: str | None = None
    task: str  # the instruction, e.g. "Given a web search query, retrieve ..."
    task_type: str  # one of TASK_TYPES for synthetic data; regenerate uses a source's type
    attributes: dict[str, Any] = Field(default_factory=dict)
    query: str
    positive: str
    negatives: list[str]
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    source: str = SYNTHETIC_SOURCE  # a dataset's name for pairs read by regenerate
    source_id: str | None = None
    mined_negatives: list[str] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)
    score: ExampleScore | None = None


class HeldoutQuery(Record):
    """A query the ``heldout`` stage wrote for a held-out document, for evaluation only: searched
    over the whole corpus, its document the one relevant answer."""

    id: str
    query: str
    corpus: str  # the input's name
    doc_id: str  # the document (passage) it was written from
    style: str
    model: str = ""
    usage: Usage = Field(default_factory=Usage)


class Reject(Record):
    """An item that did not yield a valid record, kept with its reason and the raw LLM output."""

    id: str
    stage: str
    reason: str
    detail: str = ""
    raw: str | None = None
    input: dict[str, Any] = Field(default_factory=dict)
    usage: Usage = Field(default_factory=Usage)
