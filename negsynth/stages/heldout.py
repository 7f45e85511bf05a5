"""Stage "heldout": documents never trained on, and a query for each, written for evaluation only.

In: ``[corpus] inputs`` (the documents the corpus stage reads), ``[heldout]``, ``[llm]``. Out:
``RUN_DIR/heldout/shard-XXXXX.jsonl``, one record per held-out document (``id``, ``query``,
``corpus``, ``doc_id``, ``style``, ``model``, ``usage``); ``rejects/`` with each reason;
``stats.json``; ``evaluate`` gives its verdict on them (docs/evaluate.md).

The documents are :func:`~negsynth.stages.corpus.heldout_indices` (the corpus stage's sample
leaves them out); one request each, with the corpus stage's prompt and validator and no embedder,
so nothing of the model being judged chooses which queries count.
"""

from __future__ import annotations

import random
from typing import Any

from negsynth import pipeline
from negsynth.llm.client import LLMClient
from negsynth.pipeline import Outcome, StageContext, Summary, Tally, WorkItem, config_hash
from negsynth.schemas.config import CorpusConfig, HeldoutConfig
from negsynth.schemas.outputs import queries_schema
from negsynth.schemas.records import HeldoutQuery
from negsynth.stages.common import path_fingerprint, short_id
from negsynth.stages.corpus import embedder_tokenizer, heldout_config, heldout_indices, load_corpora
from negsynth.stages.corpus_queries import build_messages, cut_tokens, make_validator

NAME = "heldout"


def query_config(cfg: Any) -> CorpusConfig:
    """``[corpus]`` as the held-out requests read it: one query per request."""
    return cfg.corpus.model_copy(update={"queries_per_doc": 1})


def plan_items(ctx: StageContext) -> tuple[list[WorkItem], dict[str, Any]]:
    """One item per held-out document, in corpus then file order; and what the set is (its
    documents, how many the corpus has, why there is none)."""
    h = heldout_config(ctx.cfg)
    corpora = load_corpora(ctx)
    total = sum(c.count for c in corpora)
    held, reason = heldout_indices(ctx.cfg, total)
    items: list[WorkItem] = []
    start = 0
    for ci, c in enumerate(corpora):
        wanted = [i - start for i in held if start <= i < start + c.count]
        start += c.count
        for _, d in c.documents_at(wanted):
            style = h.styles[random.Random(f"{h.seed}:{c.name}:{d.id}:heldout-style").randrange(len(h.styles))]
            payload = {"corpus": c.name, "corpus_index": ci, "doc_id": d.id, "style": style, "document": d.text}
            items.append(WorkItem(len(items), short_id("hq", h.seed, c.name, d.id), payload))
    cc = ctx.cfg.corpus
    return items, {
        "documents": total,
        "held_out": len(held),
        "reason": reason,
        # what evaluate searches: the corpus the set was drawn from, read as the corpus stage reads it
        "inputs": [s.model_dump(mode="json") for s in cc.inputs],
        "chunks": [cc.chunk_tokens, cc.chunk_overlap],
    }


class Heldout(pipeline.LLMStage):
    """One evaluation query per held-out document: see the module's docstring."""

    name = NAME
    summary = "held-out queries for the verdict on your documents (never trained on)"
    config = HeldoutConfig
    prompts = "corpus"
    output_name = "queries"
    records = HeldoutQuery  # no examples: score does not read them
    split = "process"  # a hundred requests or so: one process

    def uses_llm(self, cfg: Any) -> bool:
        return heldout_config(cfg).queries > 0

    def made_from(self, ctx: StageContext) -> dict[str, Any]:
        """Its section, the LLM, the corpus prompts, the documents, the corpus settings a request
        reads and which documents are held out."""
        cfg = ctx.cfg.corpus
        parts = pipeline.llm_parts(ctx, NAME, "corpus", self.section(ctx.cfg))
        parts["inputs"] = [path_fingerprint(s.path) for s in cfg.inputs]
        parts["inputs_read"] = [s.model_dump(mode="json") for s in cfg.inputs]
        parts["corpus"] = {k: getattr(cfg, k) for k in ("few_shot", "doc_tokens", "min_query_chars", "max_query_chars")}
        corpora = load_corpora(ctx)
        if any(c.chunked for c in corpora):  # as in the corpus stage: only where a document is split
            parts["corpus"]["chunks"] = [cfg.chunk_tokens, cfg.chunk_overlap]
        parts["held_out"] = heldout_indices(ctx.cfg, sum(c.count for c in corpora))[0]
        parts["tokenizer"] = ctx.cfg.embedder.model  # the prompt's document is cut with its tokens
        return pipeline.item_entry(ctx, config_hash(parts))

    def plan(self) -> list[WorkItem]:
        self.items, self.held = plan_items(self.ctx)
        self.qcfg = query_config(self.ctx.cfg)
        self.tokens: Any = False
        return self.items

    def run(self, ctx: StageContext) -> dict:
        total = sum(c.count for c in load_corpora(ctx))
        held, reason = heldout_indices(ctx.cfg, total)
        if not held:  # too few documents, or off: the one line says which
            return {"stage": NAME, "skipped": True, "reason": reason, "items": 0, "heldout": {"documents": total, "held_out": 0}}
        return super().run(ctx)

    def messages(self, item: WorkItem) -> list[dict[str, str]]:
        return build_messages(item.payload, self.qcfg, item.payload["doc_text"])

    def schema(self, item: WorkItem) -> dict[str, Any]:
        return queries_schema(1, max_query=self.qcfg.max_query_chars, min_query=self.qcfg.min_query_chars)

    def parse(self, item: WorkItem, answer: Any) -> Any:
        return make_validator(item.payload["document"], self.qcfg)(answer)

    def sample_index(self, item: WorkItem) -> int:
        return self.cfg.seed  # the LLM's seed moved by heldout.seed: another draw than the corpus stage's

    def tokenizer(self):
        if self.tokens is False:
            self.tokens = embedder_tokenizer(self.ctx.cfg)
        return self.tokens

    async def process(self, client: LLMClient | None, item: WorkItem) -> Outcome:
        p = item.payload
        doc_text = await self.off_loop(lambda: cut_tokens(p["document"], self.tokenizer(), self.qcfg.doc_tokens))
        res = await self.ask(client, WorkItem(item.index, item.id, {**p, "doc_text": doc_text}))
        inp = {k: v for k, v in p.items() if k != "document"}
        if res.value is None:
            return Outcome(reject=self.reject(WorkItem(item.index, item.id, inp), res))
        rec = HeldoutQuery(
            id=item.id,
            query=res.value[0][0],
            corpus=p["corpus"],
            doc_id=p["doc_id"],
            style=p["style"],
            model=self.ctx.cfg.llm.model,
            usage=res.usage,
        )
        return Outcome(record=rec.model_dump(mode="json"))

    def extra_stats(self) -> dict[str, Any]:
        return {"heldout": self.held}

    def estimate(self, ctx: StageContext, tally: Tally) -> None:
        """``negsynth estimate``: one request per held-out document (the document cut to
        ``corpus.doc_tokens`` words: no model is loaded)."""
        items, held = plan_items(ctx)
        qcfg = query_config(ctx.cfg)
        for it in items:
            tally.request(build_messages(it.payload, qcfg, cut_tokens(it.payload["document"], None, qcfg.doc_tokens)))
        tally.note(held["reason"] or f"one request per held-out document ({held['held_out']} of {held['documents']})")

    def report(self, stats: dict) -> list[Summary]:
        held = stats["heldout"]
        return [Summary(NAME, [*pipeline.summary_rows(stats), ("held-out documents", f"{held['held_out']} of {held['documents']}")])]


STAGE = Heldout()
