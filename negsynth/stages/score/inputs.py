"""The stage's inputs: finished shards, their examples, the hash of what the scores are made from, the decontamination texts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from negsynth.data.clean import EvalSetError, EvalTexts, load_eval_texts
from negsynth.data.readers import EvalDataError
from negsynth.data.shards import ShardError, iter_jsonl, list_shards
from negsynth.errors import UserError
from negsynth.evaluate.suite import TASKS
from negsynth.pipeline import StageContext, config_hash, inputs_fingerprint
from negsynth.schemas.records import Example, first_problem


def input_stages(cfg) -> tuple[str, ...]:
    """The stages whose examples score reads, in order: ``score.inputs``, where ``"auto"`` is every
    stage of the method that makes examples (:func:`negsynth.stages.example_stages`)."""
    if cfg.score.inputs != "auto":
        return tuple(cfg.score.inputs)
    from negsynth.stages import example_stages  # the method, read when called (it lists this stage)

    return tuple(s for s in example_stages() if s != "score")


def input_shards(ctx: StageContext) -> list[tuple[str, Path]]:
    """(stage, shard path) of every finished input shard, in output order; one-line error if none."""
    out: list[tuple[str, Path]] = []
    for st in input_stages(ctx.cfg):
        folder = ctx.run_dir / st
        shards = list_shards(folder)
        out += [(st, p) for p in shards]
        if folder.is_dir() and any(folder.glob("shard-*.jsonl.partial")):
            ctx.reporter.warn(f"{folder} has unfinished shards (.partial); score covers its finished shards only")
    if not out:
        where = " or ".join(str(ctx.run_dir / s) for s in input_stages(ctx.cfg))
        raise UserError(f"no finished shards in {where}; run `negsynth generate` first (or set score.inputs)")
    return out


def read_examples(path: Path) -> list[dict]:
    """The records of one input shard, checked against :class:`Example` (one-line error naming the record)."""
    rows: list[dict] = []
    try:
        for n, row in enumerate(iter_jsonl(path), start=1):
            try:
                Example.model_validate(row)
            except ValidationError as e:
                loc, msg = first_problem(e, "record")
                raise UserError(
                    f"{path}: record {n} is not an Example ({loc}: {msg}); rerun the stage that wrote it with --overwrite"
                ) from None
            row = dict(row)
            row.pop("score", None)
            rows.append(row)
    except ShardError as e:
        raise UserError(str(e)) from None
    return rows


def embedder_fingerprint(cfg) -> dict:
    """The embedder settings that change cosines (devices and batch size do not, beyond float noise),
    the removed ones at their old defaults (``Section.hash_dump``)."""
    return {k: v for k, v in cfg.hash_dump().items() if k not in ("device", "devices", "batch_size")}


def judge_fields_unhashed(cfg) -> set[str]:
    """The judge's settings when it is off: left out of the hash, so runs scored before the judge
    existed (or with it off) keep their hash."""
    return {"judge_model", "judge_ratio", "judge_batch_size"} if cfg.judge_model is None else {"judge_batch_size"}


def scores_hash(ctx: StageContext, shards: list[tuple[str, Path]], eval_fingerprint: str | None = None) -> str:
    """Config (the removed fields at their old defaults, ``Section.hash_dump``) + embedder + inputs
    (+ the evaluation texts decontaminated against, when any)."""
    unhashed = {"block_examples", "decontam_data_dir", *judge_fields_unhashed(ctx.cfg.score)}
    settings = {k: v for k, v in ctx.cfg.score.hash_dump().items() if k not in unhashed}
    parts: dict[str, Any] = {
        "score": {**settings, "inputs": list(input_stages(ctx.cfg))},  # "auto" as the stages it names
        "embedder": embedder_fingerprint(ctx.cfg.embedder),
        "inputs": {st: inputs_fingerprint(ctx.run_dir, st) for st in dict.fromkeys(s for s, _ in shards)},
    }
    if eval_fingerprint is not None:
        parts["decontam"] = eval_fingerprint
    return config_hash(parts)


def decontam_data_dir(ctx: StageContext) -> Path | None:
    """``score.decontam_data_dir``, else ``evaluate.data_dir``, else what ``negsynth evaluate`` uses by default."""
    d = ctx.cfg.score.decontam_data_dir or ctx.cfg.evaluate.data_dir
    if d:
        return Path(d)
    from negsynth.resources import default_data_dir

    return default_data_dir()


def load_decontam_texts(ctx: StageContext) -> EvalTexts:
    """The evaluation texts of ``score.decontam_sets`` (``skipped`` says why there are none)."""
    cfg = ctx.cfg.score
    try:
        return load_eval_texts(decontam_data_dir(ctx), TASKS, cfg.decontam_sets, cfg.decontam_retrieval_docs)
    except (EvalSetError, EvalDataError) as e:
        raise UserError(str(e)) from None
