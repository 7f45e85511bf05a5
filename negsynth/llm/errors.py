"""What can go wrong talking to an LLM server: the exceptions the client raises, which faults are
worth a retry (:func:`transport_kind`), and the one-line messages that name a likely cause.

None of this holds state: the client (:mod:`negsynth.llm.client`, which re-exports these names),
its transport (:mod:`negsynth.llm.wire`) and its outage bookkeeping (:mod:`negsynth.llm.outage`)
all classify and word a fault the same way from here.
"""

from __future__ import annotations

import asyncio
import email.utils
import sys
import time
from collections import Counter
from typing import Any

from negsynth.errors import NegsynthError
from negsynth.llm.http1 import ConnectFailed, ProtocolFault
from negsynth.llm.keys import char_name
from negsynth.schemas.config import LLMConfig


class _OpenAIOnUse:
    """The ``openai`` module, imported on first use: the lean aiohttp chat path never needs it,
    and importing it costs ~0.9 s of CPU at every start (files/batches and the httpx transport
    import it when they run). An exception can only be an openai one once openai is imported,
    so :func:`openai_loaded` guards the checks that classify exceptions."""

    def __getattr__(self, name: str) -> Any:
        import openai as module

        return getattr(module, name)


openai = _OpenAIOnUse()


def openai_loaded() -> bool:
    """Whether openai is imported (else no exception can be one of its own)."""
    return "openai" in sys.modules


def aiohttp_errors() -> tuple[type[BaseException], ...]:
    """aiohttp's base error once aiohttp is imported (only the proxy path imports it: ~0.3 s at start)."""
    mod = sys.modules.get("aiohttp")
    return (mod.ClientError,) if mod is not None else ()


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
    if isinstance(exc, (ConnectionError, *aiohttp_errors())):
        return "connection"
    if isinstance(exc, EmptyResponse):
        return "empty_choices"
    if not openai_loaded():
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


def retry_after_seconds(exc: BaseException) -> float | None:
    """The wait a fault's ``Retry-After-Ms`` / ``Retry-After`` header asks for (seconds or an HTTP
    date), or None when it names none."""
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


def never_sent(e: BaseException) -> bool:
    """The connection was refused (nothing reached the server): the request does not count."""
    if isinstance(e, ConnectFailed):
        return True
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(e, aiohttp.ClientConnectorError):
        return True
    if openai_loaded() and isinstance(e, openai.APIConnectionError) and not isinstance(e, openai.APITimeoutError):
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


def non_ascii_note(key: str) -> str:
    """For a refused key: its first non-ASCII character, named (never the key), or ''."""
    for i, c in enumerate(key):
        if ord(c) > 127:
            return f"; the key has the non-ASCII character {char_name(c)} at position {i + 1}, which API keys never have"
    return ""


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


def tls_message(url: str, detail: str) -> str:
    """One line for a failed TLS handshake with ``url``: what failed and the two usual fixes."""
    return (
        f"llm.base_url={url}: TLS failed ({detail[:200]}); the server's certificate is not trusted or not for this host: "
        "point SSL_CERT_FILE at its CA certificate, or fix llm.base_url (http:// for a plain server)"
    )


def shorten(e: BaseException, n: int = 200) -> str:
    """An exception's text on one line, at most ``n`` characters (it may reach a reject record)."""
    s = str(e).replace("\n", " ")
    return s if len(s) <= n else s[: n - 1] + "…"
