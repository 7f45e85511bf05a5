"""``negsynth inspect DIR_OR_SHARD``: what is in a run dir, a stage folder or one shard.

    rep = inspect_path("runs/default", sample=2, flag="false_negative")
    rep["stages"]["generate"]["records"], rep["score"]["levels"][0]["mean"]

The report (also ``--json``): ``stages`` (records, shards, rejects by reason, tokens, cost, wall
time per stage folder), ``task_types`` (records per task type), ``score`` (the per-level cosine and
flag statistics of ``score``, over the selected examples), ``selection`` and ``samples``. Filters
(``--task-type``, ``--flag false_negative|too_easy|non_monotonic``, ``--level``) select examples.

:mod:`~negsynth.inspect.report` builds the report, :mod:`~negsynth.inspect.render` prints it,
:mod:`~negsynth.inspect.plots` draws its figures.
"""

from __future__ import annotations

from negsynth.inspect.plots import write_plots
from negsynth.inspect.render import render
from negsynth.inspect.report import inspect_path, resolve, stage_order

__all__ = ["inspect_path", "render", "resolve", "stage_order", "write_plots"]
