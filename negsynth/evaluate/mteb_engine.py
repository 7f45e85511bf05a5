"""Evaluation through the ``mteb`` library (``pip install 'negsynth[eval]'``).

MTEB's own task definitions and evaluators score the model. A registered MTEB task whose files are
in the data dir (the STS sets, the BEIR folders, the pair sets such as TwitterSemEval2015) is
filled from them instead of the hub, so offline and online runs share the scoring code; any other
MTEB task name is loaded from the hub. mteb's results go to ``OUT/mteb/<task>.json`` and into
negsynth's report schema. The sets that are not MTEB tasks, and the classification and clustering
sets (whose local layouts differ from MTEB's), stay with negsynth's evaluator.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from negsynth.data.readers import EvalDataError, read_beir
from negsynth.errors import NegsynthError
from negsynth.evaluate.encode import encode_texts, pair_labels, sts_pairs
from negsynth.evaluate.suite import TASKS_BY_NAME, TaskSpec

#: negsynth categories whose local files fill the MTEB task of the same name
LOCAL_CATEGORIES = ("STS", "Retr", "Pair")


class MtebUnavailable(NegsynthError, ImportError):
    """mteb is not installed."""


def _mteb():
    try:
        import mteb
    except ImportError:
        raise MtebUnavailable(
            "evaluate.engine = 'mteb' needs the mteb library: pip install 'negsynth[eval]' (or pip install mteb)"
        ) from None
    return mteb


def is_mteb_task(name: str) -> bool:
    """Whether mteb registers a task of that name (negsynth's dev and non-MTEB sets are not)."""
    mteb = _mteb()
    try:
        mteb.get_task(name)
    except (KeyError, ValueError):
        return False
    return True


def local_dataset(spec: TaskSpec, data_dir: Path) -> Any:
    """The ``task.dataset`` an MTEB task of ``spec``'s category expects, read from ``data_dir``."""
    from datasets import Dataset, DatasetDict

    f = data_dir / spec.files[0]
    if spec.category == "STS":
        t1, t2, gold = sts_pairs(spec, f)
        return DatasetDict({"test": Dataset.from_dict({"sentence1": t1, "sentence2": t2, "score": gold.tolist()})})
    if spec.category == "Retr":
        queries, corpus, qrels = read_beir(f, doc_title=spec.doc_title)
        split = {
            # documents as negsynth and BEIR read them ("title text"); mteb adds an empty title
            "corpus": Dataset.from_dict({"id": list(corpus), "title": [""] * len(corpus), "text": list(corpus.values())}),
            "queries": Dataset.from_dict({"id": list(queries), "text": list(queries.values())}),
            "relevant_docs": {q: {d: int(g) for d, g in docs.items()} for q, docs in qrels.items()},
            "top_ranked": None,
        }
        return {"default": {"test": split}}
    if spec.category == "Pair":
        t1, t2, y = pair_labels(spec, f)
        return DatasetDict({"test": Dataset.from_dict({"sentence1": t1, "sentence2": t2, "labels": y})})
    raise ValueError(f"{spec.name}: category {spec.category} is not read from local files for mteb")


def mteb_task(name: str, data_dir: Path | None):
    """The registered MTEB task ``name``, with its data from ``data_dir`` when it is there.

    Returns ``(task, source)`` where ``source`` is the local folder or ``"hub"``."""
    mteb = _mteb()
    try:
        task = mteb.get_task(name)
    except (KeyError, ValueError):
        raise EvalDataError(
            f"evaluate: {name!r} is not an MTEB task; pick names from mteb.get_tasks() or drop it from evaluate.tasks"
        ) from None
    spec = TASKS_BY_NAME.get(name)
    if spec is not None and spec.category in LOCAL_CATEGORIES and data_dir is not None and (data_dir / spec.files[0]).exists():
        task.dataset = local_dataset(spec, data_dir)
        task.data_loaded = True
        return task, str(data_dir / spec.files[0])
    return task, "hub"


class _EmbedderEncoder:
    """An mteb encoder over any negsynth :class:`~negsynth.embed.base.Embedder` (decoder
    embedders, zero-shot methods), encoding as negsynth's evaluator does: documents with
    ``encode_documents``, everything else as queries with the task's instruction."""

    def __init__(self, embedder):
        from mteb.models import ModelMeta

        self.embedder = embedder
        name = getattr(embedder, "name", type(embedder).__name__)
        self.mteb_model_meta = (
            ModelMeta.create_empty(overwrites={"name": f"negsynth/{name.replace('/', '_')}"})
            if hasattr(ModelMeta, "create_empty")
            else None
        )

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs) -> np.ndarray:
        texts = [t for batch in inputs for t in batch["text"]]
        spec = TASKS_BY_NAME.get(task_metadata.name)
        is_doc = prompt_type is not None and getattr(prompt_type, "value", str(prompt_type)) == "document"
        return encode_texts(self.embedder, texts, spec.instruction if spec is not None else None, query=not is_doc)

    def similarity(self, a, b):  # both: part of mteb's EncoderProtocol, which it checks
        from sentence_transformers.util import cos_sim

        return cos_sim(a, b)

    def similarity_pairwise(self, a, b):
        from sentence_transformers.util import pairwise_cos_sim

        return pairwise_cos_sim(a, b)


def mteb_model(embedder):
    """What mteb evaluates: the SentenceTransformer itself where there is one (mteb's own wrapper,
    prompts and batching), else an encoder over the negsynth embedder."""
    st = getattr(embedder, "model", None)
    from sentence_transformers import SentenceTransformer

    return st if isinstance(st, SentenceTransformer) else _EmbedderEncoder(embedder)


def evaluate_mteb(
    embedder, names: list[str], data_dir: Path | None, *, out: Path | None = None, progress: bool = True, batch_size: int = 64
) -> dict[str, dict]:
    """Run MTEB tasks ``names``; returns negsynth report entries per task (``main_score``, the
    split, the data source, ``engine = "mteb"``) and writes mteb's results under ``out/mteb``."""
    mteb = _mteb()
    model = mteb_model(embedder)
    results: dict[str, dict] = {}
    for name in names:
        task, source = mteb_task(name, data_dir)
        n = _size(task) if source != "hub" else None
        t0 = time.perf_counter()
        if progress:
            print(f"  mteb {name} ({'local: ' + source if source != 'hub' else 'from the hub'}) ...", file=sys.stderr, flush=True)
        res = mteb.evaluate(model, task, cache=None, show_progress_bar=False, encode_kwargs={"batch_size": batch_size})
        tr = res.task_results[0]
        split = task.metadata.eval_splits[0]
        scores = tr.scores[split][0]
        spec = TASKS_BY_NAME.get(name)
        results[name] = {
            "category": spec.category if spec is not None else _category(task),
            "main_metric": task.metadata.main_score,
            "main_score": float(scores["main_score"]),
            "n": n,
            "split": split,
            "source": source,
            "engine": "mteb",
            "mteb_version": mteb.__version__,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if out is not None:
            dest = Path(out) / "mteb"
            dest.mkdir(parents=True, exist_ok=True)
            tr.to_disk(dest / f"{name}.json")
    return results


def _size(task) -> int:
    """Pairs (STS, Pair) or queries (retrieval) of a task filled by :func:`local_dataset`."""
    ds = task.dataset
    return len(ds["default"]["test"]["queries"]) if "default" in ds else len(ds["test"])


_TYPE_TO_CATEGORY = {"STS": "STS", "Retrieval": "Retr", "PairClassification": "Pair", "Classification": "Class", "Clustering": "Clust"}


def _category(task) -> str:
    return _TYPE_TO_CATEGORY.get(str(task.metadata.type), str(task.metadata.type))
