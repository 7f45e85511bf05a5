"""The pipeline's one surface: what the stages (and a caller running them from Python) use of it.

``from negsynth.pipeline import Stage, StageContext, Summary, run_item_stage, ...``: the stage
contract and its runner (``stage``), what an LLM stage's estimator fills in (``tally``), the context and budgets (``context``), the run file's
hash (``config_hash``, from ``schemas.config_io``), progress (``progress``), the shared shape of the LLM stages (``llm_stage``,
``runner``) and the Ray executor (``ray_executor``). The modules themselves are the
implementation; the stages import nothing from them directly (``tests/test_layers.py``).

The names resolve when used (PEP 562 ``__getattr__``), each loading only its own module:
importing the package, as every ``negsynth.pipeline.x`` import does first, loads none of them,
so a stage or command that needs only the contract does not pay for the LLM client, and ``import
negsynth.cli`` stays as fast as it was. Type checkers read the imports under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from negsynth.pipeline.context import Budget, SharedBudget, StageContext
    from negsynth.pipeline.executor import Executor, LocalExecutor, RayExecutor, executor_for, run_stage, run_stages, split_stages
    from negsynth.pipeline.llm_stage import (
        cost_usd,
        item_stage_fingerprint,
        llm_fingerprint,
        llm_session,
        llm_stage_parts,
        run_item_stage,
        summary_rows,
    )
    from negsynth.pipeline.llm_task import LLMStage, LLMTask, inputs_fingerprint
    from negsynth.pipeline.progress import Reporter
    from negsynth.pipeline.ray_executor import embeds_in_driver, ray_embedding
    from negsynth.pipeline.runner import Outcome, RunReport, WorkItem, failure_message
    from negsynth.pipeline.stage import Stage, Summary
    from negsynth.pipeline.tally import Tally
    from negsynth.schemas.config_io import config_hash

#: each name of the surface -> the module that defines it (of this package unless dotted)
_MODULE_OF = {
    "config_hash": "negsynth.schemas.config_io",  # the run file is read below the pipeline
    "Budget": "context",
    "SharedBudget": "context",
    "StageContext": "context",
    "Executor": "executor",
    "LocalExecutor": "executor",
    "RayExecutor": "executor",
    "executor_for": "executor",
    "split_stages": "executor",
    "LLMStage": "llm_task",
    "LLMTask": "llm_task",
    "inputs_fingerprint": "llm_task",
    "cost_usd": "llm_stage",
    "item_stage_fingerprint": "llm_stage",
    "llm_fingerprint": "llm_stage",
    "llm_session": "llm_stage",
    "llm_stage_parts": "llm_stage",
    "run_item_stage": "llm_stage",
    "summary_rows": "llm_stage",
    "Reporter": "progress",
    "embeds_in_driver": "ray_executor",
    "ray_embedding": "ray_executor",
    "Outcome": "runner",
    "RunReport": "runner",
    "WorkItem": "runner",
    "failure_message": "runner",
    "Stage": "stage",
    "Summary": "stage",
    "run_stage": "executor",
    "run_stages": "executor",
    "Tally": "tally",
}

__all__ = [
    "Budget",
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "executor_for",
    "split_stages",
    "LLMStage",
    "LLMTask",
    "Outcome",
    "Reporter",
    "RunReport",
    "SharedBudget",
    "Stage",
    "StageContext",
    "Summary",
    "Tally",
    "WorkItem",
    "config_hash",
    "cost_usd",
    "inputs_fingerprint",
    "embeds_in_driver",
    "failure_message",
    "item_stage_fingerprint",
    "llm_fingerprint",
    "llm_session",
    "llm_stage_parts",
    "ray_embedding",
    "run_item_stage",
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
