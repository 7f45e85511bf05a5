"""The embedded llama-server's guard against its whole-prompt cache hit (:class:`RepeatGuard`).

Its own module so that the chat client can consult it without importing the server's
machinery (httpx, subprocess): :mod:`negsynth.llm.server` registers a guard per llama-server it
starts, :mod:`negsynth.llm.client` asks :func:`repeat_guard` for the URL it talks to.
"""

from __future__ import annotations

import hashlib

from negsynth.data import jsonfast


class RepeatGuard:
    """The prompts one running llama-server has been sent.

    llama-server keeps each slot's last prompt. When a request's *whole* prompt is already in a
    slot it evaluates only the prompt's last token again, and that one-token path rounds
    differently from evaluating the prompt in a batch: the answer then differs from the one a
    fresh server gives (docs/llm_server.md, "Determinism"). Which slot holds which prompt depends
    on timing, so without this guard an exact repeat (brainstorm's list requests, two generate
    items with the same task and attributes) could draw a different answer run to run, and a
    killed run would not resume byte-identically. A prompt seen before is therefore sent with
    ``cache_prompt: false`` (evaluated whole, as the first time); a prompt that only shares a
    prefix keeps the prefix cache, which gives the fresh answer."""

    def __init__(self) -> None:
        self._seen: set[bytes] = set()

    def repeat(self, messages: list[dict]) -> bool:
        """Whether these messages were sent to this server before (and remember them)."""
        digest = hashlib.blake2b(jsonfast.dumps(messages), digest_size=16).digest()
        if digest in self._seen:
            return True
        self._seen.add(digest)
        return False


#: base URL -> the guard of each llama-server started by this process (see :class:`RepeatGuard`)
_GUARDS: dict[str, RepeatGuard] = {}


def repeat_guard(base_url: str) -> RepeatGuard | None:
    """The :class:`RepeatGuard` of the embedded llama-server at ``base_url``, or None (any other
    server: nothing is added to its requests)."""
    return _GUARDS.get(base_url)


def register(base_url: str) -> RepeatGuard:
    """A new guard for the llama-server just started at ``base_url`` (replacing any earlier one)."""
    _GUARDS[base_url] = guard = RepeatGuard()
    return guard


def unregister(base_url: str) -> None:
    """Forget the guard of the server at ``base_url`` (it stopped)."""
    _GUARDS.pop(base_url, None)
