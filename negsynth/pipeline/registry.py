"""The stages ``negsynth run`` can drive, by name, imported lazily (torch only when needed)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from negsynth.pipeline.context import StageContext

#: stage name -> "module:function"; each function takes a StageContext and returns its stats
STAGES: dict[str, str] = {
    "brainstorm": "negsynth.stages.brainstorm:run",
    "generate": "negsynth.stages.generate:run",
    "regenerate": "negsynth.stages.regenerate:run",
    "score": "negsynth.stages.score:run",
    "curriculum": "negsynth.stages.curriculum:run",
    "train": "negsynth.stages.train:run",
    "evaluate": "negsynth.stages.evaluate:run",
}

#: stages that call the LLM (``negsynth run`` starts the embedded server only for these)
LLM_STAGES = {"brainstorm", "generate", "regenerate"}


def get_stage(name: str) -> Callable[[StageContext], dict]:
    try:
        target = STAGES[name]
    except KeyError:
        from negsynth.errors import UserError

        raise UserError(f"unknown stage {name!r} in pipeline.stages; choose from {', '.join(STAGES)}") from None
    mod, fn = target.split(":")
    return getattr(importlib.import_module(mod), fn)


def uses_llm(name: str, cfg) -> bool:
    """Whether stage ``name`` calls the LLM under ``cfg`` (a stage module may say no with
    ``needs_llm(cfg)``, e.g. regenerate with mined negatives): no server is started for it."""
    if name not in LLM_STAGES:
        return False
    mod = importlib.import_module(STAGES[name].split(":")[0])
    check = getattr(mod, "needs_llm", None)
    return True if check is None else bool(check(cfg))
