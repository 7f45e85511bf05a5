"""The pinned prompt prefix (negsynth.llm.prefix_pin) against a stand-in llama-server whose
answers depend on where its slot's cache ends, as the real one's rounding does: with the pin the
same request gets the same answer in any order, at any concurrency; with the plain cache it does
not. (tests/test_llama_fleet_real.py checks the same on the real server, marked slow.)"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from negsynth.llm import prefix_pin
from negsynth.llm.client import LLMClient
from negsynth.llm.prefix_pin import PinFailed, prefix_length
from negsynth.schemas.config import LLMConfig


def _render(messages: list[dict], generation: bool = True) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation else "")


class SlotServer:
    """One slot, llama-server's prompt-cache rules in characters: a request with ``cache_prompt``
    evaluates its prompt from the longest prefix it shares with the slot; the answer names that
    starting point (the real server's rounding depends on it). ``/slots/0`` saves, restores and
    erases; ``/apply-template`` renders ChatML; ``/completion`` fills the slot."""

    def __init__(self, slot_dir: Path, *, refuse: str | None = None):
        self.slot = ""
        self.slot_dir = slot_dir
        self.refuse = refuse  # an endpoint answered with 500
        self.calls: list[str] = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": "m"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                path, _, query = self.path.partition("?")
                outer.calls.append(path + ("?" + query if query else ""))
                if outer.refuse and path.endswith(outer.refuse):
                    return self._send(500, {"error": {"message": "no"}})
                if path == "/apply-template":
                    return self._send(200, {"prompt": _render(body["messages"])})
                if path == "/completion":
                    with outer.lock:
                        outer.slot = body["prompt"]
                    return self._send(200, {"content": ""})
                if path == "/slots/0":
                    f = outer.slot_dir / body.get("filename", "-")
                    with outer.lock:
                        if query == "action=save":
                            f.write_text(outer.slot)
                        elif query == "action=restore":
                            if not f.exists():
                                return self._send(400, {"error": {"message": "no such file"}})
                            outer.slot = f.read_text()
                        elif query == "action=erase":
                            outer.slot = ""
                    return self._send(200, {"id_slot": 0})
                # chat: evaluated from the shared prefix; a short sleep lets other requests interleave
                prompt = _render(body["messages"])
                with outer.lock:
                    start = 0
                    if body.get("cache_prompt", True):
                        while start < min(len(prompt), len(outer.slot)) and prompt[start] == outer.slot[start]:
                            start += 1
                time.sleep(0.01)
                text = f"{body['messages'][-1]['content'][:12]}@{start}"
                with outer.lock:
                    outer.slot = prompt + text
                self._send(
                    200,
                    {
                        "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                    },
                )

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


SYSTEM = {"role": "system", "content": "You write one search query for a document. " * 4}
EXAMPLE = [{"role": "user", "content": "Document: an example"}, {"role": "assistant", "content": '{"query": "example"}'}]


def _msgs(i: int) -> list[dict]:
    # two styles of request, as a stage has (with and without a worked example); their item texts
    # share their first words, so the plain cache reuses past the prefix
    return [SYSTEM, *(EXAMPLE if i % 2 else []), {"role": "user", "content": f"Document: the same opening words {i}"}]


@pytest.fixture
def slot_server(tmp_path):
    srv = SlotServer(tmp_path)
    yield srv
    srv.close()
    prefix_pin.unregister(srv.base_url)


def _answers(srv: SlotServer, order: list[int], *, concurrency: int = 1) -> dict[int, str]:
    async def go() -> dict[int, str]:
        cfg = LLMConfig(model="m", base_url=srv.base_url, cache=False, max_concurrency=concurrency, max_retries=0)
        async with LLMClient(cfg, base_url=srv.base_url) as c:

            async def one(i: int) -> tuple[int, str]:
                r = await c.chat(c.payload(_msgs(i), response_format=None, temperature=None, sample_index=0))
                return i, r["text"]

            return dict(await asyncio.gather(*(one(i) for i in order)))

    return asyncio.run(go())


def test_the_prefix_is_the_system_prompt_and_worked_example_not_a_reasks_history():
    sys_, ex_u, ex_a = SYSTEM, *EXAMPLE
    item, answer, reask = {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": "fix"}
    assert prefix_length([item]) == 0
    assert prefix_length([sys_, item]) == 1
    assert prefix_length([sys_, ex_u, ex_a, item]) == 3
    assert prefix_length([sys_, ex_u, ex_a, item, answer, reask]) == 3  # a re-ask shares the stage's prefix
    assert prefix_length([sys_, item, answer, reask]) == 3


def test_pinned_answers_do_not_depend_on_the_order_or_the_concurrency(slot_server):
    prefix_pin.register(slot_server.base_url, slot_server.slot_dir)
    ref = _answers(slot_server, list(range(6)))
    assert _answers(slot_server, [5, 2, 0, 3, 1, 4]) == ref
    assert _answers(slot_server, list(range(6)), concurrency=4) == ref
    # each request started where its own prefix ends (the system prompt, or it and the example)
    for i, text in ref.items():
        assert text.endswith(f"@{len(_render(_msgs(i)[:-1], generation=False)) + len('<|im_start|>user' + chr(10))}")
    # two prefixes, each evaluated alone once (erase, fill, save), then restored before every request
    assert sorted(p.name for p in slot_server.slot_dir.glob("prefix-*.bin")) and len(list(slot_server.slot_dir.glob("prefix-*"))) == 2
    assert slot_server.calls.count("/slots/0?action=save") == 2
    assert slot_server.calls.count("/slots/0?action=restore") == 18


def test_without_the_pin_the_plain_cache_answers_depend_on_the_order(slot_server):
    ref = _answers(slot_server, list(range(6)))
    assert _answers(slot_server, [5, 2, 0, 3, 1, 4]) != ref  # the stand-in's rounding: the guard exists for a reason


def test_a_lost_prefix_file_is_saved_again_and_a_failing_pin_is_a_transport_fault(tmp_path):
    srv = SlotServer(tmp_path)
    try:
        prefix_pin.register(srv.base_url, tmp_path)
        ref = _answers(srv, [0, 1])
        for f in tmp_path.glob("prefix-*"):
            f.unlink()  # the server's folder emptied (a restarted server in a fresh one)
        assert _answers(srv, [0, 1]) == ref and len(list(tmp_path.glob("prefix-*"))) == 2
        srv.refuse = "/apply-template"
        prefix_pin.register(srv.base_url, tmp_path)  # a new pin: nothing saved yet
        with pytest.raises(Exception) as e:
            _answers(srv, [0])
        assert "apply-template" in str(e.value)
        assert issubclass(PinFailed, ConnectionError)
    finally:
        srv.close()
        prefix_pin.unregister(srv.base_url)
