"""An async client for any OpenAI-compatible chat-completions endpoint; it knows nothing of MGH.

Every request is a plain ``POST /chat/completions`` through the openai SDK on aiohttp (proxies
from ``HTTP(S)_PROXY``, TLS from the system and ``SSL_CERT_FILE``). Two retry layers, kept apart:
transport faults (429, 408/409/5xx, timeouts, resets, empty ``choices``) are retried with jittered
backoff and never shown to the model; an answer that fails to parse or validate is sent back with
the error, up to ``llm.max_attempts``. Every answer is in the request cache before it is used.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from string import Template
from typing import Any, Generic, TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from negsynth.data import jsonfast
from negsynth.errors import UserError
from negsynth.llm.cache import RequestCache, request_key_and_body
from negsynth.llm.endpoints import EndpointSet, read_key
from negsynth.llm.errors import (
    BadResponse,
    BudgetStop,
    EmptyResponse,
    LLMFatalError,
    OutageStop,
    TransportError,
    ValidationFailure,
    never_sent,
    redirect_message,
    refused,
    retry_after_seconds,
    shorten,
    status_code,
    tls_failure,
    transport_kind,
    unreachable_message,
)
from negsynth.llm.outage import OutageWatch
from negsynth.llm.parsing import extract_json
from negsynth.llm.prefix_pin import guard
from negsynth.llm.ratelimit import RateLimiter, rate_limiter
from negsynth.schemas.config import LLMConfig
from negsynth.schemas.records import Usage

log = logging.getLogger(__name__)
for _name in ("openai", "httpx", "httpx2", "httpcore", "aiohttp"):
    logging.getLogger(_name).setLevel(logging.WARNING)

T = TypeVar("T")


@dataclass
class ClientStats:
    """A client's counters: the budget gate reads them before each request, stats.json records them."""

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
        d = {k: dict(v) if isinstance(v, Counter) else v for k, v in vars(self).items()}
        return {**d, "outage_wait_s": round(self.outage_wait_s, 3)}


@dataclass
class LLMResult(Generic[T]):
    value: T | None
    raw: str | None
    reason: str | None = None  # reject reason of the last attempt when value is None
    detail: str = ""
    usage: Usage = field(default_factory=Usage)
    reasons: list[str] = field(default_factory=list)  # reason of each failed attempt


def resolve_api_key(cfg: LLMConfig) -> str:
    """Read the key from ``api_key_env`` or ``api_key_file``; local servers need none."""
    return read_key(cfg.api_key_env, cfg.api_key_file, "llm", LLMFatalError) or "sk-no-key-required"


def response_format_for(mode: str, schema: dict | None, name: str) -> dict | None:
    if schema is None or mode == "prompt":
        return None
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": False}}
    return {"type": "json_object", "schema": schema}  # llama.cpp / vLLM accept a schema here


def answer_of(completion: dict) -> dict:
    """``{"text", "finish_reason", "usage": [prompt_tokens, completion_tokens]}`` of a chat
    completion that has choices: what the client returns and caches."""
    ch = completion["choices"][0]
    u = completion.get("usage") or {}
    msg = ch.get("message") or {}
    return {
        "text": msg.get("content"),
        "finish_reason": ch.get("finish_reason"),
        "usage": [u.get("prompt_tokens") or 0, u.get("completion_tokens") or 0],
    }


def read_completion(raw: bytes) -> dict:
    try:
        obj = jsonfast.loads(raw)
        choices = obj.get("choices")
    except (ValueError, AttributeError):
        raise BadResponse(f"the server answered 200 with a body that is not a chat completion ({len(raw)} bytes)") from None
    if not choices:
        raise EmptyResponse("the server answered with no choices")
    return answer_of(obj)


class LLMClient(OutageWatch):
    """Bounded-concurrency chat client with caching, transport retries and validation re-asks.

    ``async with LLMClient(cfg, base_url=..., cache=...) as llm:`` then ``await
    llm.structured(messages, schema=..., validate=fn, sample_index=i)``; :func:`open_client` builds
    one from the config. The outage bookkeeping is :class:`~negsynth.llm.outage.OutageWatch`'s."""

    def __init__(
        self,
        cfg: LLMConfig,
        *,
        base_url: str,
        api_key: str | None = None,
        cache: RequestCache | None = None,
        limiter: RateLimiter | None = None,
        gate: Callable[[ClientStats], str | None] | None = None,
        ledger: Any | None = None,
        on_wait: Callable[[str, bool], None] | None = None,
        stage: str | None = None,
    ):
        self.cfg = cfg
        #: who asks (the stage's name), recorded with each answer cached (never part of its key)
        self.stage = stage
        self.base_url = base_url
        self.cache = cache if cfg.cache else None
        self.stats = ClientStats()
        self.limiter = limiter or rate_limiter(cfg)
        #: a budget: called with the counters before every request; a reason stops it
        self.gate = gate
        #: a budget shared by processes: ``await reserve()`` (a reason stops it), ``unreserve()``, ``add(pt, ct)``
        self.ledger = ledger
        #: batch mode (set by ``open_client``): ``await transport.submit(key, payload)`` answers instead of a live request
        self.transport: Any | None = None
        self._sem = asyncio.Semaphore(cfg.total_concurrency)
        self._api_key = api_key if api_key is not None else resolve_api_key(cfg)
        self._sdk: Any = None  # the openai SDK client, made on first use
        #: llm.endpoints: several servers, one picked per attempt (None: ``base_url`` alone)
        self.router: EndpointSet | None = None
        if cfg.endpoints:
            self.router = EndpointSet(cfg, self._api_key, self._endpoint_client)
            self.base_url = self.router.describe()
        #: the embedded llama-server's exact-repeat guard or prompt-prefix pin (None for every other server)
        self._guard = guard(base_url)
        self._init_watch()
        #: told (one line) when a wait for the server begins and ends; the stage shows it
        self.on_wait = on_wait

    def _redact(self, text: str) -> str:
        """Servers sometimes quote the key they got in an error; such text may reach a reject record."""
        for k in (self._api_key, *(self.router.keys() if self.router is not None else ())):
            if k and len(k) >= 8 and k in text:
                text = text.replace(k, "[redacted]")
        return text

    def _endpoint_client(self, url: str, key: str, concurrency: int) -> LLMClient:
        cfg = self.cfg.model_copy(update={"base_url": url, "max_concurrency": concurrency, "endpoints": []})
        return LLMClient(cfg, base_url=url, api_key=key)

    @property
    def sdk(self) -> Any:
        """The ``openai.AsyncOpenAI`` client of this URL: no retries of its own (the client's are
        above it), no redirect followed (one is a line naming the URL to set), ``llm.connect_timeout``."""
        if self._sdk is None:
            import openai

            timeout = openai.Timeout(None, connect=self.cfg.connect_timeout)
            try:
                http = openai.DefaultAioHttpClient(timeout=timeout, follow_redirects=False)
            except OSError as e:  # the TLS trust store the environment names cannot be read
                where = ", ".join(f"{v}={os.environ[v]}" for v in ("SSL_CERT_FILE", "SSL_CERT_DIR") if os.environ.get(v))
                raise LLMFatalError(
                    f"cannot load the TLS certificates ({where or 'the system store'}): {e.strerror or e}; fix or unset SSL_CERT_FILE / SSL_CERT_DIR"
                ) from None
            self._sdk = openai.AsyncOpenAI(base_url=self.base_url, api_key=self._api_key, max_retries=0, timeout=timeout, http_client=http)
        return self._sdk

    async def __aenter__(self) -> LLMClient:
        if self.router is not None:  # each endpoint's own client carries its requests
            await self.router.open()
        else:
            self.sdk  # noqa: B018 - opened now, so that an outage can be waited out
        return self

    async def __aexit__(self, *exc) -> None:
        await self._stop_waiting()
        if self.router is not None:
            await self.router.close()
        if self._sdk is not None:
            await self._sdk.close()
            self._sdk = None

    def _opened(self) -> bool:
        return self._sdk is not None or (self.router is not None and self.router.opened)

    async def preflight(self, timeout: float = 10.0) -> None:
        """One line in the first seconds when the endpoint is unreachable or refuses the key (``GET /models``)."""
        if self.router is not None:
            return await self.router.preflight(timeout)
        url = self.base_url
        try:
            async with asyncio.timeout(timeout):
                await self.sdk.get("/models", cast_to=bytes, options={"timeout": timeout})
        except Exception as e:
            code = status_code(e)
            if code is None:
                raise UserError(unreachable_message(url, e, timeout)) from None
            if 300 <= code < 400:
                raise UserError(redirect_message(url, url + "/models", code, e.response.headers.get("location"))) from None
            if code in (401, 403):
                raise UserError(f"llm.base_url={url} refused the API key (HTTP {code}); check llm.api_key_env") from None

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
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.stats.cache_hits += 1
                hit.pop("stage", None)  # who asked first: the cache's record, not part of the answer
                return {**hit, "cached": True}
        trial = await self._held()  # while the server is waited for: held, or sent alone as the wait's probe
        sent = self._sent
        try:
            if self.transport is not None:
                result = await self.transport.submit(key, payload)
                self.consecutive_failures = 0
                return {**result, "cached": False}  # the batch transport stored it in the cache
            async with self._sem:
                self._sent += 1
                sent = self._sent
                result = await self._send_with_retries(payload, body, retries=0 if trial is not None else self.cfg.max_retries)
            self._note_answer(sent, trial)
        except TransportError as e:
            self._note_failure(e, sent, trial)
            raise
        finally:
            self._trial_done(trial)
        if self.cache is not None:
            self.cache_answer(key, result)
        return {**result, "cached": False}

    def cache_answer(self, key: str, result: dict) -> None:
        self.cache.put(key, result if self.stage is None else {**result, "stage": self.stage})

    def backoff(self, exc: BaseException, attempt: int) -> float:
        """Seconds before retry ``attempt`` (1 = the first): ``Retry-After``, else full-jitter exponential."""
        ra = retry_after_seconds(exc)
        if ra is not None:
            return min(ra, self.cfg.backoff_max)
        return random.uniform(0.0, min(self.cfg.backoff_max, self.cfg.backoff_initial * 2 ** (attempt - 1)))

    def _note_retry(self, e: BaseException, attempt: int) -> None:
        kind = transport_kind(e) or "other"
        self.stats.transport_retries[kind] += 1
        if kind == "rate_limited":
            self.limiter.on_rate_limited(retry_after_seconds(e))
        log.debug("transport fault %s (attempt %d), retrying", kind, attempt)

    async def _send_with_retries(self, payload: dict, body: bytes | None, retries: int) -> dict:
        # one plain call; tenacity only after a transport fault (around every call it cost ~5 % of the CPU)
        try:
            try:
                return await self._send(payload, body)
            except Exception as first:
                if transport_kind(first) is None or retries == 0:
                    raise
                self._note_retry(first, 1)
                await asyncio.sleep(self.backoff(first, 1))
            retrying = AsyncRetrying(
                stop=stop_after_attempt(retries),
                wait=lambda st: self.backoff(st.outcome.exception(), st.attempt_number + 1),
                retry=retry_if_exception(lambda e: transport_kind(e) is not None),
                before_sleep=lambda st: self._note_retry(st.outcome.exception(), st.attempt_number + 1),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    return await self._send(payload, body)
        except (BudgetStop, LLMFatalError):
            raise
        except Exception as e:
            self._raise_failure(e, retries)
        raise AssertionError("unreachable")  # pragma: no cover

    def _raise_failure(self, e: Exception, retries: int) -> None:
        """A request that failed for good, as the one error that says why: a setting to fix
        (:class:`LLMFatalError`, :class:`OutageStop`) or a :class:`TransportError` (the item's)."""
        code = status_code(e)
        if code is not None and 300 <= code < 400:  # a redirect: every request would meet it
            self.outage, self.outage_fatal = (
                redirect_message(self.base_url, str(e.request.url), code, e.response.headers.get("location")),
                True,
            )
            raise OutageStop(self.outage, True) from None
        if code in (401, 403):
            raise LLMFatalError(f"{self.base_url} refused the API key ({code}); check llm.api_key_env") from None
        if code == 404:
            raise LLMFatalError(
                f"{self.base_url} answered 404 for model {self.cfg.model!r}; check llm.model and llm.base_url ({self._redact(shorten(e))})"
            ) from None
        kind = transport_kind(e)
        if kind is None:
            if code is None:
                raise e
            raise TransportError("bad_request", f"HTTP {code}: {self._redact(shorten(e))}") from None
        self.stats.transport_failures[kind] += 1
        detail = tls_failure(e) or (shorten(e) or type(e).__name__)
        if kind == "connection" and refused(e):
            detail = f"connection refused ({detail})"
        raise TransportError("transport_" + kind, f"gave up after {retries} retries: {self._redact(detail)}") from None

    async def _post(self, payload: dict, body: bytes | None) -> bytes:
        """The raw answer to ``payload`` (or ``body``, its serialised form); ``extra_body`` keys go to
        the top level, as the SDK's typed methods do."""
        extra = payload.get("extra_body")
        if extra is not None or body is None:
            merged = {k: v for k, v in payload.items() if k != "extra_body"}
            merged.update(extra or {})
            body = jsonfast.dumps(merged)
        return await self.sdk.post("/chat/completions", cast_to=bytes, content=body)

    async def count_request(self) -> None:
        """Count one request about to be sent, or raise :class:`BudgetStop` when a budget says no (the
        gate and the count with no await between them: concurrent senders never overshoot)."""
        if self.gate is not None:
            why = self.gate(self.stats)
            if why is not None:
                raise BudgetStop(why)
        if self.ledger is not None:
            why = await self.ledger.reserve()
            if why is not None:
                raise BudgetStop(why)
        self.stats.requests += 1

    async def _send(self, payload: dict, body: bytes | None = None) -> dict:
        lim = self.limiter
        reserved = await lim.acquire(payload)
        ok = False
        ep = None  # with llm.endpoints: the endpoint this attempt goes to, and its client
        via = self
        try:
            if self.router is not None:
                ep = await self.router.acquire()
                via = ep.client
            if self.outage is not None:
                raise OutageStop(self.outage, self.outage_fatal)
            await self.count_request()
            if ep is not None:
                ep.requests += 1
            try:
                # llm.timeout is a deadline for the whole request (a server that trickles its
                # answer byte by byte cannot hold it open): past it, a transport "timeout"
                async with asyncio.timeout(self.cfg.timeout):
                    if via._guard is None:
                        raw = await via._post(payload, body)
                    else:  # an embedded llama-server: its answer a fresh server's (negsynth.llm.prefix_pin)
                        async with via._guard.hold(payload["messages"]) as cache_prompt:
                            if cache_prompt is not None:  # sent, never part of the cache key
                                extra = {**(payload.get("extra_body") or {}), "cache_prompt": cache_prompt}
                                payload, body = {**payload, "extra_body": extra}, None
                            raw = await via._post(payload, body)
                answer = read_completion(raw)
            except Exception as e:
                if never_sent(e):
                    self.stats.requests -= 1  # a refused connection sent nothing: not a request
                    if self.ledger is not None:
                        self.ledger.unreserve()
                if ep is not None:
                    self.router.failed(ep, transport_kind(e), never_sent(e))
                raise
            pt, ct = answer["usage"]
            self.stats.prompt_tokens += pt
            self.stats.completion_tokens += ct
            if self.ledger is not None:
                self.ledger.add(pt, ct)
            lim.record_tokens(pt + ct, reserved, ct)
            ok = True
            if ep is not None:
                self.router.answered(ep)
            return answer
        finally:
            if ep is not None:
                self.router.release(ep)
            lim.release(ok=ok)

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
        """Ask until ``validate(parsed_json)`` returns a value or attempts run out. ``validate``
        raises :class:`ValidationFailure` to reject; the next attempt appends ``reask_template``
        with ``${detail}`` filled in. A transport failure after all retries yields a result with
        reason ``transport_*``."""
        batch = self.transport  # told when an item begins and ends: its round goes out once every item waits
        if batch is not None:
            batch.begin()
        try:
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
                    usage = Usage(prompt_tokens=pt_sum, completion_tokens=ct_sum, attempts=attempts)
                    return LLMResult(value, raw, None, "", usage, reasons)
                except ValidationFailure as e:  # a ParseError too
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
        finally:
            if batch is not None:
                batch.end()
