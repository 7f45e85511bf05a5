"""The corpus stage's teachers beyond the hybrid one (which mining computes over the whole corpus):
the LLM's query likelihood over a document and its mined negatives, and the two fused."""

from __future__ import annotations

from typing import Any

from negsynth.embed.lexical import rrf_over


def uses_likelihood(teacher: str) -> bool:
    return teacher in ("llm-likelihood", "hybrid+llm-likelihood")


def likelihood_fields(lm, query: str, document: str, negatives: list[str]) -> dict[str, Any]:
    """The ``llm-likelihood`` teacher's view of one example: the document's rank among itself and
    its negatives by ``log p(query | text)`` (mean per query token), the scores, and the label
    ``[document, negative_1..]`` for distillation."""
    scores = [round(x, 6) for x in lm.scores(query, [document, *negatives])]
    return {
        "teacher_rank": 1 + sum(x > scores[0] for x in scores[1:]),
        "teacher_pos_score": scores[0],
        "teacher_scores": scores[1:],
        "teacher_label": scores,
    }


def ensemble_fields(hybrid: dict[str, Any], likelihood: dict[str, Any]) -> dict[str, Any]:
    """``teacher = "hybrid+llm-likelihood"``: the hybrid teacher's and the LLM's orders of the
    document and its mined negatives fused by reciprocal rank (the best ranker on SciFact's dev
    claims: docs/corpus.md). ``teacher_rank`` is the document's rank among those five by the fused
    score; the scores kept are the fused ones; ``teacher_label`` (distillation) stays the LLM's
    log-likelihoods, which carry a scale the fused ranks do not."""
    hybrid_five = [hybrid["teacher_pos_score"], *hybrid["teacher_scores"]]
    fused = rrf_over(hybrid_five, likelihood["teacher_label"])
    return {
        "teacher_rank": 1 + sum(x > fused[0] for x in fused[1:]),
        "teacher_pos_score": round(fused[0], 6),
        "teacher_scores": [round(x, 6) for x in fused[1:]],
        "teacher_label": likelihood["teacher_label"],
    }
