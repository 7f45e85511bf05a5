"""The MGH method, stage by stage, in the order ``negsynth run`` runs them.

Each stage module subclasses :class:`negsynth.pipeline.Stage` (an LLM stage
:class:`negsynth.pipeline.LLMStage`) and ends with ``STAGE = MyStage()``: its loop (``run``),
what its outputs are made from (``made_from``), its summary (``report``) and, for an LLM stage,
its items and requests (``plan``, ``messages``, ``schema``, ``parse``, ``record``). What every
stage shares (input checks, reusing finished work, the embedded LLM server, writing
``stats.json``, printing the summary) is :func:`negsynth.pipeline.run_stage`. A newcomer reads
the method here, top to bottom:

==============  ==========================================================  ========  ========
stage           makes                                                       LLM       relaunch
==============  ==========================================================  ========  ========
brainstorm      embedding tasks per task type                               yes       resume
generate        per task: query, positive, 4 negatives hardest -> easiest   yes       resume
regenerate      the same graded negatives for existing (query, positive)    yes [1]   resume
corpus          queries written for a user's documents (no labels) + negs   yes       resume
heldout         held-out documents' queries, for evaluation only            yes       resume
score           measured difficulty, the order checked, false negatives     no        resume
curriculum      training rows in curriculum order (easiest level first)     no        rebuild
train           the fine-tuned embedder (InfoNCE, in-batch + hard negs)     no        rebuild
evaluate        the report on real benchmarks, beside the base model, and   no        always
                the verdict on the held-out documents
==============  ==========================================================  ========  ========

[1] not with ``regenerate.negatives = "mined"`` (mined negatives only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from negsynth.errors import UserError
from negsynth.pipeline import Stage, run_stage, run_stages
from negsynth.schemas.config import RunConfig
from negsynth.schemas.records import Example
from negsynth.stages import brainstorm, corpus, curriculum, evaluate, generate, heldout, regenerate, score, train

#: the method, in order: each stage module declares its ``STAGE``; adding a stage is a module and a
#: line here (an LLM stage: also its prompt files); its run-file section and command come with it
METHOD: tuple[Stage, ...] = (
    brainstorm.STAGE,
    generate.STAGE,
    regenerate.STAGE,
    corpus.STAGE,
    heldout.STAGE,
    score.STAGE,
    curriculum.STAGE,
    train.STAGE,
    evaluate.STAGE,
)


def sections() -> tuple[tuple[str, type], ...]:
    """The run-file sections the method's stages declare (``Stage.config``, :data:`METHOD` read
    when called): what ``load_config`` validates ``[name]`` with where RunConfig lists none."""
    return tuple((s.name, s.config) for s in METHOD if s.config is not None)


def example_stages() -> list[str]:
    """The stages of :data:`METHOD` (read when called) whose records are examples, in order: those
    that make them, then ``score``, which reads them."""
    return [s.name for s in METHOD if s.records is Example]


def get(name: str) -> Stage:
    """The stage called ``name`` (of :data:`METHOD`, read when called); one line listing the
    stages when there is none."""
    by_name = {s.name: s for s in METHOD}
    try:
        return by_name[name]
    except KeyError:
        raise UserError(f"unknown stage {name!r}; choose from {', '.join(by_name)}") from None


def run_pipeline(cfg: RunConfig, run_dir: str | Path, *, stages: list[str] | None = None, **options: Any) -> dict[str, dict]:
    """Run ``stages`` (default ``cfg.pipeline.stages``) in order; returns each stage's stats. The
    ``options`` are :func:`~negsynth.pipeline.run_stages`'s: ``reporter``, ``overwrite``, ``budget``
    (one for the whole run), ``executor`` (default this process; ``RayExecutor(workers)``: each
    stage that splits as Ray ranks, each that embeds with its encoding on Ray workers), ``verify``.

    >>> from negsynth.stages import run_pipeline
    >>> run_pipeline(negsynth.load_config("demo.toml"), "runs/demo")          # doctest: +SKIP
    """
    chosen = [get(n) for n in (stages or cfg.pipeline.stages)]  # fail on an unknown name before any work
    return run_stages(chosen, cfg, run_dir, **options)


async def arun_pipeline(cfg: RunConfig, run_dir: str | Path, **kwargs) -> dict[str, dict]:
    """:func:`run_pipeline` (same keywords) in a worker thread, for async code and notebooks: the
    caller's event loop keeps running (``stats = await arun_pipeline(cfg, "runs/x")``)."""
    import asyncio

    return await asyncio.to_thread(run_pipeline, cfg, run_dir, **kwargs)


__all__ = ["METHOD", "Stage", "arun_pipeline", "example_stages", "get", "run_pipeline", "run_stage", "sections"]
