"""A ready client in one call (:func:`open_client`): the key resolved, the request cache opened,
the rate limiter built and the endpoint checked. Nothing here knows a run dir or a stage."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from negsynth.llm.cache import RequestCache
from negsynth.llm.client import LLMClient, resolve_api_key
from negsynth.llm.ratelimit import rate_limiter
from negsynth.schemas.config import LLMConfig


class CacheOpenError(Exception):
    """The request cache at ``path`` could not be opened; ``cause`` is the sqlite3 or OS error."""

    def __init__(self, path: Path, cause: Exception):
        super().__init__(f"{path}: {cause}")
        self.path, self.cause = path, cause


@asynccontextmanager
async def open_client(
    cfg: LLMConfig,
    *,
    base_url: str,
    cache_path: Path | None = None,
    commit_window: float = 0.0,
    rate_ledger: Any = None,
    check: bool = True,
    prepare: Callable[[], None] | None = None,
    transport: Callable[[LLMClient], Any] | None = None,
    **parts: Any,
) -> AsyncIterator[LLMClient]:
    """An :class:`LLMClient` for ``cfg`` at ``base_url``; what can fail fails before anything is
    written: the key (:class:`LLMFatalError`), the cache (:class:`CacheOpenError`), with ``check``
    the preflight. Then ``prepare()`` (the caller's first write) and ``transport(client)`` (the Batch
    API's), closed on the way out. ``rate_ledger``: one RPM / TPM shared by several processes;
    ``parts``: the client's ``gate``, ``ledger``, ``on_wait`` and ``stage``.

        async with open_client(cfg.llm, base_url="http://127.0.0.1:8000/v1", cache_path=Path("llm.sqlite")) as client:
            res = await client.structured(messages, validate=Example.model_validate)
    """
    key = resolve_api_key(cfg)
    cache = None
    if cache_path is not None:
        try:
            cache = RequestCache(cache_path, commit_window=commit_window)
        except (sqlite3.DatabaseError, OSError) as e:
            raise CacheOpenError(Path(cache_path), e) from e
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
