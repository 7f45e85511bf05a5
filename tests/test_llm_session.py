"""``negsynth.llm.session.open_client``: a ready client without a run dir or a stage, its checks in order."""

from __future__ import annotations

import asyncio

import pytest
from fake_openai import FakeOpenAI, Reply

from negsynth.errors import UserError
from negsynth.llm.cache import RequestCache, request_key_and_body
from negsynth.llm.errors import LLMFatalError
from negsynth.llm.session import CacheOpenError, open_client
from negsynth.schemas.config import LLMConfig


def test_a_client_that_answers_and_caches(tmp_path):
    cache = tmp_path / "llm.sqlite"
    client_payload = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    with FakeOpenAI(lambda req, n: Reply(content='{"ok": 1}')) as srv:
        cfg = LLMConfig(base_url=srv.base_url, model="fake")

        async def ask():
            async with open_client(cfg, base_url=srv.base_url, cache_path=cache, stage="toy") as client:
                return await client.chat(client_payload), client

        first, client = asyncio.run(ask())
        sent = len(srv.requests)
        again, _ = asyncio.run(ask())  # a new client on the same cache: answered from it
    assert first["text"] == '{"ok": 1}' == again["text"]
    assert not first.get("cached") and again["cached"] is True
    assert cache.is_file() and len(srv.requests) == sent  # the second answer came from the cache
    assert client.cache is not None and client.limiter is not None
    # the cache records who asked (not part of the key, nor of the answer a hit gives back)
    assert "stage" not in again and RequestCache(cache).get(request_key_and_body(client_payload, 0)[0])["stage"] == "toy"


def test_missing_key_fails_before_the_cache_is_made(tmp_path, monkeypatch):
    monkeypatch.delenv("NEGSYNTH_TEST_NO_SUCH_KEY", raising=False)
    cfg = LLMConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="NEGSYNTH_TEST_NO_SUCH_KEY")

    async def go():
        async with open_client(cfg, base_url=cfg.base_url, cache_path=tmp_path / "llm.sqlite"):
            pass

    with pytest.raises(LLMFatalError, match="NEGSYNTH_TEST_NO_SUCH_KEY"):
        asyncio.run(go())
    assert not (tmp_path / "llm.sqlite").exists()


def test_an_unreadable_cache_names_its_file(tmp_path):
    bad = tmp_path / "llm.sqlite"
    bad.write_bytes(b"not a database" * 100)
    cfg = LLMConfig(base_url="http://127.0.0.1:9/v1", model="m")

    async def go():
        async with open_client(cfg, base_url=cfg.base_url, cache_path=bad, check=False):
            pass

    with pytest.raises(CacheOpenError) as e:
        asyncio.run(go())
    assert e.value.path == bad


def test_the_client_is_built_whole_from_the_factorys_arguments(tmp_path):
    """Gate, ledger, wait notices, commit window and transport are arguments of ``open_client``;
    ``prepare`` runs once the endpoint answered the preflight, before the transport is built from
    the client, which is closed on the way out."""
    from negsynth.llm.errors import BudgetStop

    order: list[str] = []

    class Transport:
        def __init__(self, client):
            order.append("transport")
            self.client = client

        async def aclose(self):
            order.append("closed")

    def gate(stats):
        return "max_requests=1" if stats.requests >= 1 else None

    ledger, on_wait = object(), lambda line, waiting: None
    with FakeOpenAI(lambda req, n: Reply(content='{"ok": 1}')) as srv:
        cfg = LLMConfig(base_url=srv.base_url, model="fake")

        async def go():
            async with open_client(
                cfg,
                base_url=srv.base_url,
                cache_path=tmp_path / "llm.sqlite",
                commit_window=0.05,
                gate=gate,
                ledger=ledger,
                on_wait=on_wait,
                prepare=lambda: order.append("prepare"),
                transport=Transport,
            ) as client:
                assert (client.gate, client.ledger, client.on_wait, client.cache.commit_window) == (gate, ledger, on_wait, 0.05)
                assert isinstance(client.transport, Transport) and client.transport.client is client
            return client

        client = asyncio.run(go())
        assert order == ["prepare", "transport", "closed"]

        async def gated():  # the gate is called with the client's counters before each request sent
            async with open_client(cfg, base_url=srv.base_url, gate=gate, check=False) as c:
                await c.chat({"model": "fake", "messages": [{"role": "user", "content": "one"}]})
                with pytest.raises(BudgetStop, match="max_requests=1"):
                    await c.chat({"model": "fake", "messages": [{"role": "user", "content": "two"}]})

        asyncio.run(gated())
    assert isinstance(client.transport, Transport)  # its counts stay readable after the block

    async def unreachable():  # the preflight fails: nothing prepared, no transport built
        dead = LLMConfig(base_url="http://127.0.0.1:9/v1", model="m", connect_timeout=2)
        async with open_client(dead, base_url=dead.base_url, prepare=lambda: order.append("prepare"), transport=Transport):
            pass

    order.clear()
    with pytest.raises(UserError, match="cannot reach"):
        asyncio.run(unreachable())
    assert order == []
