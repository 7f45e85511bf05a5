"""``--executor ray``: an LLM stage's shard workers as Ray tasks (``pip install 'negsynth[ray]'``).

The same deterministic split as ``--shard-index k --num-shards n`` on n machines, scheduled by
Ray instead of by hand: worker k is one Ray task running :func:`~negsynth.pipeline.stage.run_stage`
with ``shard_index = k``; when all are done the driver merges their stats (``negsynth merge``).
So the union of the shards equals a one-process run byte for byte, a task that dies is retried
by Ray (``max_retries``) and resumes from its ``.partial`` shards and the request cache, and
nothing new decides what is written.

- The run dir must be on a filesystem every Ray node sees (one node: any local folder).
- Limits stay global: each of the n workers gets ``1/n`` of ``llm.max_concurrency`` (rounded
  up) and of ``llm.rpm`` / ``llm.tpm`` (rounded down, at least 1).
- ``llm.endpoints`` travels with the config: every worker spreads its requests over the same
  servers, with ``1/n`` of each endpoint's ``max_concurrency`` (rounded up), and takes a dead
  one out on its own.
- ``llm.base_url = "embedded"`` starts one server in the driver and every worker uses it, so it
  serves a one-node cluster; a multi-node cluster needs a served endpoint (vLLM, OpenAI, ...).
- The API key is read by each worker from its own environment (``llm.api_key_env``, and each
  endpoint's ``api_key_env``), never shipped in the task's arguments.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from negsynth.errors import NegsynthError, UserError
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.embedded import llm_endpoint
from negsynth.pipeline.llm_stage import merge_stage
from negsynth.pipeline.progress import Reporter
from negsynth.pipeline.stage import Stage, check_inputs, run_stage, unfinished
from negsynth.schemas.config import RunConfig


def worker_config(cfg: RunConfig, n: int) -> RunConfig:
    """``cfg`` with the global LLM limits divided among ``n`` workers."""
    llm = cfg.llm
    update: dict[str, Any] = {"max_concurrency": max(1, math.ceil(llm.max_concurrency / n))}
    if llm.endpoints:  # every worker sends to every endpoint: each gets 1/n of each one's slots
        update["endpoints"] = [
            e.model_copy(update={"max_concurrency": max(1, math.ceil(llm.endpoint_concurrency(e) / n))}) for e in llm.endpoints
        ]
    if llm.rpm is not None:
        update["rpm"] = max(1, llm.rpm // n)
    if llm.tpm is not None:
        update["tpm"] = max(1, llm.tpm // n)
    return cfg.model_copy(update={"llm": llm.model_copy(update=update)})


def _worker(stage: Stage, cfg_json: dict, run_dir: str, k: int, n: int, base_url: str | None, overwrite: bool, mode: str) -> dict:
    """One Ray task: shard worker ``k`` of ``n`` of ``stage`` (the Stage object travels with the
    task, so this layer needs no registry of the method's stages)."""
    cfg = RunConfig.model_validate(cfg_json)
    ctx = StageContext(
        cfg=cfg,
        run_dir=Path(run_dir),
        overwrite=overwrite,
        shard_index=k,
        num_shards=n,
        reporter=Reporter(quiet=True),
        mode=mode,
        base_url=base_url,
    )
    return run_stage(stage, ctx)


def _ray():
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'negsynth[ray]' (or pip install ray)") from None
    return ray


def run_on_ray(stage: Stage, ctx: StageContext, *, workers: int, address: str | None = None, max_retries: int = 3) -> dict:
    """Run ``stage`` as ``workers`` Ray tasks and merge them; returns the merged stats."""
    if not stage.shardable:  # score dedups in input order: one process, see docs/scale.md
        raise UserError(f"--executor ray: {stage.name} does not split into shard workers; run it without --executor")
    if workers < 1:
        raise UserError(f"--workers {workers}: must be >= 1")
    if ctx.num_shards != 1:
        raise UserError("--executor ray splits the work itself: drop --shard-index/--num-shards (use --workers)")
    if any(v is not None for v in (ctx.budget.max_requests, ctx.budget.max_tokens, ctx.budget.max_cost)):
        raise UserError("--executor ray: budgets are counted per process; drop --max-requests/--max-tokens/--max-cost or run without Ray")
    ray = _ray()
    check_inputs(stage, ctx)
    address = address or os.environ.get("RAY_ADDRESS")
    cfg_json = worker_config(ctx.cfg, workers).model_dump(mode="json")
    with llm_endpoint(ctx.cfg, ctx.run_dir, ctx.reporter, needed=stage.needs_llm(ctx.cfg)) as url:
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        task = ray.remote(max_retries=max_retries)(_worker)
        ctx.reporter.info(f"{stage.name}: {workers} Ray task(s) on {ray.cluster_resources().get('CPU', 0):.0f} CPU(s)")
        refs = [
            task.remote(stage, cfg_json, str(ctx.run_dir.resolve()), k, workers, url or ctx.base_url, ctx.overwrite, ctx.mode)
            for k in range(workers)
        ]
        try:
            parts = ray.get(refs)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, NegsynthError):
                raise cause from None
            raise
        except ray.exceptions.RayError as e:  # a worker died more often than Ray retries it, or the cluster went away
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(
                f"{stage.name}: a Ray worker failed after {max_retries} retries ({first}); finished shards are kept, rerun the same command to resume"
            ) from None
    bad = next((p for p in parts if unfinished(p)), None)
    if bad is not None:
        return {**bad, "executor": "ray", "workers": workers}
    merged = merge_stage(ctx.run_dir, stage.name)
    return {**merged, "executor": "ray", "workers": workers}
