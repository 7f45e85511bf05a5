"""Two runs starting together must not share one embedded server: a server that is not ours
answering on the port we picked sends ours to another port."""

from __future__ import annotations

import http.server
import socket
import sys
import threading
from pathlib import Path

import httpx
import pytest

from negsynth.llm import server
from negsynth.schemas.config import ServeConfig

# a stand-in for llama-server: binds host:port (exits 1 when taken), answers /v1/models with "child"
CHILD = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"data":[],"who":"child"}')
    def log_message(self, *a): pass
try:
    srv = http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), H)
except OSError:
    sys.exit(1)
srv.serve_forever()
"""


class _Foreign(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"data":[],"who":"foreign"}')

    def log_message(self, *a):
        pass


@pytest.fixture
def foreign():
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Foreign)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _stand_in(monkeypatch):
    monkeypatch.setattr(server, "find_llama_server", lambda server_path=None: Path(sys.executable))
    monkeypatch.setattr(server, "server_command", lambda cfg, alias, port, **kw: [sys.executable, "-c", CHILD, cfg.host, str(port)])


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc to tell which process listens on a port")
def test_a_server_that_is_not_ours_on_the_port_moves_ours(monkeypatch, foreign):
    _stand_in(monkeypatch)
    # the race: the port looked free when start() checked it; another run's server holds it by the time ours binds
    real, checks = server._port_free, []

    def port_free(host, port):
        checks.append(port)
        return True if len(checks) == 1 else real(host, port)

    monkeypatch.setattr(server, "_port_free", port_free)
    es = server.EmbeddedServer(ServeConfig(port=foreign, startup_timeout=30), "m")
    try:
        url = es.start()
        assert es.port != foreign
        assert httpx.get(url + "/models").json()["who"] == "child"
        assert server.listens_on(es.proc.pid, es.port) is True
        assert server.listens_on(es.proc.pid, foreign) is False
    finally:
        es.stop()


def test_a_free_port_is_used_as_configured(monkeypatch):
    _stand_in(monkeypatch)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with server.EmbeddedServer(ServeConfig(port=port, startup_timeout=30), "m") as es:
        assert es.port == port
        assert httpx.get(es.base_url + "/models").json()["who"] == "child"
