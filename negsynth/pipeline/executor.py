"""Where stages run: one executor object, chosen once (``--executor local | ray``) and handed to
the pipeline; the stages do not know which runs them.

``LocalExecutor`` runs every stage in this process. ``RayExecutor`` runs a stage that splits into
shard workers (``Stage.shardable``, calling the LLM) as ``workers`` Ray tasks merged here, and a
stage whose heavy work is embedding (``Stage.embeds``) here with that embedding on ``workers`` Ray
actors (:mod:`negsynth.pipeline.ray_executor`); every other stage of a pipeline runs here.

Each executor answers three questions the runner asks: ``check(stage)`` (can this stage run on
me alone? one line when not), ``run_one(stage, ctx)`` (one stage's command) and, inside a pipeline
(:func:`negsynth.pipeline.stage.run_stages`), ``around(stage, ctx)`` and ``run(stage, ctx,
start_llm)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

from negsynth.errors import UserError
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.stage import Stage, run_stage


def split_stages(method: Sequence[Stage]) -> tuple[str, ...]:
    """The stages ``--executor ray`` splits: those whose work splits into shard workers
    (``Stage.shardable``), then those whose embedding it spreads over workers (``Stage.embeds``;
    the stage itself runs in one process), each once, in the method's order."""
    return tuple(dict.fromkeys([s.name for s in method if s.shardable] + [s.name for s in method if s.embeds]))


class LocalExecutor:
    """Every stage in this process."""

    name = "local"
    #: whether the embedded LLM's only clients are in this process (its prompt prefix may be
    #: pinned, :mod:`negsynth.llm.prefix_pin`); Ray's workers are other processes
    llm_in_process = True

    def check(self, stage: Stage) -> None:
        """Every stage runs locally."""

    def run_one(self, stage: Stage, ctx: StageContext) -> dict:
        return run_stage(stage, ctx)

    def around(self, stage: Stage, ctx: StageContext) -> AbstractContextManager[dict]:
        return nullcontext({})

    def run(self, stage: Stage, ctx: StageContext, start_llm: Callable[[], str | None] | None = None) -> dict:
        return run_stage(stage, ctx, start_llm=start_llm)


class RayExecutor(LocalExecutor):
    """Shard workers and embedding on ``workers`` Ray workers (``address``: a cluster to join)."""

    name = "ray"
    llm_in_process = False

    def __init__(self, workers: int, address: str | None = None, *, method: Sequence[Stage] = ()):
        self.workers = workers
        self.address = address
        self.method = method  # the method's stages, to name those that split in a refusal

    def check(self, stage: Stage) -> None:
        if not (stage.shardable or stage.embeds):
            split = split_stages(self.method)
            hint = f" (it splits: {', '.join(split)})" if split else ""
            raise UserError(f"--executor ray: {stage.name} does not split into Ray workers; run it without --executor{hint}")

    def run_one(self, stage: Stage, ctx: StageContext) -> dict:
        from negsynth.pipeline.ray_executor import run_on_ray

        self.check(stage)
        return run_on_ray(stage, ctx, workers=self.workers, address=self.address)

    @contextmanager
    def around(self, stage: Stage, ctx: StageContext) -> Iterator[dict]:
        """A stage's encoding on the Ray workers (score, mining, corpus's index); every other stage as it is."""
        from negsynth.pipeline.ray_executor import embeds_in_driver, ray_embedding

        if not embeds_in_driver(stage, ctx.cfg):
            yield {}
            return
        with ray_embedding(ctx, workers=self.workers, address=self.address):
            yield {"executor": "ray", "workers": self.workers}

    def run(self, stage: Stage, ctx: StageContext, start_llm: Callable[[], str | None] | None = None) -> dict:
        """A shardable LLM stage as shard workers, with the run's one embedded server; the others here."""
        from negsynth.pipeline.ray_executor import embeds_in_driver, run_on_ray

        if stage.shardable and not embeds_in_driver(stage, ctx.cfg):
            return run_on_ray(stage, ctx, workers=self.workers, address=self.address, start_llm=start_llm)
        return run_stage(stage, ctx, start_llm=start_llm)


Executor = LocalExecutor


def executor_for(kind: str, *, workers: int = 1, address: str | None = None, method: Sequence[Stage] = ()) -> LocalExecutor:
    """The executor ``--executor`` names: ``local`` or ``ray`` (``--workers``, ``--ray-address``;
    ``method``: the stages, for the refusal of one that does not split)."""
    if kind == "local":
        return LocalExecutor()
    if kind == "ray":
        return RayExecutor(workers, address, method=method)
    raise UserError(f"--executor {kind!r}: choose local or ray")
