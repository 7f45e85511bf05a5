"""Stage — train: fine-tune an embedding model on the curriculum, in order.

In:  ``RUN_DIR/curriculum/dataset`` (training order) and ``[train]`` (:class:`TrainConfig`).
Out: ``RUN_DIR/train/final/`` (a SentenceTransformer folder; reload with
     ``negsynth.train.load_model(path)``), checkpoints ``RUN_DIR/train/checkpoint-N``,
     ``final/train_log.json`` (loss, lr, phase, level per step) and ``RUN_DIR/train/stats.json``
     (written by ``run_stage``).

``train.output_dir`` is ignored here (the run dir decides). A rerun of an interrupted train
continues from its latest whole checkpoint (:func:`_resume_point`); ``train.resume`` resumes even
after a config change and refuses the change instead of retraining (``keeps_on_change``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time

from negsynth.errors import UserError
from negsynth.pipeline import Stage, StageContext, Summary, config_hash, read_json
from negsynth.schemas.train import TrainConfig

NAME = "train"


def run(ctx: StageContext) -> dict:
    """Train (derived data: ``run_stage`` reuses the model while what it is made from is unchanged;
    with ``train.resume`` a changed config is refused instead of retrained: ``keeps_on_change``)."""
    from negsynth.data.curriculum import CurriculumError, load_curriculum

    out = ctx.run_dir / NAME
    data_dir = ctx.run_dir / "curriculum"
    tc = ctx.cfg.train.model_copy(update={"output_dir": str(out)})
    final = out / "final"
    if not (data_dir / "dataset").is_dir():
        raise UserError(f"{data_dir}: no curriculum dataset; run `negsynth curriculum` first")
    try:
        ds = load_curriculum(data_dir)
    except CurriculumError as e:
        raise UserError(str(e)) from None
    if len(ds) == 0:
        raise UserError(
            f"{data_dir}: the curriculum has 0 rows, nothing to train on; make more examples (or keep more in score) and rerun "
            "`negsynth score` and `negsynth curriculum` (check generate's valid count and score's rejects)"
        )
    from negsynth.train.loss import DISTILL_LOSSES

    if tc.loss in DISTILL_LOSSES and "label" not in ds.column_names:
        from negsynth.train.trainer import TEACHER_SETTING

        raise UserError(
            f"train.loss = {tc.loss!r} learns from a teacher's scores, and {data_dir} has none: make the examples with "
            f'{TEACHER_SETTING}, rerun `negsynth corpus` and `negsynth curriculum`, or set train.loss = "mnrl"'
        )
    from negsynth.train import train
    from negsynth.train.distributed import announce
    from negsynth.train.memory import PeakRSS

    tc = _curriculum_batch(ctx, tc)
    tc = _stock_schedule(ctx, tc)
    tc = _resume_point(ctx, tc)
    announce(tc)  # under a launcher: the other ranks train with this very config
    resumed_from = _checkpoint_step_of(tc.resume, out)
    t0 = time.monotonic()
    ctx.reporter.info(
        f"train: {len(ds)} rows, model={tc.model}, pooling={tc.pooling}, batch {tc.batch_size} x accum {tc.grad_accum}, tau={tc.temperature or 'auto'}"
        + (f", loss={tc.loss}" if tc.loss != "mnrl" else "")
    )
    try:
        # steps, loss and ETA on the reporter's bar (silent with --quiet / --json); anything the
        # trainer still prints on stdout goes to stderr: stdout is for --json output
        with contextlib.redirect_stdout(sys.stderr), PeakRSS() as mem:
            path = train(ds, tc, progress=ctx.reporter.progress)
    except ValueError as e:  # config problems the trainer detects (named field + fix)
        raise UserError(f"[train] {e}") from None
    saved = json.loads((final / "train_log.json").read_text(encoding="utf-8"))
    log = saved.get("log_history", [])
    losses = [e["loss"] for e in log if "loss" in e]
    return {
        "stage": NAME,
        "model": path,
        "rows": len(ds),
        "steps": len(losses),
        # the step of the checkpoint this run continued from (None: it trained from step 0)
        "resumed_from_step": resumed_from,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "phases_seen": sorted({e.get("phase") for e in log if e.get("phase") is not None}),
        "wall_time_s": round(time.monotonic() - t0, 3),
        # the process's resident memory at its highest while training (sampled every 50 ms)
        "peak_rss_mib": mem.peak_mib,
        # GradCache's rows per chunk when the loss embedded the batch in chunks (train.mini_batch_size), else None
        "gradcache_rows": (saved.get("loss") or {}).get("mini_batch_size"),
    }


def _curriculum_build(ctx: StageContext) -> dict:
    """The curriculum's build statistics (its card), or {} when there is no card."""
    return (read_json(ctx.run_dir / "curriculum" / "card.json") or {}).get("build") or {}


def _stock_schedule(ctx: StageContext, tc):
    """``tc`` for a ``stock`` curriculum, trained as sentence-transformers' stock recipe trains
    ``mine_hard_negatives``' rows: the ``NO_DUPLICATES`` sampler, one forward pass per batch where
    ``mini_batch_size`` is ``"auto"``, ``curriculum.total_steps`` where ``train.max_steps`` is
    unset: the stock recipe's model, bit for bit (tests/test_train_stock_equivalence.py)."""
    build = _curriculum_build(ctx)
    if build.get("schedule") != "stock":
        return tc
    update: dict = {"batch_sampler": "shuffled"}
    if tc.mini_batch_size == "auto":
        update["mini_batch_size"] = None
    if tc.max_steps < 0 and isinstance(build.get("total_steps"), int):
        update["max_steps"] = build["total_steps"]
    return tc.model_copy(update=update)


def _curriculum_batch(ctx: StageContext, tc):
    """``tc`` with the curriculum's batch size where it chose a smaller one than asked (too few
    examples to fill one of distinct texts): the rows are packed for it. Not under
    ``train.batch_sampler = "shuffled"``, which batches the rows itself."""
    if tc.batch_sampler == "shuffled":
        return tc
    build = _curriculum_build(ctx)
    b = build.get("batch_size")
    if build.get("batch_size_wanted") and isinstance(b, int) and b != tc.batch_size:
        ctx.reporter.info(f"train: batch size {b}, the curriculum's (too few examples for {build['batch_size_wanted']})")
        return tc.model_copy(update={"batch_size": b})
    return tc


def _memory_cell(stats: dict) -> str:
    if stats.get("peak_rss_mib") is None:
        return "-"
    chunks = f" (GradCache, {stats['gradcache_rows']}-row chunks)" if stats.get("gradcache_rows") else ""
    return f"{stats['peak_rss_mib']} MiB{chunks}"


def _resume_point(ctx: StageContext, tc):
    """``tc`` with ``resume`` set to the checkpoint an interrupted run of the same job left, or
    afresh (old checkpoints removed) when there is none or it was made from something else."""
    import shutil

    from negsynth.data.shards import atomic_write_json
    from negsynth.train.trainer import checkpoints, last_checkpoint

    if tc.resume is not False:  # asked for explicitly: the trainer takes it as given
        return tc
    out = ctx.run_dir / NAME
    made_from = {"config_hash": STAGE.made_from(ctx)}
    marker = out / "_made_from.json"
    same = read_json(marker) == made_from
    last = last_checkpoint(out) if same and not ctx.overwrite else None
    if last is not None:
        ctx.reporter.info(f"train: resuming from {last} (an interrupted run of the same config); --overwrite starts afresh")
        return tc.model_copy(update={"resume": str(last)})
    old = checkpoints(out)
    if old:
        why = (
            "--overwrite"
            if ctx.overwrite
            else "made from another config or curriculum"
            if marker.exists() and not same
            else "none is whole"
        )
        ctx.reporter.info(f"train: starting afresh ({why}): removing {len(old)} old checkpoint(s) in {out}")
        for _, p, _ in old:
            shutil.rmtree(p, ignore_errors=True)
    shutil.rmtree(out / "final", ignore_errors=True)
    atomic_write_json(marker, made_from)
    return tc


def _checkpoint_step_of(resume, out) -> int | None:
    """The step of the checkpoint ``resume`` names (True: the latest whole one in ``out``)."""
    from pathlib import Path

    from negsynth.train.trainer import checkpoint_step, last_checkpoint

    if resume is True:
        resume = last_checkpoint(out)
    return checkpoint_step(Path(resume)) if resume else None


def report(stats: dict) -> list[Summary]:
    fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    loss = f"{fmt(stats['loss_first'])} -> {fmt(stats['loss_last'])}"
    return [
        Summary(
            "train",
            [
                ("model", stats["model"]),
                ("steps", stats["steps"]),
                ("loss first -> last", loss),
                ("wall time", f"{stats['wall_time_s']:.1f} s"),
                ("peak memory", _memory_cell(stats)),
            ],
        )
    ]


class Train(Stage):
    """The fine-tuned embedder: see the module's docstring."""

    name = NAME
    summary = "the fine-tuned embedder"
    config = TrainConfig
    relaunch = "rebuild"
    done_files = ("stats.json", "final")

    def inputs(self, cfg) -> tuple[str, ...]:
        return ("curriculum",)

    def keeps_on_change(self, cfg) -> bool:
        return bool(cfg.train.resume)

    def made_from(self, ctx: StageContext) -> str:
        """The hash of what the model is trained from: the train settings (not where it trains) and
        the curriculum's card; settings at their defaults keep an older run dir's hash."""
        from negsynth.schemas.config import added_at_default

        card = ctx.run_dir / "curriculum" / "card.json"
        tc = ctx.cfg.train
        # the settings added later (the loss) count only where they differ from their defaults
        settings = added_at_default(tc, tc.model_dump(exclude={"resume", "output_dir", "device"}))
        if tc.batch_sampler == "ordered":  # the one sampler before the setting existed: older models are kept
            settings.pop("batch_sampler")
        return config_hash({"train": settings, "data": card.read_text() if card.exists() else None})

    run = staticmethod(run)
    report = staticmethod(report)


STAGE = Train()
