"""A cross-encoder as a teacher: one relevance score per (query, text), from any
sentence-transformers ``CrossEncoder`` a user names (a hub name such as
``cross-encoder/ms-marco-MiniLM-L6-v2``, or a folder), on the GPU when there is one.

It answers the same call as the query-likelihood teachers (:meth:`scores`), so ``corpus`` and
``regenerate`` rank a document among its mined negatives, filter, veto and distil with it the
same way; scores are cached per model, query and text (a rerun or a resumed run computes none
twice)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from negsynth.embed.base import resolve_device
from negsynth.embed.likelihood import ScoreCache
from negsynth.errors import UserError


def _not_a_cross_encoder(setting: str, model: str, e: Exception) -> UserError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return UserError(f"{setting} = {model!r}: not a sentence-transformers CrossEncoder name or folder ({first})")


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
        from sentence_transformers import CrossEncoder

        try:
            self.model = CrossEncoder(model, device=resolve_device(device), max_length=max_length)
        except (OSError, ValueError) as e:
            raise _not_a_cross_encoder(setting, model, e) from None
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
