"""A real-socket fake of an OpenAI-compatible server for tests (no mocked functions).

``FakeOpenAI(responder)`` serves ``/v1/models`` and ``/v1/chat/completions`` on 127.0.0.1 in a
background thread. ``responder(request: dict, n: int) -> Reply`` decides each answer (``n``
counts chat requests from 0); ``Reply`` can carry content, status, headers, a delay, empty
choices, ``finish_reason`` or a connection reset. Every chat request body is kept in
``.requests`` so tests can assert what the client sent (and that nothing was sent twice).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    content: str | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    finish_reason: str = "stop"
    empty_choices: bool = False
    reset: bool = False  # close the socket abruptly (RST) instead of answering
    body: dict | None = None  # raw JSON body to send instead of a completion
    prompt_tokens: int = 10
    completion_tokens: int = 20


def completion_body(content: str | None, *, model: str = "fake", finish_reason: str = "stop", empty: bool = False, pt: int = 10, ct: int = 20) -> dict:
    choices = [] if empty else [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
    }


class FakeOpenAI:
    def __init__(self, responder: Callable[[dict, int], Reply], *, models: list[str] | None = None, require_key: str | None = None):
        self.responder = responder
        self.models = models or ["fake"]
        self.require_key = require_key
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _auth_ok(self) -> bool:
                if outer.require_key is None:
                    return True
                return self.headers.get("Authorization") == f"Bearer {outer.require_key}"

            def do_GET(self) -> None:
                if not self._auth_ok():
                    return self._send(401, {"error": {"message": "bad key"}})
                if self.path.rstrip("/").endswith("/models"):
                    return self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in outer.models]})
                self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                n_bytes = int(self.headers.get("Content-Length") or 0)
                req = json.loads(self.rfile.read(n_bytes) or b"{}")
                if not self._auth_ok():
                    return self._send(401, {"error": {"message": "bad key"}})
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": "not found"}})
                with outer._lock:
                    n = len(outer.requests)
                    outer.requests.append(req)
                    outer.headers.append(dict(self.headers))
                r = outer.responder(req, n)
                if r.delay:
                    time.sleep(r.delay)
                if r.reset:
                    # SO_LINGER 0 -> the kernel sends RST: a connection reset mid-response
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if r.status != 200:
                    return self._send(r.status, r.body or {"error": {"message": f"fake error {r.status}", "type": "fake"}}, r.headers)
                body = r.body or completion_body(
                    r.content, model=req.get("model", "fake"), finish_reason=r.finish_reason, empty=r.empty_choices, pt=r.prompt_tokens, ct=r.completion_tokens
                )
                self._send(200, body, r.headers)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up (timeout test) is expected, not an error

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "FakeOpenAI":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- canned valid answers per request kind -------------------------------------------------
def _last_user(req: dict) -> str:
    """The task prompt of a request (re-ask turns skipped)."""
    return next(m["content"] for m in reversed(req["messages"]) if m["role"] == "user" and not m["content"].startswith("Your answer was rejected"))


def valid_answer(req: dict, n: int) -> str:
    """A valid JSON answer for a brainstorm or generate request, unique per request."""
    prompt = _last_user(req)
    tag = abs(hash(prompt)) % 10**8
    if prompt.startswith("Brainstorm"):
        return json.dumps({"tasks": [f"Task number {n}-{i} about topic {tag} for retrieval" for i in range(5)]})
    if '"S1"' in prompt:
        return json.dumps({"S1": f"sentence one {tag}", "S2": f"sentence two {tag}", "negatives": [f"other sentence {j} of {tag}" for j in range(4)]})
    if "misleading_labels" in prompt:
        return json.dumps({"input_text": f"text to classify {tag}", "label": f"category of topic {tag}", "misleading_labels": [f"wrong label {j} {tag}" for j in range(4)]})
    if '"user_query"' in prompt:
        return json.dumps({"user_query": f"query {tag}", "positive_document": f"positive document {tag}", "hard_negative_documents": [f"distractor passage number {j} {tag}" for j in range(4)]})
    if '"hard_negative_documents"' in prompt and '"input"' in prompt:
        return json.dumps({"input": f"input {tag}", "positive_document": f"positive {tag}", "hard_negative_documents": [f"distractor {j} {tag}" for j in range(4)]})
    # regenerate: negatives only
    return json.dumps({"hard_negative_documents": [f"regenerated distractor {j} {tag}" for j in range(4)]})


def always_valid(req: dict, n: int) -> Reply:
    return Reply(content=valid_answer(req, n))
