"""How a chat request travels: the HTTP side of :class:`~negsynth.llm.client.LLMClient`.

One of three paths, by ``llm.transport``: ``"http1"`` (the lean path: keep-alive HTTP/1.1 on
asyncio, :class:`~negsynth.llm.http1.H1Pool`; aiohttp stands in when the environment names a
proxy), ``"aiohttp"``, or ``"httpx"`` (the openai SDK, which files/batches use on every path).
Here are opening and closing them, the preflight check, one chat request on the lean path with
its redirects, and the cheap probe that tells whether a server that went away answers again.

The client's retries, budget and cache sit above this (:mod:`negsynth.llm.client`); how a fault
is classified and worded is :mod:`negsynth.llm.errors`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from negsynth.data import jsonfast
from negsynth.llm.endpoints import EndpointSet
from negsynth.llm.errors import (
    BadResponse,
    EmptyResponse,
    HTTPFault,
    LLMFatalError,
    OutageStop,
    non_ascii_note,
    openai,
    tls_message,
)
from negsynth.llm.http1 import ConnectFailed, H1Pool, TLSFailed
from negsynth.schemas.config import LLMConfig


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


class Wire:
    """The transport half of :class:`~negsynth.llm.client.LLMClient`, mixed into it (one object:
    the endpoint router opens, checks and closes its per-URL clients through these methods).

    The client sets ``cfg``, ``base_url``, ``router`` and ``_api_key`` and calls :meth:`_init_wire`
    from its constructor. A redirect that no request can follow sets the outage bookkeeping's
    ``outage`` (:class:`~negsynth.llm.outage.OutageWatch`): every later request would meet it.
    """

    cfg: LLMConfig
    base_url: str
    router: EndpointSet | None
    _api_key: str
    outage: str | None
    outage_fatal: bool

    def _init_wire(self) -> None:
        """Nothing open yet: ``async with`` the client opens the transport (:meth:`_open_wire`)."""
        self._client: openai.AsyncOpenAI | None = None
        self._pool: H1Pool | None = None  # the lean path (llm.transport = "http1")
        self._session: Any | None = None  # aiohttp.ClientSession: "aiohttp", or "http1" through a proxy
        self._proxy: str | None = None

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

    async def _open_wire(self) -> None:
        """Open the transport ``llm.transport`` names (each endpoint's own with ``llm.endpoints``)."""
        if self.router is not None:  # each endpoint opens its own transport
            await self.router.open()
            return
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

    async def _close_wire(self) -> None:
        """Close whatever :meth:`_open_wire` opened (and the SDK client, when one was made)."""
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

    def _connected(self) -> bool:
        """Whether the transport is open (every endpoint's, with ``llm.endpoints``): only then can
        a probe tell that a server that went away answers again."""
        return (
            (self.router is not None and self.router.opened)
            or self._pool is not None
            or self._session is not None
            or self._client is not None
        )

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
            except TimeoutError:
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
