"""The teachers beyond the hybrid one (which the corpus stage's mining computes over the whole
corpus): the LLM's query likelihood or a user's cross-encoder over a text and its mined negatives
(corpus, regenerate), and the hybrid and likelihood teachers fused (corpus)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from negsynth.embed.lexical import rrf_over
from negsynth.errors import UserError

#: the llm-likelihood teacher reads the first 192 of a document's tokens (its dev measurement:
#: benchmarks/likelihood_teacher.py on SciFact's train claims)
LIKELIHOOD_DOC_TOKENS = 192


def check_likelihood_source(stage: str, which: str, llm_base_url: str) -> None:
    """``<stage>.likelihood = "llm"`` needs an endpoint that echoes prompt log-probs: refuse the embedded server."""
    if which == "llm" and llm_base_url == "embedded":
        raise UserError(
            f"{stage}.likelihood = 'llm': the embedded llama-server echoes no prompt log-probs; "
            f"set {stage}.likelihood = 'embedded' (the same model, in-process) or point llm.base_url at vLLM or llama-cpp-python's server"
        )


def likelihood_scorer(stage: str, which: str, llm: Any, run_dir: Path, info=None) -> Any:
    """The query-likelihood scorer: the embedded GGUF in-process (``which = "embedded"``) or the
    run's ``[llm]`` endpoint (``"llm"``), its scores cached in ``RUN_DIR/cache/likelihood.sqlite``
    (a rerun or a resumed run computes none twice)."""
    cache = run_dir / "cache" / "likelihood.sqlite"
    if which == "llm":
        from negsynth.llm.keys import read_key
        from negsynth.llm.likelihood import EndpointLikelihood

        key = read_key(llm.api_key_env, llm.api_key_file, "llm")
        return EndpointLikelihood(
            llm.base_url,
            llm.model,
            key,
            max_doc_words=LIKELIHOOD_DOC_TOKENS,
            cache=cache,
            timeout_s=llm.timeout,
            setting=f"{stage}.likelihood",
            max_retries=llm.max_retries,
            backoff_initial=llm.backoff_initial,
            backoff_max=llm.backoff_max,
        )
    from negsynth.embed.likelihood import QueryLikelihood

    if info is not None:
        info("loading the embedded LLM for the llm-likelihood teacher ...")
    return QueryLikelihood.load(max_doc_tokens=LIKELIHOOD_DOC_TOKENS, cache=cache)


def uses_likelihood(teacher: str) -> bool:
    return teacher in ("llm-likelihood", "hybrid+llm-likelihood")


def scores_texts(teacher: str) -> bool:
    """The teacher scores the document (or positive) and its mined negatives one by one."""
    return uses_likelihood(teacher) or teacher == "cross-encoder"


def check_teacher_model(stage: str, section: Any) -> None:
    """``<stage>.teacher = "cross-encoder"``: its model must resolve before any LLM request is paid."""
    if section.teacher == "cross-encoder":
        from negsynth.embed.cross_encoder import check_cross_encoder

        check_cross_encoder(section.teacher_model, f"{stage}.teacher_model")


def pair_scorer(stage: str, section: Any, llm: Any, run_dir: Path, info=None) -> Any:
    """The scorer of ``<stage>.teacher``: the user's cross-encoder (``teacher_model``) or the
    query likelihood (:func:`likelihood_scorer`); scores cached in ``RUN_DIR/cache/``."""
    if section.teacher == "cross-encoder":
        from negsynth.embed.cross_encoder import CrossEncoderScorer

        if info is not None:
            info(f"loading the cross-encoder teacher {section.teacher_model} ...")
        return CrossEncoderScorer(section.teacher_model, cache=run_dir / "cache" / "cross_encoder.sqlite", setting=f"{stage}.teacher_model")
    return likelihood_scorer(stage, section.likelihood, llm, run_dir, info)


def likelihood_fields(lm, query: str, document: str, negatives: list[str]) -> dict[str, Any]:
    """A text-scoring teacher's view of one example (``llm-likelihood``: ``log p(query | text)``,
    mean per query token; ``cross-encoder``: the model's relevance score): the document's rank
    among itself and its negatives, the scores, and the label ``[document, negative_1..]`` for
    distillation."""
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


def relabel_fields(lm, query: str, positive: str, candidates: list[str], k: int) -> tuple[list[int], dict[str, Any]]:
    """A labelled pair's teacher (``regenerate.teacher``): the positive and every mined candidate
    scored by ``lm``; a candidate scored at or above the positive is a false negative (RLHN) and
    left out. Returns the indices of the first ``k`` candidates kept and the example's teacher
    fields (the positive's rank among all candidates, the kept ones' scores, the label
    ``[positive, kept_1..k]``, how many were left out)."""
    scores = [round(x, 6) for x in lm.scores(query, [positive, *candidates])]
    pos, cand = scores[0], scores[1:]
    kept = [i for i, x in enumerate(cand) if x < pos][:k]
    return kept, {
        "teacher_rank": 1 + sum(x >= pos for x in cand),
        "teacher_pos_score": pos,
        "teacher_scores": [cand[i] for i in kept],
        "teacher_label": [pos, *(cand[i] for i in kept)],
        "teacher_false_negatives": sum(x >= pos for x in cand),
    }
