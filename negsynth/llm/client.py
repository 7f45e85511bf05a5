"""An async client for any OpenAI-compatible chat-completions endpoint.

It knows nothing of MGH: it sends the messages it is given and returns parsed, validated
objects. Two retry layers, kept apart:

* **transport** (a plain retry loop): 429 (honouring ``Retry-After``), 408/409/5xx, timeouts, connection
  resets and empty ``choices`` are retried with jittered exponential backoff. They are never
  shown to the model.
* **validation re-ask**: an answer that fails to parse or validate is sent back with the error
  so the model can correct it, up to ``llm.max_attempts`` attempts.

Every answered request is stored in a :class:`~negsynth.llm.cache.RequestCache` before it is
used, keyed by everything that shapes it, so a rerun or resumed run pays for nothing twice.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from string import Template
from typing import Any, Generic, TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from negsynth.data import jsonfast
from negsynth.errors import NegsynthError
from negsynth.llm.cache import RequestCache, request_key_and_body
from negsynth.llm.endpoints import EndpointSet
from negsynth.llm.http1 import ConnectFailed, H1Pool, ProtocolFault, TLSFailed
from negsynth.llm.keys import char_name, read_key
from negsynth.llm.parsing import ParseError, extract_json
from negsynth.llm.repeats import repeat_guard
from negsynth.schemas.config import LLMConfig
from negsynth.schemas.records import Usage

log = logging.getLogger(__name__)
for _name in ("openai", "httpx", "httpcore", "aiohttp"):
    logging.getLogger(_name).setLevel(logging.WARNING)


class _OpenAIOnUse:
    """The ``openai`` module, imported on first use: the lean aiohttp chat path never needs it,
    and importing it costs ~0.9 s of CPU at every start (files/batches and the httpx transport
    import it when they run). An exception can only be an openai one once openai is imported,
    so :func:`_openai_loaded` guards the checks that classify exceptions."""

    def __getattr__(self, name: str) -> Any:
        import openai as module

        return getattr(module, name)


openai = _OpenAIOnUse()


def _openai_loaded() -> bool:
    return "openai" in sys.modules


def _aiohttp_errors() -> tuple[type[BaseException], ...]:
    """aiohttp's base error once aiohttp is imported (only the proxy path imports it: ~0.3 s at start)."""
    mod = sys.modules.get("aiohttp")
    return (mod.ClientError,) if mod is not None else ()


T = TypeVar("T")


class LLMFatalError(NegsynthError, RuntimeError):
    """A fault no retry can fix (bad key, unknown model, unreachable server): stop the stage."""


class TransportError(NegsynthError, RuntimeError):
    """Transport retries exhausted for one request; the item becomes a reject, the stage goes on."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class EmptyResponse(NegsynthError, RuntimeError):
    """The server answered 200 with no choices."""


class BudgetStop(NegsynthError, RuntimeError):
    """A --max-* budget is spent: no new request is sent. The item stays unfinished (a rerun does it)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class OutageStop(BudgetStop):
    """Too many requests in a row failed at the transport/HTTP level: the server is down or is the
    wrong one. No new request is sent; the unfinished items stay pending (a rerun does them).
    ``fatal``: the server answers but refuses or garbles every request, a setting to fix (exit 2)
    rather than an outage to wait out."""

    def __init__(self, reason: str, fatal: bool = False):
        super().__init__(reason)
        self.fatal = fatal


class ValidationFailure(NegsynthError, ValueError):
    """Raised by a validate callback: ``reason`` is a short code, ``detail`` is shown to the model."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass
class LLMResult(Generic[T]):
    value: T | None
    raw: str | None
    reason: str | None = None  # reject reason of the last attempt when value is None
    detail: str = ""
    usage: Usage = field(default_factory=Usage)
    reasons: list[str] = field(default_factory=list)  # reason of each failed attempt


@dataclass
class ClientStats:
    requests: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasks: int = 0
    failed_attempts: Counter = field(default_factory=Counter)  # validation reason -> attempts
    transport_retries: Counter = field(default_factory=Counter)
    transport_failures: Counter = field(default_factory=Counter)
    outage_waits: int = 0  # outages waited out (the server came back within llm.outage_wait)
    outage_wait_s: float = 0.0  # seconds spent waiting for the server
    requeued: int = 0  # items whose retries ran out, sent again (an outage ridden out)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "reasks": self.reasks,
            "failed_attempts": dict(self.failed_attempts),
            "transport_retries": dict(self.transport_retries),
            "transport_failures": dict(self.transport_failures),
            "outage_waits": self.outage_waits,
            "outage_wait_s": round(self.outage_wait_s, 3),
            "requeued": self.requeued,
        }


class HTTPFault(NegsynthError):
    """A non-200 answer on the lean path (the SDK path raises openai.APIStatusError)."""

    def __init__(self, status_code: int, headers: Any, message: str):
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.headers = headers
        self.message = message


class BadResponse(NegsynthError, RuntimeError):
    """A 200 whose body is not a chat completion (cut off, not JSON): retried like a reset."""


def transport_kind(exc: BaseException) -> str | None:
    """Classify a retryable transport fault, or None when the exception is not one."""
    if isinstance(exc, HTTPFault):
        code = exc.status_code
        if code == 429:
            return "rate_limited"
        if code in (408, 409, 425) or code >= 500:
            return f"http_{code}"
        return None
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, (BadResponse, ProtocolFault)):
        return "bad_response"
    if isinstance(exc, (ConnectionError, *_aiohttp_errors())):
        return "connection"
    if isinstance(exc, EmptyResponse):
        return "empty_choices"
    if not _openai_loaded():
        return None
    if isinstance(exc, openai.RateLimitError):
        return "rate_limited"
    if isinstance(exc, openai.APITimeoutError):
        # the aiohttp transport maps every aiohttp.ClientConnectionError (a reset, a closed
        # socket) to httpx.ConnectTimeout: look at the original cause to tell them apart
        return "connection" if _caused_by_disconnect(exc) else "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        if code in (408, 409, 425, 429) or code >= 500:
            return f"http_{code}"
    return None


def _caused_by_disconnect(exc: BaseException) -> bool:
    e: BaseException | None = exc.__cause__ or exc.__context__
    for _ in range(6):
        if e is None:
            return False
        if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
            return False
        if isinstance(e, (ConnectionError, OSError)) or type(e).__name__ in (
            "ServerDisconnectedError",
            "ClientOSError",
            "ClientPayloadError",
        ):
            return True
        mod = type(e).__module__ or ""
        if mod.startswith("aiohttp") and "Timeout" not in type(e).__name__:
            return True
        e = e.__cause__ or e.__context__
    return False


def _retry_after_seconds(exc: BaseException) -> float | None:
    headers = getattr(exc, "headers", None)
    if headers is None:
        resp = getattr(exc, "response", None)
        if resp is None:
            return None
        headers = resp.headers
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if not ra:
        return None
    try:
        return max(0.0, float(ra))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(ra)
            return max(0.0, when.timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def resolve_api_key(cfg: LLMConfig) -> str:
    """Read the key from ``api_key_env`` or ``api_key_file``; local servers need none."""
    return read_key(cfg.api_key_env, cfg.api_key_file, "llm", LLMFatalError) or "sk-no-key-required"


def non_ascii_note(key: str) -> str:
    """For a refused key: its first non-ASCII character, named (never the key), or ''."""
    for i, c in enumerate(key):
        if ord(c) > 127:
            return f"; the key has the non-ASCII character {char_name(c)} at position {i + 1}, which API keys never have"
    return ""


def response_format_for(mode: str, schema: dict | None, name: str) -> dict | None:
    if schema is None or mode == "prompt":
        return None
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": False}}
    return {"type": "json_object", "schema": schema}  # llama.cpp / vLLM accept a schema here


class LLMClient:
    """Bounded-concurrency chat client with caching, transport retries and validation re-asks.

    Use as ``async with LLMClient(cfg, base_url=..., cache=...) as llm:`` then
    ``await llm.structured(messages, schema=..., validate=fn, sample_index=i)``. Everything it
    works with is passed here (:func:`negsynth.llm.open_client` builds one from the config); the
    one part plugged in later is a transport that needs the client itself (:meth:`plugged`).
    """

    def __init__(
        self,
        cfg: LLMConfig,
        *,
        base_url: str,
        api_key: str | None = None,
        cache: RequestCache | None = None,
        limiter: Any | None = None,
        gate: Callable[[ClientStats], str | None] | None = None,
        ledger: Any | None = None,
        on_wait: Callable[[str, bool], None] | None = None,
        transport: Any | None = None,
        stage: str | None = None,
    ):
        self.cfg = cfg
        #: who asks (the pipeline: the stage's name), recorded with each answer this client caches
        #: (``"stage"`` in the cached value, never part of its key), so that a reader of the cache
        #: (``negsynth estimate``) knows which stage an answer belongs to
        self.stage = stage
        self.base_url = base_url
        self.cache = cache if cfg.cache else None
        self.stats = ClientStats()
        self.limiter = limiter
        #: called with the client's counters before every request that would be sent (not cache
        #: hits): a reason stops it (the stages' budget)
        self.gate = gate
        #: a budget shared with other processes (``--executor ray``), or None: ``await
        #: ledger.reserve()`` counts a request before it is sent (a reason stops it instead),
        #: ``ledger.unreserve()`` gives back one never sent, ``ledger.add(pt, ct)`` adds an answer's tokens
        self.ledger = ledger
        #: batch mode: ``await transport.submit(key, payload)`` answers instead of a live request
        self.transport = transport
        self._sem = asyncio.Semaphore(cfg.total_concurrency)
        self._api_key = api_key if api_key is not None else resolve_api_key(cfg)
        #: llm.endpoints: several servers, one picked per attempt (None: ``base_url`` alone)
        self.router: EndpointSet | None = None
        if cfg.endpoints:
            self.router = EndpointSet(cfg, self._api_key, self._endpoint_client)
            self.base_url = self.router.describe()
        self._client: openai.AsyncOpenAI | None = None
        #: the embedded llama-server's exact-repeat guard (None for every other server)
        self._repeats = repeat_guard(base_url)
        self._pool: H1Pool | None = None  # the lean path (llm.transport = "http1")
        self._session: Any | None = None  # aiohttp.ClientSession: "aiohttp", or "http1" through a proxy
        self._proxy: str | None = None
        #: requests in a row whose retries ran out at the transport/HTTP level; an answer resets it,
        #: unless that request was sent before the first failure of the run (an answer the server
        #: wrote just before it went away says nothing about it now)
        self.consecutive_failures = 0
        self._sent = 0  # requests sent so far, in order (the send order decides "before")
        self._streak_from = 0  # send number of the first failed request of the current run
        self.failure_kinds: Counter = Counter()  # reason -> requests, in the current run of failures
        self.last_failure: str = ""
        #: set once ``llm.max_consecutive_failures`` is reached: the one-line reason the stage stopped
        self.outage: str | None = None
        self.outage_fatal = False
        #: waiting out an outage (llm.outage_wait): set while the server is probed; requests wait
        #: for it before they are sent
        self._back: asyncio.Event | None = None
        self._probe_task: asyncio.Task | None = None
        #: when the current run of failures began (the first request of it that failed for good):
        #: past ``llm.outage_wait`` from there with no answer, the stage stops as an outage
        self._outage_since: float | None = None
        self.answers = 0  # requests answered so far (an item's failures between two answers are an outage's)
        #: item -> (answers when it last failed, times it failed while others were answered, times sent again)
        self._item_fails: dict[Any, tuple[int, int, int]] = {}
        self._probe_answered = False  # a probe answered during the current run of failures
        #: told (one line) when a wait for the server begins and ends; the stage shows it
        self.on_wait = on_wait

    def _redact(self, text: str) -> str:
        """Servers sometimes quote the key they got in an error; such text may reach a reject record."""
        for k in (self._api_key, *(self.router.keys() if self.router is not None else ())):
            if k and len(k) >= 8 and k in text:
                text = text.replace(k, "[redacted]")
        return text

    def _endpoint_client(self, url: str, key: str, concurrency: int) -> LLMClient:
        """The single-URL client whose transport carries one endpoint's requests."""
        cfg = self.cfg.model_copy(update={"base_url": url, "max_concurrency": concurrency, "endpoints": []})
        return LLMClient(cfg, base_url=url, api_key=key)

    def _make_client(self) -> openai.AsyncOpenAI:
        import httpx

        if not self._api_key.isascii():
            raise LLMFatalError(
                f"the openai SDK's HTTP client cannot send an API key with a non-ASCII character{non_ascii_note(self._api_key)[1:]}; fix the key in llm.api_key_env"
            )
        timeout = httpx.Timeout(self.cfg.timeout, connect=self.cfg.connect_timeout)
        kw: dict[str, Any] = {}
        if self.cfg.transport == "aiohttp":
            kw["http_client"] = openai.DefaultAioHttpClient(timeout=timeout)
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self._api_key, max_retries=0, timeout=timeout, **kw)

    @property
    def sdk(self) -> openai.AsyncOpenAI:
        """The openai SDK client (files/batches, and chat with ``llm.transport = "httpx"``)."""
        if self._client is None:
            self._client = self._make_client()
        return self._client

    async def __aenter__(self) -> LLMClient:
        if self.router is not None:  # each endpoint opens its own transport
            await self.router.open()
            return self
        self._chat_url = self.base_url.rstrip("/") + "/chat/completions"
        self._proxy = proxy_for(self._chat_url) if self.cfg.transport != "httpx" else None
        if self.cfg.transport == "http1" and self._proxy is None:
            # the lean path: keep-alive HTTP/1.1 on asyncio, JSON in and out, no SDK models
            # (the SDK's request transform and response models cost ~2 ms CPU per request,
            # aiohttp's request machinery ~0.3 ms more than this)
            self._pool = H1Pool(
                self._chat_url,
                headers={"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json", "Accept": "application/json"},
                limit=self.cfg.max_concurrency + 8,
                connect_timeout=self.cfg.connect_timeout,
            )
            self._chat_target = self._pool.target(self._chat_url)
        elif self.cfg.transport in ("http1", "aiohttp"):
            # aiohttp: chosen, or the lean path's stand-in when the environment names a proxy
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.cfg.max_concurrency + 8, limit_per_host=0, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.cfg.connect_timeout, sock_read=self.cfg.timeout),
                headers={"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json"},
                skip_auto_headers=("User-Agent",),
                # proxies (HTTP(S)_PROXY / NO_PROXY, as the SDK's httpx client honours them) are
                # resolved once here: trust_env=True would redo a netrc lookup in an executor and
                # a proxy lookup per request, ~0.3 ms of CPU each
                trust_env=False,
            )
        else:
            self.sdk  # noqa: B018
        return self

    async def __aexit__(self, *exc) -> None:
        if self._probe_task is not None and not self._probe_task.done():
            self._probe_task.cancel()
            try:
                await self._probe_task
            except (asyncio.CancelledError, Exception):
                pass
        if self.router is not None:
            await self.router.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    @asynccontextmanager
    async def plugged(self, transport: Any) -> AsyncIterator[Any]:
        """Send through ``transport`` (``await transport.submit(key, payload)``, the Batch API)
        inside the block, closing it (``await transport.aclose()``) at its end. For a transport
        built from this client, once its endpoint was checked (:func:`negsynth.llm.open_client`'s
        ``transport``); it stays readable (``client.transport``, its counts) after the block."""
        self.transport = transport
        try:
            yield transport
        finally:
            await transport.aclose()

    async def preflight(self, timeout: float = 10.0) -> None:
        """Fail in the first seconds, in one line, when the endpoint is unreachable or refuses the key.

        The lean-path twin of :func:`negsynth.llm.server.preflight` (same messages): it reuses the
        connection pool instead of importing and building an httpx client (~0.5 s of CPU at start).
        """
        from negsynth.errors import UserError

        if self.router is not None:
            return await self.router.preflight(timeout)
        url = self.base_url
        if self._pool is None and self._session is None:
            from negsynth.llm.server import preflight

            return preflight(url, self._api_key, timeout=timeout)
        refused = f"cannot reach llm.base_url={url}: connection refused; start the server (negsynth serve) or fix llm.base_url"
        slow = f"llm.base_url={url} did not answer within {timeout:.0f} s; check the URL or the server"
        models = url.rstrip("/") + "/models"
        if self._pool is not None:
            try:
                async with asyncio.timeout(timeout):
                    resp = await self._pool.request("GET", self._pool.target(models))
                    status, headers = resp.status, resp.headers
            except TLSFailed as e:
                raise UserError(tls_message(url, str(e))) from None
            except ConnectFailed as e:
                if isinstance(e.__cause__, ConnectionRefusedError):
                    raise UserError(refused) from None
                raise UserError(f"cannot reach llm.base_url={url}: {e}; start the server or fix llm.base_url") from None
            except TimeoutError:
                raise UserError(slow) from None
            except ConnectionError as e:
                raise UserError(f"cannot reach llm.base_url={url}: {type(e).__name__}; fix llm.base_url") from None
        else:
            import aiohttp

            try:
                async with self._session.get(
                    models, timeout=aiohttp.ClientTimeout(total=timeout), proxy=self._proxy, allow_redirects=False
                ) as r:
                    status, headers = r.status, r.headers
                    await r.read()
            except aiohttp.ClientSSLError as e:  # before ClientConnectorError: it is one
                raise UserError(tls_message(url, _ssl_detail(e))) from None
            except aiohttp.ClientConnectorError as e:
                if isinstance(e.os_error, ConnectionRefusedError):
                    raise UserError(refused) from None
                raise UserError(
                    f"cannot reach llm.base_url={url}: {e.os_error.strerror or e.os_error}; start the server or fix llm.base_url"
                ) from None
            except (asyncio.TimeoutError, TimeoutError):
                raise UserError(slow) from None
            except aiohttp.ClientError as e:
                raise UserError(f"cannot reach llm.base_url={url}: {type(e).__name__}; fix llm.base_url") from None
        if status in _REDIRECTS:
            try:
                redirect_target(self.base_url, models, status, headers)
            except OutageStop as e:
                raise UserError(str(e)) from None
        if status in (401, 403):
            raise UserError(f"llm.base_url={url} refused the API key (HTTP {status}); check llm.api_key_env{non_ascii_note(self._api_key)}")
        # 404/405: some OpenAI-compatible servers have no /models; the first request will tell

    async def _post_chat(self, payload: dict, data: bytes | None = None) -> tuple[str | None, str | None, int, int]:
        """One chat request on the lean path: ``(text, finish_reason, prompt_tokens, completion_tokens)``.

        ``data`` is the payload already serialised (see ``request_key_and_body``); ``extra_body``
        keys are merged into the top level, as the openai SDK does.
        """
        extra = payload.get("extra_body")
        if extra is not None or data is None:
            body = {k: v for k, v in payload.items() if k != "extra_body"}
            body.update(extra or {})
            data = jsonfast.dumps(body)
        url = self._chat_url
        for _ in range(_MAX_REDIRECTS + 1):
            if self._pool is not None:
                resp = await self._pool.request("POST", self._pool.target(url) if url is not self._chat_url else self._chat_target, data)
                status, headers, raw = resp.status, resp.headers, resp.body
            else:
                # redirects are followed below, the same way on both transports
                async with self._session.post(url, data=data, proxy=self._proxy, allow_redirects=False) as r:
                    raw = await r.read()
                    status, headers = r.status, r.headers
            if status == 200:
                break
            if status not in _REDIRECTS:
                raise HTTPFault(status, headers, _error_message(raw))
            try:
                url = redirect_target(self.base_url, url, status, headers)
            except OutageStop as e:  # a redirect not to follow: every request would meet it
                self.outage, self.outage_fatal = str(e), True
                raise
            if status == 308:  # permanent: later requests go straight there
                self._chat_url = url
                if self._pool is not None:
                    self._chat_target = self._pool.target(url)
        else:
            self.outage, self.outage_fatal = (
                f"llm.base_url={self.base_url}: more than {_MAX_REDIRECTS} redirects for one request; set llm.base_url to the final address",
                True,
            )
            raise OutageStop(self.outage, True)
        try:
            obj = jsonfast.loads(raw)
            choices = obj.get("choices")
        except (ValueError, AttributeError):
            raise BadResponse(f"the server answered 200 with a body that is not a chat completion ({len(raw)} bytes)") from None
        if not choices:
            raise EmptyResponse("the server answered with no choices")
        ch = choices[0]
        u = obj.get("usage") or {}
        msg = ch.get("message") or {}
        return msg.get("content"), ch.get("finish_reason"), u.get("prompt_tokens") or 0, u.get("completion_tokens") or 0

    # -- one request -------------------------------------------------------------------------
    def payload(self, messages: list[dict], *, response_format: dict | None, temperature: float | None, sample_index: int) -> dict:
        cfg = self.cfg
        p: dict[str, Any] = {
            "model": cfg.model,
            "messages": messages,
            "temperature": cfg.temperature if temperature is None else temperature,
            "top_p": cfg.top_p,
            "max_tokens": cfg.max_tokens,
        }
        if response_format is not None:
            p["response_format"] = response_format
        if cfg.seed is not None:
            # one seed per sample: repeated requests for the same prompt (brainstorm's lists, several
            # samples of one item) must not all draw the same answer
            p["seed"] = cfg.seed + sample_index
        if cfg.extra_body:
            p["extra_body"] = cfg.extra_body
        return p

    async def chat(self, payload: dict, *, sample_index: int = 0) -> dict:
        """Send one request (or serve it from the cache): ``{"text", "finish_reason", "usage", "cached"}``."""
        key, body = request_key_and_body(payload, sample_index)
        if self.cache is None:
            key = None
        if key is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.stats.cache_hits += 1
                hit.pop("stage", None)  # who asked first: the cache's record, not part of the answer
                return {**hit, "cached": True}
        while self._back is not None:  # the server is down: wait with everyone for it to come back
            await self._back.wait()
        if self.outage is not None:
            raise OutageStop(self.outage, self.outage_fatal)
        sent = self._sent
        try:
            if self.transport is not None:
                result = await self.transport.submit(key or request_key_and_body(payload, sample_index)[0], payload)
                self.consecutive_failures = 0
                return {**result, "cached": False}  # the batch transport stored it in the cache
            async with self._sem:
                self._sent += 1
                sent = self._sent
                result = await self._send_with_retries(payload, body)
        except TransportError as e:
            if self.consecutive_failures == 0:
                self._streak_from = sent
            if self._outage_since is None:
                self._outage_since = time.monotonic()
            self._note_failure(e)
            raise
        self.answers += 1
        if self.consecutive_failures == 0 or sent > self._streak_from:
            self.consecutive_failures = 0
            self.failure_kinds.clear()
            self._outage_since = None
            self._probe_answered = False
        if key is not None:
            self.cache_answer(key, result)
        return {**result, "cached": False}

    def cache_answer(self, key: str, result: dict) -> None:
        """Keep an answer in the request cache, with the :attr:`stage` that asked for it."""
        self.cache.put(key, result if self.stage is None else {**result, "stage": self.stage})

    def _note_failure(self, e: TransportError) -> None:
        """One more request failed for good; at ``llm.max_consecutive_failures`` in a row, stop."""
        self.consecutive_failures += 1
        self.failure_kinds[e.reason] += 1
        self.last_failure = e.detail
        if self.outage is None and self._back is None and self.consecutive_failures >= self.cfg.max_consecutive_failures:
            fatal = self.failure_kinds.most_common(1)[0][0] in FATAL_KINDS
            message = self._outage_message()
            if fatal or not self._can_wait():
                self.outage_fatal, self.outage = fatal, message
            else:
                self._start_wait(message)

    def _outage_message(self) -> str:
        hanging = None
        if self._probe_answered and self.failure_kinds and self.failure_kinds.most_common(1)[0][0] == "transport_timeout":
            # GET /models answers but no chat request does: the server is up and hangs
            hanging = self.router.hanging() if self.router is not None else None
            hanging = hanging or self.base_url
        return outage_message(self.base_url, self.cfg, self.consecutive_failures, self.failure_kinds, self.last_failure, hanging=hanging)

    # -- riding out an outage ---------------------------------------------------------------
    def _can_wait(self) -> bool:
        return (
            self.cfg.outage_wait > 0
            and self.transport is None
            and (
                (self.router is not None and self.router.opened)
                or self._pool is not None
                or self._session is not None
                or self._client is not None
            )
        )

    def _start_wait(self, message: str) -> None:
        """Hold every request and probe the server with backoff until it answers (then resume) or
        ``llm.outage_wait`` has passed since the outage began (then stop as an outage)."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
        left = self._outage_since + self.cfg.outage_wait - now
        if left <= 0:
            self.outage = self._waited(message)
            return
        self._back = asyncio.Event()
        self._probe_task = asyncio.ensure_future(self._wait_for_server(message, now + left))

    async def _wait_for_server(self, message: str, deadline: float) -> None:
        back, t0, delay = self._back, time.monotonic(), max(0.05, min(self.cfg.backoff_initial, 5.0))
        cause = message.split(":", 1)[0]
        self._tell(
            f"the LLM server is not answering ({cause}); waiting for it, probing with backoff for up to {deadline - t0:.0f} s more (llm.outage_wait)",
            True,
        )
        try:
            while True:
                pause = min(delay, deadline - time.monotonic())
                if pause <= 0:
                    self.outage = self._waited(self._outage_message() if self._probe_answered else message)
                    break
                await asyncio.sleep(pause)
                delay = min(delay * 2, 30.0, max(self.cfg.backoff_max, 0.05))
                if await self._probe():
                    self._probe_answered = True
                    self.consecutive_failures = 0
                    self.failure_kinds.clear()
                    self.stats.outage_waits += 1
                    self._tell(f"the LLM server answers again after {time.monotonic() - t0:.0f} s; resuming", False)
                    break
        finally:
            self.stats.outage_wait_s += time.monotonic() - t0
            self._back = None
            back.set()

    def _waited(self, message: str) -> str:
        return f"{message} (waited {self.cfg.outage_wait:g} s for it: llm.outage_wait)"

    def _tell(self, line: str, waiting: bool) -> None:
        log.info(line)
        if self.on_wait is not None:
            self.on_wait(line, waiting)

    async def _probe(self) -> bool:
        """One cheap request that costs nothing (``GET /models``): does the server answer again?
        Any HTTP answer but a 5xx or a 429 counts (some servers have no /models: 404 is fine).
        With ``llm.endpoints``: every endpoint's health check at once; any that answers is back in."""
        timeout = max(1.0, min(self.cfg.connect_timeout, 10.0))
        if self.router is not None:
            return await self.router.probe_all(timeout)
        url = self.base_url.rstrip("/") + "/models"
        try:
            async with asyncio.timeout(timeout):
                if self._pool is not None:
                    status = (await self._pool.request("GET", self._pool.target(url))).status
                elif self._session is not None:
                    async with self._session.get(url, proxy=self._proxy, allow_redirects=False) as r:
                        status = r.status
                        await r.read()
                else:
                    try:
                        await self._client.models.list()
                        status = 200
                    except Exception as e:  # an openai.APIStatusError still means it answers
                        status = getattr(e, "status_code", None)
                        if status is None:
                            return False
        except Exception:
            return False
        return status < 500 and status != 429

    #: times an item is sent again after failing while the server answered other requests
    #: (a request the server keeps failing, not an outage): then it is left pending
    SPORADIC_RETRIES = 2

    async def again(self, item: Any) -> bool:
        """An item whose requests failed at the transport level (its own retries ran out): True
        when it should go back in the queue, after a pause (this waits it), False to leave it
        pending (a rerun does it).

        Sent again while the failures can be an outage: until the endpoints have been failing
        continuously for ``llm.outage_wait`` (then the client stops as an outage, exit 4); an
        outage long enough to trip ``llm.max_consecutive_failures`` holds every request while the
        server is probed. An item that keeps failing while other requests are answered is sent
        again :attr:`SPORADIC_RETRIES` times. False at once with ``llm.outage_wait = 0``, in
        batch mode, or when the server answers wrongly (a setting to fix)."""
        if self.outage is not None or not self._can_wait():
            return False
        if self.failure_kinds and self.failure_kinds.most_common(1)[0][0] in FATAL_KINDS:
            return False  # the server answers, wrongly: a setting to fix, not an outage to wait out
        seen, sporadic, sent = self._item_fails.get(item, (self.answers, 0, 0))
        if self.answers > seen:
            sporadic += 1
            if sporadic > self.SPORADIC_RETRIES:
                return False
        sent += 1
        if self._outage_since is not None and time.monotonic() - self._outage_since >= self.cfg.outage_wait and self._back is None:
            self.outage = self._waited(self._outage_message())
            return False
        delay = random.uniform(0.5, 1.0) * min(max(self.cfg.backoff_max, 0.05), max(self.cfg.backoff_initial, 0.01) * 2 ** (sent - 1))
        await asyncio.sleep(delay)
        while self._back is not None:  # an outage is being waited out: back in the queue once it ends
            await self._back.wait()
        self._item_fails[item] = (self.answers, sporadic, sent)
        if self.outage is not None:
            return False
        self.stats.requeued += 1
        return True

    def backoff(self, exc: BaseException, attempt: int) -> float:
        """Seconds before retry ``attempt`` (1 = the first retry): ``Retry-After`` when the server
        gave one (capped by ``backoff_max``), else full-jitter exponential
        ``uniform(0, min(backoff_max, backoff_initial * 2 ** (attempt - 1)))``."""
        ra = _retry_after_seconds(exc)
        if ra is not None:
            return min(ra, self.cfg.backoff_max)
        return random.uniform(0.0, min(self.cfg.backoff_max, self.cfg.backoff_initial * 2 ** (attempt - 1)))

    def _note_retry(self, e: BaseException, attempt: int) -> None:
        kind = transport_kind(e) or "other"
        self.stats.transport_retries[kind] += 1
        if self.limiter is not None and kind == "rate_limited":
            self.limiter.on_rate_limited(_retry_after_seconds(e))
        log.debug("transport fault %s (attempt %d), retrying", kind, attempt)

    async def _send_with_retries(self, payload: dict, body: bytes | None = None) -> dict:
        # The happy path is one plain call; only after a transport fault does tenacity take over
        # (its per-call machinery cost ~5 % of the client's CPU when wrapped around every request).
        try:
            try:
                return await self._send(payload, body)
            except Exception as first:
                if transport_kind(first) is None or self.cfg.max_retries == 0:
                    raise
                self._note_retry(first, 1)
                await asyncio.sleep(self.backoff(first, 1))
            retrying = AsyncRetrying(
                stop=stop_after_attempt(self.cfg.max_retries),
                wait=lambda st: self.backoff(st.outcome.exception(), st.attempt_number + 1),
                retry=retry_if_exception(lambda e: transport_kind(e) is not None),
                before_sleep=lambda st: self._note_retry(st.outcome.exception(), st.attempt_number + 1),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    return await self._send(payload, body)
        except HTTPFault as e:
            if e.status_code in (401, 403):
                raise LLMFatalError(
                    f"{self.base_url} refused the API key ({e.status_code}); check llm.api_key_env{non_ascii_note(self._api_key)}"
                ) from None
            if e.status_code == 404:
                raise LLMFatalError(
                    f"{self.base_url} answered 404 for model {self.cfg.model!r}; check llm.model and llm.base_url ({self._redact(_short(e))})"
                ) from None
            kind = transport_kind(e)
            if kind is None:
                raise TransportError("bad_request", self._redact(_short(e))) from None
            self.stats.transport_failures[kind] += 1
            raise TransportError("transport_" + kind, f"gave up after {self.cfg.max_retries} retries: {self._redact(_short(e))}") from None
        except (asyncio.TimeoutError, ConnectionError, BadResponse, EmptyResponse, *_aiohttp_errors()) as e:
            kind = transport_kind(e) or "connection"
            self.stats.transport_failures[kind] += 1
            detail = _short(e) or type(e).__name__
            raise TransportError("transport_" + kind, f"gave up after {self.cfg.max_retries} retries: {self._redact(detail)}") from None
        except Exception as e:
            # the SDK's errors (httpx transport, files/batches); not named in an except clause, so
            # an exception passing through (a cancellation) never imports openai on its way
            if not _openai_loaded():
                raise
            self._raise_sdk_error(e)
        raise AssertionError("unreachable")  # pragma: no cover

    def _raise_sdk_error(self, e: Exception) -> None:
        """One of openai's exceptions as a fatal error or a transport failure; anything else as it is."""
        if isinstance(e, (openai.AuthenticationError, openai.PermissionDeniedError)):
            raise LLMFatalError(f"{self.base_url} refused the API key ({e.status_code}); check llm.api_key_env") from None
        if isinstance(e, openai.NotFoundError):
            raise LLMFatalError(
                f"{self.base_url} answered 404 for model {self.cfg.model!r}; check llm.model and llm.base_url ({self._redact(_short(e))})"
            ) from None
        if isinstance(e, openai.APIStatusError):
            kind = transport_kind(e)
            if kind is None:
                raise TransportError("bad_request", f"HTTP {e.status_code}: {self._redact(_short(e))}") from None
            self.stats.transport_failures[kind] += 1
            raise TransportError("transport_" + kind, f"gave up after {self.cfg.max_retries} retries: {self._redact(_short(e))}") from None
        if isinstance(e, openai.APIConnectionError):
            kind = transport_kind(e) or "connection"
            self.stats.transport_failures[kind] += 1
            raise TransportError("transport_" + kind, f"gave up after {self.cfg.max_retries} retries: {self._redact(_short(e))}") from None
        raise e

    async def _send(self, payload: dict, body: bytes | None = None) -> dict:
        lim = self.limiter
        reserved = 0
        if lim is not None:
            reserved = await lim.acquire(payload)
        ok = False
        ep = None  # with llm.endpoints: the endpoint this attempt goes to, and its transport
        via = self
        try:
            if self.router is not None:
                ep = await self.router.acquire()
                via = ep.client
            lean = via._pool is not None or via._session is not None
            assert lean or via._client is not None, "use LLMClient inside 'async with'"
            # the gate and the count happen with no await between them, so concurrent senders
            # can never overshoot --max-requests
            if self.outage is not None:
                raise OutageStop(self.outage, self.outage_fatal)
            if self.gate is not None:
                why = self.gate(self.stats)
                if why is not None:
                    raise BudgetStop(why)
            if self.ledger is not None:
                # shared with other processes: the check and the count are one call on the ledger
                why = await self.ledger.reserve()
                if why is not None:
                    raise BudgetStop(why)
            self.stats.requests += 1
            if ep is not None:
                ep.requests += 1
            if via._repeats is not None and via._repeats.repeat(payload["messages"]):
                # an exact repeat on the embedded llama-server: evaluated whole, so that its answer
                # is a fresh server's (RepeatGuard); the request cache's key was made before this
                payload, body = {**payload, "extra_body": {**(payload.get("extra_body") or {}), "cache_prompt": False}}, None
            try:
                # llm.timeout is a deadline for the whole request (a server that trickles its
                # answer byte by byte cannot hold it open): past it, a transport "timeout"
                async with asyncio.timeout(self.cfg.timeout):
                    if lean:
                        text, finish, pt, ct = await via._post_chat(payload, body)
                    else:
                        resp = await via._client.chat.completions.create(**payload)
            except Exception as e:
                if _never_sent(e):
                    self.stats.requests -= 1  # a refused connection sent nothing: not a request
                    if self.ledger is not None:
                        self.ledger.unreserve()
                if ep is not None:
                    self.router.failed(ep, transport_kind(e), _never_sent(e))
                raise
            if not lean:
                if not resp.choices:
                    raise EmptyResponse("the server answered with no choices")
                ch = resp.choices[0]
                u = resp.usage
                pt = (u.prompt_tokens or 0) if u else 0
                ct = (u.completion_tokens or 0) if u else 0
                text = ch.message.content if ch.message is not None else None
                finish = ch.finish_reason
            self.stats.prompt_tokens += pt
            self.stats.completion_tokens += ct
            if self.ledger is not None:
                self.ledger.add(pt, ct)
            if lim is not None:
                lim.record_tokens(pt + ct, reserved, ct)
            ok = True
            if ep is not None:
                self.router.answered(ep)
            return {"text": text, "finish_reason": finish, "usage": [pt, ct]}
        finally:
            if ep is not None:
                self.router.release(ep)
            if lim is not None:
                lim.release(ok=ok)

    # -- structured output with re-asks ----------------------------------------------------
    async def structured(
        self,
        messages: list[dict],
        *,
        validate: Callable[[Any], T],
        schema: dict | None = None,
        name: str = "output",
        sample_index: int = 0,
        temperature: float | None = None,
        reask_template: str = "Your answer was rejected: ${detail}\nReturn a corrected JSON object only.",
    ) -> LLMResult[T]:
        """Ask until ``validate(parsed_json)`` returns a value or attempts run out.

        ``validate`` raises :class:`ValidationFailure` (or :class:`ParseError`) to reject; the
        next attempt appends ``reask_template`` with ``${detail}`` filled in (the stages pass
        the ``reask`` prompt template). A transport failure after all retries yields a result
        with reason ``transport_*``.
        """
        if self.transport is not None:
            self.transport.begin()
            try:
                return await self._structured(messages, validate, schema, name, sample_index, temperature, reask_template)
            finally:
                self.transport.end()
        return await self._structured(messages, validate, schema, name, sample_index, temperature, reask_template)

    async def _structured(self, messages, validate, schema, name, sample_index, temperature, reask_template) -> LLMResult:
        rf = response_format_for(self.cfg.structured_output, schema, name)
        msgs = list(messages)
        pt_sum = ct_sum = attempts = 0  # one Usage model at the end, not three per attempt
        reasons: list[str] = []
        raw: str | None = None
        reason, detail = None, ""
        for attempt in range(self.cfg.max_attempts):
            if attempt and self.cache is not None:
                self.cache.flush()  # the answer being re-asked is on disk before the re-ask leaves
            payload = self.payload(msgs, response_format=rf, temperature=temperature, sample_index=sample_index)
            try:
                out = await self.chat(payload, sample_index=sample_index)
            except TransportError as e:
                usage = Usage(prompt_tokens=pt_sum, completion_tokens=ct_sum, attempts=attempts + 1)
                return LLMResult(None, raw, e.reason, e.detail, usage, reasons + [e.reason])
            pt, ct = out["usage"]
            pt_sum, ct_sum, attempts = pt_sum + pt, ct_sum + ct, attempts + 1
            raw = out["text"]
            try:
                if out["finish_reason"] == "length":
                    raise ValidationFailure(
                        "truncated", "the answer was cut off at the token limit; answer more briefly with complete JSON"
                    )
                value = validate(extract_json(raw))
                return LLMResult(value, raw, None, "", Usage(prompt_tokens=pt_sum, completion_tokens=ct_sum, attempts=attempts), reasons)
            except (ValidationFailure, ParseError) as e:
                reason, detail = e.reason, e.detail
                reasons.append(reason)
                self.stats.failed_attempts[reason] += 1
            if attempt + 1 < self.cfg.max_attempts:
                self.stats.reasks += 1
                msgs = msgs + [
                    {"role": "assistant", "content": raw or ""},
                    {"role": "user", "content": Template(reask_template).safe_substitute(detail=detail)},
                ]
        return LLMResult(None, raw, reason, detail, Usage(prompt_tokens=pt_sum, completion_tokens=ct_sum, attempts=attempts), reasons)


def _never_sent(e: BaseException) -> bool:
    """The connection was refused (nothing reached the server): the request does not count."""
    if isinstance(e, ConnectFailed):
        return True
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(e, aiohttp.ClientConnectorError):
        return True
    if _openai_loaded() and isinstance(e, openai.APIConnectionError) and not isinstance(e, openai.APITimeoutError):
        c = e.__cause__ or e.__context__
        for _ in range(4):
            if c is None:
                break
            if isinstance(c, ConnectionRefusedError) or type(c).__name__ in ("ConnectError", "ClientConnectorError"):
                return True
            c = c.__cause__ or c.__context__
    return False


#: when most failed requests in a row failed like this, the server answers but something is
#: misconfigured (URL, model, request parameters): fix it, then rerun (the items are retried)
FATAL_KINDS = ("bad_request", "transport_bad_response", "transport_empty_choices")


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY``,
    minus ``NO_PROXY``), or None: what ``trust_env`` would resolve per request, resolved once."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    if not host or urllib.request.proxy_bypass(host if parts.port is None else f"{host}:{parts.port}"):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


def outage_message(base_url: str, cfg: LLMConfig, n: int, kinds: Counter, last: str, *, hanging: str | None = None) -> str:
    """One line: why the stage stopped after ``n`` failed requests in a row, and the likely cause.
    ``hanging``: the server(s) whose ``GET /models`` answers while no chat request does."""
    top = kinds.most_common(1)[0][0] if kinds else "transport"
    what = ", ".join(f"{k} {v}" for k, v in kinds.most_common())
    if hanging and "timeout" in top:
        hint = (
            f"{hanging} answers GET /models but no chat request within llm.timeout={cfg.timeout:g} s: the server hangs; "
            f"restart it (or raise llm.timeout if llm.model={cfg.model!r} is that slow)"
        )
    elif "connection" in top and "TLS handshake" in last:
        hint = tls_message(base_url, last)
    elif "connection" in top:
        hint = f"the server at {base_url} is down or unreachable; start it (or fix llm.base_url)"
    elif "timeout" in top:
        hint = f"the server at {base_url} did not answer within llm.timeout={cfg.timeout:g} s; check that it is up and serving llm.model={cfg.model!r}, or raise llm.timeout"
    elif "bad_response" in top or "empty_choices" in top:
        hint = f"{base_url} answers, but not with chat completions (an HTML page? a wrong path?); llm.base_url should end in /v1"
    elif "bad_request" in top:
        hint = f"{base_url} refuses the requests as bad ({last[:120]}); check llm.model={cfg.model!r}, llm.structured_output and llm.extra_body"
    elif "rate_limited" in top:
        hint = f"{base_url} keeps answering 429; lower llm.max_concurrency or set llm.rpm / llm.tpm"
    elif "batch" in top:
        hint = f"the Batch API at {base_url} failed ({last[:120]}); check the server"
    else:
        hint = f"the server at {base_url} keeps failing ({last[:120]})"
    if top in FATAL_KINDS:
        return f"{n} requests in a row failed ({what}): {hint}; then rerun the same command (the failed items are retried)"
    return f"{n} requests in a row failed ({what}): {hint}; the unfinished items are kept as pending, rerun the same command to resume"


_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_REDIRECTS = 5


def _origin(url: str) -> tuple[str, str, int | None]:
    from urllib.parse import urlsplit

    p = urlsplit(url)
    return p.scheme, (p.hostname or "").lower(), p.port or (443 if p.scheme == "https" else 80)


def redirect_target(base_url: str, url: str, status: int, headers: Any) -> str:
    """Where a redirect answer to ``url`` leads, when it is one to follow: a 307/308 on the same
    origin (same method and body, as aiohttp does). Any other is one line naming it (a fatal
    :class:`OutageStop`): a 301/302/303 would turn the POST into a GET, and the API key is never
    sent to another host."""
    from urllib.parse import urljoin

    loc = headers.get("location") or headers.get("Location")
    if not loc:
        raise OutageStop(f"llm.base_url={base_url} answered a {status} redirect without a Location; fix llm.base_url", True)
    new = urljoin(url, loc)
    suggest = (
        new[: -len("/chat/completions")]
        if new.endswith("/chat/completions")
        else new[: -len("/models")]
        if new.endswith("/models")
        else new
    )
    suggest = suggest[:200]
    if _origin(new) != _origin(url):
        raise OutageStop(
            f"llm.base_url={base_url} redirects ({status}) to another host, {suggest}; the API key is not sent there: set llm.base_url = {suggest!r} if you trust it",
            True,
        )
    if status not in (307, 308):
        raise OutageStop(
            f"llm.base_url={base_url} redirects ({status}) to {suggest}, which would turn the POST into a GET; set llm.base_url = {suggest!r}",
            True,
        )
    return new


def tls_message(url: str, detail: str) -> str:
    return (
        f"llm.base_url={url}: TLS failed ({detail[:200]}); the server's certificate is not trusted or not for this host: "
        "point SSL_CERT_FILE at its CA certificate, or fix llm.base_url (http:// for a plain server)"
    )


def _ssl_detail(e: BaseException) -> str:
    cause = getattr(e, "_certificate_error", None) or getattr(e, "os_error", None) or e
    detail = getattr(cause, "verify_message", None) or getattr(cause, "reason", None) or str(cause)
    host = getattr(getattr(e, "_conn_key", None), "host", None)
    port = getattr(getattr(e, "_conn_key", None), "port", None)
    return f"TLS handshake with {host}:{port} failed: {detail}" if host else f"TLS handshake failed: {detail}"


def _error_message(raw: bytes) -> str:
    try:
        obj = json.loads(raw)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    except ValueError:
        pass
    return raw[:200].decode("utf-8", "replace")


def _short(e: BaseException, n: int = 200) -> str:
    s = str(e).replace("\n", " ")
    return s if len(s) <= n else s[: n - 1] + "…"
