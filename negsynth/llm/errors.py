"""What can go wrong talking to an LLM server: the exceptions the client raises, which faults are
worth a retry (:func:`transport_kind`), and the one-line messages that name a likely cause. The
SDK's exceptions are recognised without importing it (~1 s of CPU): only once the client has.
"""

from __future__ import annotations

import email.utils
import ssl
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import urljoin, urlsplit

from negsynth.errors import NegsynthError
from negsynth.schemas.config import LLMConfig


class LLMFatalError(NegsynthError, RuntimeError):
    """A fault no retry can fix (bad key, unknown model, unreachable server): stop the stage."""


class Failure(NegsynthError):
    """A short ``reason`` code and a one-line ``detail``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class ValidationFailure(Failure, ValueError):
    """Raised by a validate callback to reject an answer; ``detail`` is shown to the model."""


class TransportError(Failure, RuntimeError):
    """Transport retries exhausted for one request; the item becomes a reject, the stage goes on."""


class EmptyResponse(NegsynthError, RuntimeError):
    """The server answered 200 with no choices."""


class BadResponse(NegsynthError, RuntimeError):
    """A 200 whose body is not a chat completion (cut off, not JSON): retried like a reset."""


class NotSent(NegsynthError, ConnectionError):
    """Something before the request failed, so nothing was sent; retried as a connection fault."""


class BudgetStop(NegsynthError, RuntimeError):
    """A --max-* budget is spent: no new request is sent. The item stays unfinished (a rerun does it)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class OutageStop(BudgetStop):
    """Too many requests in a row failed: no new request is sent, the unfinished items stay pending.
    ``fatal``: the server answers but refuses or garbles every request, a setting to fix (exit 2)."""

    def __init__(self, reason: str, fatal: bool = False):
        super().__init__(reason)
        self.fatal = fatal


def _openai() -> Any:
    return sys.modules.get("openai")


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from, outermost first (the SDK wraps the socket's error twice)."""
    e: BaseException | None = exc
    for _ in range(8):
        if e is None:
            return
        yield e
        e = e.__cause__ or e.__context__


def status_code(exc: BaseException) -> int | None:
    """The HTTP status of an answer the SDK raised for (``openai.APIStatusError``), else None."""
    oa = _openai()
    return exc.status_code if oa is not None and isinstance(exc, oa.APIStatusError) else None


def transport_kind(exc: BaseException) -> str | None:
    """Classify a retryable transport fault, or None when the exception is not one."""
    code = status_code(exc)
    if code is not None:
        if code == 429:
            return "rate_limited"
        return f"http_{code}" if code in (408, 409, 425) or code >= 500 else None
    if isinstance(exc, TimeoutError):  # the client's own deadline (llm.timeout)
        return "timeout"
    if isinstance(exc, BadResponse):
        return "bad_response"
    if isinstance(exc, EmptyResponse):
        return "empty_choices"
    if isinstance(exc, ConnectionError):
        return "connection"
    oa = _openai()
    if oa is not None and isinstance(exc, oa.APIConnectionError):
        # the SDK's aiohttp transport reports a reset or a refused connection as a connect timeout:
        # what happened is the socket's error at the end of the chain. A server that took the
        # request and never answered is a timeout; one that cannot be reached is a connection fault
        for c in causes(exc):
            if isinstance(c, TimeoutError) and type(c).__name__ != "ConnectionTimeoutError":
                return "timeout"
        return "connection"
    return None


def never_sent(exc: BaseException) -> bool:
    """Nothing reached the server (the connection was refused or never made): not a request."""
    for c in causes(exc):
        if isinstance(c, (NotSent, ConnectionRefusedError)) or type(c).__name__ == "ClientConnectorError":
            return True
    return False


def tls_failure(exc: BaseException) -> str | None:
    """``TLS handshake with HOST:PORT failed: why`` when a TLS handshake failed on the way, else None."""
    for c in causes(exc):
        if isinstance(c, ssl.SSLError):
            inner = getattr(c, "certificate_error", None) or getattr(c, "os_error", None) or c  # aiohttp's wrapper
            why = getattr(inner, "verify_message", None) or getattr(inner, "reason", None) or str(inner)
            host, port = getattr(c, "host", None), getattr(c, "port", None)
            return f"TLS handshake with {host}:{port} failed: {why}" if host else f"TLS handshake failed: {why}"
    return None


def refused(exc: BaseException) -> bool:
    return any(isinstance(c, ConnectionRefusedError) for c in causes(exc))


def retry_after_seconds(exc: BaseException) -> float | None:
    """The wait a fault's ``Retry-After-Ms`` / ``Retry-After`` header asks for (seconds or an HTTP
    date), or None when it names none."""
    headers = getattr(exc, "headers", None) or getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
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


#: failures that say the server answers but something is misconfigured (URL, model, parameters)
FATAL_KINDS = ("bad_request", "transport_bad_response", "transport_empty_choices")


def outage_message(base_url: str, cfg: LLMConfig, n: int, kinds: Counter, last: str, *, hanging: str | None = None) -> str:
    """One line: why the stage stopped after ``n`` failed requests in a row, and the likely cause.
    ``hanging``: the server(s) that took the requests and answered none in time."""
    top = kinds.most_common(1)[0][0] if kinds else "transport"
    what = ", ".join(f"{k} {v}" for k, v in kinds.most_common())
    if hanging and "timeout" in top:
        hint = (
            f"{hanging} took chat requests and answered none within llm.timeout={cfg.timeout:g} s: the server hangs; "
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


def unreachable_message(url: str, e: BaseException, timeout: float) -> str:
    """One line for an endpoint that did not answer ``GET /models``."""
    tls = tls_failure(e)
    if tls:
        return tls_message(url, tls)
    if refused(e):
        return f"cannot reach llm.base_url={url}: connection refused; start the server (negsynth serve) or fix llm.base_url"
    if transport_kind(e) == "timeout":
        return f"llm.base_url={url} did not answer within {timeout:.0f} s; check the URL or the server"
    root = list(causes(e))[-1]
    return f"cannot reach llm.base_url={url}: {shorten(root, 120) or type(root).__name__}; start the server or fix llm.base_url"


def tls_message(url: str, detail: str) -> str:
    return (
        f"llm.base_url={url}: TLS failed ({detail[:200]}); the server's certificate is not trusted or not for this host: "
        "point SSL_CERT_FILE at its CA certificate, or fix llm.base_url (http:// for a plain server)"
    )


def redirect_message(base_url: str, url: str, status: int, location: str | None) -> str:
    """One line for a redirect answered to ``url`` (never followed: a 301/302/303 would turn the POST
    into a GET, and the key is never sent to another host), naming the ``llm.base_url`` to set."""
    if not location:
        return f"llm.base_url={base_url} answered a {status} redirect without a Location; fix llm.base_url"
    new = urljoin(url, location)
    for tail in ("/chat/completions", "/models"):
        if new.endswith(tail):
            new = new[: -len(tail)]
    new = new[:200]
    a, b = urlsplit(url), urlsplit(new)
    if (a.scheme, a.hostname, a.port) != (b.scheme, b.hostname, b.port):
        return f"llm.base_url={base_url} redirects ({status}) to another host, {new}; the API key is not sent there: set llm.base_url = {new!r} if you trust it"
    return f"llm.base_url={base_url} redirects ({status}) to {new}; set llm.base_url = {new!r}"


def shorten(e: BaseException, n: int = 200) -> str:
    """An exception's text on one line, at most ``n`` characters (it may reach a reject record)."""
    s = str(e).replace("\n", " ")
    return s if len(s) <= n else s[: n - 1] + "…"
