"""The pipeline's one surface: what the stages (and a Python caller) use of it; the stages import
nothing from its modules directly (``tests/test_layers.py``)."""

from negsynth.pipeline.context import Budget, StageContext
from negsynth.pipeline.executor import LocalExecutor, RayExecutor, executor_for, run_stage, run_stages
from negsynth.pipeline.llm_stage import LLMStage, inputs_fingerprint, item_entry, llm_parts, summary_rows
from negsynth.pipeline.manifest import read_json
from negsynth.pipeline.progress import Reporter
from negsynth.pipeline.runner import Outcome, RunReport, WorkItem, failure_message
from negsynth.pipeline.stage import Stage, Summary
from negsynth.pipeline.tally import Tally
from negsynth.schemas.config_io import config_hash

__all__ = [
    "Budget",
    "LLMStage",
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
    "config_hash",
    "executor_for",
    "failure_message",
    "inputs_fingerprint",
    "item_entry",
    "llm_parts",
    "read_json",
    "run_stage",
    "run_stages",
    "summary_rows",
]
