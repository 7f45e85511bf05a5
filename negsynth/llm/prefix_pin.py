"""How a client in this process keeps the embedded llama-server's answers a fresh server's.

llama-server's prompt cache evaluates only the part of a prompt its slot does not hold yet, and
that rounds differently from evaluating the whole prompt: with the plain cache an answer depends
on what the slot served last (docs/llm_server.md, "Determinism"). Each server this process starts
registers one guard by its URL (:func:`register`); the client asks :func:`guard` for the URL it
talks to and sends each request inside ``guard.hold(messages)``:

* :class:`RepeatGuard` (prompt cache off): an exact repeat of a prompt sent before goes with
  ``cache_prompt: false``, evaluated whole as the first time;
* :class:`PrefixPin` (``serve.prompt_cache = "pinned"``): before each request the slot is set to
  the request's prefix (:func:`prefix_length`; saved once per prefix on an empty slot, restored
  before every request) and the request goes with ``cache_prompt: true``. The answer is then a
  function of the request alone, in any order and on any server of a fleet, and the shared prefix
  is evaluated once per server. Restore and request must reach the slot with nothing in between,
  so only clients in the process that started the server may pin (a lock per event loop).
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
    """Setting the slot to the prefix failed: the request itself was not sent (a transport fault
    of kind ``connection``: retried, and in a fleet the server is taken out and probed back)."""


def prefix_length(messages: list[dict]) -> int:
    """How many leading messages form the request's pinned prefix: up to and including the
    first assistant message when one comes before the last message (the stage's worked example:
    a re-ask's earlier answer and correction then stay outside the shared prefix), else every
    message but the last (a system prompt before the item); 0 for a single message."""
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
        """Within the block the slot holds exactly ``messages``' prefix and nothing else is sent
        to this server by this process; yields the ``cache_prompt`` the request must carry (False:
        no prefix, the prompt is evaluated whole)."""
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
    """The guard of the embedded llama-server at ``base_url``, or None (any other server: nothing
    is added to its requests)."""
    return _GUARDS.get(base_url)


def register(base_url: str, slot_dir: str | Path | None = None) -> RepeatGuard | PrefixPin:
    """A new guard for the server just started (or restarted) at ``base_url``: a :class:`PrefixPin`
    saving into ``slot_dir``, or a :class:`RepeatGuard` without one."""
    _GUARDS[base_url] = g = RepeatGuard() if slot_dir is None else PrefixPin(base_url, slot_dir)
    return g


def unregister(base_url: str) -> None:
    _GUARDS.pop(base_url, None)
