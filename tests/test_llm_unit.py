"""Cache key, JSON extraction and the client's two retry layers (against the fake server)."""

import asyncio
import hashlib
import json

import pytest
from fake_openai import FakeOpenAI, Reply

from negsynth.llm.cache import RequestCache, request_key_and_body
from negsynth.llm.client import LLMClient
from negsynth.llm.errors import ValidationFailure
from negsynth.llm.parsing import ParseError, extract_json
from negsynth.schemas.config import LLMConfig


def test_request_key_covers_every_input():
    def key(v: dict) -> str:
        return request_key_and_body(v["p"], v["n"])[0]

    base = {"p": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "max_tokens": 5}, "n": 0}
    k = key(base)
    # the key of every cached answer: a SHA-256 of the sorted, compact JSON of {"n", "p"}
    assert k == hashlib.sha256(json.dumps(base, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()
    assert k == key({"n": 0, "p": dict(reversed(list(base["p"].items())))})  # order independent
    variants = [
        {**base, "n": 1},
        {**base, "p": {**base["p"], "model": "m2"}},
        {**base, "p": {**base["p"], "temperature": 0.8}},
        {**base, "p": {**base["p"], "max_tokens": 6}},
        {**base, "p": {**base["p"], "messages": [{"role": "user", "content": "hi!"}]}},
        {**base, "p": {**base["p"], "response_format": {"type": "json_object"}}},
    ]
    assert len({key(v) for v in variants} | {k}) == len(variants) + 1


def test_cache_persists(tmp_path):
    c = RequestCache(tmp_path / "c.sqlite")
    c.put("k", {"text": "x", "usage": [1, 2]})
    c.close()
    c2 = RequestCache(tmp_path / "c.sqlite")
    assert c2.get("k") == {"text": "x", "usage": [1, 2]} and c2.get("other") is None and len(c2) == 1


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('Sure! Here it is: {"a": [1, 2]} hope it helps', {"a": [1, 2]}),
        ('{"a": "line\x01break"}', {"a": "line\x01break"}),
    ],
)
def test_extract_json(text, expected):
    assert extract_json(text) == expected


@pytest.mark.parametrize(
    "text, reason", [("", "empty_output"), (None, "empty_output"), ('{"a": ', "invalid_json"), ("no json here", "invalid_json")]
)
def test_extract_json_errors(text, reason):
    with pytest.raises(ParseError) as e:
        extract_json(text)
    assert e.value.reason == reason


def _cfg(url, **kw):
    return LLMConfig(base_url=url, model="fake", backoff_initial=0.01, backoff_max=0.05, timeout=2, **{"outage_wait": 0, **kw})


def test_transport_retry_then_success_is_not_shown_to_model(tmp_path):
    def responder(req, n):
        if n < 2:
            return Reply(status=429, headers={"Retry-After": "0"})
        return Reply(content='{"ok": true}')

    async def go(url):
        async with LLMClient(_cfg(url), base_url=url, cache=RequestCache(tmp_path / "c.sqlite")) as llm:
            res = await llm.structured([{"role": "user", "content": "x"}], validate=lambda o: o)
            return res, llm.stats

    with FakeOpenAI(responder) as srv:
        res, stats = asyncio.run(go(srv.base_url))
        assert res.value == {"ok": True} and stats.transport_retries["rate_limited"] == 2
        assert all(len(r["messages"]) == 1 for r in srv.requests)  # the 429s never reached the prompt


def test_reask_shows_error_and_sums_usage(tmp_path):
    def responder(req, n):
        return Reply(content=f'{{"v": {n}}}', prompt_tokens=3, completion_tokens=4)

    def validate(o):
        if o["v"] < 2:
            raise ValidationFailure("too_small", f"v={o['v']} is too small")
        return o["v"]

    async def go(url):
        async with LLMClient(_cfg(url, max_attempts=3), base_url=url, cache=None) as llm:
            return await llm.structured([{"role": "user", "content": "x"}], validate=validate)

    with FakeOpenAI(responder) as srv:
        res = asyncio.run(go(srv.base_url))
        assert res.value == 2 and res.reasons == ["too_small", "too_small"]
        assert res.usage.prompt_tokens == 9 and res.usage.completion_tokens == 12 and res.usage.attempts == 3
        last = srv.requests[-1]["messages"]
        assert last[-1]["content"].startswith("Your answer was rejected: v=1 is too small")
        assert last[-2] == {"role": "assistant", "content": '{"v": 1}'}


def test_fatal_auth_error(tmp_path):
    from negsynth.llm.errors import LLMFatalError

    async def go(url):
        async with LLMClient(_cfg(url), base_url=url, api_key="wrong") as llm:
            return await llm.structured([{"role": "user", "content": "x"}], validate=lambda o: o)

    with FakeOpenAI(lambda r, n: Reply(content="{}"), require_key="right") as srv:
        with pytest.raises(LLMFatalError, match="refused the API key"):
            asyncio.run(go(srv.base_url))


def test_the_environment_proxy_is_used(tmp_path, monkeypatch):
    """HTTP_PROXY / NO_PROXY are honoured: the fake server plays the proxy for a host that does not resolve."""
    target = "http://upstream.invalid:9/v1"

    async def go():
        async with LLMClient(_cfg(target, max_retries=0, max_attempts=1), base_url=target, cache=None) as llm:
            return await llm.structured([{"role": "user", "content": "x"}], validate=lambda o: o)

    with FakeOpenAI(lambda r, n: Reply(content='{"ok": true}')) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.base_url.rsplit("/v1", 1)[0])
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert asyncio.run(go()).value == {"ok": True} and len(proxy.requests) == 1
        monkeypatch.setenv("NO_PROXY", "upstream.invalid")
        res = asyncio.run(go())  # straight to a host that does not resolve: a transport failure
        assert res.value is None and res.reason == "transport_connection" and len(proxy.requests) == 1


def test_a_stage_command_imports_the_openai_sdk_only_when_it_sends(tmp_path):
    """Importing openai costs ~1 s of CPU per process: a command's imports (and a stage that never
    opens a client) must not pay it."""
    import subprocess
    import sys
    from pathlib import Path

    script = "import sys, negsynth.cli, negsynth.stages.generate, negsynth.stages.score, negsynth.llm; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]


def test_cache_answers_put_in_one_loop_iteration_share_a_commit_and_survive(tmp_path):
    """Inside an event loop puts are committed together before the loop waits again: visible to
    ``get`` at once, on disk for another connection after one loop turn, and on close."""
    import sqlite3

    from negsynth.llm.cache import RequestCache

    path = tmp_path / "c.sqlite"
    cache = RequestCache(path)

    def on_disk() -> int:
        with sqlite3.connect(path) as other:
            return other.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    async def go():
        for i in range(5):
            cache.put(f"k{i}", {"text": str(i)})
        assert cache.get("k3") == {"text": "3"} and on_disk() == 0  # pending, still readable
        await asyncio.sleep(0)
        assert on_disk() == 5
        cache.put("k5", {"text": "5"})

    asyncio.run(go())
    cache.close()
    assert on_disk() == 6
    again = RequestCache(path)
    assert again.get("k5") == {"text": "5"} and len(again) == 6
    again.put("k6", {"text": "6"})  # no loop: committed at once
    assert on_disk() == 7
    again.close()


def test_the_cache_sees_what_another_process_commits(tmp_path):
    """Workers share one cache file: an answer another connection committed is found at once."""
    import sqlite3

    path = tmp_path / "c.sqlite"
    c = RequestCache(path)
    assert c.get("k") is None
    with sqlite3.connect(path) as other:
        other.execute("INSERT INTO responses (key, value) VALUES (?, ?)", ("k", '{"w": 2}'))
    assert c.get("k") == {"w": 2}
    c.close()


def test_an_answer_is_on_disk_before_its_re_ask_is_sent(tmp_path):
    """The re-ask depends on the first answer: a kill right after the re-ask left must not lose it."""
    import sqlite3

    from negsynth.llm.cache import RequestCache

    path = tmp_path / "c.sqlite"
    seen_on_disk = []

    def responder(req, n):
        with sqlite3.connect(path) as other:
            seen_on_disk.append(other.execute("SELECT COUNT(*) FROM responses").fetchone()[0])
        return Reply(content="not json" if len(seen_on_disk) == 1 else '{"ok": true}')

    async def go(url):
        cache = RequestCache(path)
        try:
            async with LLMClient(_cfg(url).model_copy(update={"seed": 0}), base_url=url, cache=cache) as llm:
                return await llm.structured([{"role": "user", "content": "x"}], validate=lambda o: o)
        finally:
            cache.close()

    with FakeOpenAI(responder) as srv:
        assert asyncio.run(go(srv.base_url)).value == {"ok": True}
    assert seen_on_disk == [0, 1]


def test_an_answer_sent_before_the_outage_began_does_not_hide_it():
    """Requests in flight when the server goes away can be answered after later ones have already
    failed; such an answer must not reset the count of failures in a row (it did, so a busy
    machine turned an outage into a long trickle of failed items)."""
    from negsynth.llm.errors import TransportError

    async def go():
        url = "http://127.0.0.1:9/v1"
        async with LLMClient(_cfg(url, max_consecutive_failures=3), base_url=url, cache=None) as llm:
            release = asyncio.Event()

            async def send(payload, body, retries):
                if payload["messages"][0]["content"] == "slow":
                    await release.wait()  # answered by the server just before it went away
                    return {"text": "{}", "finish_reason": "stop", "usage": {}}
                raise TransportError("transport_connection", "refused")

            llm._send_with_retries = send
            slow = asyncio.create_task(
                llm.chat(llm.payload([{"role": "user", "content": "slow"}], response_format=None, temperature=None, sample_index=0))
            )
            await asyncio.sleep(0)
            for i in range(2):
                with pytest.raises(TransportError):
                    await llm.chat(
                        llm.payload([{"role": "user", "content": f"down {i}"}], response_format=None, temperature=None, sample_index=0)
                    )
            release.set()
            assert (await slow)["text"] == "{}"
            assert llm.consecutive_failures == 2 and llm.outage is None
            with pytest.raises(TransportError):
                await llm.chat(llm.payload([{"role": "user", "content": "down 2"}], response_format=None, temperature=None, sample_index=0))
            assert llm.outage and "3 requests in a row failed" in llm.outage
            # an answer to a request sent after the failures began does reset it
            llm.outage = None
            llm.consecutive_failures = 0

            async def ok(payload, body, retries):
                return {"text": "{}", "finish_reason": "stop", "usage": {}}

            llm._send_with_retries = send
            with pytest.raises(TransportError):
                await llm.chat(llm.payload([{"role": "user", "content": "down 3"}], response_format=None, temperature=None, sample_index=0))
            llm._send_with_retries = ok
            await llm.chat(llm.payload([{"role": "user", "content": "fine"}], response_format=None, temperature=None, sample_index=0))
            assert llm.consecutive_failures == 0

    asyncio.run(go())


def test_an_exact_repeat_to_the_embedded_llama_server_is_evaluated_whole(tmp_path):
    """Only a prompt sent before, and only to a registered llama-server, goes with
    ``cache_prompt: false``; the request cache's keys do not change (a rerun is served from it)."""
    from negsynth.llm import prefix_pin

    def ask(url, seeds, cache):
        async def go():
            async with LLMClient(_cfg(url).model_copy(update={"seed": 0}), base_url=url, cache=cache) as llm:
                msgs = [{"role": "user", "content": "same prompt"}]
                return [
                    (await llm.chat(llm.payload(msgs, response_format=None, temperature=None, sample_index=s)))["cached"] for s in seeds
                ]

        return asyncio.run(go())

    with FakeOpenAI(lambda req, n: Reply(content='{"v": 1}')) as srv:
        cache = RequestCache(tmp_path / "c.sqlite")
        assert ask(srv.base_url, [0, 1], None) == [False, False]
        assert ["cache_prompt" in r for r in srv.requests] == [False, False]  # not registered: nothing added
        prefix_pin.register(srv.base_url)
        try:
            assert ask(srv.base_url, [0, 1, 0], cache) == [False, False, True]  # the 3rd: the cache's answer
            assert [r.get("cache_prompt") for r in srv.requests[2:]] == [None, False]  # the 2nd send repeats the 1st's prompt
            prefix_pin.register(srv.base_url)  # a restarted server holds no prompt yet
            assert ask(srv.base_url, [0, 1, 2], cache) == [True, True, False]
            assert srv.requests[-1].get("cache_prompt") is None
        finally:
            prefix_pin.unregister(srv.base_url)


def test_an_item_is_sent_again_while_the_failures_can_be_an_outage():
    """``again``: an item whose retries ran out goes back in the queue while no other request is
    answered (an outage) until the failures are ``llm.outage_wait`` old; one that keeps failing
    while others are answered twice more, then it is left pending; never with outage_wait 0."""
    import time

    async def go(url):
        async with LLMClient(_cfg(url, outage_wait=60), base_url=url) as llm:
            llm._outage_since = time.monotonic()
            assert all([await llm.again(7) for _ in range(5)])  # no answer between: an outage, sent again
            verdicts = []
            for _ in range(4):
                llm.answers += 1  # another request was answered meanwhile
                verdicts.append(await llm.again(7))
            assert verdicts == [True, True, False, False] and await llm.again(8)
            assert llm.outage is None and llm.stats.requeued == 8
            llm._outage_since = time.monotonic() - 61  # failing for longer than llm.outage_wait
            assert not await llm.again(9)
            assert "waited 60 s for it: llm.outage_wait" in llm.outage
        async with LLMClient(_cfg(url), base_url=url) as llm:
            assert not await llm.again(1)  # outage_wait 0: pending at once

    with FakeOpenAI(lambda req, n: Reply(content="{}")) as srv:
        asyncio.run(go(srv.base_url))
