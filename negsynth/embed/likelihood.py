"""Query likelihood from a causal LM: how well a document explains a query, with no generation.

UPR (Sachan et al. 2022) re-ranks a retriever's candidates by ``log p(query | document)``: a
language model reads a document and the instruction to write a question about it, and the
question's tokens are scored in one forward pass. It needs no label and no training, so it can
serve as a teacher for data without labels: score a query's document and its candidates, and let
the student learn the teacher's preferences (or drop what the teacher disputes).

:class:`QueryLikelihood` scores with any transformers causal LM (default: the embedded SmolLM2
GGUF, converted once by :func:`negsynth.embed.hf.resolve_decoder_path`). The score is the mean
log-probability per query token (a sum would favour short queries). Documents are cut to
``max_doc_tokens`` tokens; pairs are scored in batches, padded on the left so that every query
ends at the last position.

    lm = QueryLikelihood.load()
    lm.scores("what causes lift on a wing", ["Lift is produced by ...", "Boundary layers ..."])

``cache``: a SQLite file of the scores already computed, keyed by the model, the template, the
cut and the texts (:class:`ScoreCache`); a rerun, a resumed run or another run sharing the file
computes nothing twice, as the request cache does for answers.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: UPR's prompt (Sachan et al. 2022, §3): the document, then the instruction; the query follows
TEMPLATE = "Passage: {document}\nPlease write a question based on this passage.\nQuestion:"


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


class QueryLikelihood:
    """Mean ``log p(query | TEMPLATE(document))`` per query token, for one query and many documents."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_doc_tokens: int = 256,
        batch_size: int = 8,
        template: str = TEMPLATE,
        cache: str | Path | None = None,
        model_id: str = "",
    ):
        self.model, self.tok = model, tokenizer
        self.max_doc_tokens, self.batch_size, self.template = max_doc_tokens, batch_size, template
        self.cache = ScoreCache(cache) if cache else None
        # what a cached score depends on besides its texts: the model (and where it ran), the prompt, the cut
        p = next(model.parameters(), None)
        where = f"{p.device.type}:{p.dtype}" if p is not None else ""
        self._salt = json.dumps([model_id or getattr(model, "name_or_path", ""), where, template, max_doc_tokens])

    def _key(self, query: str, document: str) -> str:
        return hashlib.sha256(json.dumps([self._salt, query, document]).encode()).hexdigest()

    @classmethod
    def load(cls, model: str = "default", *, device: str = "auto", dtype: str = "auto", **kw: Any) -> QueryLikelihood:
        """The decoder ``model`` (``default``: the embedded SmolLM2) with its LM head."""
        from negsynth.embed.hf import load_decoder, resolve_decoder_path

        m, tok = load_decoder(model, device=device, dtype=dtype, causal_lm=True)
        kw.setdefault("model_id", Path(resolve_decoder_path(model)).name)
        return cls(m, tok, **kw)

    def _prompt_ids(self, document: str) -> list[int]:
        doc_ids = self.tok(document, add_special_tokens=False)["input_ids"][: self.max_doc_tokens]
        head, tail = self.template.split("{document}")
        return self.tok(head, add_special_tokens=False)["input_ids"] + doc_ids + self.tok(tail, add_special_tokens=False)["input_ids"]

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """One score per document, in order: the mean log-probability of ``query``'s tokens."""
        if self.cache is None:
            return self._compute(query, documents)
        keys = [self._key(query, d) for d in documents]
        return self.cache.through(keys, lambda todo: self._compute(query, [documents[i] for i in todo]))

    def _compute(self, query: str, documents: Sequence[str]) -> list[float]:
        import torch

        q_ids = self.tok(" " + query.strip(), add_special_tokens=False)["input_ids"]
        if not q_ids:
            return [0.0] * len(documents)
        seqs = [self._prompt_ids(d) + q_ids for d in documents]
        out: list[float] = []
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        dev = next(self.model.parameters()).device
        n_q = len(q_ids)
        for start in range(0, len(seqs), self.batch_size):
            batch = seqs[start : start + self.batch_size]
            width = max(len(s) for s in batch)
            ids = torch.tensor([[pad] * (width - len(s)) + s for s in batch], device=dev)
            mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in batch], device=dev)
            # left padding: explicit positions so every sequence starts at position 0
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                # only the last n_q + 1 positions' logits: the vocabulary head over the document
                # would cost as much as the rest of the model for a small one
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=n_q + 1).logits
            # the query's tokens are the last n_q; each is predicted by the position before it
            logp = torch.log_softmax(logits[:, -n_q - 1 : -1, :].float(), dim=-1)
            target = ids[:, -n_q:]
            tok_lp = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            out.extend(float(x) for x in tok_lp.mean(-1).cpu())
        return out
