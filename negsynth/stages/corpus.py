"""Stage "corpus": the LLM writes queries grounded in a user's documents — no labels needed
(docs/corpus.md).

In: ``[corpus] inputs`` (folders of documents, table files, BEIR, HF datasets; long documents
split into passages, :mod:`negsynth.data.corpus`), ``[llm]``, ``[embedder]``. Out:
``RUN_DIR/corpus/shard-XXXXX.jsonl`` — :class:`~negsynth.schemas.records.Example` records (the
LLM's query, the document as positive, 4 mined negatives) that ``score`` reads like any other
stage's; ``rejects/`` with each reason; ``stats.json``.

Per sampled document one request asks for ``queries_per_doc`` queries in a seeded style, the
document cut to ``doc_tokens`` tokens; each query is one item, and the items of a document share
its one answer (a resumed run pays for none twice). The corpus is embedded once (cached in
``corpus/_index``) and each query searched alone: its document's rank (the round trip) and its
hardest positive-aware negatives; an optional cross-encoder teacher ranks the document among them.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from typing import Any

from negsynth import pipeline
from negsynth.data.corpus import CorpusData, read_corpus, sample_indices
from negsynth.embed.cross_encoder import check_teacher_model, teacher_fields, teacher_scorer
from negsynth.errors import UserError
from negsynth.llm.client import LLMClient
from negsynth.pipeline import Outcome, StageContext, Tally, WorkItem, config_hash
from negsynth.schemas.config import CorpusConfig, HeldoutConfig, RunConfig
from negsynth.schemas.outputs import queries_schema
from negsynth.schemas.records import NUM_NEGATIVES, SYNTHETIC_SOURCE, Example, Reject
from negsynth.stages.common import path_fingerprint, short_id
from negsynth.stages.corpus_queries import STYLES, build_messages, cut_tokens, extracted_queries, llm_writes, make_validator
from negsynth.stages.corpus_report import report, run_stats

NAME = "corpus"


# -- planning -------------------------------------------------------------------------------
def load_corpora(ctx: StageContext) -> list[CorpusData]:
    """Count every input's documents (passages, where long ones are split); the last read is kept
    for the run that follows its fingerprint (same inputs, same files: not read twice)."""
    cfg = ctx.cfg.corpus
    if not cfg.inputs:
        raise UserError('corpus has no inputs: pass --input PATH, or add [[corpus.inputs]] path = "..." to the run file')
    key = config_hash(
        {
            "inputs": [s.model_dump(mode="json") for s in cfg.inputs],
            "chunks": [cfg.chunk_tokens, cfg.chunk_overlap],
            "files": [path_fingerprint(s.path, mtime=True) for s in cfg.inputs],
        }
    )
    if _LOADED.get("key") != key:
        _LOADED.clear()
        corpora = [read_corpus(spec, cfg.chunk_tokens, cfg.chunk_overlap) for spec in cfg.inputs]
        _LOADED.update(key=key, corpora=corpora)
    corpora = _LOADED["corpora"]
    for c in corpora:
        c.positions = {}
    check_size(cfg, corpora)
    return corpora


#: the last :func:`load_corpora` read: its key and its corpora
_LOADED: dict[str, Any] = {}


def check_size(cfg: CorpusConfig, corpora: list[CorpusData]) -> None:
    """Refuse, before any request, a corpus too small to mine NUM_NEGATIVES negatives from, saying
    what left it so small (rows with no text, repeated ids): never a failure blamed on the model."""
    for c in corpora:
        if c.count > NUM_NEGATIVES:
            continue
        gone = []
        if c.duplicate_ids:
            gone.append(f"{c.duplicate_ids} left out as repeats of an earlier id (ids = {c.ids!r})")
        if c.empty_skipped:
            gone.append(f"{c.empty_skipped} with no text")
        why = f" of {c.rows} rows ({'; '.join(gone)})" if gone else ""
        raise UserError(
            f"{c.path}: {c.count} document{'s' if c.count != 1 else ''}{why}; mining {NUM_NEGATIVES} negatives per query needs at least "
            f"{NUM_NEGATIVES + 1} documents in each corpus: add documents, or fix the ids (--ids row)"
        )


def heldout_config(cfg: RunConfig) -> HeldoutConfig:
    """``[heldout]`` of the run file: the section the ``heldout`` stage brings to it (its defaults
    in a config made without the method's sections)."""
    return getattr(cfg, "heldout", None) or HeldoutConfig()


def heldout_indices(cfg: RunConfig, total: int) -> tuple[list[int], str | None]:
    """The held-out documents of a corpus of ``total`` documents (every input's in a row), sorted,
    and why there are none (None: there are some): ``min(heldout.queries, floor(heldout.share *
    sampled))``, drawn one after another with ``heldout.seed``, so a smaller set is the start of a
    larger one (arms sampling other training documents share their held-out documents)."""
    h = heldout_config(cfg)
    if h.queries == 0:
        return [], "heldout.queries = 0: no held-out set, no verdict"
    sampled = len(sample_indices(total, cfg.corpus.max_docs, cfg.corpus.seed))
    n = min(h.queries, int(h.share * sampled + 1e-9))
    if n < h.min_queries:
        need = math.ceil(h.min_queries / h.share - 1e-9)
        return [], (
            f"{sampled} documents: too few to set aside a held-out set (needs {need} for heldout.min_queries = {h.min_queries} "
            f"at heldout.share = {h.share}); no verdict on your own documents"
        )
    rng, picked = random.Random(f"{h.seed}:heldout"), {}
    while len(picked) < n:
        picked.setdefault(rng.randrange(total), None)
    return sorted(picked), None


def training_sample(cfg: RunConfig, total: int) -> tuple[Sequence[int], list[int]]:
    """The corpus stage's sample (``corpus.max_docs`` of ``total``, seeded) less the held-out
    documents, and the held-out documents it had drawn (their removal is part of what the
    examples are made from; with none removed the sample is what it always was)."""
    picked = sample_indices(total, cfg.corpus.max_docs, cfg.corpus.seed)
    lookup = picked if isinstance(picked, range) else set(picked)
    removed = [i for i in heldout_indices(cfg, total)[0] if i in lookup]
    if not removed:
        return picked, []
    gone = set(removed)
    return [i for i in picked if i not in gone], removed


def plan_items(ctx: StageContext, corpora: list[CorpusData]) -> list[WorkItem]:
    """One item per (sampled document, query index), in corpus then file order. The sample is
    drawn over the documents of every corpus in a row, less the held-out documents
    (:func:`training_sample`); each corpus is then read up to its last sampled document, and only
    those are kept (their index goes to ``CorpusData.positions``)."""
    import bisect

    cfg = ctx.cfg.corpus
    picked = training_sample(ctx.cfg, sum(c.count for c in corpora))[0]
    items: list[WorkItem] = []
    start = 0
    for ci, c in enumerate(corpora):
        lo, hi = bisect.bisect_left(picked, start), bisect.bisect_left(picked, start + c.count)
        wanted = [i - start for i in picked[lo:hi]]
        start += c.count
        for pos, d in c.documents_at(wanted):
            c.positions[d.id] = pos
            style = cfg.styles[random.Random(f"{cfg.seed}:{c.name}:{d.id}:style").randrange(len(cfg.styles))]  # the same on every rerun
            for j in range(cfg.queries_per_doc):
                payload = {"corpus": c.name, "corpus_index": ci, "doc_id": d.id, "query_index": j, "style": style, "document": d.text}
                if not llm_writes(cfg):  # the no-LLM queries read the title (LLM payloads stay as they were)
                    payload["title"] = d.title
                items.append(WorkItem(len(items), short_id("cq", c.name, d.id, j), payload))
    return items


# -- one item -------------------------------------------------------------------------------
def _failed_in_transit(fut: asyncio.Future) -> bool:
    """A document's answer that is a transport failure (the server, not the model)."""
    if fut.cancelled() or fut.exception() is not None:
        return True
    return fut.result().value is None and str(fut.result().reason or "").startswith("transport_")


def embedder_tokenizer(cfg: RunConfig):
    """The ``[embedder]``'s tokenizer, which cuts the prompts' documents; None (cut by words) when none loads."""
    try:
        from transformers import AutoTokenizer

        from negsynth.embed.models import resolve_model

        return AutoTokenizer.from_pretrained(resolve_model(cfg.embedder.model).path)
    except Exception:
        return None


async def search_and_judge(
    job: Corpus, p: dict[str, Any], query: str, meta: dict[str, Any]
) -> tuple[dict[str, Any], tuple[str, str, dict[str, Any]] | None]:
    """The query's search of its corpus: its document's rank (the round trip), its mined negatives,
    the teacher's view, each filter that is set, and the count check. Returns the search and None,
    or a rejection ``(reason, detail, extra input fields)`` instead of None; fills ``meta`` with the
    ranks and scores."""
    cfg, m = job.cfg, job.cfg.mining
    k = NUM_NEGATIVES
    ci, pos = p["corpus_index"], job.positions[p["corpus_index"]][p["doc_id"]]
    mined = await job.off_loop(
        lambda: job.index(ci).search(
            query,
            pos,
            k,
            relative_margin=m.relative_margin,
            absolute_margin=m.absolute_margin,
            max_score=m.max_score,
            range_max=m.range_max,
            lexical=job.lexical(ci).scores(query) if cfg.candidates == "hybrid" else None,
            order=cfg.candidates,
        )
    )
    # the round trip (the embedder's rank of the document) and the teacher's: each kept in the
    # meta, each a filter when its k is set
    ranks = [("round_trip", "round_trip_rank", mined["rank"], cfg.round_trip_k, "the embedder")]
    if cfg.teacher != "none" and len(mined["negatives"]) >= k:
        mined.update(await job.off_loop(teacher_fields, job.teacher(), query, p["document"], mined["negatives"]))
    if "teacher_rank" in mined:
        ranks.append(("teacher_rank", "teacher_rank", mined["teacher_rank"], cfg.teacher_k, f"the {cfg.teacher} teacher"))
    for reason, key, rank, limit, who in ranks:
        meta[key] = rank
        if limit and rank > limit:
            setting = "round_trip_k" if reason == "round_trip" else "teacher_k"
            among = "among itself and its mined negatives" if key == "teacher_rank" else "in the corpus"
            return (
                mined,
                (reason, f"{who} ranks its own document {rank} {among}, below {setting}={limit}", {"query": query, key: rank}),
            )
    if len(mined["negatives"]) < k:
        detail = f"{len(mined['negatives'])} of {k} negatives survived mining (corpus too small, or the margin removed the rest)"
        return mined, ("too_few_mined", detail, {"query": query})
    meta["mined_scores"] = mined["scores"]
    meta["mined_pos_score"] = mined["pos_score"]
    if cfg.teacher != "none":
        meta.update({k: mined[k] for k in ("teacher_pos_score", "teacher_scores", "teacher_label")})
    return mined, None


# -- the stage ------------------------------------------------------------------------------
class Corpus(pipeline.LLMStage):
    """Queries the LLM writes for a user's documents (or taken from them), with mined negatives.
    An item is one query; a document's one request is asked when its first item needs it and its
    answer shared by the document's items (:meth:`answer`)."""

    name = NAME
    summary = "queries written for a user's documents, with negatives"
    config = CorpusConfig
    prompts = "corpus"
    output_name = "queries"
    records = Example
    split = "process"  # a document's queries share one LLM answer: one process, its encoding on Ray workers

    def uses_llm(self, cfg: Any) -> bool:
        return llm_writes(cfg.corpus)

    def embeds(self, cfg: Any) -> bool:
        return True  # its index: mined negatives and the round trip

    def made_from(self, ctx: StageContext) -> dict[str, Any]:
        """The settings, LLM, prompts and documents the examples are made from (its inputs are
        documents read in place, not a stage's shards)."""
        cfg = ctx.cfg.corpus
        parts = {**pipeline.llm_parts(ctx, NAME, "corpus", cfg), "inputs": [path_fingerprint(s.path) for s in cfg.inputs]}
        # settings added after run dirs existed count only where they change what is read, so an older
        # run dir's hash (and its resume) stays as it was: how ids are made where they differ from the
        # column's, a glob, and the chunk sizes where a document is split
        specs = [
            {k: v for k, v in (("glob", s.glob), ("ids", s.ids)) if v is not None and v not in ("column", "first")} for s in cfg.inputs
        ]
        if any(specs):
            parts["inputs_read"] = specs
        corpora = load_corpora(ctx)
        if any(c.chunked for c in corpora):
            parts["chunks"] = [cfg.chunk_tokens, cfg.chunk_overlap]
        removed = training_sample(ctx.cfg, sum(c.count for c in corpora))[1]
        if removed:  # held-out documents left the sample (a sample they miss is what it always was)
            parts["heldout"] = config_hash(removed)
        parts["embedder"] = ctx.cfg.embedder
        return pipeline.item_entry(ctx, config_hash(parts))

    def check(self) -> None:
        check_teacher_model(NAME, self.cfg)

    def plan(self) -> list[WorkItem]:
        self.corpora = load_corpora(self.ctx)
        self.items = plan_items(self.ctx, self.corpora)
        self.positions = [c.positions for c in self.corpora]  # the sampled documents' index rows
        self.answers: dict[tuple[int, str], asyncio.Future] = {}
        self.model, self.tokens, self.indexes, self.lexicals, self.teacher_model = None, False, {}, {}, None
        self.prepared = False
        return self.items

    # the document's one request
    def messages(self, item: WorkItem) -> list[dict[str, str]]:
        return build_messages(item.payload, self.cfg, item.payload["doc_text"])

    def schema(self, item: WorkItem) -> dict[str, Any]:
        return queries_schema(self.cfg.queries_per_doc, max_query=self.cfg.max_query_chars, min_query=self.cfg.min_query_chars)

    def parse(self, item: WorkItem, answer: Any) -> Any:
        return make_validator(item.payload["document"], self.cfg)(answer)

    def answer(self, client: LLMClient, it: WorkItem) -> asyncio.Future:
        """The one LLM answer of a document, shared by its items (requested once); with
        ``corpus.queries = "title"``, the document's title as its query."""
        p = it.payload
        key = (p["corpus_index"], p["doc_id"])
        fut = self.answers.get(key)
        if fut is None and not llm_writes(self.cfg):
            fut = self.answers[key] = asyncio.get_running_loop().create_future()
            fut.set_result(extracted_queries(p, self.cfg))
        if fut is not None and fut.done() and _failed_in_transit(fut):
            fut = None  # its request failed at the transport level: an item sent again asks again
        if fut is None:
            fut = self.answers[key] = asyncio.ensure_future(self.ask_document(client, it))
        return fut

    async def ask_document(self, client: LLMClient, it: WorkItem):
        doc_text = await self.off_loop(cut_tokens, it.payload["document"], self.tokenizer(), self.cfg.doc_tokens)
        return await self.ask(client, WorkItem(it.index, it.id, {**it.payload, "doc_text": doc_text}))

    async def process(self, client: LLMClient | None, it: WorkItem) -> Outcome:
        """Its own flow: one answer per document shared by its queries, then search and judging."""
        p, cfg = it.payload, self.cfg
        llm = llm_writes(cfg)
        j = p["query_index"]  # its place in its answer
        self.prepare_index()  # before this item's request, and so before any: nothing is in flight while it runs
        res = await asyncio.shield(self.answer(client, it))
        # the document's answer is paid once: counted on its first item (queries from its text: none)
        usage = res.usage if j == 0 and llm else None
        inp = {k: v for k, v in p.items() if k not in ("document", "title")}

        def reject(reason: str, detail: str, **extra: Any) -> Outcome:
            rej = Reject(
                id=it.id,
                stage=NAME,
                reason=reason,
                detail=detail,
                raw=res.raw if j == 0 else None,
                input={**inp, **extra},
                **({"usage": usage} if usage else {}),
            )
            return Outcome(reject=rej.model_dump(mode="json"))

        if res.value is None:
            return reject(res.reason or "unknown", res.detail)
        queries, verdicts = res.value
        if verdicts[j] is not None:
            return reject(*verdicts[j], query=queries[j])
        query = queries[j]
        query_model = self.ctx.cfg.llm.model if llm else f"extract:{cfg.queries}"
        meta: dict[str, Any] = {"corpus": p["corpus"], "doc_id": p["doc_id"], "query_model": query_model}
        if res.reasons:
            meta["failed_attempts"] = res.reasons
        mined, rejected = await search_and_judge(self, p, query, meta)
        if rejected is not None:
            return reject(rejected[0], rejected[1], **rejected[2])
        # a mined negative is a document of the corpus: copied as long as the prompt shows a document
        # (doc_tokens), not whole (one huge document would be copied into every example)
        negs = await self.off_loop(lambda: [cut_tokens(t, self.tokenizer(), cfg.doc_tokens, mark="") for t in mined["negatives"]])
        ex = Example(
            id=it.id,
            task=STYLES[p["style"]][3],
            task_type="short-long",
            attributes={"style": p["style"], "query_index": p["query_index"]},
            query=query,
            positive=p["document"],
            negatives=negs,
            model=f"mined:{self.ctx.cfg.embedder.model}:corpus",
            source=SYNTHETIC_SOURCE,
            source_id=f"{p['corpus']}:{p['doc_id']}:{j}",
            meta=meta,
            **({"usage": usage} if usage else {}),
        )
        return Outcome(record=ex.model_dump(mode="json", exclude={"score"}))

    # the run's embedder, tokenizer and indexes
    def prepare_index(self) -> None:
        """Load the embedder and build (or load) the index of every corpus with a sampled document
        before the first request: the build holds the event loop, and answers in flight meanwhile
        would time out unread and be paid again."""
        if self.prepared:
            return
        self.prepared = True
        for ci, positions in enumerate(self.positions):
            if positions:
                self.index(ci)
                if self.cfg.candidates == "hybrid":
                    self.lexical(ci)
        self.tokenizer()

    def mining_model(self):
        if self.model is None:
            self.ctx.reporter.info(f"corpus: loading the embedder ({self.ctx.cfg.embedder.model}) ...")
            self.model = self.ctx.load_mining_model()
        return self.model

    def tokenizer(self):
        if self.tokens is False:
            # the model's own; --executor ray's stand-in holds none: the same one, loaded here
            own = getattr(self.mining_model(), "tokenizer", None)
            self.tokens = own if own is not None else embedder_tokenizer(self.ctx.cfg)
        return self.tokens

    def index(self, ci: int):
        if ci not in self.indexes:
            from negsynth.embed.mining import CorpusIndex

            c = self.corpora[ci]
            key = config_hash({"embedder": self.ctx.cfg.embedder, "input": path_fingerprint(c.path), "docs": c.count})
            folder = self.out / "_index"
            self.ctx.reporter.info(f"corpus: embedding {c.count} documents of {c.name} (cached) ...")
            self.indexes[ci] = CorpusIndex.from_batches(
                self.mining_model(),
                lambda: ([d.text for d in docs] for _, docs in c.batches()),
                c.count,
                batch_size=self.ctx.cfg.embedder.batch_size,
                cache=folder / f"{ci:03d}-{key}.npy",
                store=folder / f"{ci:03d}-{key}-{config_hash(c.columns)[:8]}.texts",
            )
        return self.indexes[ci]

    def lexical(self, ci: int):
        """The BM25 index of corpus ``ci`` for hybrid candidates (built once, saved beside the dense index)."""
        if ci not in self.lexicals:
            from negsynth.embed.lexical import LexicalIndex

            c = self.corpora[ci]
            key = config_hash({"input": path_fingerprint(c.path), "docs": c.count, "columns": c.columns})
            self.ctx.reporter.info(f"corpus: BM25 index of {c.count} documents of {c.name} (cached) ...")
            self.lexicals[ci] = LexicalIndex.build(
                (d.text for _, docs in c.batches() for d in docs), cache=self.out / "_index" / f"{ci:03d}-{key}.bm25"
            )
        return self.lexicals[ci]

    def teacher(self):
        """The teacher that scores the document and its negatives: the user's cross-encoder
        (``corpus.teacher_model``); made once."""
        if self.teacher_model is None:
            self.teacher_model = teacher_scorer(NAME, self.cfg, self.ctx.run_dir, lambda m: self.ctx.reporter.info(f"corpus: {m}"))
        return self.teacher_model

    def extra_stats(self) -> dict[str, Any]:
        return run_stats(self.ctx, self.corpora, len(self.items), self.out)

    def estimate(self, ctx: StageContext, tally: Tally) -> None:
        """``negsynth estimate``: one request per sampled document (its queries share the answer)."""
        cfg = ctx.cfg.corpus
        if not cfg.inputs:
            raise tally.no_inputs()
        items = plan_items(ctx, load_corpora(ctx))
        tally.count(len(items))
        if not llm_writes(cfg):
            tally.note(f"queries taken from the documents (corpus.queries = {cfg.queries!r}): no LLM request")
            return
        for it in items:
            p = it.payload
            if not p["query_index"]:
                # the stage cuts the document to corpus.doc_tokens tokens of the embedder's tokenizer;
                # words stand in for them here (no model is loaded)
                tally.request(build_messages(p, cfg, cut_tokens(p["document"], None, cfg.doc_tokens)), items=0)
        tally.note("one request per sampled document (corpus.max_docs), the document cut to corpus.doc_tokens words")

    report = staticmethod(report)


STAGE = Corpus()
