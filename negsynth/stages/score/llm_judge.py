"""The configured LLM as the false-negative judge (``score.judge_model = "llm"``).

RLHN (Thakur et al., 2025) relabels hard negatives that an LLM judges relevant to the query and
reports +0.7 to +1.4 nDCG@10 on BEIR. Here the LLM reads the query, the positive and the
example's negatives in one request and answers, as validated JSON, which negatives also answer
the query; those become judged false negatives (the same flag a cross-encoder judge sets). It has
the interface of :class:`~negsynth.embed.cross_encoder.CrossEncoderJudge` (``name``, ``score_examples``):
a negative it says answers the query scores 1.0 against a positive of 1.0, so
:func:`~negsynth.embed.cross_encoder.judged_false_negatives` flags it at any ``judge_ratio``.

Every request goes through the run's LLM session (cache, re-asks, retries, budget). An example
whose judgement fails is left unjudged (the embedder's verdict stands; ``stats.json["judge"]
["not_judged"]``). A spent ``--max-*`` budget (counted over every block of the invocation) lets
the requests in flight finish and raises :class:`~negsynth.llm.errors.BudgetStop`: the block is
not written, and a rerun judges it again from the cache.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, StrictBool, ValidationError

from negsynth.aio import run_sync
from negsynth.llm.errors import BudgetStop, OutageStop, ValidationFailure
from negsynth.pipeline import LLMTask, StageContext, Tally, budget_gate, cost_usd, llm_session
from negsynth.prompts import load_examples, render
from negsynth.stages.common import schema_failure
from negsynth.stages.score.inputs import input_stages

NAME = "llm"


def judge_messages(query: str, positive: str, negatives: Sequence[str]) -> list[dict[str, str]]:
    cands = "\n\n".join(f"[{i + 1}] {t}" for i, t in enumerate(negatives))
    return [{"role": "user", "content": render("judge", query=query, positive=positive, candidates=cands, n=len(negatives))}]


class Judgement(BaseModel):
    """The judge's answer: one verdict per candidate, in order."""

    answers_query: list[StrictBool]


class JudgeTask(LLMTask):
    """The judgement of one example (a dict with query, positive and negatives) as an LLM task: the
    judge prompt, one boolean per negative, temperature 0."""

    output_name = "judgement"
    temperature = 0.0

    def messages(self, item: dict) -> list[dict[str, str]]:
        return judge_messages(item["query"], item["positive"], item["negatives"])

    def schema(self, item: dict) -> dict[str, Any]:
        n = len(item["negatives"])
        return {
            "type": "object",
            "properties": {"answers_query": {"type": "array", "items": {"type": "boolean"}, "minItems": n, "maxItems": n}},
            "required": ["answers_query"],
        }

    def parse(self, item: dict, answer: Any) -> list[bool]:
        try:
            verdicts = Judgement.model_validate(answer).answers_query
        except ValidationError as e:
            raise schema_failure(e) from None
        n = len(item["negatives"])
        if len(verdicts) != n:
            raise ValidationFailure("wrong_count", f'"answers_query" must hold exactly {n} values, one per candidate; got {len(verdicts)}')
        return verdicts


class LLMJudge:
    """Judges examples' negatives with the run's LLM (``llm.*`` settings, temperature 0)."""

    name = NAME
    task = JudgeTask()

    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.failed: Counter = Counter()  # reason -> examples left unjudged, this run
        self.requests = 0
        self.cache_hits = 0
        self.tokens = [0, 0]  # prompt, completion: sent this run, every block

    def score_examples(self, examples: Sequence[dict]) -> tuple[list[float | None], list[list[float] | None]]:
        """``(1.0 per judged positive, 1.0 / 0.0 per negative)``; ``None`` for an example not judged."""
        return run_sync(self._run(list(examples)))

    async def _run(self, examples: list[dict]):
        # the budget's check on this block's session, counting what earlier blocks sent
        cfg, (pt, ct) = self.ctx.cfg.llm, self.tokens
        spent = {"requests": self.requests, "prompt_tokens": pt, "completion_tokens": ct, "cost_usd": cost_usd(cfg, pt, ct)}
        async with llm_session(self.ctx, stage="score", gate=budget_gate(cfg, self.ctx.budget.after(spent))) as client:
            with self.ctx.reporter.progress("score: LLM judge", len(examples)) as bar:
                done = Counter()

                async def one(ex: dict) -> list[bool] | None:
                    v = await self._one(client, ex)
                    done["valid" if v is not None else "rejected"] += 1
                    bar.update(advance=1, valid=done["valid"], rejected=done["rejected"])
                    return v

                # a budget stop lets the requests in flight finish (and be cached) before it is raised
                results = await asyncio.gather(*(one(ex) for ex in examples), return_exceptions=True)
            self.requests += client.stats.requests
            self.cache_hits += client.stats.cache_hits
            self.tokens[0] += client.stats.prompt_tokens
            self.tokens[1] += client.stats.completion_tokens
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:  # anything else first, then an outage, then a spent budget
                raise min(errors, key=lambda e: 2 if type(e) is BudgetStop else 1 if isinstance(e, OutageStop) else 0)
        pos: list[float | None] = []
        negs: list[list[float] | None] = []
        for verdict in results:
            pos.append(None if verdict is None else 1.0)
            negs.append(None if verdict is None else [1.0 if v else 0.0 for v in verdict])
        return pos, negs

    async def _one(self, client, ex: dict) -> list[bool] | None:
        if not ex["negatives"]:
            return []
        res = await self.task.ask(client, ex)
        if res.value is None:
            self.failed[res.reason or "unknown"] += 1
            return None
        return res.value


def estimate(ctx: StageContext, tally: Tally) -> None:
    """``negsynth estimate`` for score: one judgement request per example with the LLM judge
    (``score.judge_model = "llm"``), none otherwise. Before any example exists, generate's planned
    items stand in, each with its task type's worked example's texts."""
    if ctx.cfg.score.judge_model != "llm":
        tally.note("score.judge_model is not 'llm': no LLM request")
        return
    plan = "generate" in ctx.cfg.pipeline.stages and not list((ctx.run_dir / "generate").glob("shard-*.jsonl"))
    generated = tally.planned("generate", plan=plan)
    examples: list[dict] = []
    for stage in input_stages(ctx.cfg):
        for p in sorted((ctx.run_dir / stage).glob("shard-*.jsonl")):
            with open(p, encoding="utf-8") as f:
                examples += [json.loads(x) for x in f if x.strip()]
    if examples:
        tally.note("one judgement per example in the finished shards")
    else:
        for g in generated or []:
            # every worked example is {query field, positive field, [negatives]}, in that order
            query, positive, negatives = list(load_examples(f"generate_{g['task_type']}")[0]["output"].values())[:3]
            examples.append({"query": str(query), "positive": str(positive), "negatives": [str(x) for x in negatives]})
        tally.note("no examples yet: one judgement per planned generate item, generate's worked examples standing in for the texts")
    for ex in examples:
        item = {"query": ex.get("query", ""), "positive": ex.get("positive", ""), "negatives": ex.get("negatives") or []}
        tally.request(LLMJudge.task.messages(item), answer_tokens=min(tally.fallback, 8 + 6 * len(item["negatives"])))
