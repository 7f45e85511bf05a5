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
import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from string import Template
from typing import Any, Generic, TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from negsynth.llm.cache import RequestCache, request_key_and_body
from negsynth.llm.endpoints import EndpointSet
from negsynth.llm.errors import (
    BadResponse,
    BudgetStop,
    EmptyResponse,
    HTTPFault,
    LLMFatalError,
    OutageStop,
    TransportError,
    ValidationFailure,
    aiohttp_errors,
    never_sent,
    non_ascii_note,
    openai,
    openai_loaded,
    retry_after_seconds,
    shorten,
    transport_kind,
)
from negsynth.llm.keys import read_key
from negsynth.llm.outage import OutageWatch
from negsynth.llm.parsing import ParseError, extract_json
from negsynth.llm.prefix_pin import prefix_pin
from negsynth.llm.repeats import repeat_guard
from negsynth.llm.stats import ClientStats
from negsynth.llm.wire import Wire
from negsynth.schemas.config import LLMConfig
from negsynth.schemas.records import Usage

log = logging.getLogger(__name__)
for _name in ("openai", "httpx", "httpcore", "aiohttp"):
    logging.getLogger(_name).setLevel(logging.WARNING)

T = TypeVar("T")


@dataclass
class LLMResult(Generic[T]):
    value: T | None
    raw: str | None
    reason: str | None = None  # reject reason of the last attempt when value is None
    detail: str = ""
    usage: Usage = field(default_factory=Usage)
    reasons: list[str] = field(default_factory=list)  # reason of each failed attempt


def _with_cache_prompt(payload: dict, on: bool) -> dict:
    """``payload`` with llama-server's ``cache_prompt`` set (sent, never part of the cache key)."""
    return {**payload, "extra_body": {**(payload.get("extra_body") or {}), "cache_prompt": on}}


def resolve_api_key(cfg: LLMConfig) -> str:
    """Read the key from ``api_key_env`` or ``api_key_file``; local servers need none."""
    return read_key(cfg.api_key_env, cfg.api_key_file, "llm", LLMFatalError) or "sk-no-key-required"


def response_format_for(mode: str, schema: dict | None, name: str) -> dict | None:
    if schema is None or mode == "prompt":
        return None
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": False}}
    return {"type": "json_object", "schema": schema}  # llama.cpp / vLLM accept a schema here


class LLMClient(OutageWatch, Wire):
    """Bounded-concurrency chat client with caching, transport retries and validation re-asks.

    Use as ``async with LLMClient(cfg, base_url=..., cache=...) as llm:`` then
    ``await llm.structured(messages, schema=..., validate=fn, sample_index=i)``. Everything it
    works with is passed here (:func:`negsynth.llm.open_client` builds one from the config); the
    one part plugged in later is a transport that needs the client itself (:meth:`plugged`).

    Its parts by responsibility: this class sends one request (budget, retries, cache) and asks
    until an answer validates; the HTTP transport is :class:`~negsynth.llm.wire.Wire`'s, the
    failures in a row and the waits for a server that went away
    :class:`~negsynth.llm.outage.OutageWatch`'s, both mixed in (one object: the pipeline reads
    the outage on the client, the endpoint router opens and checks its per-URL clients).
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
        self._init_wire()
        #: the embedded llama-server's exact-repeat guard, or its prompt-prefix pin (None for every other server)
        self._pin = prefix_pin(base_url)
        self._repeats = repeat_guard(base_url) if self._pin is None else None
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
        """The single-URL client whose transport carries one endpoint's requests."""
        cfg = self.cfg.model_copy(update={"base_url": url, "max_concurrency": concurrency, "endpoints": []})
        return LLMClient(cfg, base_url=url, api_key=key)

    async def __aenter__(self) -> LLMClient:
        await self._open_wire()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._stop_probing()
        await self._close_wire()

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
            self._note_failure(e, sent)
            raise
        self._note_answer(sent)
        if key is not None:
            self.cache_answer(key, result)
        return {**result, "cached": False}

    def cache_answer(self, key: str, result: dict) -> None:
        """Keep an answer in the request cache, with the :attr:`stage` that asked for it."""
        self.cache.put(key, result if self.stage is None else {**result, "stage": self.stage})

    def backoff(self, exc: BaseException, attempt: int) -> float:
        """Seconds before retry ``attempt`` (1 = the first retry): ``Retry-After`` when the server
        gave one (capped by ``backoff_max``), else full-jitter exponential
        ``uniform(0, min(backoff_max, backoff_initial * 2 ** (attempt - 1)))``."""
        ra = retry_after_seconds(exc)
        if ra is not None:
            return min(ra, self.cfg.backoff_max)
        return random.uniform(0.0, min(self.cfg.backoff_max, self.cfg.backoff_initial * 2 ** (attempt - 1)))

    def _note_retry(self, e: BaseException, attempt: int) -> None:
        kind = transport_kind(e) or "other"
        self.stats.transport_retries[kind] += 1
        if self.limiter is not None and kind == "rate_limited":
            self.limiter.on_rate_limited(retry_after_seconds(e))
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
                    f"{self.base_url} answered 404 for model {self.cfg.model!r}; check llm.model and llm.base_url ({self._redact(shorten(e))})"
                ) from None
            kind = transport_kind(e)
            if kind is None:
                raise TransportError("bad_request", self._redact(shorten(e))) from None
            self.stats.transport_failures[kind] += 1
            raise TransportError("transport_" + kind, f"gave up after {self.cfg.max_retries} retries: {self._redact(shorten(e))}") from None
        except (TimeoutError, ConnectionError, BadResponse, EmptyResponse, *aiohttp_errors()) as e:
            kind = transport_kind(e) or "connection"
            self.stats.transport_failures[kind] += 1
            detail = shorten(e) or type(e).__name__
            raise TransportError("transport_" + kind, f"gave up after {self.cfg.max_retries} retries: {self._redact(detail)}") from None
        except Exception as e:
            # the SDK's errors (httpx transport, files/batches); not named in an except clause, so
            # an exception passing through (a cancellation) never imports openai on its way
            if not openai_loaded():
                raise
            self._raise_sdk_error(e)
        raise AssertionError("unreachable")  # pragma: no cover

    def _raise_sdk_error(self, e: Exception) -> None:
        """One of openai's exceptions as a fatal error or a transport failure; anything else as it is."""
        if isinstance(e, (openai.AuthenticationError, openai.PermissionDeniedError)):
            raise LLMFatalError(f"{self.base_url} refused the API key ({e.status_code}); check llm.api_key_env") from None
        if isinstance(e, openai.NotFoundError):
            raise LLMFatalError(
                f"{self.base_url} answered 404 for model {self.cfg.model!r}; check llm.model and llm.base_url ({self._redact(shorten(e))})"
            ) from None
        if isinstance(e, openai.APIStatusError):
            kind = transport_kind(e)
            if kind is None:
                raise TransportError("bad_request", f"HTTP {e.status_code}: {self._redact(shorten(e))}") from None
            self.stats.transport_failures[kind] += 1
            raise TransportError("transport_" + kind, f"gave up after {self.cfg.max_retries} retries: {self._redact(shorten(e))}") from None
        if isinstance(e, openai.APIConnectionError):
            kind = transport_kind(e) or "connection"
            self.stats.transport_failures[kind] += 1
            raise TransportError("transport_" + kind, f"gave up after {self.cfg.max_retries} retries: {self._redact(shorten(e))}") from None
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
                payload, body = _with_cache_prompt(payload, False), None
            try:
                # llm.timeout is a deadline for the whole request (a server that trickles its
                # answer byte by byte cannot hold it open): past it, a transport "timeout"
                async with asyncio.timeout(self.cfg.timeout):
                    if via._pin is not None and lean:
                        # a pinned embedded llama-server: its slot set to the request's prefix
                        # first, nothing else sent to it until the answer (negsynth.llm.prefix_pin)
                        async with via._pin.hold(payload["messages"]) as cache_prompt:
                            text, finish, pt, ct = await via._post_chat(_with_cache_prompt(payload, cache_prompt))
                    elif lean:
                        text, finish, pt, ct = await via._post_chat(payload, body)
                    else:
                        resp = await via._client.chat.completions.create(**payload)
            except Exception as e:
                if never_sent(e):
                    self.stats.requests -= 1  # a refused connection sent nothing: not a request
                    if self.ledger is not None:
                        self.ledger.unreserve()
                if ep is not None:
                    self.router.failed(ep, transport_kind(e), never_sent(e))
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
