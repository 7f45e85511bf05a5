"""A ready client in one call: the key resolved, the request cache opened, the rate limiter built
and the endpoint checked, with every part the client works with (budget gate, shared ledger,
wait notices, the Batch API transport) passed in. Nothing here knows a run dir or a stage; the
pipeline says what those parts are (:func:`negsynth.pipeline.llm_session`: the manifest,
budgets, progress and the Batch API).

    async with open_client(cfg.llm, base_url="http://127.0.0.1:8000/v1", cache_path=Path("llm.sqlite")) as client:
        res = await client.structured(messages, Example)
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from negsynth.llm.cache import RequestCache
from negsynth.llm.client import LLMClient, resolve_api_key
from negsynth.llm.ratelimit import RateLimiter, SharedRateLimiter
from negsynth.llm.stats import ClientStats
from negsynth.schemas.config import LLMConfig


class CacheOpenError(Exception):
    """The request cache at ``path`` could not be opened; ``cause`` is the sqlite3 or OS error."""

    def __init__(self, path: Path, cause: Exception):
        super().__init__(f"{path}: {cause}")
        self.path, self.cause = path, cause


def rate_limiter(cfg: LLMConfig, ledger: Any = None) -> RateLimiter:
    """Always on: RPM / TPM when configured, and the adaptive slow-down on 429 bursts; with a
    ``ledger`` (``--executor ray``), one RPM / TPM shared by every worker."""
    kw = {"max_concurrency": cfg.total_concurrency, "max_tokens": cfg.max_tokens, "cooldown_s": max(cfg.backoff_initial, 0.01)}
    if ledger is not None:
        return SharedRateLimiter(ledger, rpm=cfg.rpm, tpm=cfg.tpm, **kw)
    return RateLimiter(rpm=cfg.rpm, tpm=cfg.tpm, **kw)


@asynccontextmanager
async def open_client(
    cfg: LLMConfig,
    *,
    base_url: str,
    cache_path: Path | None = None,
    commit_window: float = 0.0,
    rate_ledger: Any = None,
    gate: Callable[[ClientStats], str | None] | None = None,
    ledger: Any = None,
    on_wait: Callable[[str, bool], None] | None = None,
    check: bool = True,
    prepare: Callable[[], None] | None = None,
    transport: Callable[[LLMClient], Any] | None = None,
    stage: str | None = None,
) -> AsyncIterator[LLMClient]:
    """Yield an :class:`LLMClient` for ``cfg`` at ``base_url``, built whole, in this order, so that
    what can fail fails before anything is written: the API key
    (:class:`~negsynth.llm.client.LLMFatalError` when it is missing), then the request cache at
    ``cache_path`` (created when absent; :class:`CacheOpenError` when unreadable), then, with
    ``check``, one preflight request to the endpoint. Then ``prepare()`` (the caller's first
    write, once every check passed), then ``transport(client)`` when given (a transport built
    from the client, e.g. the Batch API's, which keeps its state on disk), closed on the way out
    as the cache is.

    What the client works with is passed here, none of it set afterwards: ``commit_window`` (see
    :attr:`RequestCache.commit_window`), ``rate_ledger`` (one RPM / TPM shared by several
    processes), ``gate`` (called with the client's counters before each request sent: a reason
    stops it), ``ledger`` (a budget shared by several processes), ``on_wait`` (told when a wait
    for the server begins and ends) and ``stage`` (who asks, recorded with each cached answer)."""
    key = resolve_api_key(cfg)
    cache = None
    if cache_path is not None:
        try:
            cache = RequestCache(cache_path, commit_window=commit_window)
        except (sqlite3.DatabaseError, OSError) as e:
            raise CacheOpenError(Path(cache_path), e) from e
    parts = {"gate": gate, "ledger": ledger, "on_wait": on_wait, "stage": stage}
    try:
        async with LLMClient(cfg, base_url=base_url, api_key=key, cache=cache, limiter=rate_limiter(cfg, rate_ledger), **parts) as client:
            if check:
                await client.preflight(timeout=min(10.0, cfg.connect_timeout))
            if prepare is not None:
                prepare()
            if transport is None:
                yield client
            else:
                # built from the checked client; it stays readable (``client.transport``, its counts) after the block
                client.transport = transport(client)
                try:
                    yield client
                finally:
                    await client.transport.aclose()
    finally:
        if cache is not None:
            cache.close()
