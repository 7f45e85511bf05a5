"""A second opinion on false negatives: a cross-encoder reads (query, text) together.

The embedder's own cosine (``score.fn_ratio``) is what the negatives were chosen by, so it is a
weak check of itself. :class:`CrossEncoderJudge` scores pairs with sentence-transformers'
``CrossEncoder`` (sigmoid scores in [0, 1] for one-label rerankers); :func:`judged_false_negatives`
applies the positive-aware rule on those scores.

Never imports :mod:`negsynth.stages`: usable on its own::

    judge = CrossEncoderJudge.load("cross-encoder/ms-marco-MiniLM-L6-v2")
    pos, negs = judge.score_examples([{"query": q, "positive": p, "negatives": [n1, n2, n3, n4]}])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from negsynth.embed.base import quiet_loading


class CrossEncoderJudge:
    """Scores ``(query, text)`` pairs with a sentence-transformers ``CrossEncoder``."""

    def __init__(self, model, name: str, batch_size: int = 32):
        self.model = model
        self.name = name
        self.batch_size = batch_size

    @classmethod
    @quiet_loading()
    def load(cls, model: str, *, device: str = "auto", batch_size: int = 32) -> CrossEncoderJudge:
        """A local folder or a hub name (offline: the folder must exist or the hub cache hold it)."""
        from pathlib import Path

        from sentence_transformers import CrossEncoder

        from negsynth.embed.base import resolve_device
        from negsynth.errors import UserError

        cfg_file = Path(model) / "config.json"
        if cfg_file.is_file():
            import json

            arch = json.loads(cfg_file.read_text(encoding="utf-8")).get("architectures") or []
            if not any(a.endswith("ForSequenceClassification") for a in arch):
                # CrossEncoder would "convert" it with a randomly initialised head: random verdicts
                raise UserError(
                    f"score.judge_model = {model!r} is not a cross-encoder (architectures {arch}); point it at a reranker folder "
                    "(e.g. a saved ms-marco-MiniLM-L6-v2), not at an embedding model"
                )
        try:
            ce = CrossEncoder(model, device=resolve_device(device))
        except (OSError, ValueError) as e:
            where = "folder" if Path(model).exists() else "name"
            raise UserError(
                f"score.judge_model = {model!r}: could not load it as a cross-encoder ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                f"set it to a cross-encoder {where} that sentence-transformers' CrossEncoder loads (e.g. a saved ms-marco-MiniLM-L6-v2)"
            ) from None
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
