"""A pinned prompt prefix on the embedded llama-server (``serve.prompt_cache = "pinned"``).

llama-server's prompt cache evaluates only the part of a prompt that its slot does not already
hold, and an answer computed that way is not bit for bit the answer computed on the whole prompt:
where the evaluation starts changes the rounding. With the plain cache the starting point is
the longest prefix shared with *whatever the slot served last*, so the answer depends on the
order of requests and on which server of a fleet got them (docs/llm_server.md).

A pin makes the starting point a function of the request alone. A request's **prefix** is its
leading messages (:func:`prefix_length`: the system prompt and the worked example every request of
a stage shares). Before each request the server's one slot is set to exactly that prefix: the
first time a prefix is seen it is evaluated alone on an empty slot and saved to a file
(``/slots/0?action=save``, llama-server's ``--slot-save-path``); every request restores its
prefix's file (``action=restore``, ~7 MB for SmolLM2's ~300-token system prompt, a few ms) and
is sent with ``cache_prompt: true``, so the server evaluates the rest from the prefix's end. The
same request then gets the same answer on any server of the fleet, in any order, on any machine
with the same build, while the shared prefix is evaluated once per server instead of once per
request.

The restore and the request must reach the slot with nothing in between, so a pin serves
clients in the process that started the server (the stage's own client: :class:`PrefixPin` holds
a lock per event loop around the pair); servers that other processes talk to (``negsynth
serve``, Ray workers) run with the prompt cache off instead.

Its own module so that the chat client can consult it without importing the server's machinery:
:mod:`negsynth.llm.server` registers a pin per pinned server it starts, :mod:`negsynth.llm.client`
asks :func:`prefix_pin` for the URL it talks to.
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


class PrefixPin:
    """One pinned llama-server: its root URL (without ``/v1``) and the folder it saves slots in.

    :meth:`hold` sets the slot to a request's prefix and keeps the server to that request until
    the block ends; the prefixes saved so far are remembered (a restarted server registers a new
    pin and saves them again)."""

    def __init__(self, base_url: str, slot_dir: str | Path) -> None:
        self.root = base_url.rstrip("/").removesuffix("/v1")
        self.slot_dir = Path(slot_dir)
        self._saved: dict[str, str] = {}  # digest of the prefix messages -> file name in slot_dir
        # one lock per event loop (an asyncio lock belongs to the loop it first waited in)
        self._locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            self._locks[loop] = lock = asyncio.Lock()
        return lock

    @contextlib.asynccontextmanager
    async def hold(self, messages: list[dict]) -> AsyncIterator[bool]:
        """Within the block the slot holds exactly ``messages``' prefix and nothing else is sent
        to this server by this process; yields the ``cache_prompt`` the request must carry (False:
        no prefix, the prompt is evaluated whole)."""
        k = prefix_length(messages)
        async with self._lock():
            if k == 0:
                yield False
                return
            import httpx

            async with httpx.AsyncClient(timeout=None) as http:
                await self._restore(http, messages[:k], messages[k].get("role", "user"))
            yield True

    async def _restore(self, http, prefix: list[dict], next_role: str) -> None:
        digest = hashlib.blake2b(jsonfast.dumps([prefix, next_role]), digest_size=16).hexdigest()
        name = self._saved.get(digest)
        if name is not None and await self._call(http, "restore", name, missing_ok=True):
            return
        name = f"prefix-{digest}.bin"
        text = await self._render(http, prefix, next_role)
        # evaluated alone, on an empty slot: the saved state is a function of the prefix only
        await self._call(http, "erase")
        await self._post(http, "/completion", {"prompt": text, "n_predict": 0, "cache_prompt": True})
        await self._call(http, "save", name)
        self._saved[digest] = name
        await self._call(http, "restore", name)

    async def _render(self, http, prefix: list[dict], next_role: str) -> str:
        """The prefix as the server's chat template writes it, up to where the next message's
        text begins (its role header included, so the rest of the prompt starts with the text)."""
        out = await self._post(http, "/apply-template", {"messages": [*prefix, {"role": next_role, "content": _SENTINEL}]})
        prompt = out.get("prompt") if isinstance(out, dict) else None
        if not isinstance(prompt, str) or _SENTINEL not in prompt:
            raise PinFailed(f'{self.root}/apply-template did not render the prompt prefix; set serve.prompt_cache = "off"')
        return prompt.split(_SENTINEL, 1)[0]

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


#: base URL -> the pin of each pinned llama-server started by this process
_PINS: dict[str, PrefixPin] = {}


def prefix_pin(base_url: str) -> PrefixPin | None:
    """The :class:`PrefixPin` of the pinned embedded llama-server at ``base_url``, or None."""
    return _PINS.get(base_url)


def register(base_url: str, slot_dir: str | Path) -> PrefixPin:
    """A new pin for the server just started at ``base_url`` (replacing any earlier one)."""
    _PINS[base_url] = pin = PrefixPin(base_url, slot_dir)
    return pin


def unregister(base_url: str) -> None:
    _PINS.pop(base_url, None)
