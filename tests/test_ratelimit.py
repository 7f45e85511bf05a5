"""RateLimiter on a fake clock: RPM/TPM buckets, usage correction, AIMD slow-down on 429 bursts."""

from __future__ import annotations

import asyncio

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid

from negsynth.llm.client import LLMClient
from negsynth.llm.ratelimit import RateLimiter, estimate_prompt_tokens
from negsynth.schemas.config import LLMConfig


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    async def sleep(self, dt: float) -> None:
        self.sleeps.append(dt)
        self.t += dt
        await asyncio.sleep(0)


def payload(chars: int = 400, max_tokens: int = 100) -> dict:
    return {"messages": [{"role": "user", "content": "x" * chars}], "max_tokens": max_tokens}


def run(coro):
    return asyncio.run(coro)


def test_rpm_spaces_requests_after_the_burst():
    clk = FakeClock()
    lim = RateLimiter(rpm=60, burst_s=5.0, clock=clk, sleep=clk.sleep)  # 1/s, burst of 5

    async def go():
        times = []
        for _ in range(15):
            await lim.acquire(payload())
            lim.release()
            times.append(clk.t)
        return times

    times = run(go())
    assert times[:5] == [1000.0] * 5  # the bucket starts full
    gaps = [b - a for a, b in zip(times[4:], times[5:])]
    assert all(g == pytest.approx(1.0, abs=1e-6) for g in gaps)  # then one per second
    # 15 requests at 60 rpm with a 5-request burst need >= 10 s of (fake) waiting
    assert clk.t - 1000.0 == pytest.approx(10.0, abs=1e-6)


def test_tpm_reserves_an_estimate_and_corrects_with_real_usage():
    clk = FakeClock()
    lim = RateLimiter(tpm=6000, burst_s=10.0, clock=clk, sleep=clk.sleep)  # 100 tok/s, bucket 1000
    p = payload(chars=400, max_tokens=100)
    est = lim.estimate(p)
    assert est == estimate_prompt_tokens(p) + 100  # no completion seen yet: max_tokens

    async def go():
        r = await lim.acquire(p)
        assert r == est
        # the real answer was much smaller: the difference is given back
        lim.record_tokens(actual=50, reserved=r, completion=10)
        return lim.buckets._t

    left = run(go())
    assert left == pytest.approx(1000 - 50)
    # the completion estimate now follows real completions instead of max_tokens
    assert lim.estimate(p) < est


def test_tpm_waits_for_refill_when_bucket_is_spent():
    clk = FakeClock()
    lim = RateLimiter(tpm=600, burst_s=10.0, clock=clk, sleep=clk.sleep)  # 10 tok/s, bucket 100

    async def go():
        await lim.acquire(payload(chars=40, max_tokens=60))
        lim.record_tokens(actual=100, reserved=lim.estimate(payload(chars=40, max_tokens=60)), completion=60)
        lim.release()
        t0 = clk.t
        await lim.acquire(payload(chars=40, max_tokens=60))
        return clk.t - t0

    waited = run(go())
    assert waited > 0  # the bucket was empty: the second request had to wait for refill
    assert lim.waited_s == pytest.approx(waited)


def test_429_burst_halves_window_once_and_everyone_cools_down():
    clk = FakeClock()
    lim = RateLimiter(max_concurrency=16, cooldown_s=2.0, clock=clk, sleep=clk.sleep)
    for _ in range(5):  # one burst of five 429s
        lim.on_rate_limited()
    assert lim.window == 8 and lim.window_cuts == 1 and lim.rate_limited == 5

    async def go():
        t0 = clk.t
        await lim.acquire(payload())
        return clk.t - t0

    assert run(go()) == pytest.approx(2.0)  # the shared cool-down
    lim.release(ok=True)
    assert lim.window == pytest.approx(8 + 1 / 8)  # additive increase
    clk.t += 3.0
    lim.on_rate_limited(retry_after=0.5)  # a later burst cuts again
    assert lim.window == pytest.approx((8 + 1 / 8) / 2) and lim.window_cuts == 2
    for _ in range(200):  # successes widen it back, never beyond max_concurrency
        lim.inflight += 1
        lim.release(ok=True)
    assert lim.window == 16


def test_window_bounds_requests_in_flight():
    clk = FakeClock()
    lim = RateLimiter(max_concurrency=8, clock=clk, sleep=clk.sleep)
    lim.on_rate_limited(retry_after=0.0)
    assert lim.window == 4
    peak = {"now": 0, "max": 0}

    async def one():
        await lim.acquire(payload())
        peak["now"] += 1
        peak["max"] = max(peak["max"], peak["now"])
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        peak["now"] -= 1
        lim.release(ok=False)  # no widening: the window stays at 4

    async def go():
        await asyncio.gather(*(one() for _ in range(20)))

    run(go())
    assert peak["max"] == 4


def test_client_feeds_the_limiter_429_retry_after_and_usage():
    """Through the real client and a real socket: a 429 with Retry-After reaches the limiter."""

    def responder(req, n):
        if n == 0:
            return Reply(status=429, headers={"Retry-After": "0.01"})
        return always_valid(req, n)

    cfg = LLMConfig(base_url="http://x", model="fake", backoff_initial=0.01, backoff_max=0.05, timeout=5, max_concurrency=4)

    async def go(url):
        lim = RateLimiter(tpm=10**6, max_concurrency=4, cooldown_s=0.01)
        async with LLMClient(cfg, base_url=url, api_key="k", limiter=lim) as c:
            out = await c.chat(
                c.payload([{"role": "user", "content": "Brainstorm tasks"}], response_format=None, temperature=None, sample_index=0)
            )
        return lim, c, out

    with FakeOpenAI(responder) as srv:
        lim, c, out = run(go(srv.base_url))
    assert out["text"] and len(srv.requests) == 2
    assert lim.rate_limited == 1 and lim.window_cuts == 1
    assert c.stats.transport_retries == {"rate_limited": 1}
    assert lim.inflight == 0 and lim._completions == 1  # released and corrected with real usage


class _Ref:
    """An answered call, awaitable like a Ray ObjectRef (and fine to ignore)."""

    def __init__(self, value) -> None:
        self.value = value

    def __await__(self):
        return self.value
        yield  # a generator: ``await`` returns ``value`` at once


class _Remote:
    """A RateLedger called the way a Ray actor handle is (``ledger.take.remote(...)`` awaited)."""

    def __init__(self, ledger) -> None:
        self.ledger = ledger
        self.calls: list[str] = []

    def __getattr__(self, name):
        fn = getattr(self.ledger, name)
        outer = self

        class _M:
            @staticmethod
            def remote(*a):
                outer.calls.append(name)
                return _Ref(fn(*a))

        return _M


def test_rate_ledger_paces_reservations_and_corrects_tokens():
    from negsynth.llm.ratelimit import RateLedger

    clk = FakeClock()
    led = RateLedger(rpm=60, tpm=None, burst_s=5.0, clock=clk)  # 1/s, burst of 5
    waits = [led.take() for _ in range(8)]
    assert waits == pytest.approx([0, 0, 0, 0, 0, 1.0, 2.0, 3.0])  # each reservation queues behind the last
    clk.t += 10.0
    assert led.take() == 0.0  # refilled
    tl = RateLedger(rpm=None, tpm=6000, burst_s=10.0, clock=clk)  # 100 tok/s, bucket 1000
    assert tl.take(800) == 0.0 and tl.take(400) == pytest.approx(2.0)  # 200 tokens short: 2 s
    tl.correct(-400)  # the second used 400 fewer than reserved
    assert tl.take(0) == 0.0
    tl.drain()
    assert tl.take(100) == pytest.approx(1.0)


def test_two_processes_share_one_rate_instead_of_a_static_split():
    """Two limiters on one ledger together keep to 60 rpm; a process alone gets the whole rate
    (a static split would give each 30 rpm)."""
    from negsynth.llm.ratelimit import RateLedger

    clk = FakeClock()
    handle = _Remote(RateLedger(rpm=60, tpm=None, burst_s=2.0, clock=clk))
    a = RateLimiter(rpm=60, ledger=handle, clock=clk, sleep=clk.sleep)
    b = RateLimiter(rpm=60, ledger=handle, clock=clk, sleep=clk.sleep)

    async def go(lims, n):
        sent = []
        for i in range(n):
            lim = lims[i % len(lims)]
            await lim.acquire(payload())
            lim.release()
            sent.append(clk.t)
        return sent

    both = run(go([a, b], 8))
    assert both[:2] == [1000.0, 1000.0]  # the burst of 2, shared
    assert [y - x for x, y in zip(both[1:], both[2:])] == pytest.approx([1.0] * 6)  # one per second in all
    clk.t += 100.0
    alone = run(go([a], 6))
    assert [y - x for x, y in zip(alone[1:], alone[2:])] == pytest.approx([1.0] * 4)  # the whole 60 rpm, not 30
    a.on_rate_limited(None)
    assert handle.calls.count("drain") == 1 and a.as_dict()["shared"] is True
