"""Run several stages from one config: the path shared by ``negsynth run`` and Python users.

>>> from negsynth.pipeline.run import run_pipeline
>>> run_pipeline(load_config("demo.toml"), "runs/demo")          # doctest: +SKIP
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from negsynth.pipeline.context import Budget, StageContext
from negsynth.pipeline.progress import Reporter
from negsynth.pipeline.registry import LLM_STAGES, get_stage
from negsynth.schemas.config import RunConfig


def run_pipeline(
    cfg: RunConfig,
    run_dir: str | Path,
    *,
    stages: list[str] | None = None,
    reporter: Reporter | None = None,
    overwrite: bool = False,
    budget: Budget | None = None,
) -> dict[str, dict]:
    """Run ``stages`` (default ``cfg.pipeline.stages``) in order; returns each stage's stats."""
    names = stages or cfg.pipeline.stages
    fns = [(n, get_stage(n)) for n in names]  # fail on an unknown name before any work
    reporter = reporter or Reporter()
    out: dict[str, dict] = {}
    with ExitStack() as stack:
        base_url = None
        if cfg.llm.base_url == "embedded" and any(n in LLM_STAGES for n in names):
            from negsynth.llm.server import EmbeddedServer

            reporter.info(f"starting the embedded llama.cpp server ({cfg.llm.model}) ...")
            server = stack.enter_context(EmbeddedServer(cfg.serve, cfg.llm.model, log_path=Path(run_dir) / "logs" / "llama-server.log"))
            base_url = server.base_url
            reporter.info(f"embedded server ready at {base_url}")
        for name, fn in fns:
            ctx = StageContext(cfg=cfg, run_dir=Path(run_dir), overwrite=overwrite, reporter=reporter, base_url=base_url, budget=budget or Budget())
            out[name] = fn(ctx)
    return out
