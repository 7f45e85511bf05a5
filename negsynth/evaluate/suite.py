"""The built-in evaluation suite: every set in the shared benchmark folder, one :class:`TaskSpec` each
(where it lives, its columns, its MTEB category and the E5-style instruction its queries get).

Categories and main scores: STS (Spearman of cosine vs gold), Retr (nDCG@10, exact dense search
over a BEIR corpus), Pair (AP of cosine), Class (logistic-regression accuracy), Clust (k-means
V-measure), and Triplet (cos(a, p) > cos(a, n); not an MTEB category, kept out of the averages).
Queries get ``Instruct: {instruction}\nQuery: {text}`` when the embedder's ``instruct_queries`` is
on; in symmetric tasks every input is a query, retrieval documents never get one. Instructions are
E5 / LLM2Vec's where they have one for the set, else ours (Cranfield, MRPC, TREC, AGNews,
TRECClustering and :func:`retrieval_task`'s generic one).

Suites: ``full`` runs every default task on all rows; ``quick`` subsamples them (seed 0) to the
``quick`` caps, a CPU demo of about a minute whose figures compare only with other quick ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from negsynth.errors import NegsynthError

STS_INSTRUCTION = "Retrieve semantically similar text."
NLI_INSTRUCTION = "Given a premise, retrieve a hypothesis that is entailed by the premise"
SCIFACT_INSTRUCTION = "Given a scientific claim, retrieve documents that support or refute the claim"

CATEGORIES: tuple[str, ...] = ("Class", "Clust", "Pair", "Retr", "STS")  # MTEB-style averages
EXTRA_CATEGORIES: tuple[str, ...] = ("Triplet",)
MAIN_METRIC = {
    "STS": "spearman",
    "Retr": "ndcg@10",
    "Pair": "ap",
    "Class": "accuracy",
    "Clust": "v_measure",
    "Triplet": "accuracy",
}


@dataclass(frozen=True)
class TaskSpec:
    """One evaluation set.

    ``files`` are paths relative to the data dir (a retrieval task names its folder).
    ``columns`` maps roles to header names: STS ``text1/text2/score``; Pair
    ``text1/text2/label``; Class / Clust ``text/label``; Triplet ``anchor/positive/negative``.
    ``positive_labels`` / ``negative_labels`` turn a multi-class pair label into 1 / 0 (other
    labels are dropped). ``quick`` caps the rows (pairs, texts, queries/corpus) in the quick suite.
    """

    name: str
    category: str
    files: tuple[str, ...]
    instruction: str
    columns: dict[str, str] = field(default_factory=dict)
    positive_labels: tuple[str, ...] = ("1",)
    negative_labels: tuple[str, ...] = ("0",)
    doc_title: bool = True  # retrieval: embed "title text" (BEIR); False when text repeats title
    eval_mode: str = ""  # classification: "train_test" or "cv"
    quick: dict[str, int] = field(default_factory=dict)
    default: bool = True
    note: str = ""

    @property
    def main_metric(self) -> str:
        return MAIN_METRIC[self.category]


_STS_COLS = {"text1": "sentence1", "text2": "sentence2", "score": "score"}
_PAIR_COLS = {"text1": "text1", "text2": "text2", "label": "label"}
_CLS_COLS = {"text": "text", "label": "label"}
_TRIPLE_COLS = {"anchor": "anchor", "positive": "positive", "negative": "negative"}
_STS_QUICK = {"rows": 500}


def _sts(name: str, path: str, *, default: bool = True, note: str = "", columns: dict | None = None) -> TaskSpec:
    return TaskSpec(name, "STS", (path,), STS_INSTRUCTION, columns or _STS_COLS, quick=_STS_QUICK, default=default, note=note)


def _retrieval(name: str, folder: str, instruction: str, **spec) -> TaskSpec:
    """A BEIR-folder retrieval task, cut to 100 queries against 1,000 documents in the quick suite."""
    return TaskSpec(name, "Retr", (folder,), instruction, quick={"queries": 100, "corpus": 1000}, **spec)


def _pair(name: str, path: str, instruction: str, **spec) -> TaskSpec:
    """A pair-classification task from one ``text1/text2/label`` file, 500 pairs in the quick suite."""
    return TaskSpec(name, "Pair", (path,), instruction, _PAIR_COLS, quick={"rows": 500}, **spec)


#: the labelled-text sets, each read by a classification and a clustering task
_TREC = ("trec/train.tsv", "trec/test.tsv")
_AG_NEWS = ("ag_news/test.tsv",)


def _labelled(name: str, category: str, files: tuple[str, ...], instruction: str, *, quick: dict | None = None, **spec) -> TaskSpec:
    """A ``text/label`` task (``Class`` or ``Clust``), 2,000 rows in the quick suite unless ``quick`` says otherwise."""
    return TaskSpec(name, category, files, instruction, _CLS_COLS, quick=quick or {"rows": 2000}, **spec)


def _entailment(name: str, path: str, *, note: str) -> TaskSpec:
    """An NLI test set as pair classification: entailment = 1 vs contradiction = 0, neutral dropped."""
    return _pair(
        name,
        path,
        NLI_INSTRUCTION,
        positive_labels=("entailment",),
        negative_labels=("contradiction",),
        note=f"entailment=1 vs contradiction=0, neutral dropped; {note}",
    )


TASKS: tuple[TaskSpec, ...] = (
    # --- STS (Spearman) -----------------------------------------------------------------
    _sts("STS12", "sts12/test.tsv"),
    _sts("STS13", "sts13/test.tsv", note="SMT subset absent (LDC), as in SentEval/MTEB"),
    _sts("STS14", "sts14/test.tsv"),
    _sts("STS15", "sts15/test.tsv"),
    _sts("STS16", "sts16/test.tsv"),
    _sts("STSBenchmark", "stsb/test.tsv"),
    _sts("SICK-R", "sickr/test.tsv"),
    _sts("STSBenchmark-dev", "stsb/dev.tsv", default=False, note="dev split: for tuning, not reporting"),
    _sts(
        "TwitterSemEval2015-graded",
        "twitter_semeval2015/test_graded.tsv",
        default=False,
        columns={"text1": "text1", "text2": "text2", "score": "label"},
        note="0-5 expert scores of all 972 pairs; not an MTEB task",
    ),
    # --- Retrieval (nDCG@10) --------------------------------------------------------------
    _retrieval("SciFact", "scifact", SCIFACT_INSTRUCTION, note="corpus rebuilt from HF allenai/scifact (0.007% bytes off BEIR)"),
    _retrieval(
        "SciFact-dev",
        "scifact/train",
        SCIFACT_INSTRUCTION,
        default=False,
        note="SciFact train claims against the same corpus: for choosing settings, not reporting",
    ),
    _retrieval(
        "Cranfield",
        "cranfield",
        "Given a question about aeronautics, retrieve scientific abstracts that answer the question",
        doc_title=False,
        note="graded qrels (gain 1-4); not an MTEB task; title repeated in text so text only",
    ),
    # --- Pair classification (AP of cosine) -----------------------------------------------
    _pair("TwitterSemEval2015", "twitter_semeval2015/test.tsv", "Retrieve tweets that are semantically similar to the given tweet"),
    _pair(
        "MRPC",
        "mrpc/test.tsv",
        "Retrieve sentences from news articles that are paraphrases of the given sentence",
        note="not an MTEB task",
    ),
    _entailment("SICK-E", "sickr/test_entailment.tsv", note="not an MTEB task"),
    _entailment("SNLI-PC", "snli/test.tsv", note="SentEval-tokenised text; not an MTEB task"),
    # --- Classification (accuracy) ---------------------------------------------------------
    _labelled(
        "TREC",
        "Class",
        _TREC,
        "Classify the given question by the type of its expected answer",
        eval_mode="train_test",
        quick={"train": 1000},
        note="coarse labels (6); logistic regression fit on train, accuracy on test",
    ),
    _labelled(
        "AGNews",
        "Class",
        _AG_NEWS,
        "Classify the given news article into its topic",
        eval_mode="cv",
        note="no train split: stratified 5-fold CV (shuffle, seed 0) on the test split, mean accuracy",
    ),
    # --- Clustering (V-measure) --------------------------------------------------------------
    _labelled("AGNewsClustering", "Clust", _AG_NEWS, "Identify the topic or theme of the given news articles", note="k = 4 topics"),
    _labelled(
        "TRECClustering",
        "Clust",
        _TREC,
        "Identify the type of answer the given question asks for",
        note="train+test, k = 6 coarse labels",
    ),
    # --- Triplets (accuracy; not in the MTEB average) ---------------------------------------
    TaskSpec(
        "SICK-Triplets",
        "Triplet",
        ("sickr/triples_test.tsv",),
        NLI_INSTRUCTION,
        _TRIPLE_COLS,
        note="(premise, entailed, contradicting) - the hard-negative setting",
    ),
    TaskSpec(
        "SNLI-Triplets",
        "Triplet",
        ("snli/triples_test.tsv",),
        NLI_INSTRUCTION,
        _TRIPLE_COLS,
        quick={"rows": 500},
    ),
)

TASKS_BY_NAME: dict[str, TaskSpec] = {t.name: t for t in TASKS}


class UnknownTask(NegsynthError, ValueError):
    pass


def select_tasks(suite: str = "quick", tasks: list[str] | tuple[str, ...] | str | None = None) -> list[TaskSpec]:
    """The tasks to run: an explicit list (names, category names like ``STS``, or
    :class:`TaskSpec` objects such as :func:`retrieval_task`'s), else the suite's defaults. Names are case-insensitive; an unknown name raises :class:`UnknownTask`."""
    if suite not in ("full", "quick"):
        raise UnknownTask(f"evaluate: suite must be 'full' or 'quick', got {suite!r}")
    if tasks is None:
        return [t for t in TASKS if t.default]
    if isinstance(tasks, str):
        tasks = [x for x in tasks.split(",") if x.strip()]
    lower = {t.name.lower(): t for t in TASKS}
    chosen: list[TaskSpec] = []
    for raw in tasks:
        if isinstance(raw, TaskSpec):  # a task built by the caller (a BEIR folder by path)
            if raw not in chosen:
                chosen.append(raw)
            continue
        key = raw.strip().lower()
        cats = [c for c in CATEGORIES + EXTRA_CATEGORIES if c.lower() == key]
        if cats:
            picked = [t for t in TASKS if t.category == cats[0] and t.default]
        elif key in lower:
            picked = [lower[key]]
        else:
            known = ", ".join(t.name for t in TASKS)
            raise UnknownTask(
                f"evaluate: unknown task {raw!r}; use one of: {known} (or a category: {', '.join(CATEGORIES + EXTRA_CATEGORIES)})"
            )
        chosen.extend(t for t in picked if t not in chosen)
    return chosen


GENERIC_RETRIEVAL_INSTRUCTION = "Given a query, retrieve relevant documents that answer the query"


def retrieval_task(name: str, folder, *, instruction: str | None = None, doc_title: bool = True, note: str = "") -> TaskSpec:
    """A retrieval task from a BEIR folder given by path (``queries.jsonl`` + ``qrels.tsv``, the
    corpus in the folder or its parent, as in ``scifact/train``), scored like the built-in ones
    (nDCG@10 by exact dense search over the whole corpus). Pass it in ``evaluate(tasks=[...])``."""
    from pathlib import Path

    path = Path(folder).expanduser().resolve()
    return _retrieval(
        name,
        str(path),
        instruction or GENERIC_RETRIEVAL_INSTRUCTION,
        doc_title=doc_title,
        default=False,
        note=note or f"BEIR folder {path}",
    )
