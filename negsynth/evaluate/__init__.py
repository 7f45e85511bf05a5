"""A small offline MTEB on the real benchmark files in ``shared/data``.

Public API::

    from negsynth.evaluate import evaluate, render_table, compare, print_report, paired_test
    report = evaluate(embedder, suite="quick")          # dict, see runner.py for the schema
    print_report(report, baseline=old_report)           # rich table with deltas
    paired_test(a, b)   # two models' per-query scores: mean difference, bootstrap CI, sign-flip p

``negsynth evaluate --help`` runs it from the shell (MiniLM by default).
"""

from negsynth.data.readers import EvalDataError
from negsynth.evaluate.own_corpus import paired_test
from negsynth.evaluate.runner import compare, evaluate, load_report, print_report, render_table, write_report
from negsynth.evaluate.suite import TASKS, TaskSpec, UnknownTask, retrieval_task, select_tasks

__all__ = [
    "TASKS",
    "EvalDataError",
    "TaskSpec",
    "UnknownTask",
    "compare",
    "evaluate",
    "load_report",
    "paired_test",
    "print_report",
    "render_table",
    "retrieval_task",
    "select_tasks",
    "write_report",
]
