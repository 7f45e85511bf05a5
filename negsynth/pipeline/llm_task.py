"""``LLMStage``: one class an LLM stage subclasses, so that the stage writes only what it knows.

A stage that asks the LLM for one JSON object per work item declares its name, summary, config
section, prompt-file prefix and input stages as class attributes, and supplies:

``plan()``
    its work items (deterministic: the same config and inputs give the same items);
``messages(item)``, ``schema(item)``, ``validator(item)``
    the chat messages, the JSON schema of the answer (or None) and the function that turns the
    parsed answer into a value or raises ``ValidationFailure`` (the client re-asks with its reason);
``record(item, value, result)``
    the output record of a valid answer;
and optionally ``check()`` (refusals before any work), ``reject(item, result)``,
``sample_index(item)``, ``fingerprint_extra()``, ``extra_stats()``, ``estimate_items(tally)``
and ``report(stats)``.

The base supplies the rest, once for every such stage: ``run`` (the resumable shards, the LLM
session, budgets and stats, :func:`negsynth.pipeline.llm_stage.run_item_stage`), the fingerprint
(its config section, the LLM settings, its prompt files and its inputs' shards), the estimate
``negsynth estimate`` prints (the plan's messages, counted as the run would send them) and the
:class:`~negsynth.pipeline.stage.Stage` declaration the runner, CLI, ``estimate`` and ``inspect``
read (:meth:`LLMStage.declare`). A stage module ends with ``STAGE = MyStage.declare()`` and one
line in ``negsynth.stages.METHOD``.

A stage whose items are not one JSON object each (brainstorm's rounds, corpus's mining before the
LLM) keeps its own loop on :func:`~negsynth.pipeline.llm_stage.run_item_stage`.

``LLMTask``, its base, is the request alone (messages, schema, validator, ``ask``): what a step
that asks the LLM inside another stage subclasses (score's LLM judge).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from negsynth.data.shards import list_shards
from negsynth.llm.client import LLMClient, LLMResult
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.llm_stage import item_stage_fingerprint, llm_stage_parts, run_item_stage, stage_entry, summary_rows
from negsynth.pipeline.manifest import begin_staging
from negsynth.pipeline.runner import Outcome, WorkItem
from negsynth.pipeline.stage import Stage, Summary
from negsynth.pipeline.tally import Tally
from negsynth.prompts import reask_template
from negsynth.schemas.config_io import config_hash
from negsynth.schemas.records import Reject


def inputs_fingerprint(run_dir: Path, stage: str) -> str:
    """Names and sizes of a stage's finished shards: changes when its outputs change."""
    h = hashlib.sha256()
    for p in list_shards(Path(run_dir) / stage):
        h.update(p.name.encode())
        h.update(str(p.stat().st_size).encode())
    return h.hexdigest()[:16]


class LLMTask:
    """One JSON answer asked of the LLM per item: what a request is (:meth:`messages`, :meth:`schema`,
    :meth:`validator`, the answer's name, a temperature) and :meth:`ask`, the one call that asks it
    (re-asked with the validator's reason until valid or out of attempts; cached, retried and
    budgeted by the client it is given). :class:`LLMStage` is a task whose answers become a stage's
    records; a step inside a stage that asks the LLM per item (score's LLM judge) is a task too, so
    every LLM request of the package is made one way."""

    #: the answer's name in the client's messages and re-asks ("example", "queries", ...)
    output_name: ClassVar[str] = "output"
    #: the sampling temperature of its requests (None: ``llm.temperature``)
    temperature: ClassVar[float | None] = None

    def messages(self, item: Any) -> list[dict[str, str]]:
        raise NotImplementedError

    def schema(self, item: Any) -> dict[str, Any] | None:
        return None

    def validator(self, item: Any) -> Any:
        raise NotImplementedError

    def sample_index(self, item: Any) -> int:
        """Which sample of the same request this item is (part of the request's cache key)."""
        return 0

    async def ask(self, client: LLMClient, item: Any) -> LLMResult:
        """The item's answer: its value, or why every attempt failed (``reason``, ``detail``, ``raw``)."""
        return await client.structured(
            self.messages(item),
            validate=self.validator(item),
            schema=self.schema(item),
            name=self.output_name,
            sample_index=self.sample_index(item),
            temperature=self.temperature,
            reask_template=reask_template(),
        )


class LLMStage(LLMTask):
    """Subclass, set the class attributes, implement :meth:`plan`, :meth:`messages`,
    :meth:`validator` and :meth:`record`; ``STAGE = Subclass.declare()``. One instance is made per
    run (or fingerprint, or estimate) with the stage's context: ``self.ctx``, ``self.cfg`` (its
    section of the run file)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    config: ClassVar[type]
    #: the prefix of its prompt templates (``generate_`` -> ``generate_*.txt``): part of its fingerprint
    prompts: ClassVar[str]
    inputs: ClassVar[tuple[str, ...]] = ()
    #: its records are examples (query, positive, negatives): ``inspect`` and ``export`` read them
    examples: ClassVar[bool] = False
    shardable: ClassVar[bool] = True
    #: ``None``: it always calls the LLM; else a function of the run config saying whether it does
    #: (regenerate with mined negatives does not); :meth:`uses_llm` is the same for one run
    llm_when: ClassVar[Callable[[Any], bool] | None] = None
    #: a function of the run config: its heavy work is embedding (``Stage.embeds``), done in
    #: :meth:`before`, once in the driver under ``--executor ray`` (:meth:`prepare`)
    embeds_when: ClassVar[Callable[[Any], bool] | None] = None
    #: every item in one shard, finished only when :meth:`verdict` passes (outputs all or nothing: brainstorm)
    one_shard: ClassVar[bool] = False
    #: the files in its folder that make it finished
    done_files: ClassVar[tuple[str, ...]] = ("stats.json",)

    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.cfg = self.section(ctx)

    @classmethod
    def section(cls, ctx: StageContext) -> Any:
        """Its section of the run file (``cfg.<name>``); the section's defaults where the run file
        has no such section (a stage added without one)."""
        own = getattr(ctx.cfg, cls.name, None)
        return cls.config() if own is None else own

    # ------------------------------------------------------------------ what a stage supplies
    def check(self) -> None:
        """Refuse, with a one-line ``UserError``, a config this stage cannot run (before any work)."""

    def plan(self) -> list[WorkItem]:
        raise NotImplementedError

    def before(self, items: list[WorkItem]) -> None:
        """Work on the planned items before any of them is processed (regenerate's mining)."""

    def verdict(self, rep: Any, rows: list[tuple[str, dict]]) -> str | None:
        """A ``one_shard`` stage's judgment of all its rows once every item is done: None, or why it failed."""
        return None

    def fixed(self) -> int:
        """How many of its valid records need no request (they do not hide that every request failed alike)."""
        return 0

    def uses_llm(self) -> bool:
        """Whether this run's items call the LLM (else ``process`` gets no client and no session opens)."""
        return self.llm_when is None or bool(self.llm_when(self.ctx.cfg))

    def record(self, item: WorkItem, value: Any, result: LLMResult) -> dict[str, Any]:
        raise NotImplementedError

    def reject(self, item: WorkItem, result: LLMResult) -> dict[str, Any]:
        """The reject kept for an item whose answers all failed: its reason, detail and raw answer."""
        rej = Reject(
            id=item.id,
            stage=self.name,
            reason=result.reason or "unknown",
            detail=result.detail,
            raw=result.raw,
            input=item.payload,
            usage=result.usage,
        )
        return rej.model_dump(mode="json")

    def sample_index(self, item: WorkItem) -> int:
        """Which sample of the same request this item is (part of the request's cache key)."""
        return int(item.payload.get("k", 0))

    def fingerprint_extra(self) -> dict[str, Any]:
        """Keys added to the manifest entry after the config hash (e.g. the seed)."""
        return {}

    def extra_stats(self) -> dict[str, Any] | None:
        """Stage-specific keys of ``stats.json`` (called once every item is done)."""
        return None

    def estimate_items(self, tally: Tally) -> list[WorkItem]:
        """The items ``negsynth estimate`` counts: the plan (override where the inputs do not exist
        yet and stand-ins are counted; say so with ``tally.note``)."""
        return self.plan()

    @classmethod
    def report(cls, stats: dict) -> list[Summary]:
        return [Summary(cls.name, summary_rows(stats))]

    # ------------------------------------------------------------------ what the base supplies
    async def process(self, client: LLMClient, item: WorkItem) -> Outcome:
        """Ask for the item's answer (re-asked with the validator's reason until valid or out of
        attempts): its record, or its reject."""
        res = await self.ask(client, item)
        if res.value is None:
            return Outcome(reject=self.reject(item, res))
        return Outcome(record=self.record(item, res.value, res))

    def config_digest(self) -> str:
        """The hash of what the outputs are made from: its section, the LLM settings, its prompt
        files and its inputs' finished shards."""
        parts = llm_stage_parts(self.ctx, self.name, self.prompts, self.cfg)
        if self.inputs:
            ins = [inputs_fingerprint(self.ctx.run_dir, s) for s in self.inputs]
            parts["inputs"] = ins[0] if len(ins) == 1 else ins
        return config_hash(parts)

    @classmethod
    def fingerprint(cls, ctx: StageContext) -> dict[str, Any]:
        st = cls(ctx)
        return item_stage_fingerprint(ctx, st.config_digest(), **st.fingerprint_extra())

    @classmethod
    def run(cls, ctx: StageContext) -> dict:
        st = cls(ctx)
        st.check()
        items = st.plan()
        st.before(items)
        return run_item_stage(
            ctx,
            cls.declare(),
            items,
            st.process,
            llm=st.uses_llm(),
            extra=st.extra_stats,
            one_shard=cls.one_shard,
            verdict=st.verdict if cls.one_shard else None,
            fixed=st.fixed(),
        )

    @classmethod
    def prepare(cls, ctx: StageContext) -> None:
        """``--executor ray``: once in the driver, before the ranks start, the plan and
        :meth:`before` (what it made, they read from the stage's folder) and, under
        ``--overwrite``, the staging folder they all write to."""
        st = cls(ctx)
        items = st.plan()
        st.before(items)
        if ctx.overwrite:
            begin_staging(ctx.run_dir, cls.name, stage_entry(ctx, cls.declare(), len(items)))

    @classmethod
    def estimate(cls, ctx: StageContext, tally: Tally) -> list[dict[str, Any]]:
        """One request per item, with the messages the run sends; the items' payloads (what a
        later stage's estimator may read)."""
        st = cls(ctx)
        items = st.estimate_items(tally)
        for it in items:
            tally.request(st.messages(it))
        return [it.payload for it in items]

    @classmethod
    def declare(cls) -> Stage:
        """The stage as the runner, the CLI, ``estimate`` and ``inspect`` see it (made once per class)."""
        made = cls.__dict__.get("_declared")
        if made is None:
            made = Stage(
                cls.name,
                cls.summary,
                cls.run,
                config=cls.config,
                fingerprint=cls.fingerprint,
                report=cls.report,
                inputs=cls.inputs,
                llm=True if cls.llm_when is None else cls.llm_when,
                estimate=cls.estimate,
                staged=True,
                done_files=cls.done_files,
                shardable=cls.shardable,
                embeds=cls.embeds_when or False,
                prepare=cls.prepare if cls.shardable else None,
                examples=cls.examples,
            )
            cls._declared = made
        return made
