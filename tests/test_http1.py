"""The lean HTTP/1.1 pool against a scripted socket server: every framing an OpenAI-compatible
server (llama.cpp, vLLM/uvicorn, nginx or Cloudflare in front of an API) may use, and the faults
the client's retry layer must see as the right kind."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib

import pytest
from helpers import self_signed_cert

from negsynth.llm.errors import never_sent, transport_kind
from negsynth.llm.http1 import ConnectFailed, H1Pool, ProtocolFault


class Script:
    """A TCP server answering request i (counted across connections) with ``answers[i](conn_no)``:
    bytes to write, then optionally close (``(bytes, close)``)."""

    def __init__(self, answers):
        self.answers = answers
        self.requests: list[bytes] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn_no = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode().split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                out = self.answers[min(len(self.requests), len(self.answers)) - 1](conn_no)
                data, close = out if isinstance(out, tuple) else (out, False)
                for part in data if isinstance(data, list) else [data]:
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0.005)  # arrive in separate reads
                if close:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def http(status: int, body: bytes, headers: dict[str, str] | None = None, version: str = "1.1") -> bytes:
    hs = {"Content-Length": str(len(body)), **(headers or {})}
    return f"HTTP/{version} {status} X\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in hs.items()).encode() + b"\r\n" + body


BODY = json.dumps({"choices": [{"message": {"content": "ü" * 50}}]}).encode()


async def exchange(answers, n=1, **pool_kw):
    script = Script(answers)
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = H1Pool(f"http://127.0.0.1:{port}/v1", headers={"Authorization": "Bearer k"}, **pool_kw)
    try:
        out = []
        for _ in range(n):
            out.append(await pool.request("POST", "/v1/chat/completions", b'{"a":1}'))
        return out, script, pool
    finally:
        await pool.close()
        server.close()


def run(answers, n=1, **kw):
    return asyncio.run(exchange(answers, n, **kw))


def test_content_length_keep_alive_reuses_one_connection():
    out, script, _ = run([lambda c: http(200, BODY)], n=3)
    assert [r.body for r in out] == [BODY] * 3 and script.connections == 1
    head = script.requests[0].decode()
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n") and "Host: 127.0.0.1:" in head
    assert "Authorization: Bearer k" in head and head.endswith('Content-Length: 7\r\n\r\n{"a":1}')


def test_chunked_body_split_across_reads_with_trailers():
    chunks = [BODY[:10], BODY[10:]]
    raw = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\nX-Trailer: t\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    pieces = [head + raw[:3], raw[3:17], raw[17:-5], raw[-5:]]
    out, script, _ = run([lambda c: pieces], n=2)
    assert [r.body for r in out] == [BODY, BODY] and script.connections == 1


def test_gzip_and_deflate_answers_are_decoded():
    out, _, _ = run(
        [
            lambda c: http(200, gzip.compress(BODY), {"Content-Encoding": "gzip"}),
            lambda c: http(200, zlib.compress(BODY), {"Content-Encoding": "deflate"}),
        ],
        n=2,
    )
    assert [r.body for r in out] == [BODY, BODY]


def test_interim_100_continue_is_skipped_and_headers_are_lower_cased():
    out, _, _ = run([lambda c: b"HTTP/1.1 100 Continue\r\n\r\n" + http(429, b"{}", {"Retry-After": "3"})])
    assert out[0].status == 429 and out[0].headers["retry-after"] == "3"


def test_connection_close_and_http10_answers_open_a_new_connection():
    out, script, _ = run([lambda c: (http(200, BODY, {"Connection": "close"}), True), lambda c: http(200, BODY, version="1.0")], n=3)
    assert [r.body for r in out] == [BODY] * 3 and script.connections == 3


def test_body_framed_by_the_end_of_the_connection():
    out, _, _ = run([lambda c: ([b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n", BODY], True)], n=2)
    assert [r.body for r in out] == [BODY, BODY]


def test_a_connection_the_server_closed_while_idle_is_not_reused():
    async def go():
        script = Script([lambda c: (http(200, BODY, {"Connection": "keep-alive"}), c == 1)])  # conn 1: answer, then close
        server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
        pool = H1Pool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        first = await pool.request("POST", "/x", b"{}")
        await asyncio.sleep(0.1)  # the server's FIN arrives while the connection is idle
        second = await pool.request("POST", "/x", b"{}")
        await pool.close()
        server.close()
        return first, second, script

    first, second, script = asyncio.run(go())
    assert first.body == second.body == BODY and script.connections == 2 and len(script.requests) == 2


def test_a_request_lost_with_its_connection_is_not_resent_behind_the_callers_back():
    with pytest.raises(ConnectionResetError):
        run([lambda c: http(200, BODY), lambda c: (b"", True)], n=2)


def test_reset_mid_answer_is_a_connection_fault_and_not_resent():
    with pytest.raises(ConnectionResetError) as e:
        run([lambda c: (http(200, BODY)[:40], True)])
    assert transport_kind(e.value) == "connection" and not never_sent(e.value)


def test_garbage_answer_is_a_bad_response():
    with pytest.raises(ProtocolFault) as e:
        run([lambda c: b"SSH-2.0-OpenSSH_9.6\r\n\r\n"])
    assert transport_kind(e.value) == "bad_response"


def test_refused_connection_is_never_sent():
    async def go():
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        pool = H1Pool(f"http://127.0.0.1:{port}", connect_timeout=2)
        try:
            await pool.request("POST", "/v1/chat/completions", b"{}")
        finally:
            await pool.close()

    with pytest.raises(ConnectFailed) as e:
        asyncio.run(go())
    assert never_sent(e.value) and transport_kind(e.value) == "connection"


def test_a_cancelled_request_drops_its_connection():
    async def go():
        script = Script([lambda c: ([http(200, BODY)[:20]], False)])  # never finishes
        server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
        pool = H1Pool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await pool.request("POST", "/x", b"{}")
        assert pool._open == 0 and not pool._idle
        await pool.close()
        server.close()

    asyncio.run(go())


def test_https_with_certificate_verification(tmp_path, monkeypatch):
    """TLS through the system's trust store (SSL_CERT_FILE points it at a self-signed test CA);
    a certificate the store does not trust is a failed connect, not a silent downgrade."""
    import ssl

    key, cert = self_signed_cert(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def go(trusted: bool):
        script = Script([lambda c: http(200, BODY)])
        server = await asyncio.start_server(script.handle, "127.0.0.1", 0, ssl=server_ctx)
        pool = H1Pool(f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", connect_timeout=5)
        try:
            return [(await pool.request("POST", "/v1/chat/completions", b"{}")).body for _ in range(2)], script.connections
        finally:
            await pool.close()
            server.close()

    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    assert asyncio.run(go(True)) == ([BODY, BODY], 1)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "none.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    with pytest.raises(ConnectFailed):
        asyncio.run(go(False))
