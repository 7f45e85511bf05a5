"""Run several stages from one config: the path shared by ``negsynth run`` and Python users.

>>> from negsynth.pipeline.run import run_pipeline
>>> run_pipeline(load_config("demo.toml"), "runs/demo")          # doctest: +SKIP
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from negsynth.pipeline.context import Budget, StageContext
from negsynth.pipeline.llm_stage import llm_endpoint
from negsynth.pipeline.progress import Reporter
from negsynth.pipeline.registry import get_stage, uses_llm
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
    llm_idx = [i for i, n in enumerate(names) if uses_llm(n, cfg)]
    with ExitStack() as stack:
        base_url = None
        for i, (name, fn) in enumerate(fns):
            if i == (llm_idx or [None])[0]:
                base_url = stack.enter_context(llm_endpoint(cfg, Path(run_dir), reporter))
            ctx = StageContext(cfg=cfg, run_dir=Path(run_dir), overwrite=overwrite, reporter=reporter, base_url=base_url, budget=budget or Budget())
            reporter.info(f"[bold]== {name}[/]")
            out[name] = fn(ctx)
            st = out[name]
            if st.get("failed") or st.get("outage") or st.get("stopped_by") or st.get("pending"):
                if st.get("stopped_by"):
                    reporter.warn(f"{name} stopped by budget {st['stopped_by']}; later stages not run")
                else:
                    reporter.warn(f"{name} did not finish; later stages not run")
                break  # later stages would train and evaluate on partial (or no) data
            if llm_idx and i == llm_idx[-1]:
                stack.close()  # the LLM is no longer needed: free its cores for scoring and training
    return out
