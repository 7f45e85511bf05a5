"""A real-socket fake of an OpenAI-compatible server for tests (no mocked functions).

It also fakes the Batch API: ``POST /v1/files`` (multipart upload), ``GET /v1/files/{id}/content``,
``POST /v1/batches`` and ``GET /v1/batches/{id}``; a batch runs every line through the same
responder when it is polled (``batch_polls_to_complete``, ``batch_hold``).

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
    trickle: float = 0.0  # send the headers, then the body one byte every `trickle` seconds
    raw: bytes | None = None  # send these bytes (text/html) with the status instead of JSON

    def completion(self, model: str) -> dict:
        """The chat completion this reply makes for a request that named ``model``."""
        return completion_body(
            self.content,
            model=model,
            finish_reason=self.finish_reason,
            empty=self.empty_choices,
            pt=self.prompt_tokens,
            ct=self.completion_tokens,
        )


def completion_body(
    content: str | None, *, model: str = "fake", finish_reason: str = "stop", empty: bool = False, pt: int = 10, ct: int = 20
) -> dict:
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
    def __init__(
        self, responder: Callable[[dict, int], Reply], *, models: list[str] | None = None, require_key: str | None = None, port: int = 0
    ):
        self.responder = responder
        self.models = models or ["fake"]
        self.require_key = require_key
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._lock = threading.Lock()
        # Batch API: uploaded files, batches, the chat bodies run inside batches, and controls
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}
        self.batch_requests: list[dict] = []
        self.batch_polls_to_complete = 1  # retrieves answered "in_progress" before a batch completes
        self.batch_hold = threading.Event()  # clear() it to keep every batch "in_progress"
        self.batch_hold.set()
        self.on_batch_poll: Callable[[dict], None] | None = None
        self.batch_api = True  # False: /files and /batches answer 404 (a server without the Batch API)
        # /v1/completions (the legacy endpoint): completions(request) -> response body; None: 404
        self.completions: Callable[[dict], dict] | None = None
        self.completion_requests: list[dict] = []
        self.models_redirect: str | None = None  # GET /models answers a 307 to this Location instead
        self.down = False  # go_down(): refuse new connections, reset the open ones; come_back() undoes it
        self.dropped = 0  # requests reset because the server was down
        # connections accepted and not yet closed, and when one last opened or closed (quiesce())
        self.open_connections = 0
        self.last_activity = time.monotonic()
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

            def _send_bytes(self, status: int, data: bytes, ctype: str = "application/octet-stream") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _reset(self) -> None:
                # SO_LINGER 0 -> the kernel sends RST: a connection reset mid-response
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True

            def do_GET(self) -> None:
                if outer.down:
                    return self._reset()
                if not self._auth_ok():
                    return self._send(401, {"error": {"message": "bad key"}})
                parts = self.path.split("?")[0].rstrip("/").split("/")
                if len(parts) >= 3 and parts[-1] == "content" and parts[-3] == "files":
                    data = outer.files.get(parts[-2])
                    if data is None:
                        return self._send(404, {"error": {"message": "no such file"}})
                    return self._send_bytes(200, data)
                if len(parts) >= 2 and parts[-2] == "batches":
                    b = outer.batches.get(parts[-1])
                    if b is None:
                        return self._send(404, {"error": {"message": "no such batch"}})
                    return self._send(200, outer._poll_batch(b))
                if self.path.rstrip("/").endswith("/models") and outer.models_redirect:
                    return self._send(307, {"moved": True}, {"Location": outer.models_redirect})
                if self.path.rstrip("/").endswith("/models"):
                    return self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in outer.models]})
                self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                n_bytes = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n_bytes)
                if outer.down:
                    with outer._lock:
                        outer.dropped += 1
                    return self._reset()
                if not self._auth_ok():
                    return self._send(401, {"error": {"message": "bad key"}})
                path = self.path.split("?")[0].rstrip("/")
                if not outer.batch_api and (path.endswith("/files") or path.endswith("/batches")):
                    return self._send(404, {"error": {"message": "no Batch API here"}})
                if path.endswith("/files"):
                    return self._send(200, outer._upload(self.headers.get("Content-Type", ""), raw))
                if path.endswith("/batches"):
                    return self._send(200, outer._create_batch(json.loads(raw)))
                req = json.loads(raw or b"{}")
                if path.endswith("/completions") and not path.endswith("/chat/completions") and outer.completions is not None:
                    with outer._lock:
                        outer.completion_requests.append(req)
                        outer.headers.append(dict(self.headers))
                    return self._send(200, outer.completions(req))
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": "not found"}})
                with outer._lock:
                    n = len(outer.requests)
                    outer.requests.append(req)
                    outer.headers.append(dict(self.headers))
                r = outer.responder(req, n)
                if r.delay:
                    time.sleep(r.delay)
                if r.reset or outer.down:
                    return self._reset()
                if r.raw is not None:
                    return self._send_bytes(r.status, r.raw, "text/html")
                if r.status != 200:
                    return self._send(r.status, r.body or {"error": {"message": f"fake error {r.status}", "type": "fake"}}, r.headers)
                body = r.body or r.completion(req.get("model", "fake"))
                if r.trickle:
                    data = json.dumps(body).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    try:
                        for i in range(len(data)):
                            self.wfile.write(data[i : i + 1])
                            self.wfile.flush()
                            time.sleep(r.trickle)
                    except OSError:  # the client gave up
                        self.close_connection = True
                    return
                self._send(200, body, r.headers)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def process_request(self, request: Any, client_address: Any) -> None:
                with outer._lock:  # counted on accept, before its thread starts
                    outer.open_connections += 1
                    outer.last_activity = time.monotonic()
                super().process_request(request, client_address)

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    with outer._lock:
                        outer.open_connections -= 1
                        outer.last_activity = time.monotonic()

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up (timeout test) is expected, not an error

        self._server_cls, self._handler_cls = Server, Handler
        self.server = Server(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._serving = False

    def quiesce(self, idle_s: float = 1.0, timeout_s: float = 60.0) -> None:
        """Wait until no connection is open and none opened or closed for ``idle_s`` seconds: a
        killed client's last requests, still queued or being read on a loaded machine, are then
        handled (by whatever the responder says now) before the next client starts."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                quiet = self.open_connections == 0 and time.monotonic() - self.last_activity >= idle_s
            if quiet:
                return
            time.sleep(0.05)
        raise TimeoutError(f"fake server: {self.open_connections} connections still open after {timeout_s} s")

    # -- an outage -------------------------------------------------------------------------
    def go_down(self) -> None:
        """The server goes away: new connections are refused, open ones reset. Safe from a responder."""
        self.down = True
        threading.Thread(target=self._stop_listening, daemon=True).start()

    def _stop_listening(self) -> None:
        with self._lock:
            if not self._serving:
                return
            self._serving = False
        self.server.shutdown()
        self.server.server_close()

    def come_back(self) -> None:
        """The server is back on the same port, with the same state (files, batches, requests)."""
        deadline = time.monotonic() + 5
        while self._serving and time.monotonic() < deadline:
            time.sleep(0.01)
        while True:
            try:
                self.server = self._server_cls(("127.0.0.1", self.port), self._handler_cls)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.down = False
        self._serving = True
        self.thread.start()

    # -- Batch API -------------------------------------------------------------------------
    def _new_file(self, data: bytes, purpose: str, name: str = "file.jsonl") -> dict:
        with self._lock:
            fid = f"file-{len(self.files):04d}"
            self.files[fid] = data
        return {
            "id": fid,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": name,
            "purpose": purpose,
            "status": "processed",
        }

    def _upload(self, content_type: str, raw: bytes) -> dict:
        from email.parser import BytesParser
        from email.policy import HTTP

        msg = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw)
        fields: dict[str, Any] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[name] = (part.get_filename(), part.get_payload(decode=True))
        fname, data = fields["file"]
        purpose = fields.get("purpose", (None, b"batch"))[1].decode()
        return self._new_file(data, purpose, fname or "file.jsonl")

    def _create_batch(self, req: dict) -> dict:
        with self._lock:
            bid = f"batch-{len(self.batches):04d}"
            b = {
                "id": bid,
                "object": "batch",
                "endpoint": req["endpoint"],
                "input_file_id": req["input_file_id"],
                "completion_window": req.get("completion_window", "24h"),
                "status": "validating",
                "created_at": int(time.time()),
                "output_file_id": None,
                "error_file_id": None,
                "request_counts": {"total": 0, "completed": 0, "failed": 0},
                "_polls": 0,
            }
            self.batches[bid] = b
        return {k: v for k, v in b.items() if not k.startswith("_")}

    def _poll_batch(self, b: dict) -> dict:
        if self.on_batch_poll is not None:
            self.on_batch_poll(b)
        with self._lock:
            if b["status"] not in ("completed", "expired", "failed"):
                b["_polls"] += 1
                if self.batch_hold.is_set() and b["_polls"] > self.batch_polls_to_complete:
                    self._run_batch(b)
                else:
                    b["status"] = "in_progress"
        return {k: v for k, v in b.items() if not k.startswith("_")}

    def _run_batch(self, b: dict) -> None:
        """Answer every line with the responder: 200s to the output file, errors to the error file.

        A ``Reply(status=0)`` leaves the line unprocessed (the batch then ends "expired").
        """
        out, err = [], []
        lines = [json.loads(x) for x in self.files[b["input_file_id"]].decode().splitlines() if x.strip()]
        expired = False
        for line in lines:
            body = line["body"]
            n = len(self.requests) + len(self.batch_requests)
            self.batch_requests.append(body)
            r = self.responder(body, n)
            if r.status == 0:
                expired = True
                continue
            if r.status != 200:
                err.append(
                    {
                        "id": f"req-{n}",
                        "custom_id": line["custom_id"],
                        "response": {"status_code": r.status, "body": {"error": {"message": "fake"}}},
                        "error": None,
                    }
                )
                continue
            cb = r.completion(body.get("model", "fake"))
            out.append(
                {
                    "id": f"req-{n}",
                    "custom_id": line["custom_id"],
                    "response": {"status_code": 200, "request_id": f"r{n}", "body": cb},
                    "error": None,
                }
            )
        if out:
            b["output_file_id"] = self._new_file_locked("".join(json.dumps(x) + "\n" for x in out).encode(), "batch_output")
        if err:
            b["error_file_id"] = self._new_file_locked("".join(json.dumps(x) + "\n" for x in err).encode(), "batch_output")
        b["request_counts"] = {"total": len(lines), "completed": len(out), "failed": len(err)}
        b["status"] = "expired" if expired else "completed"

    def _new_file_locked(self, data: bytes, purpose: str) -> str:
        fid = f"file-{len(self.files):04d}"
        self.files[fid] = data
        return fid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._serving = True
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.down = True
        self._stop_listening()


# -- canned valid answers per request kind -------------------------------------------------
def _last_user(req: dict) -> str:
    """The task prompt of a request (re-ask turns skipped)."""
    return next(
        m["content"] for m in reversed(req["messages"]) if m["role"] == "user" and not m["content"].startswith("Your answer was rejected")
    )


def valid_answer(req: dict, n: int, *, tasks: int = 5) -> str:
    """A valid JSON answer for a brainstorm (``tasks`` tasks) or generate request, unique per request."""
    prompt = _last_user(req)
    tag = abs(hash(prompt)) % 10**8
    if prompt.startswith("Brainstorm"):
        return json.dumps({"tasks": [f"Task number {n}-{i} about topic {tag} for retrieval" for i in range(tasks)]})
    if '"S1"' in prompt:
        return json.dumps(
            {"S1": f"sentence one {tag}", "S2": f"sentence two {tag}", "negatives": [f"other sentence {j} of {tag}" for j in range(4)]}
        )
    if "misleading_labels" in prompt:
        return json.dumps(
            {
                "input_text": f"text to classify {tag}",
                "label": f"category of topic {tag}",
                "misleading_labels": [f"wrong label {j} {tag}" for j in range(4)],
            }
        )
    if '"user_query"' in prompt:
        return json.dumps(
            {
                "user_query": f"query {tag}",
                "positive_document": f"positive document {tag}",
                "hard_negative_documents": [f"distractor passage number {j} {tag}" for j in range(4)],
            }
        )
    if '"hard_negative_documents"' in prompt and '"input"' in prompt:
        return json.dumps(
            {
                "input": f"input {tag}",
                "positive_document": f"positive {tag}",
                "hard_negative_documents": [f"distractor {j} {tag}" for j in range(4)],
            }
        )
    # regenerate: negatives only
    return json.dumps({"hard_negative_documents": [f"regenerated distractor {j} {tag}" for j in range(4)]})


def always_valid(req: dict, n: int) -> Reply:
    return Reply(content=valid_answer(req, n))


def sts_reasked_once(req: dict, n: int) -> Reply:
    """STS items need one re-ask; everything else is valid at once. Deterministic by body."""
    last = req["messages"][-1]["content"]
    if last.startswith("Your answer was rejected"):
        return Reply(content=valid_answer({"messages": req["messages"][:-2]}, n))
    if '"S1"' in last:
        return Reply(content='{"S1": "a b", "S2": "c d", "negatives": ["x y", "x y", "z w", "q r"]}')
    return Reply(content=valid_answer(req, n))
