"""The corpus stage's queries: the prompt asking the LLM for a document's queries, the validation
of its answer, and the no-LLM source (``corpus.queries = "title"``) shaped as an answer."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from negsynth.data.text import text_key
from negsynth.llm.client import LLMResult
from negsynth.llm.errors import ValidationFailure
from negsynth.prompts import load_example, load_template, render
from negsynth.schemas.config import CorpusConfig
from negsynth.schemas.outputs import QueriesOut
from negsynth.stages.common import schema_failure
from negsynth.validators import check_query

#: per style: (one, many, the rule shown to the model, the retrieval instruction of its examples)
STYLES: dict[str, tuple[str, str, str, str]] = {
    "question": (
        "1 question",
        "{n} different questions",
        "Each is a question ending with a question mark.",
        "Given a question, retrieve documents that answer the question",
    ),
    "claim": (
        "1 claim",
        "{n} different claims",
        "Each is one declarative sentence stating a finding or fact (a statement, not a question).",
        "Given a claim, retrieve documents that support or refute the claim",
    ),
    "keywords": (
        "1 keyword query",
        "{n} different keyword queries",
        "Each is 3 to 8 keywords, not a sentence.",
        "Given a web search query, retrieve relevant documents that answer the query",
    ),
}


# -- the prompt -----------------------------------------------------------------------------
def cut_tokens(text: str, tokenizer, n: int, mark: str = " ...") -> str:
    """``text`` cut to its first ``n`` tokens (``mark`` ends a cut); words when no tokenizer."""
    if tokenizer is None:
        words = text.split()
        return text if len(words) <= n else " ".join(words[:n]) + mark
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False, verbose=False)
    offs = enc["offset_mapping"]
    if len(offs) <= n:
        return text
    return text[: offs[n - 1][1]].rstrip() + mark


def render_prompt(document: str, style: str, n: int) -> str:
    """The prompt of one document. ``negatives_rule`` stays empty: the prompt files' bytes are part
    of the stage's hash, so they keep the slot for older run dirs to resume."""
    one, many, rule, _ = STYLES[style]
    count = one if n == 1 else many.format(n=n)
    shape = '{"queries": [' + ", ".join(['"..."'] * n) + "]}"
    return render("corpus", document=document, count=count, style_rule=rule, negatives_rule="", shape=shape)


def example_answer(style: str, n: int) -> dict[str, Any]:
    qs = list(load_example("corpus")[style])
    return {"queries": [qs[i % len(qs)] for i in range(n)]}


def build_messages(p: dict[str, Any], cfg: CorpusConfig, doc_text: str) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": load_template("system").strip()}]
    if cfg.few_shot:
        ex = load_example("corpus")
        msgs.append({"role": "user", "content": render_prompt(ex["document"], p["style"], cfg.queries_per_doc)})
        msgs.append({"role": "assistant", "content": json.dumps(example_answer(p["style"], cfg.queries_per_doc), ensure_ascii=False)})
    msgs.append({"role": "user", "content": render_prompt(doc_text, p["style"], cfg.queries_per_doc)})
    return msgs


# -- validation -----------------------------------------------------------------------------
def make_validator(document: str, cfg: CorpusConfig):
    """``validate(obj) -> (queries, verdicts)``; raises (a re-ask) while no query passes."""
    ex = load_example("corpus")
    shown = {text_key(q) for s in STYLES for q in ex[s]}

    def validate(obj: Any):
        try:
            out = QueriesOut.model_validate(obj)
        except ValidationError as e:
            raise schema_failure(e) from None
        if len(out.queries) != cfg.queries_per_doc:
            raise ValidationFailure("wrong_query_count", f"'queries' must hold exactly {cfg.queries_per_doc} items, got {len(out.queries)}")
        verdicts: list[tuple[str, str] | None] = []
        seen: set[str] = set()
        for q in out.queries:
            v = check_query(q, document, min_chars=cfg.min_query_chars, max_chars=cfg.max_query_chars)
            key = text_key(q) if isinstance(q, str) else ""
            if v.keep and cfg.few_shot and key in shown:
                v = v._replace(
                    keep=False, reason="copied_example", detail="you copied the worked example's query; write one about this document"
                )
            if v.keep and key in seen:
                v = v._replace(keep=False, reason="duplicate_query", detail="two queries are the same; make them different")
            seen.add(key)
            verdicts.append(None if v.keep else (v.reason, v.detail))
        if all(v is not None for v in verdicts):
            reason, detail = verdicts[0]
            raise ValidationFailure(reason, detail)
        return [q.strip() for q in out.queries], verdicts

    return validate


# -- queries without an LLM ------------------------------------------------------------------
def llm_writes(cfg: CorpusConfig) -> bool:
    """Whether the LLM writes the queries (``corpus.queries = "llm"``), or they are taken from the text."""
    return cfg.queries == "llm"


def extracted_queries(p: dict[str, Any], cfg: CorpusConfig) -> LLMResult:
    """A document's query without an LLM (``corpus.queries = "title"``), shaped as the stage's LLM
    answer: its title, the one query of the document. No validator runs: a copied title is what it is."""
    doc = p["document"]
    title = " ".join(str(p.get("title") or "").split())
    if not title or text_key(title) == text_key(doc):
        return LLMResult(None, None, "no_title", "the document has no title apart from its text (corpus.queries = 'title')")
    return LLMResult(([title[: cfg.max_query_chars]], [None]), None)
