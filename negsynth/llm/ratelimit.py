"""Client-side rate limits (RPM, TPM) and adaptive slow-down on 429 bursts (docs/reliability.md).

RPM / TPM are token buckets (:class:`RateLedger`; under ``--executor ray`` one actor for every
worker) that a request reserves its estimated tokens from, corrected by its real usage. A 429
halves the window of requests in flight, empties the buckets and starts a cool-down; each success
widens the window by ``1 / window``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from negsynth.schemas.config import LLMConfig


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


class RateLedger:
    """RPM / TPM buckets, full at the start, holding ``burst_s`` seconds of refill."""

    def __init__(self, rpm: int | None, tpm: int | None, *, burst_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.rpm, self.tpm, self.clock = rpm, tpm, clock
        self._r_cap = max(1.0, (rpm or 0) / 60.0 * burst_s)
        self._t_cap = max(1.0, (tpm or 0) / 60.0 * burst_s)
        self._r, self._t = self._r_cap, self._t_cap
        self._last = clock()

    def _refill(self) -> None:
        now = self.clock()
        dt = now - self._last
        if dt > 0:
            if self.rpm:
                self._r = min(self._r_cap, self._r + dt * self.rpm / 60.0)
            if self.tpm:
                self._t = min(self._t_cap, self._t + dt * self.tpm / 60.0)
            self._last = now

    def take(self, tokens: int = 0) -> float:
        """Reserve one request of ``tokens`` (a bucket may go below zero); the seconds to wait before sending it."""
        self._refill()
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
            self._refill()
            self._t -= delta_tokens

    def drain(self) -> None:
        """A 429: the server says we are over, whatever the buckets hold."""
        self._refill()
        if self.rpm:
            self._r = min(self._r, 0.0)
        if self.tpm:
            self._t = min(self._t, 0.0)


class RateLimiter:
    """RPM / TPM and the AIMD window of one process; ``ledger``: the Ray actor handle of a shared
    :class:`RateLedger` (without one the buckets are this process's own)."""

    def __init__(
        self,
        rpm: int | None = None,
        tpm: int | None = None,
        *,
        ledger: Any = None,
        max_concurrency: int | None = None,
        max_tokens: int = 1024,
        burst_s: float = 10.0,
        cooldown_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ):
        self.rpm, self.tpm = rpm, tpm
        self.ledger = ledger
        self.buckets = RateLedger(rpm, tpm, burst_s=burst_s, clock=clock) if ledger is None else None
        self.clock, self.sleep = clock, sleep
        self.max_tokens = max_tokens
        self._completion_mean: float | None = None
        self._completions = 0
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

    def estimate(self, payload: dict[str, Any]) -> int:
        mt = payload.get("max_tokens") or self.max_tokens
        completion = mt if self._completion_mean is None else min(mt, self._completion_mean * 1.2)
        return int(estimate_prompt_tokens(payload) + completion)

    def _call(self, method: str, *args: Any) -> Any:  # an awaitable for the shared ledger
        return getattr(self.buckets, method)(*args) if self.ledger is None else getattr(self.ledger, method).remote(*args)

    async def acquire(self, payload: dict[str, Any]) -> int:
        """Wait until the request may be sent; returns the tokens reserved for it."""
        tokens = self.estimate(payload) if self.tpm else 0
        while True:
            t0 = self.clock()
            if self.inflight >= self.window:
                self._changed.clear()
                await self._changed.wait()
                self.waited_s += self.clock() - t0
                continue
            w = self._cool_until - t0
            if w <= 0:
                break
            self.waited_s += w
            await self.sleep(w)
        self.inflight += 1
        if self.rpm or self.tpm:
            wait = self._call("take", tokens)
            wait = wait if self.ledger is None else await wait
            if wait > 0:
                self.waited_s += wait
                await self.sleep(wait)
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
            self._call("correct", actual - reserved)

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
        self._call("drain")

    def as_dict(self) -> dict[str, Any]:
        window = None if self.window == float("inf") else round(self.window, 2)
        d = {"rpm": self.rpm, "tpm": self.tpm, "waited_s": round(self.waited_s, 3), "rate_limited": self.rate_limited}
        return {**d, "window_cuts": self.window_cuts, "window": window, **({"shared": True} if self.ledger is not None else {})}


def rate_limiter(cfg: LLMConfig, ledger: Any = None) -> RateLimiter:
    """The client's limiter for ``cfg``; ``ledger``: one RPM / TPM shared by every worker."""
    kw = {"max_concurrency": cfg.total_concurrency, "max_tokens": cfg.max_tokens, "cooldown_s": max(cfg.backoff_initial, 0.01)}
    return RateLimiter(rpm=cfg.rpm, tpm=cfg.tpm, ledger=ledger, **kw)
