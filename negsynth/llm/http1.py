"""A lean HTTP/1.1 client for the chat hot path, on asyncio's own transports.

An LLM stage sends thousands of small JSON POSTs to one host. aiohttp spends ~0.5 ms of CPU on
each (request and response objects, cookie jar, tracing hooks, timeouts per read); this client
spends ~0.25 ms (``benchmarks/llm_throughput.py``, ``raw-h1`` beside ``raw``). It does what an
OpenAI-compatible endpoint needs and nothing more:

* keep-alive connections to one origin, one request at a time on each, at most ``limit`` open;
  one the server closed while idle is noticed (its FIN arrives on the event loop) and not reused;
* ``http`` and ``https`` (TLS through :mod:`ssl`, the system's certificates);
* bodies framed by ``Content-Length``, ``Transfer-Encoding: chunked`` or the end of the
  connection; ``gzip`` / ``deflate`` answers decoded; ``1xx`` interim answers skipped;
  ``Connection: close`` and HTTP/1.0 answers honoured.

A request is never re-sent here: a connection lost after the request left is a
:class:`ConnectionResetError` for the caller's retry layer to count and retry.

Not here: proxies, cookies, HTTP/2; redirects are the caller's (the client follows a 307/308
on the same origin, as aiohttp does, and names any other in one line). With a proxy in the environment
:class:`~negsynth.llm.client.LLMClient` uses aiohttp instead. Errors are the standard ones: a
refused or failed connect is :class:`ConnectFailed` (nothing was sent), a connection lost
mid-answer is :class:`ConnectionResetError`, a malformed answer is :class:`ProtocolFault`.
Timeouts are the caller's (``asyncio.timeout`` around :meth:`H1Pool.request`); the connect has
its own ``connect_timeout``.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ConnectFailed", "H1Pool", "ProtocolFault", "Response", "TLSFailed"]


class ConnectFailed(ConnectionError):
    """The connection could not be opened (refused, unresolvable host, connect timeout): nothing was sent."""


class TLSFailed(ConnectFailed):
    """The TCP connection opened but the TLS handshake failed (an untrusted or wrong certificate,
    a plain-HTTP server on an https URL): nothing was sent."""


class ProtocolFault(ConnectionError):
    """The server's bytes are not an HTTP/1.x answer."""


class Response:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status = status
        self.headers = headers  # names lower-cased; a repeated header keeps its last value
        self.body = body


_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 64 * 1024


class _Connection(asyncio.Protocol):
    """One socket; parses the answer to the request in flight as its bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.buf = bytearray()
        self.reusable = True
        self.received = 0  # bytes of the current answer received so far
        self.method = "POST"
        self._reset_answer()

    def _reset_answer(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.framing = ""  # "" = reading the head; "length" | "chunked" | "eof"
        self.remaining = 0
        self.chunks: list[bytes] = []
        self.keep_alive = True

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes with no request in flight: this connection is out of step
            self.reusable = False
            return
        self.received += len(data)
        self.buf += data
        try:
            self._parse()
        except ProtocolFault as e:
            self._fail(e)

    def eof_received(self) -> bool:
        if self.waiter is not None and self.framing == "eof":
            self._finish(bytes(self.buf))
            self.buf.clear()
        self.reusable = False
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            if self.framing == "eof":
                self._finish(bytes(self.buf))
                return
            err = ConnectionResetError(f"the server closed the connection ({self.received} bytes of the answer received)")
            if exc is not None:
                err.__cause__ = exc
            self.waiter.set_exception(err)
        self.waiter = None

    # -- parsing ---------------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self.buf
        while self.waiter is not None:
            if not self.framing:
                end = buf.find(_HEAD_END)
                if end < 0:
                    if len(buf) > _MAX_HEAD:
                        raise ProtocolFault(f"answer head longer than {_MAX_HEAD} bytes")
                    return
                self._head(bytes(buf[:end]))
                del buf[: end + 4]
                continue
            if self.framing == "length":
                if len(buf) < self.remaining:
                    return
                body = bytes(buf[: self.remaining])
                del buf[: self.remaining]
                self._finish(body)
                return
            if self.framing == "chunked":
                if not self._chunks():
                    return
                continue
            return  # "eof": everything until the server closes

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
            raise ProtocolFault(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        status = int(status_line[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolFault(f"malformed header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:  # 100 Continue and friends: the real answer follows
            return
        self.status, self.headers = status, headers
        conn = headers.get("connection", "").lower()
        self.keep_alive = "close" not in conn and (status_line[0] != "HTTP/1.0" or "keep-alive" in conn)
        if status in (204, 304) or self.method == "HEAD":
            self.framing, self.remaining = "length", 0
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self.framing = "chunked"
        elif "content-length" in headers:
            try:
                self.framing, self.remaining = "length", int(headers["content-length"])
            except ValueError:
                raise ProtocolFault(f"bad Content-Length {headers['content-length'][:40]!r}") from None
        else:
            self.framing, self.keep_alive = "eof", False

    def _chunks(self) -> bool:
        """Consume whole chunks from the buffer; True when the body (and trailers) are complete."""
        buf = self.buf
        while True:
            if self.remaining:  # inside a chunk: its data and CRLF
                if len(buf) < self.remaining + 2:
                    return False
                self.chunks.append(bytes(buf[: self.remaining]))
                del buf[: self.remaining + 2]
                self.remaining = 0
            eol = buf.find(b"\r\n")
            if eol < 0:
                return False
            size_text = bytes(buf[:eol]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolFault(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:  # last chunk, then trailers up to an empty line
                if buf[eol + 2 : eol + 4] == b"\r\n":
                    del buf[: eol + 4]
                else:
                    end = buf.find(_HEAD_END, eol)
                    if end < 0:
                        return False
                    del buf[: end + 4]
                self._finish(b"".join(self.chunks))
                return True
            del buf[: eol + 2]
            self.remaining = size

    def _finish(self, body: bytes) -> None:
        coding = self.headers.get("content-encoding", "").lower()
        if coding in ("gzip", "x-gzip", "deflate"):
            try:
                body = zlib.decompress(body, 47)  # 32 + 15: gzip or zlib header, detected
            except zlib.error:
                if coding != "deflate":
                    self._fail(ProtocolFault(f"the answer is not valid {coding}"))
                    return
                try:
                    body = zlib.decompress(body, -15)  # raw deflate, as some servers send it
                except zlib.error:
                    self._fail(ProtocolFault("the answer is not valid deflate"))
                    return
        waiter, self.waiter = self.waiter, None
        if not self.keep_alive:
            self.reusable = False
        resp = Response(self.status, self.headers, body)
        self._reset_answer()
        if waiter is not None and not waiter.done():
            waiter.set_result(resp)

    def _fail(self, exc: Exception) -> None:
        self.reusable = False
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    # -- one exchange ----------------------------------------------------------------------
    def send(self, data: bytes, method: str) -> asyncio.Future:
        self.method = method
        self.received = 0
        self._reset_answer()
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)  # type: ignore[union-attr]
        return self.waiter

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()


def ssl_errors() -> tuple[type[BaseException], ...]:
    """ssl's errors when ssl is imported (an https pool imports it), else none."""
    import sys

    mod = sys.modules.get("ssl")
    return (mod.SSLError, mod.CertificateError) if mod is not None else ()


class H1Pool:
    """Keep-alive connections to the origin of ``base_url``.

    ``headers`` go with every request (authorization, content type); ``limit`` caps open
    connections (callers bound their own concurrency; this is a backstop).
    """

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None, limit: int = 100, connect_timeout: float = 10.0):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        host_header = self.host if ":" not in self.host else f"[{self.host}]"
        if not default_port:
            host_header += f":{self.port}"
        fixed = {"Host": host_header, **(headers or {})}
        # UTF-8, as aiohttp encodes header values: an API key with a non-ASCII character is sent
        # the same way on both transports (and is not a UnicodeEncodeError here)
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("utf-8")
        self.limit = limit
        self.connect_timeout = connect_timeout
        self._idle: deque[_Connection] = deque()
        self._open = 0
        self._slots = asyncio.Semaphore(limit)
        self._ssl: Any = None
        self._closed = False

    def target(self, url: str) -> str:
        """The request target (path and query) of an absolute URL on this origin."""
        parts = urlsplit(url)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def _ssl_context(self) -> Any:
        if self.scheme != "https":
            return None
        if self._ssl is None:
            import ssl

            self._ssl = ssl.create_default_context()
        return self._ssl

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._ssl_context()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    _Connection, self.host, self.port, ssl=tls, server_hostname=self.host if tls else None
                )
        except TimeoutError:
            raise ConnectFailed(f"connecting to {self.host}:{self.port} took longer than {self.connect_timeout:g} s") from None
        except ssl_errors() as e:  # before OSError: ssl.SSLError is one
            detail = getattr(e, "verify_message", None) or getattr(e, "reason", None) or str(e)
            raise TLSFailed(f"TLS handshake with {self.host}:{self.port} failed: {detail}") from e
        except OSError as e:  # refused, unreachable, unresolvable, TLS handshake
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {e.strerror or e}") from e
        self._open += 1
        return conn

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to have timed out
            if conn.reusable and not conn.transport.is_closing():  # type: ignore[union-attr]
                return conn
            self._drop(conn)
        return None

    def _drop(self, conn: _Connection) -> None:
        conn.abort()
        self._open -= 1

    async def request(self, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Response:
        """Send one request and read its whole answer."""
        if self._closed:
            raise RuntimeError("the connection pool is closed")
        head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._fixed
        if headers:
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        data = head + b"Content-Length: %d\r\n\r\n" % len(body) + body if body or method in ("POST", "PUT", "PATCH") else head + b"\r\n"
        async with self._slots:
            conn = self._take_idle()
            if conn is None:
                conn = await self._connect()
            try:
                resp = await conn.send(data, method)
            except BaseException:  # a cancellation (timeout) mid-answer leaves the socket out of step
                self._drop(conn)
                raise
            if conn.reusable and not self._closed:
                self._idle.append(conn)
            else:
                self._drop(conn)
            return resp

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            conn = self._idle.pop()
            if conn.transport is not None:
                conn.transport.close()
            self._open -= 1
