"""The pipeline's one surface: what the stages (and a caller running them from Python) use of it.

``from negsynth.pipeline import Stage, LLMStage, StageContext, WorkItem, ...``: the stage contract
(``stage``), the LLM stages' shape and plumbing (``llm_stage``, ``runner``), the context and
budgets (``context``), what an estimator fills in (``tally``), where stages run (``executor``)
and the run file's hash (``config_hash``, from ``schemas.config_io``). The stages import nothing
from the modules directly (``tests/test_layers.py``).

The names resolve when used (PEP 562 ``__getattr__``), each loading only its own module:
importing the package, as every ``negsynth.pipeline.x`` import does first, loads none of them,
so a command that needs only the contract does not pay for the LLM client. Type checkers read
the imports under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from negsynth.pipeline.context import Budget, StageContext
    from negsynth.pipeline.executor import Executor, LocalExecutor, RayExecutor, executor_for, run_stage, run_stages
    from negsynth.pipeline.llm_stage import (
        LLMStage,
        LLMTask,
        budget_gate,
        cost_usd,
        inputs_fingerprint,
        item_entry,
        llm_fingerprint,
        llm_parts,
        llm_session,
        summary_rows,
    )
    from negsynth.pipeline.progress import Reporter
    from negsynth.pipeline.ray_executor import ray_embedding
    from negsynth.pipeline.runner import Outcome, RunReport, WorkItem, failure_message
    from negsynth.pipeline.stage import Stage, Summary
    from negsynth.pipeline.tally import Tally
    from negsynth.schemas.config_io import config_hash

#: each name of the surface -> the module that defines it (of this package unless dotted)
_MODULE_OF = {
    "config_hash": "negsynth.schemas.config_io",  # the run file is read below the pipeline
    "Budget": "context",
    "StageContext": "context",
    "Executor": "executor",
    "LocalExecutor": "executor",
    "RayExecutor": "executor",
    "executor_for": "executor",
    "run_stage": "executor",
    "run_stages": "executor",
    "LLMStage": "llm_stage",
    "LLMTask": "llm_stage",
    "budget_gate": "llm_stage",
    "cost_usd": "llm_stage",
    "inputs_fingerprint": "llm_stage",
    "item_entry": "llm_stage",
    "llm_fingerprint": "llm_stage",
    "llm_parts": "llm_stage",
    "llm_session": "llm_stage",
    "summary_rows": "llm_stage",
    "Reporter": "progress",
    "ray_embedding": "ray_executor",
    "Outcome": "runner",
    "RunReport": "runner",
    "WorkItem": "runner",
    "failure_message": "runner",
    "Stage": "stage",
    "Summary": "stage",
    "Tally": "tally",
}

__all__ = [
    "Budget",
    "Executor",
    "LLMStage",
    "LLMTask",
    "LocalExecutor",
    "Outcome",
    "RayExecutor",
    "Reporter",
    "RunReport",
    "Stage",
    "StageContext",
    "Summary",
    "Tally",
    "WorkItem",
    "budget_gate",
    "config_hash",
    "cost_usd",
    "executor_for",
    "failure_message",
    "inputs_fingerprint",
    "item_entry",
    "llm_fingerprint",
    "llm_parts",
    "llm_session",
    "ray_embedding",
    "run_stage",
    "run_stages",
    "summary_rows",
]


def __getattr__(name: str) -> Any:
    """A name of :data:`__all__`, read from its module (imported on first use) each time, so what
    the module holds now is what a caller gets (a test's monkeypatch of the module included)."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module if "." in module else f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
