"""``negsynth inspect DIR_OR_SHARD``: what is in a run dir, a stage folder or one shard.

>>> from negsynth.inspect import inspect_path
>>> rep = inspect_path("runs/default", sample=2, flag="false_negative")   # doctest: +SKIP
>>> rep["stages"]["generate"]["records"], rep["score"]["levels"][0]["mean"]  # doctest: +SKIP
(60, 0.4125)

The report (also ``--json``) has:

* ``stages``: per stage folder — ``records``, ``shards``, ``rejected``, ``rejects_by_reason``,
  and from its ``stats.json`` files ``tokens`` {prompt, completion}, ``estimated_cost_usd``,
  ``wall_time_s``;
* ``task_types``: per stage, records per task type;
* ``score`` (when the examples carry scores): ``examples`` (after filters), ``cos_pos``
  {mean, median}, ``levels`` (per LLM level: n, mean, median, false_negative_rate, too_easy_rate),
  ``monotonic_pct``, ``kendall_tau_mean``, ``false_negative_rate_by_task_type``;
* ``selection``: the filters and how many examples match; ``samples``: ``--sample N`` examples.

Filters select examples: ``--task-type``; ``--flag false_negative|too_easy`` (at any level, or
at ``--level L``); ``--flag non_monotonic``; ``--level L`` alone keeps only level L in the
per-level table. The score statistics are computed over the selection.

Scale: shards are read with polars (``scan_ndjson`` with an explicit partial schema), so only
the columns a number needs are materialised — ids, task types, reasons and score structs, never
the texts. Texts are read only for the ``--sample`` rows, line by line from their files. A
corrupted shard ends with one line naming the file and line.

The package's modules: :mod:`~negsynth.inspect.report` builds the report,
:mod:`~negsynth.inspect.render` prints it, :mod:`~negsynth.inspect.plots` draws its figures.
"""

from __future__ import annotations

from negsynth.inspect.plots import write_plots
from negsynth.inspect.render import render
from negsynth.inspect.report import (
    FLAGS,
    example_stages,
    inspect_path,
    level_word,
    negatives_mined,
    pick_samples,
    read_lines,
    resolve,
    score_frame,
    score_stats,
    select_examples,
    stage_order,
    stage_summary,
)

__all__ = [
    "FLAGS",
    "example_stages",
    "inspect_path",
    "level_word",
    "negatives_mined",
    "pick_samples",
    "read_lines",
    "render",
    "resolve",
    "score_frame",
    "score_stats",
    "select_examples",
    "stage_order",
    "stage_summary",
    "write_plots",
]
