"""Query likelihood through an OpenAI-compatible endpoint: ``log p(query | document)`` from the
prompt log-probs a ``/completions`` request echoes back.

The in-process scorer (:class:`negsynth.embed.likelihood.QueryLikelihood`) runs a transformers
causal LM here; a team whose LLM is behind an API (vLLM, llama-cpp-python's server) scores with
that model instead, with the same prompt (UPR's), the same score (the mean log-probability per
query token) and the same cache. One request per document: the prompt is the template around the
document followed by the query, ``echo`` returns the log-probability of every prompt token with
its character offset, and the tokens from the query's first character on are averaged. Servers
that echo no prompt log-probs (llama.cpp's ``llama-server``, OpenAI's chat models) are refused in
one line on the first request. A 429, 408/409, 5xx, timeout or dropped connection is retried with
the run's backoff (``Retry-After`` honoured, ``llm.max_retries`` times) before it is an error.

    lm = EndpointLikelihood("http://localhost:8000/v1", "Qwen/Qwen2.5-7B-Instruct", cache="runs/x/cache/likelihood.sqlite")
    lm.scores("what causes lift on a wing", ["Lift is produced by ...", "Boundary layers ..."])
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from negsynth.embed.likelihood import TEMPLATE, ScoreCache
from negsynth.errors import UserError
from negsynth.llm.errors import retry_after_seconds

#: statuses a server may answer differently a moment later
TRANSIENT = frozenset({408, 409, 429, 500, 502, 503, 504})


def _tries(attempt: int) -> str:
    return "1 try" if attempt == 0 else f"{attempt + 1} tries"


class EndpointLikelihood:
    """Mean ``log p(query | TEMPLATE(document))`` per query token, from ``base_url``'s echoed
    prompt log-probs. Documents are cut to ``max_doc_words`` words (no tokenizer here)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        max_doc_words: int = 192,
        template: str = TEMPLATE,
        cache: str | Path | None = None,
        timeout_s: float = 120.0,
        transport: Any = None,
        setting: str = "corpus.likelihood",
        max_retries: int = 6,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        import httpx

        self.url = base_url.rstrip("/") + "/completions"
        self.setting = setting  # the run-file key that chose this scorer, for the error lines
        self.model, self.template, self.max_doc_words = model, template, max_doc_words
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(headers=headers, timeout=timeout_s, transport=transport)
        self.cache = ScoreCache(cache) if cache else None
        self.max_retries, self.backoff_initial, self.backoff_max, self._sleep = max_retries, backoff_initial, backoff_max, sleep
        self.retries = 0  # transport retries so far (429s, 5xx, timeouts)
        # what a cached score depends on besides its texts: the endpoint's model, the prompt, the cut
        self._salt = json.dumps(["endpoint", model, template, max_doc_words])

    def _key(self, query: str, document: str) -> str:
        return hashlib.sha256(json.dumps([self._salt, query, document]).encode()).hexdigest()

    def prefix(self, document: str) -> str:
        return self.template.replace("{document}", " ".join(document.split()[: self.max_doc_words]))

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """One score per document, in order (cached scores are not asked again)."""
        if self.cache is None:
            return [self.score(query, d) for d in documents]
        keys = [self._key(query, d) for d in documents]
        return self.cache.through(keys, lambda todo: [self.score(query, documents[i]) for i in todo])

    def score(self, query: str, document: str) -> float:
        prefix = self.prefix(document)
        prompt = f"{prefix} {query.strip()}"
        body = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
        r = self._post(body)
        lp = ((r.json().get("choices") or [{}])[0]).get("logprobs") or {}
        offsets, values = lp.get("text_offset"), lp.get("token_logprobs")
        if not offsets or not values or len(offsets) != len(values) or offsets[-1] < len(prefix):
            raise UserError(
                f"{self.setting} = 'llm': {self.url} echoes no prompt log-probs (a server that does: vLLM, llama-cpp-python's); "
                f"set {self.setting} = 'embedded' to score with the embedded model in-process"
            )
        # the query's tokens: from the first one that starts at or after the prefix's end, through
        # the prompt's end (the generated token after it is not the query's)
        picked = [v for o, v in zip(offsets, values, strict=True) if len(prefix) <= o < len(prompt) and v is not None]
        return sum(picked) / len(picked) if picked else 0.0

    def _post(self, body: dict) -> Any:
        """POST with retries on what may pass (429, 408/409, 5xx, timeouts, dropped connections):
        ``Retry-After`` when the server names a wait (capped at ``backoff_max``), else full-jitter
        exponential backoff, as the chat client waits. Anything else, or the last failure, is one line."""
        import httpx

        for attempt in range(self.max_retries + 1):
            try:
                r = self._http.post(self.url, json=body)
            except httpx.TransportError as e:  # timeouts, refused or reset connections
                if attempt == self.max_retries:
                    raise UserError(
                        f"{self.setting} = 'llm': {self.url} unreachable after {_tries(attempt)} ({type(e).__name__}): {e}"
                    ) from None
                wait = None
            else:
                if r.status_code < 400:
                    return r
                if r.status_code not in TRANSIENT or attempt == self.max_retries:
                    tries = f" after {_tries(attempt)}" if attempt else ""
                    raise UserError(f"{self.setting} = 'llm': {self.url} answered HTTP {r.status_code}{tries}: {r.text[:200]}")
                wait = retry_after_seconds(r)
            self.retries += 1
            cap = min(self.backoff_max, self.backoff_initial * 2**attempt)
            self._sleep(min(wait, self.backoff_max) if wait is not None else random.uniform(0.0, cap))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()
