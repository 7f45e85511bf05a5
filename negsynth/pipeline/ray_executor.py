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
- Budgets (``--max-requests`` / ``--max-tokens`` / ``--max-cost``) are one budget for the whole
  invocation, not split: a :class:`BudgetLedger` actor holds the counts, every worker's client
  counts a request on it before sending (so together they never overshoot ``--max-requests``) and
  adds each answer's tokens. Once a limit is reached no worker sends a new request; the requests
  in flight finish, finished work is written and the stage stops with ``stopped_by`` (exit 3), as
  in one process. A worker Ray retries keeps what its first try counted (a request may then be
  counted but unanswered: the budget can end early, never late).
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
from negsynth.pipeline.context import Budget, SharedBudget, StageContext
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


class BudgetLedger:
    """The counts of one invocation's budget, shared by its Ray workers (a Ray actor: it runs its
    calls one at a time, so :meth:`reserve`'s check and count can never interleave with another
    worker's)."""

    def __init__(self, budget: Budget, input_per_mtok: float, output_per_mtok: float):
        self.budget = budget
        self.price = (input_per_mtok, output_per_mtok)
        self.requests = self.prompt_tokens = self.completion_tokens = 0

    def cost(self) -> float:
        return (self.prompt_tokens * self.price[0] + self.completion_tokens * self.price[1]) / 1e6

    def reserve(self) -> str | None:
        """Count one request, or say which limit is reached (then nothing is counted)."""
        why = self.budget.exceeded(self.requests, self.prompt_tokens + self.completion_tokens, self.cost())
        if why is None:
            self.requests += 1
        return why

    def unreserve(self) -> None:
        self.requests -= 1  # a refused connection sent nothing: not a request

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def used(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "tokens": self.prompt_tokens + self.completion_tokens,
            "cost_usd": round(self.cost(), 6),
        }


def _worker(
    stage: Stage,
    cfg_json: dict,
    run_dir: str,
    k: int,
    n: int,
    base_url: str | None,
    overwrite: bool,
    mode: str,
    limits: tuple[int | None, int | None, float | None] = (None, None, None),
    ledger: Any = None,
) -> dict:
    """One Ray task: shard worker ``k`` of ``n`` of ``stage`` (the Stage object travels with the
    task, so this layer needs no registry of the method's stages). With ``ledger`` (a
    :class:`BudgetLedger` actor) its requests count against the invocation's one budget."""
    cfg = RunConfig.model_validate(cfg_json)
    ctx = StageContext(
        cfg=cfg,
        run_dir=Path(run_dir),
        overwrite=overwrite,
        shard_index=k,
        num_shards=n,
        budget=SharedBudget(*limits, ledger=ledger) if ledger is not None else Budget(),
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
    b = ctx.budget
    limits = (b.max_requests, b.max_tokens, b.max_cost)
    ray = _ray()
    check_inputs(stage, ctx)
    address = address or os.environ.get("RAY_ADDRESS")
    cfg_json = worker_config(ctx.cfg, workers).model_dump(mode="json")
    with llm_endpoint(ctx.cfg, ctx.run_dir, ctx.reporter, needed=stage.needs_llm(ctx.cfg)) as url:
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        task = ray.remote(max_retries=max_retries)(_worker)
        ctx.reporter.info(f"{stage.name}: {workers} Ray task(s) on {ray.cluster_resources().get('CPU', 0):.0f} CPU(s)")
        ledger = None
        if any(v is not None for v in limits):  # one budget for every worker (no CPU of its own)
            price = ctx.cfg.llm.price
            ledger = ray.remote(num_cpus=0)(BudgetLedger).remote(b, price.input_per_mtok, price.output_per_mtok)
        refs = [
            task.remote(
                stage, cfg_json, str(ctx.run_dir.resolve()), k, workers, url or ctx.base_url, ctx.overwrite, ctx.mode, limits, ledger
            )
            for k in range(workers)
        ]
        try:
            parts = ray.get(refs)
            used = ray.get(ledger.used.remote()) if ledger is not None else None
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
        finally:
            if ledger is not None:
                ray.kill(ledger)
    budget = (
        {
            "budget": {
                "max_requests": b.max_requests,
                "max_tokens": b.max_tokens,
                "max_cost": b.max_cost,
                "scope": SharedBudget.scope,
                "used": used,
            }
        }
        if used is not None
        else {}
    )
    # a failure or an outage says more than a budget stop (and exits with its own code)
    bad = next((p for p in parts if unfinished(p) and not p.get("stopped_by")), None) or next((p for p in parts if unfinished(p)), None)
    if bad is not None:
        if bad.get("stopped_by"):  # every worker's items done and written, not only this one's
            bad = {**bad, **{k: sum(int(p.get(k) or 0) for p in parts) for k in ("items", "valid", "rejected")}}
        return {**bad, "executor": "ray", "workers": workers, **budget}
    merged = merge_stage(ctx.run_dir, stage.name)
    return {**merged, "executor": "ray", "workers": workers, **budget}
