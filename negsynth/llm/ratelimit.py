"""Client-side rate limits (RPM, TPM) and adaptive slow-down on 429 bursts.

:class:`RateLimiter` is the ``limiter`` hook of :class:`~negsynth.llm.client.LLMClient`:

* **RPM / TPM** are token buckets refilled continuously (``rpm / 60`` requests and ``tpm / 60``
  tokens per second, holding at most ``burst_s`` seconds of refill). Before a request is sent,
  :meth:`acquire` reserves an *estimate* of its tokens (prompt characters / 4 plus the expected
  completion: the running mean of real completions, ``max_tokens`` until one is seen); when the
  answer arrives :meth:`record_tokens` corrects the bucket with the real usage.
* **Adaptive slow-down (AIMD)**: a 429 halves the window of requests allowed in flight (at most
  once per cool-down, so one burst of 429s counts once) and starts a shared cool-down that every
  sender waits out (``Retry-After`` when the server gave one). Each success widens the window
  again by ``1 / window`` (about +1 per round trip), up to ``max_concurrency``.

Everything takes ``clock`` / ``sleep`` so tests can run it on a fake clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


def estimate_prompt_tokens(payload: dict[str, Any]) -> int:
    """A cheap, slightly generous prompt-token estimate: ~4 characters per token plus framing."""
    n = 0
    for m in payload.get("messages", ()):
        c = m.get("content")
        if isinstance(c, str):
            n += len(c)
        n += 16  # role and framing
    rf = payload.get("response_format")
    if rf:
        n += len(str(rf))
    return n // 4 + 8


class _Buckets:
    """RPM / TPM token buckets, refilled continuously (``rpm / 60`` requests and ``tpm / 60`` tokens
    per second, holding at most ``burst_s`` seconds of refill), full at the start."""

    def __init__(self, rpm: int | None, tpm: int | None, burst_s: float, clock: Callable[[], float]):
        self.rpm, self.tpm, self.clock = rpm, tpm, clock
        self._r_cap = max(1.0, (rpm or 0) / 60.0 * burst_s)
        self._t_cap = max(1.0, (tpm or 0) / 60.0 * burst_s)
        self._r, self._t = self._r_cap, self._t_cap
        self._last = clock()

    def _refill(self, now: float) -> None:
        dt = now - self._last
        if dt > 0:
            if self.rpm:
                self._r = min(self._r_cap, self._r + dt * self.rpm / 60.0)
            if self.tpm:
                self._t = min(self._t_cap, self._t + dt * self.tpm / 60.0)
            self._last = now

    def _empty(self) -> None:
        """The server answered 429: whatever the buckets hold, it says we are over."""
        if self.rpm:
            self._r = min(self._r, 0.0)
        if self.tpm:
            self._t = min(self._t, 0.0)


class RateLimiter(_Buckets):
    def __init__(
        self,
        rpm: int | None = None,
        tpm: int | None = None,
        *,
        max_concurrency: int | None = None,
        max_tokens: int = 1024,
        burst_s: float = 10.0,
        cooldown_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ):
        super().__init__(rpm, tpm, burst_s, clock)
        self.sleep = sleep
        self.max_tokens = max_tokens
        self._completion_mean: float | None = None
        self._completions = 0
        # AIMD window on requests in flight
        self.max_window = float(max_concurrency) if max_concurrency else float("inf")
        self.window = self.max_window
        self.inflight = 0
        self.cooldown_s = cooldown_s
        self._cool_until = float("-inf")
        self._last_cut = float("-inf")
        self._changed = asyncio.Event()
        # counters for stats.json
        self.waited_s = 0.0
        self.rate_limited = 0
        self.window_cuts = 0

    # -- the estimate ------------------------------------------------------------------------
    def estimate(self, payload: dict[str, Any]) -> int:
        mt = payload.get("max_tokens") or self.max_tokens
        completion = mt if self._completion_mean is None else min(mt, self._completion_mean * 1.2)
        return int(estimate_prompt_tokens(payload) + completion)

    def _wait_needed(self, now: float, tokens: int) -> float:
        """Seconds to wait before a request of ``tokens`` may go (0 = now)."""
        w = max(0.0, self._cool_until - now)
        if self.rpm and self._r < 1.0:
            w = max(w, (1.0 - self._r) * 60.0 / self.rpm)
        if self.tpm:
            need = min(float(tokens), self._t_cap)  # a request bigger than the bucket goes when it is full
            if self._t < need:
                w = max(w, (need - self._t) * 60.0 / self.tpm)
        return w

    async def acquire(self, payload: dict[str, Any]) -> int:
        """Wait until the request may be sent; returns the tokens reserved for it."""
        tokens = self.estimate(payload) if self.tpm else 0
        while True:
            if self.inflight >= self.window:
                self._changed.clear()
                t0 = self.clock()
                await self._changed.wait()
                self.waited_s += self.clock() - t0
                continue
            now = self.clock()
            self._refill(now)
            w = self._wait_needed(now, tokens)
            if w <= 0:
                break
            self.waited_s += w
            await self.sleep(w)
        if self.rpm:
            self._r -= 1.0
        if self.tpm:
            self._t -= tokens
        self.inflight += 1
        return tokens

    def release(self, *, ok: bool = True) -> None:
        """The request ended (answered, failed or cancelled)."""
        self.inflight = max(0, self.inflight - 1)
        if ok and self.window < self.max_window:
            self.window = min(self.max_window, self.window + 1.0 / max(1.0, self.window))
        self._changed.set()

    def record_tokens(self, actual: int, reserved: int = 0, completion: int | None = None) -> None:
        """Correct the TPM bucket with the real usage of a request that reserved ``reserved``."""
        if completion is not None:
            self._completions += 1
            m = self._completion_mean
            self._completion_mean = float(completion) if m is None else m + (completion - m) / min(self._completions, 50)
        if self.tpm:
            self._t -= actual - reserved

    def on_rate_limited(self, retry_after: float | None = None) -> None:
        """A 429: shared cool-down for every sender, and halve the in-flight window once per burst."""
        self.rate_limited += 1
        now = self.clock()
        pause = retry_after if retry_after is not None else self.cooldown_s
        self._cool_until = max(self._cool_until, now + pause)
        if now - self._last_cut >= max(self.cooldown_s, pause):
            self._last_cut = now
            base = self.window if self.window != float("inf") else max(1.0, float(self.inflight))
            self.window = max(1.0, base / 2.0)
            self.window_cuts += 1
        self._empty()

    def as_dict(self) -> dict[str, Any]:
        return {
            "rpm": self.rpm,
            "tpm": self.tpm,
            "waited_s": round(self.waited_s, 3),
            "rate_limited": self.rate_limited,
            "window_cuts": self.window_cuts,
            "window": None if self.window == float("inf") else round(self.window, 2),
        }


class RateLedger(_Buckets):
    """RPM / TPM buckets shared by several processes (the shard workers of ``--executor ray`` hold
    one as a Ray actor): :meth:`take` reserves a request's tokens at once and says how long the
    caller must wait before sending, so the reservations of every process together keep to the
    rates, with no static split between them (a worker alone on the queue gets the whole rate).

    A reservation may take a bucket below zero; the wait is the time until the refill covers it."""

    def __init__(self, rpm: int | None, tpm: int | None, *, burst_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        super().__init__(rpm, tpm, burst_s, clock)
        self.taken = 0

    def take(self, tokens: int = 0) -> float:
        """Reserve one request of ``tokens`` (estimated); the seconds to wait before sending it."""
        self._refill(self.clock())
        self.taken += 1
        wait = 0.0
        if self.rpm:
            self._r -= 1.0
            wait = max(wait, -self._r * 60.0 / self.rpm)
        if self.tpm:
            self._t -= min(float(tokens), self._t_cap)  # a request bigger than the bucket goes when it is full
            wait = max(wait, -self._t * 60.0 / self.tpm)
        return max(0.0, wait)

    def correct(self, delta_tokens: int) -> None:
        """The real usage of an answered request minus what it reserved."""
        if self.tpm:
            self._refill(self.clock())
            self._t -= delta_tokens

    def drain(self) -> None:
        """A process got a 429: the server says every process is over, so the buckets are empty."""
        self._refill(self.clock())
        self._empty()


class SharedRateLimiter(RateLimiter):
    """A :class:`RateLimiter` whose RPM / TPM buckets live in a :class:`RateLedger` shared with
    other processes (``ledger``: a Ray actor handle; its methods are called as ``.remote()``).
    The in-flight window and the 429 cool-down stay this process's own, as each process has its
    own connections; a 429 also empties the shared buckets."""

    def __init__(self, ledger: Any, rpm: int | None = None, tpm: int | None = None, **kw: Any):
        super().__init__(None, None, **kw)
        self.ledger = ledger
        self.shared_rpm, self.shared_tpm = rpm, tpm

    def estimate(self, payload: dict[str, Any]) -> int:
        return super().estimate(payload) if self.shared_tpm else 0

    async def acquire(self, payload: dict[str, Any]) -> int:
        await super().acquire(payload)  # the window and the cool-down of this process
        tokens = self.estimate(payload)
        if self.shared_rpm or self.shared_tpm:
            wait = await self.ledger.take.remote(tokens)
            if wait > 0:
                self.waited_s += wait
                await self.sleep(wait)
        return tokens

    def record_tokens(self, actual: int, reserved: int = 0, completion: int | None = None) -> None:
        super().record_tokens(actual, reserved, completion)
        if self.shared_tpm:
            self.ledger.correct.remote(actual - reserved)

    def on_rate_limited(self, retry_after: float | None = None) -> None:
        super().on_rate_limited(retry_after)
        self.ledger.drain.remote()

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "rpm": self.shared_rpm, "tpm": self.shared_tpm, "shared": True}
