"""Stage "regenerate": 4 graded negatives for (query, positive) pairs of public data (docs/regenerate.md).

In:  ``[regenerate] inputs`` (:mod:`negsynth.data.sources`); ``[llm]``; with ``mine > 0`` ``[embedder]``.
Out: ``RUN_DIR/regenerate/shard-XXXXX.jsonl`` — :class:`~negsynth.schemas.records.Example` records
     with ``source`` / ``source_id``; ``rejects/``.

Pairs are deduplicated across inputs (the first wins); a pair whose own texts no answer could pass
is skipped. With ``mine = K`` each pair gets K mined negatives (cached in ``regenerate/_mined/``);
the LLM writes 4 negatives checked as ``generate``'s are, or with ``negatives = "mined"`` the mined
ones are the example's.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from pydantic import ValidationError

from negsynth import pipeline
from negsynth.data.shards import atomic_write_json
from negsynth.data.source_kinds import SourceKind, source_key, source_kind
from negsynth.data.sources import SourceData, load_source
from negsynth.data.text import text_key
from negsynth.embed.cross_encoder import check_teacher_model, relabel_fields, teacher_scorer
from negsynth.errors import UserError
from negsynth.llm.client import LLMClient
from negsynth.llm.errors import ValidationFailure
from negsynth.pipeline import Outcome, StageContext, Summary, Tally, WorkItem, config_hash
from negsynth.prompts import load_example, load_template, render
from negsynth.schemas.config import MiningConfig, RegenerateConfig, SourceSpec
from negsynth.schemas.outputs import NegativesOut, negatives_schema
from negsynth.schemas.records import NUM_NEGATIVES, Example, Reject
from negsynth.stages.common import path_fingerprint, schema_failure, short_id
from negsynth.validators import check_distinct, check_example, check_lengths, check_nonempty

NAME = "regenerate"

#: extra sentence for sources whose "documents" are not documents (spec §1.5)
NOTES = {
    "nli": " Here the texts are hypotheses that are NOT entailed by the query (the premise).",
    "quora": " Here the texts are questions that do NOT ask the same thing as the query.",
}


# -- planning -------------------------------------------------------------------------------
def kind_for(spec: SourceSpec, name: str, cfg: RegenerateConfig) -> tuple[SourceKind, bool]:
    """The source's instructions / symmetry / task type after the spec's and run's overrides."""
    kind, known = source_kind(name, cfg.instructions, SourceKind((cfg.default_instruction,)))
    ins = (spec.instruction,) if spec.instruction else kind.instructions
    sym = kind.symmetric if spec.symmetric is None else spec.symmetric
    tt = spec.task_type or ("sts" if sym else kind.task_type)
    return SourceKind(ins, sym, tt), known or bool(spec.instruction)


def load_inputs(ctx: StageContext) -> list[tuple[SourceSpec, SourceData]]:
    cfg = ctx.cfg.regenerate
    if not cfg.inputs:
        raise UserError('regenerate has no inputs: pass --input PATH, or add [[regenerate.inputs]] path = "..." to the run file')
    return [(spec, load_source(spec)) for spec in cfg.inputs]


def plan_items(ctx: StageContext, sources: list[tuple[SourceSpec, SourceData]]) -> tuple[list[WorkItem], dict[str, Any]]:
    """The work items (input order, then row order) and per-source planning stats."""
    cfg = ctx.cfg.regenerate
    items: list[WorkItem] = []
    seen: dict[str, str] = {}
    per_source: dict[str, dict[str, Any]] = {}
    for si, (spec, data) in enumerate(sources):
        kind, known = kind_for(spec, data.name, cfg)
        if not known:
            ctx.reporter.warn(
                f"source {data.name!r} is not in the instruction table; using {kind.instructions[0]!r} "
                f"(set instruction in the source spec, --instruction, or regenerate.instructions.{data.name})"
            )
        label = data.name if data.name not in per_source else f"{data.name}#{si}"
        st = per_source[label] = {
            "path": spec.path,
            "split": data.split,
            "pairs_in_source": data.total_rows,
            "selected": len(data.pairs),
            "duplicates": 0,
            "skipped": Counter(),
            "items": 0,
            "instructions": list(kind.instructions),
            "symmetric": kind.symmetric,
            "task_type": kind.task_type,
            "columns": data.columns,
            "invalid_rows_skipped": data.skipped_rows,
        }
        for p in data.pairs:
            for v in (
                check_nonempty({"query": p.query, "positive": p.positive}),
                check_lengths({"query": p.query, "positive": p.positive}, cfg.min_chars, cfg.max_chars),
                check_distinct(p.query, p.positive, []),
            ):
                if not v.keep:
                    st["skipped"][v.reason] += 1
                    break
            else:
                key = text_key(p.query) + "\x1f" + text_key(p.positive)  # dedup: the normalised pair
                if cfg.dedup and key in seen:
                    st["duplicates"] += 1
                    continue
                seen[key] = p.source_id
                instruction = spec.instruction or p.instruction or kind.instructions[p.row % len(kind.instructions)]
                payload = {
                    "source": data.name,
                    "source_id": p.source_id,
                    "source_index": si,
                    "query_key": p.query_key,
                    "instruction": instruction,
                    "task_type": kind.task_type,
                    "symmetric": kind.symmetric,
                    "query": p.query,
                    "positive": p.positive,
                    "source_negatives": p.negatives,
                    "meta": p.meta,
                }
                items.append(WorkItem(len(items), short_id("rg", p.source_id, key), payload))
                st["items"] += 1
        st["skipped"] = dict(st["skipped"])
    return items, per_source


def mine_k(cfg: RegenerateConfig) -> int:
    """Negatives mined per pair: ``mine``, and at least the 4 levels when they are the negatives."""
    return max(cfg.mine, NUM_NEGATIVES) if cfg.negatives == "mined" else cfg.mine


# -- mining ---------------------------------------------------------------------------------
#: the ``regenerate.mining`` options :func:`~negsynth.embed.mining.mine_negatives` takes, under the same names
MINING_OPTIONS = {"relative_margin", "absolute_margin", "max_score", "range_min", "range_max", "sampling"}


def miner(opts: MiningConfig, k: int, **encoding: Any) -> Callable[..., dict[str, dict[str, Any]]]:
    """:func:`~negsynth.embed.mining.mine_negatives` of the ``k`` hardest with ``regenerate.mining``
    bound, to call as ``(model, queries, known_positives, corpus)``."""
    from negsynth.embed.mining import mine_negatives

    return partial(mine_negatives, k=k, **opts.model_dump(include=MINING_OPTIONS), **encoding)


def run_miner(ctx: StageContext, opts: MiningConfig, k: int) -> Callable[..., dict[str, dict[str, Any]]]:
    """:func:`miner` with the run's embedder batch size and the library's embeddings kept in the run
    dir per embedder (``cache/mine-embeddings/``): mining the same texts again embeds nothing."""
    cache = ctx.run_dir / "cache" / "mine-embeddings" / config_hash({"embedder": ctx.cfg.embedder})
    return miner(opts, k, batch_size=ctx.cfg.embedder.batch_size, cache_folder=cache)


def mine_for_items(ctx: StageContext, items: list[WorkItem], sources: list[tuple[SourceSpec, SourceData]]) -> dict[str, Any]:
    """Fill ``payload["mined"]`` for every item (cached per source in ``regenerate/_mined/``)."""
    cfg = ctx.cfg.regenerate
    k = mine_k(cfg)
    cache_dir = ctx.run_dir / NAME / "_mined"
    model = None
    stats: dict[str, Any] = {}
    for si, (spec, data) in enumerate(sources):
        mine_items = [it for it in items if it.payload["source_index"] == si]
        if not mine_items:
            continue
        queries = {it.payload["query_key"]: it.payload["query"] for it in mine_items}
        key = config_hash(
            {
                "spec": spec,
                "mining": cfg.mining,
                "k": k,
                "embedder": ctx.cfg.embedder,
                "queries": sorted(queries),
                "corpus": len(data.corpus),
                "input": path_fingerprint(spec.path),
            }
        )
        path = cache_dir / f"{si:03d}-{key}.json"
        if path.exists():
            found = json.loads(path.read_text(encoding="utf-8"))
        else:
            if model is None:
                ctx.reporter.info(f"mining {k} negatives per pair with the embedder ({ctx.cfg.embedder.model}) ...")
                model = ctx.load_mining_model()
            known = {q: data.positives_by_query.get(q, []) for q in queries}
            found = run_miner(ctx, cfg.mining, k)(model, queries, known, data.corpus)
            atomic_write_json(path, found)
        short = 0
        for it in mine_items:
            f = found.get(it.payload["query_key"]) or {"negatives": [], "scores": [], "pos_score": None}
            # a negative of a multi-positive query must not be this pair's positive either
            negs = [(n, s) for n, s in zip(f["negatives"], f["scores"]) if text_key(n) != text_key(it.payload["positive"])]
            it.payload["mined"] = {"negatives": [n for n, _ in negs], "scores": [s for _, s in negs], "pos_score": f["pos_score"]}
            short += len(negs) < k
        label = data.name if data.name not in stats else f"{data.name}#{si}"
        stats[label] = {"pairs": len(mine_items), "fewer_than_k": short, "corpus": len(data.corpus)}
    return stats


# -- prompting and validation ---------------------------------------------------------------
def cut(text: str, limit: int | None) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters (``" ..."`` marks a cut)."""
    if limit is None or len(text) <= limit:
        return text
    head = text[:limit]
    sp = head.rfind(" ")
    return (head[:sp] if sp > limit // 2 else head).rstrip() + " ..."


def render_prompt(instruction: str, query: str, positive: str, *, symmetric: bool, source: str = "") -> str:
    return render(
        "regenerate",
        instruction=instruction,
        query=query,
        positive=positive,
        doc_word="text" if symmetric else "document",
        note=NOTES.get(source_key(source), ""),
    )


def example_name(symmetric: bool) -> str:
    return "regenerate_symmetric" if symmetric else "regenerate"


def build_messages(payload: dict[str, Any], cfg: RegenerateConfig) -> list[dict[str, str]]:
    """System prompt, an optional worked example (retrieval or symmetric), then the real prompt."""
    sym = payload["symmetric"]
    msgs = [{"role": "system", "content": load_template("system").strip()}]
    if cfg.few_shot:
        ex = load_example(example_name(sym))
        msgs.append(
            {
                "role": "user",
                "content": render_prompt(ex["instruction"], ex["query"], ex["positive"], symmetric=sym, source="nli" if sym else ""),
            }
        )
        msgs.append({"role": "assistant", "content": json.dumps(ex["output"], ensure_ascii=False)})
    pos = cut(payload["positive"], cfg.prompt_positive_chars)
    msgs.append(
        {"role": "user", "content": render_prompt(payload["instruction"], payload["query"], pos, symmetric=sym, source=payload["source"])}
    )
    return msgs


def make_validator(payload: dict[str, Any], cfg: RegenerateConfig):
    """``validate(obj) -> negatives``: the generate checks against the source's query and positive."""
    shown = {text_key(n) for n in load_example(example_name(payload["symmetric"]))["output"]["hard_negative_documents"]}
    q, pos = payload["query"], payload["positive"]

    def validate(obj: Any) -> list[str]:
        try:
            out = NegativesOut.model_validate(obj)
        except ValidationError as e:
            raise schema_failure(e) from None
        negs = list(out.hard_negative_documents)
        if cfg.few_shot and any(isinstance(n, str) and text_key(n) in shown for n in negs):
            raise ValidationFailure("copied_example", "you copied the worked example; write new negatives for the given query")
        v = check_example(q, pos, negs, min_chars=cfg.min_chars, max_chars=cfg.max_chars)
        if not v.keep:
            raise ValidationFailure(v.reason, v.detail.replace("'negatives'", "'hard_negative_documents'"))
        return [n.strip() for n in negs]

    return validate


def pair_meta(p: dict[str, Any]) -> dict[str, Any]:
    """The meta of a pair's example: the source row's, with the source's own negatives if any."""
    meta: dict[str, Any] = dict(p["meta"])
    if p["source_negatives"]:
        meta["source_negatives"] = p["source_negatives"]
    return meta


def pair_example(it: WorkItem, negatives: list[str], model: str, meta: dict[str, Any], **extra: Any) -> Outcome:
    """The example of one source pair (the item's payload) with its graded ``negatives``."""
    p = it.payload
    ex = Example(
        id=it.id,
        task=p["instruction"],
        task_type=p["task_type"],
        attributes={"symmetric": p["symmetric"]},
        query=p["query"],
        positive=p["positive"],
        negatives=negatives,
        model=model,
        source=p["source"],
        source_id=p["source_id"],
        meta=meta,
        **extra,
    )
    return Outcome(record=ex.model_dump(mode="json", exclude={"score"}))


async def mined_item(it: WorkItem, cfg: RegenerateConfig, model: str, teacher: Any = None) -> Outcome:
    """An example whose 4 graded negatives are mined ones (``regenerate.negatives = "mined"``).
    ``teacher``: async ``(query, positive, candidates) -> (kept indices, teacher fields)``."""
    p = it.payload
    mined = p.get("mined") or {"negatives": [], "scores": [], "pos_score": None}
    picked, fields = list(range(min(NUM_NEGATIVES, len(mined["negatives"])))), {}
    if teacher is not None and mined["negatives"]:
        picked, fields = await teacher(p["query"], p["positive"], list(mined["negatives"]))
    if len(picked) < NUM_NEGATIVES:
        detail = f"{len(picked)} of {NUM_NEGATIVES} negatives survived mining (corpus too small, or the margin removed the rest)"
        if fields.get("teacher_false_negatives"):
            detail = f"{len(picked)} of {NUM_NEGATIVES} negatives left: the teacher scored {fields['teacher_false_negatives']} at or above the positive (raise regenerate.mine)"
        rej = Reject(
            id=it.id, stage=NAME, reason="too_few_mined", detail=detail, raw=None, input={k: v for k, v in p.items() if k != "mined"}
        )
        return Outcome(reject=rej.model_dump(mode="json"))
    meta = pair_meta(p)
    meta["mined_scores"] = [mined["scores"][i] for i in picked]
    meta["mined_pos_score"] = mined["pos_score"]
    meta.update(fields)
    return pair_example(it, [mined["negatives"][i] for i in picked], model, meta)


class Regenerate(pipeline.LLMStage):
    """Graded negatives for existing (query, positive) pairs: the LLM writes them, or mining finds them."""

    name = NAME
    summary = "graded negatives for existing pairs"
    config = RegenerateConfig
    prompts = "regenerate"
    output_name = "negatives"
    records = Example

    def uses_llm(self, cfg: Any) -> bool:
        return cfg.regenerate.negatives != "mined"

    def embeds(self, cfg: Any) -> bool:
        """Its mining (with the LLM, done in ``prepare``; the ranks read ``regenerate/_mined/``)."""
        return mine_k(cfg.regenerate) > 0

    def made_from(self, ctx: StageContext) -> dict[str, Any]:
        """Its settings and inputs, and the LLM and prompts unless the negatives are mined."""
        cfg = ctx.cfg.regenerate
        parts = {
            **pipeline.llm_parts(ctx, NAME, "regenerate", cfg),
            "inputs": [path_fingerprint(s.path) + ([path_fingerprint(s.corpus)] if s.corpus else []) for s in cfg.inputs],
        }
        if cfg.mine or cfg.negatives == "mined":
            parts["embedder"] = ctx.cfg.embedder
        if cfg.negatives == "mined":
            del parts["prompts"], parts["llm"]
        return pipeline.item_entry(ctx, config_hash(parts), mine=cfg.mine)

    def check(self) -> None:
        check_teacher_model(NAME, self.cfg)

    def plan(self) -> list[WorkItem]:
        self.sources = load_inputs(self.ctx)
        items, self.per_source = plan_items(self.ctx, self.sources)
        if not items:
            left = {k: {f: v[f] for f in ("selected", "duplicates", "skipped")} for k, v in self.per_source.items()}
            raise UserError(
                f"regenerate: no pair left to regenerate after dedup and source checks; see the inputs (stats: {json.dumps(left)})"
            )
        self.n_items, self.mining, self.scorer = len(items), None, None
        self.taught = {"pairs": 0, "false_negatives": 0}  # this run's teacher: pairs scored, candidates left out
        return items

    def before(self, items: list[WorkItem]) -> None:
        """The mining of every pair (once: a relaunch or a rank reads it from ``_mined/``)."""
        if mine_k(self.cfg):
            self.mining = mine_for_items(self.ctx, items, self.sources)

    def messages(self, item: WorkItem) -> list[dict[str, str]]:
        return build_messages(item.payload, self.cfg)

    def schema(self, item: WorkItem) -> dict[str, Any]:
        return negatives_schema(self.cfg.max_doc_chars)

    def parse(self, item: WorkItem, answer: Any) -> list[str]:
        return make_validator(item.payload, self.cfg)(answer)

    async def process(self, client: LLMClient | None, item: WorkItem) -> Outcome:
        if self.cfg.negatives == "mined":
            teacher = self.teach if self.cfg.teacher != "none" else None
            return await mined_item(item, self.cfg, f"mined:{self.ctx.cfg.embedder.model}:top", teacher)
        return await super().process(client, item)

    async def teach(self, query: str, positive: str, candidates: list[str]) -> tuple[list[int], dict[str, Any]]:
        """``regenerate.teacher``: the scorer (made once) on the run's worker thread."""
        if self.scorer is None:
            info = lambda m: self.ctx.reporter.info(f"regenerate: {m}")  # noqa: E731
            self.scorer = await self.off_loop(teacher_scorer, NAME, self.cfg, self.ctx.run_dir, info)
        kept, fields = await self.off_loop(relabel_fields, self.scorer, query, positive, candidates, NUM_NEGATIVES)
        self.taught["pairs"] += 1
        self.taught["false_negatives"] += fields["teacher_false_negatives"]
        return kept, fields

    def record(self, item: WorkItem, value: Any, result: Any) -> dict[str, Any]:
        p = item.payload
        meta = pair_meta(p)
        mined = p.get("mined")
        if mined is not None:
            meta["mined_scores"] = mined["scores"]
            meta["mined_pos_score"] = mined["pos_score"]
        if result.reasons:
            meta["failed_attempts"] = result.reasons
        mined_negatives = list(mined["negatives"]) if mined else []
        return pair_example(item, value, self.ctx.cfg.llm.model, meta, usage=result.usage, mined_negatives=mined_negatives).record

    def extra_stats(self) -> dict[str, Any]:
        per_source = self.per_source
        extra: dict[str, Any] = {
            "pairs": self.n_items,
            "sources": per_source,
            "duplicates": sum(v["duplicates"] for v in per_source.values()),
            "skipped_pairs": sum(sum(v["skipped"].values()) for v in per_source.values()),
        }
        if self.mining is not None:
            extra["mining"] = {"k": mine_k(self.cfg), "strategy": "top", "negatives": self.cfg.negatives, **self.mining}
        if self.cfg.teacher != "none":
            extra["teacher"] = {"kind": self.cfg.teacher, **self.taught}
        return extra

    def estimate_items(self, tally: Tally) -> list[WorkItem]:
        """One request per input pair left after dedup and checks."""
        if not self.cfg.inputs:
            raise tally.no_inputs()
        items, _ = plan_items(self.ctx, load_inputs(self.ctx))
        tally.note("one request per input pair left after dedup and checks")
        return items

    def report(self, stats: dict) -> list[Summary]:
        rows = pipeline.summary_rows(stats)
        rows.insert(0, ("pairs (after dedup)", str(stats.get("pairs", stats["items"]))))
        rows.insert(1, ("duplicates dropped", str(stats.get("duplicates", 0))))
        return [Summary("regenerate", rows)]


STAGE = Regenerate()
