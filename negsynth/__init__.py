"""negsynth: LLM-driven multi-granularity hard-negative synthesis (MGH) for text-embedding training.

The Python API, one import path each (defined in :mod:`negsynth.api`, loaded on first use so that
``import negsynth`` stays cheap)::

    import negsynth
    cfg = negsynth.load_config("my.toml", ["train.lr=1e-5"])   # built-in defaults <- file <- overrides
    stats = negsynth.run(cfg, "runs/mine")                     # the stages, as `negsynth run`
    ds = negsynth.training_data(negsynth.sample_corpus(), "runs/sample")  # documents -> datasets.Dataset
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# the package root sits in the top layer with the API (tests/test_layers.py), so no module of the
# package imports it; negsynth.api is imported on first use only, to keep ``import negsynth`` cheap
__all__ = ["evaluate_model", "load_config", "model_path", "run", "sample_corpus", "training_data"]


def __getattr__(name: str) -> Any:
    """A name of :data:`__all__`, from :mod:`negsynth.api` (imported on first use)."""
    if name in __all__:
        return getattr(importlib.import_module("negsynth.api"), name)
    raise AttributeError(f"module 'negsynth' has no attribute {name!r}")
