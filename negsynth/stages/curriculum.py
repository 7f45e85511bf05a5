"""Stage — curriculum: scored examples -> training rows in training order.

In:  ``RUN_DIR/<curriculum.input>/`` (default ``score``) :class:`Example` shards.
Out: ``RUN_DIR/curriculum/`` — ``dataset/`` (HF ``save_to_disk``), ``train.parquet``,
     ``card.json`` / ``card.md`` (composition), ``stats.json`` (written by ``run_stage``).

Columns: ``anchor`` (instruction-formatted query), ``positive``, ``negative`` (the example's
negative at the row's level; ``negative_1..4``, hardest first, with a ``tuple`` schedule), ``level``
(1 = hardest … 4 = easiest; 0 = every level), ``phase``, ``batch``, ``task_type``, ``example_id``,
``source``. Rows are in training order: never shuffle them. ``schedule = "auto"`` (the default)
is resolved by :func:`resolve_schedule`.
The rules (phases, disjoint groups, no duplicate text per batch) are in
:mod:`negsynth.data.curriculum`.
"""

from __future__ import annotations

import time
from collections import Counter

from negsynth.errors import UserError
from negsynth.pipeline import Stage, StageContext, Summary, config_hash, inputs_fingerprint
from negsynth.schemas.config import CurriculumConfig
from negsynth.stages.common import read_stage_records

NAME = "curriculum"


def anchor_template(cfg) -> str | None:
    """The anchor format: ``curriculum.instruction_template`` when instructions are on ("on", or
    "auto" with ``evaluate.instruct_queries``), else the bare query — train as you evaluate."""
    cc = cfg.curriculum
    on = cc.instructions == "on" or (cc.instructions == "auto" and cfg.evaluate.instruct_queries)
    return cc.instruction_template if on else None


def resolve_schedule(cc, examples: list[dict]) -> str:
    """``curriculum.schedule``, with ``auto`` resolved: ``tuple`` (every row carries its 4 hardest
    negatives) when all negatives were mined — ``curriculum.negatives = "mined"`` or every example
    made by the corpus stage's mining (``model`` = ``mined:…:corpus``) — since on SciFact mined
    negatives trained better that way than as a graded curriculum (benchmarks/scifact_recipe.py);
    ``stock`` when every example is a labelled pair with the 4 hardest mined negatives
    (``regenerate.negatives = "mined"``, ``mining.strategy = "top"``): the stock recipe's own rows and training, which led negsynth's tuple path on
    SciFact-dev and Cranfield-dev (docs/recipe.md); else ``curriculum``, the method's order for
    LLM-graded negatives."""
    if cc.schedule != "auto":
        return cc.schedule
    models = [str(e.get("model") or "") for e in examples]
    if cc.negatives != "mined" and models and all(m.startswith("mined:") and m.endswith(":top") for m in models):
        return "stock"  # labelled pairs with the hardest mined negatives: the stock recipe's rows, trained its way
    mined = cc.negatives == "mined" or (bool(models) and all(m.startswith("mined:") for m in models))
    return "tuple" if mined else "curriculum"


def run(ctx: StageContext) -> dict:
    """Build the dataset (derived data: ``run_stage`` reuses it while what it is made from is unchanged)."""
    from negsynth.data.curriculum import (
        BatchFillError,
        CurriculumError,
        build_curriculum,
        has_full_batch,
        largest_fitting_batch,
        save_curriculum,
    )
    from negsynth.data.stock import stock_curriculum

    cc = ctx.cfg.curriculum
    batch_size = cc.batch_size or ctx.cfg.train.batch_size
    out = ctx.run_dir / NAME
    t0 = time.monotonic()
    examples = list(read_stage_records(ctx.run_dir, cc.input, hint=f"run `negsynth {cc.input}` first (curriculum.input = {cc.input!r})"))
    try:
        schedule = resolve_schedule(cc, examples)
        options = {
            "schedule": schedule,
            "total_steps": cc.total_steps,
            "epochs": cc.epochs if cc.total_steps is None else None,
            "seed": cc.seed,
            "homogeneous_batches": cc.homogeneous_batches,
            "use_mined": cc.negatives == "mined",
            "instruction_template": anchor_template(ctx.cfg),
        }
        try:
            rows = (stock_curriculum if schedule == "stock" else build_curriculum)(examples, batch_size=batch_size, **options)
        except BatchFillError:
            rows = None
        # "stock" plans no batches: the trainer's shuffled sampler leaves one short rather than repeat a text
        if schedule != "stock" and not has_full_batch(rows):  # a small pool: no text may appear twice in a batch, so fewer rows share one
            wanted, fit = batch_size, largest_fitting_batch(examples, batch_size, **options)
            if fit is None:
                raise CurriculumError(
                    f"curriculum: {len(examples)} examples gave no batch of even 2 rows whose texts are all distinct "
                    "(no text may appear twice in a batch); make more examples"
                )
            batch_size, rows = fit
            rows.stats["batch_size_wanted"] = wanted
            mined = cc.negatives == "mined" or all(str(e.get("model") or "").startswith("mined:") for e in examples)
            why = ", and mined negatives are other examples' documents" if mined else ""
            ctx.reporter.warn(
                f"curriculum: {len(examples)} examples cannot fill a batch of {wanted} with distinct texts (no text may appear twice "
                f"in a batch{why}); using batch size {batch_size}, the largest that fills, "
                + (
                    f"for the curriculum's batches (train's shuffled sampler batches the rows itself, {wanted} at most)"
                    if ctx.cfg.train.batch_sampler == "shuffled"
                    else "for curriculum and train (more examples keep the size asked for)"
                )
            )
        save_curriculum(rows, out, stats=dict(rows.stats))
    except CurriculumError as e:
        raise UserError(str(e)) from None
    return {
        "stage": NAME,
        "examples": len(examples),
        "rows": len(rows),
        "batches": rows.stats.get("steps", len(rows) // batch_size),
        "short_batches": rows.stats.get("short_batches", 0),
        "batch_size": batch_size,
        # the batch size asked for, when too few examples filled no batch of it (batch_size: the largest that did)
        "batch_size_wanted": rows.stats.get("batch_size_wanted"),
        "schedule": schedule,
        "schedule_setting": cc.schedule,
        "rows_per_phase": dict(Counter(str(r["phase"]) for r in rows)),
        "builder": dict(rows.stats),
        "output": str(out),
        "wall_time_s": round(time.monotonic() - t0, 3),
    }


def report(stats: dict) -> list[Summary]:
    return [
        Summary(
            "curriculum",
            [
                ("examples in", stats["examples"]),
                ("rows (training order)", stats["rows"]),
                (
                    (
                        "batches of",
                        f"the trainer's shuffled sampler (NO_DUPLICATES): {stats['batches']} steps x up to {stats['batch_size']}",
                    )
                    if stats["schedule"] == "stock"
                    else (
                        "batches of",
                        f"{stats['batches']} x {stats['batch_size']}"
                        + (f" ({stats['short_batches']} shorter: a phase's last rows)" if stats.get("short_batches") else "")
                        + (f" (too few examples for {stats['batch_size_wanted']})" if stats.get("batch_size_wanted") else ""),
                    )
                ),
                ("schedule", stats["schedule"] + (" (auto)" if stats.get("schedule_setting") == "auto" else "")),
                ("rows per phase", ", ".join(f"{k}: {v}" for k, v in stats["rows_per_phase"].items())),
                *[(f"  {k}", v) for k, v in stats["builder"].items() if k.startswith(("dropped", "skipped", "moved", "rows_in_short"))],
                ("output", stats.get("output", "")),
            ],
        )
    ]


class Curriculum(Stage):
    """Training rows in training order: see the module's docstring."""

    name = NAME
    summary = "training rows, easiest level first"
    config = CurriculumConfig
    relaunch = "rebuild"

    def inputs(self, cfg) -> tuple[str, ...]:
        return (cfg.curriculum.input,)

    def made_from(self, ctx: StageContext) -> str:
        """The hash of what the dataset is made from: settings, batch size, anchor format, input shards."""
        cc = ctx.cfg.curriculum
        batch_size = cc.batch_size or ctx.cfg.train.batch_size
        return config_hash(
            {
                "curriculum": cc,
                "batch_size": batch_size,
                "anchor": anchor_template(ctx.cfg),
                "inputs": inputs_fingerprint(ctx.run_dir, cc.input),
            }
        )

    def run(self, ctx: StageContext) -> dict:
        return run(ctx)

    def report(self, stats: dict) -> list[Summary]:
        return report(stats)


STAGE = Curriculum()
