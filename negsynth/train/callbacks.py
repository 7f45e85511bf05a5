"""The trainer callbacks that report a curriculum run: its phase and level in the step log, and
steps, loss and ETA on a progress bar (both used by :func:`negsynth.train.trainer.make_trainer`)."""

from __future__ import annotations

import logging

# the trainer's logger, as before these callbacks had a module of their own
log = logging.getLogger("negsynth.train.trainer")


def curriculum_log_callback(phases: list | None, levels: list | None, grad_accum: int, batch_starts: list | None):
    """A callback that logs each step with the curriculum phase and level it trained on."""
    from transformers import TrainerCallback

    class CurriculumLogCallback(TrainerCallback):
        """Adds the curriculum ``phase``/``level`` of the last consumed batch to each log record.

        Optimizer step s consumed micro-batches ``[(s-1)·A, s·A)``; the phase is that of the first row of
        the last one (``batch_starts``: each planned batch's first row, short batches included;
        without it the batches are shuffled, which only a curriculum of one phase and one level
        allows, so the first row tells). ``state.log_history[-1]`` is the record the trainer just
        stored, so the phase lands in ``trainer_state.json`` next to the loss.
        """

        def on_log(self, args, state, control, logs=None, **kw):
            if not phases or not state.global_step or logs is None or "loss" not in logs:
                return
            row = batch_starts[((state.global_step * grad_accum) - 1) % len(batch_starts)] if batch_starts else 0
            rec = state.log_history[-1] if state.log_history else {}
            rec["phase"] = phases[row]
            if levels:
                rec["level"] = levels[row]
            log.info(
                "step %d loss %.4f phase %s level %s lr %.2e",
                state.global_step,
                logs["loss"],
                phases[row],
                levels[row] if levels else "-",
                logs.get("learning_rate", float("nan")),
            )

    return CurriculumLogCallback()


def progress_callback(progress):
    """Steps, loss and ETA on a progress bar: ``progress(description, total, status=..., completed=...)``
    is a context manager yielding a bar with ``update(advance=0, **fields)`` (the stage passes
    :meth:`negsynth.pipeline.progress.Reporter.progress`). The bar opens when training starts
    (the trainer knows its step count then; a resumed run starts at its checkpoint's step) and
    closes when it ends; :meth:`close` closes it after an error too. Rank 0 only."""
    from contextlib import ExitStack

    from transformers import TrainerCallback

    class TrainProgress(TrainerCallback):
        is_negsynth_progress = True

        def __init__(self):
            self.stack = ExitStack()
            self.bar = None
            self.step = 0

        def on_train_begin(self, args, state, control, **kw):
            if state.is_world_process_zero and self.bar is None:
                self.step = state.global_step
                self.bar = self.stack.enter_context(progress("train", state.max_steps, status="", completed=state.global_step))

        def on_step_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.update(advance=state.global_step - self.step)
                self.step = state.global_step

        def on_log(self, args, state, control, logs=None, **kw):
            if self.bar is not None and logs and "loss" in logs:
                self.bar.update(status=f"loss {logs['loss']:.4f}")

        def on_train_end(self, args, state, control, **kw):
            self.close()

        def close(self) -> None:
            self.bar = None
            self.stack.close()

    return TrainProgress()
