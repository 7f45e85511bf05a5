"""How a client in this process keeps the embedded llama-server's answers a fresh server's
(an answer on a cached prompt prefix rounds differently: docs/llm_server.md, "Determinism").

Each server this process starts registers a guard by its URL; the client sends each request inside
``guard(url).hold(messages)``: a :class:`RepeatGuard` sends an exact repeat with ``cache_prompt:
false``; a :class:`PrefixPin` restores the request's saved prefix into the slot before it, so the
answer is a function of the request alone, on any server of a fleet, in any order.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

from negsynth.data import jsonfast
from negsynth.llm.errors import NotSent

#: stands in for the first message after the prefix while the chat template renders it
_SENTINEL = "\u2063negsynth-prefix-end\u2063"


class PinFailed(NotSent):
    """Setting the slot to the prefix failed: the request was not sent (retried as a connection fault)."""


def prefix_length(messages: list[dict]) -> int:
    """How many leading messages form the pinned prefix: up to the first assistant message before
    the last (the worked example; a re-ask's history stays outside), else all but the last."""
    for i, m in enumerate(messages[:-1]):
        if m.get("role") == "assistant":
            return i + 1
    return max(0, len(messages) - 1)


def _digest(obj) -> bytes:
    return hashlib.blake2b(jsonfast.dumps(obj), digest_size=16).digest()


class RepeatGuard:
    """The prompts one running llama-server (prompt cache off) has been sent."""

    def __init__(self) -> None:
        self._seen: set[bytes] = set()

    @contextlib.asynccontextmanager
    async def hold(self, messages: list[dict]) -> AsyncIterator[bool | None]:
        """Yields False for a prompt sent before (send it with ``cache_prompt: false``), else None."""
        d = _digest(messages)
        repeat = d in self._seen
        self._seen.add(d)
        yield False if repeat else None


class PrefixPin:
    """One pinned llama-server: its root URL (without ``/v1``) and the folder it saves slots in."""

    def __init__(self, base_url: str, slot_dir: str | Path) -> None:
        self.root = base_url.rstrip("/").removesuffix("/v1")
        self.slot_dir = Path(slot_dir)
        self._saved: dict[str, str] = {}  # digest of the prefix messages -> file name in slot_dir
        # one lock per event loop (an asyncio lock belongs to the loop it first waited in)
        self._locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @contextlib.asynccontextmanager
    async def hold(self, messages: list[dict]) -> AsyncIterator[bool]:
        """Within the block the slot holds exactly ``messages``' prefix and nothing else is sent to
        this server; yields the ``cache_prompt`` the request must carry (False: no prefix)."""
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop) or self._locks.setdefault(loop, asyncio.Lock())
        k = prefix_length(messages)
        async with lock:
            if k == 0:
                yield False
                return
            import httpx

            async with httpx.AsyncClient(timeout=None) as http:
                await self._restore(http, messages[:k], messages[k].get("role", "user"))
            yield True

    async def _restore(self, http, prefix: list[dict], next_role: str) -> None:
        digest = _digest([prefix, next_role]).hex()
        name = self._saved.get(digest)
        if name is not None and await self._call(http, "restore", name, missing_ok=True):
            return
        name = f"prefix-{digest}.bin"
        # the prefix as the chat template writes it, up to where the next message's text begins
        out = await self._post(http, "/apply-template", {"messages": [*prefix, {"role": next_role, "content": _SENTINEL}]})
        prompt = out.get("prompt") if isinstance(out, dict) else None
        if not isinstance(prompt, str) or _SENTINEL not in prompt:
            raise PinFailed(f'{self.root}/apply-template did not render the prompt prefix; set serve.prompt_cache = "off"')
        # evaluated alone, on an empty slot: the saved state is a function of the prefix only
        await self._call(http, "erase")
        await self._post(http, "/completion", {"prompt": prompt.split(_SENTINEL, 1)[0], "n_predict": 0, "cache_prompt": True})
        await self._call(http, "save", name)
        self._saved[digest] = name
        await self._call(http, "restore", name)

    async def _call(self, http, action: str, filename: str | None = None, *, missing_ok: bool = False) -> bool:
        body = {"filename": filename} if filename else {}
        return await self._post(http, f"/slots/0?action={action}", body, missing_ok=missing_ok) is not None

    async def _post(self, http, path: str, body: dict, *, missing_ok: bool = False):
        import httpx

        try:
            r = await http.post(self.root + path, content=jsonfast.dumps(body), headers={"Content-Type": "application/json"})
        except httpx.HTTPError as e:
            raise PinFailed(f"{self.root}{path.split('?')[0]}: {type(e).__name__}") from None
        if r.status_code != 200:
            if missing_ok:
                return None  # a restore whose file went: saved again by the caller
            raise PinFailed(f"{self.root}{path} answered {r.status_code} while pinning a prompt prefix: {r.text[:200]}")
        return r.json()


#: base URL -> the guard of each llama-server started by this process
_GUARDS: dict[str, RepeatGuard | PrefixPin] = {}


def guard(base_url: str) -> RepeatGuard | PrefixPin | None:
    """The guard of the embedded llama-server at ``base_url``, or None (any other server)."""
    return _GUARDS.get(base_url)


def register(base_url: str, slot_dir: str | Path | None = None) -> None:
    """A fresh guard for the server just (re)started at ``base_url``: a :class:`PrefixPin` saving into ``slot_dir``, else a :class:`RepeatGuard`."""
    _GUARDS[base_url] = RepeatGuard() if slot_dir is None else PrefixPin(base_url, slot_dir)


def unregister(base_url: str) -> None:
    _GUARDS.pop(base_url, None)
