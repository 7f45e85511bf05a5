"""A sentence-transformers ``CrossEncoder`` reading (query, text) together, named by the user (a hub
name such as ``cross-encoder/ms-marco-MiniLM-L6-v2``, or a folder; :func:`load_cross_encoder`), on
the GPU when there is one: a teacher (``corpus.teacher`` / ``regenerate.teacher = "cross-encoder"``,
:class:`CrossEncoderScorer`) or score's false-negative judge (``score.judge_model``,
:class:`CrossEncoderJudge`: a second opinion beside the embedder's own cosine, which chose the
negatives and so is a weak check of itself).

``corpus`` ranks a document among its mined negatives with it (:func:`teacher_fields`: a filter
and distillation labels); ``regenerate`` drops the mined candidates it scores at or above the
labelled positive (:func:`relabel_fields`, RLHN). Scores are cached per model, query and text in
``RUN_DIR/cache/cross_encoder.sqlite`` (:class:`ScoreCache`: a rerun or a resumed run computes
none twice)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from negsynth.embed.base import quiet_loading, resolve_device
from negsynth.errors import UserError


class ScoreCache:
    """Scores by key in one SQLite file, written as they are computed (safe to kill at any point)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, timeout=60)
        with self._lock, self._db:
            self._db.execute("CREATE TABLE IF NOT EXISTS scores (key TEXT PRIMARY KEY, value REAL NOT NULL)")

    def get(self, keys: Sequence[str]) -> dict[str, float]:
        out: dict[str, float] = {}
        with self._lock:
            for k in keys:
                row = self._db.execute("SELECT value FROM scores WHERE key = ?", (k,)).fetchone()
                if row is not None:
                    out[k] = float(row[0])
        return out

    def put(self, items: dict[str, float]) -> None:
        with self._lock, self._db:
            self._db.executemany("INSERT OR REPLACE INTO scores VALUES (?, ?)", list(items.items()))

    def through(self, keys: Sequence[str], compute) -> list[float]:
        """The scores of ``keys``, in order: the cached ones read, the rest from ``compute(indices)``
        (their scores, in that order) and written."""
        known = self.get(keys)
        todo = [i for i, k in enumerate(keys) if k not in known]
        if todo:
            new = {keys[i]: x for i, x in zip(todo, compute(todo), strict=True)}
            self.put(new)
            known.update(new)
        return [known[k] for k in keys]


def _not_a_cross_encoder(setting: str, model: str, e: Exception) -> UserError:
    first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
    return UserError(f"{setting} = {model!r}: not a sentence-transformers CrossEncoder name or folder ({first})")


@quiet_loading()
def load_cross_encoder(model: str, setting: str, *, device: str = "auto", **kw):
    """``CrossEncoder(model, **kw)`` on ``device``, or one line naming ``setting``: a model that
    does not load, or a folder holding an embedding model (CrossEncoder would give it a randomly
    initialised head: random scores)."""
    from sentence_transformers import CrossEncoder

    cfg_file = Path(model) / "config.json"
    if cfg_file.is_file():
        arch = json.loads(cfg_file.read_text(encoding="utf-8")).get("architectures") or []
        if not any(a.endswith("ForSequenceClassification") for a in arch):
            raise UserError(
                f"{setting} = {model!r} is not a cross-encoder (architectures {arch}); point it at a reranker folder "
                "(e.g. a saved ms-marco-MiniLM-L6-v2), not at an embedding model"
            )
    try:
        return CrossEncoder(model, device=resolve_device(device), **kw)
    except (OSError, ValueError) as e:
        raise _not_a_cross_encoder(setting, model, e) from None


def check_cross_encoder(model: str, setting: str) -> None:
    """One line unless ``model`` resolves (its config read from the folder, the hub or the hub's
    cache): a stage checks it before paying for any LLM request; the weights load later."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as e:
        raise _not_a_cross_encoder(setting, model, e) from None


class CrossEncoderScorer:
    """Relevance of texts to a query by a sentence-transformers ``CrossEncoder``: its raw output
    (a logit for one-label models), the higher the more relevant."""

    def __init__(
        self,
        model: str,
        *,
        cache: str | Path | None = None,
        device: str = "auto",
        batch_size: int = 32,
        max_length: int = 512,
        setting: str = "corpus.teacher_model",
    ):
        self.model = load_cross_encoder(model, setting, device=device, max_length=max_length)
        self.batch_size = batch_size
        self.cache = ScoreCache(cache) if cache else None
        # what a cached score depends on besides its texts: the model and the cut
        self._salt = json.dumps(["cross-encoder", model, max_length])

    def _key(self, query: str, text: str) -> str:
        return hashlib.sha256(json.dumps([self._salt, query, text]).encode()).hexdigest()

    def _predict(self, query: str, texts: Sequence[str]) -> list[float]:
        out = self.model.predict([(query, t) for t in texts], batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True)
        return [float(x) for x in out.reshape(len(texts), -1)[:, 0]]

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """One score per text, in order (cached scores are not computed again)."""
        if self.cache is None:
            return self._predict(query, documents)
        keys = [self._key(query, d) for d in documents]
        return self.cache.through(keys, lambda todo: self._predict(query, [documents[i] for i in todo]))


def check_teacher_model(stage: str, section: Any) -> None:
    """``<stage>.teacher = "cross-encoder"``: its model must resolve before any LLM request is paid."""
    if section.teacher == "cross-encoder":
        check_cross_encoder(section.teacher_model, f"{stage}.teacher_model")


def teacher_scorer(stage: str, section: Any, run_dir: Path, info=None) -> CrossEncoderScorer:
    """The scorer of ``<stage>.teacher``: the user's cross-encoder (``teacher_model``), its scores
    cached in ``RUN_DIR/cache/cross_encoder.sqlite``."""
    if info is not None:
        info(f"loading the cross-encoder teacher {section.teacher_model} ...")
    return CrossEncoderScorer(section.teacher_model, cache=run_dir / "cache" / "cross_encoder.sqlite", setting=f"{stage}.teacher_model")


def teacher_fields(scorer, query: str, document: str, negatives: list[str]) -> dict[str, Any]:
    """The teacher's view of one example: the document's rank among itself and its negatives, the
    scores, and the label ``[document, negative_1..]`` for distillation."""
    scores = [round(x, 6) for x in scorer.scores(query, [document, *negatives])]
    return {
        "teacher_rank": 1 + sum(x > scores[0] for x in scores[1:]),
        "teacher_pos_score": scores[0],
        "teacher_scores": scores[1:],
        "teacher_label": scores,
    }


def relabel_fields(scorer, query: str, positive: str, candidates: list[str], k: int) -> tuple[list[int], dict[str, Any]]:
    """A labelled pair's teacher (``regenerate.teacher``): the positive and every mined candidate
    scored by ``scorer``; a candidate scored at or above the positive is a false negative (RLHN) and
    left out. Returns the indices of the first ``k`` candidates kept and the example's teacher
    fields (the positive's rank among all candidates, the kept ones' scores, the label
    ``[positive, kept_1..k]``, how many were left out)."""
    scores = [round(x, 6) for x in scorer.scores(query, [positive, *candidates])]
    pos, cand = scores[0], scores[1:]
    kept = [i for i, x in enumerate(cand) if x < pos][:k]
    return kept, {
        "teacher_rank": 1 + sum(x >= pos for x in cand),
        "teacher_pos_score": pos,
        "teacher_scores": [cand[i] for i in kept],
        "teacher_label": [pos, *(cand[i] for i in kept)],
        "teacher_false_negatives": sum(x >= pos for x in cand),
    }


class CrossEncoderJudge:
    """score's false-negative judge: ``(query, text)`` pairs scored in [0, 1] by a one-label reranker."""

    def __init__(self, model, name: str, batch_size: int = 32):
        self.model = model
        self.name = name
        self.batch_size = batch_size

    @classmethod
    def load(cls, model: str, *, device: str = "auto", batch_size: int = 32) -> CrossEncoderJudge:
        """A local folder or a hub name (offline: the folder must exist or the hub cache hold it)."""
        ce = load_cross_encoder(model, "score.judge_model", device=device)
        if ce.num_labels != 1:
            raise UserError(
                f"score.judge_model = {model!r} has {ce.num_labels} labels; the judge needs a one-score reranker (num_labels = 1)"
            )
        return cls(ce, name=str(model), batch_size=batch_size)

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Relevance in [0, 1] per pair (sigmoid of the reranker's logit), float64."""
        if not pairs:
            return np.zeros(0)
        import torch

        s = self.model.predict(
            list(pairs), batch_size=self.batch_size, activation_fn=torch.nn.Sigmoid(), show_progress_bar=False, convert_to_numpy=True
        )
        return np.asarray(s, dtype=np.float64).reshape(-1)

    def score_examples(self, examples: Sequence[dict]) -> tuple[np.ndarray, list[list[float]]]:
        """``(score of each positive [N], scores of each example's negatives)``, each distinct pair scored once."""
        index: dict[tuple[str, str], int] = {}
        for ex in examples:
            for t in (ex["positive"], *ex["negatives"]):
                index.setdefault((ex["query"], t), len(index))
        s = self.score(list(index))
        pos = np.array([s[index[(ex["query"], ex["positive"])]] for ex in examples], dtype=np.float64)
        negs = [[float(s[index[(ex["query"], t)]]) for t in ex["negatives"]] for ex in examples]
        return pos, negs


def judged_false_negatives(pos: float, negs: Sequence[float], ratio: float) -> list[bool]:
    """A negative is a false negative when the judge scores it at or above ``ratio`` x the positive.

    >>> judged_false_negatives(0.8, [0.9, 0.77, 0.2], 0.95)
    [True, True, False]
    """
    return [n >= ratio * pos for n in negs]
