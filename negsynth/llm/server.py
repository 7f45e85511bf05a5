"""The embedded LLM: llama.cpp's ``llama-server`` serving a GGUF model on 127.0.0.1, alone
(:class:`EmbeddedServer`) or as a fleet (:class:`EmbeddedFleet`: one thread and one slot per server
by default, as llama.cpp's answers change with its thread count). Flags, determinism and
measurements: docs/llm_server.md.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

from negsynth.errors import UserError
from negsynth.llm import prefix_pin
from negsynth.schemas.config import EndpointConfig, LLMConfig, ServeConfig

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
    """Whether process ``pid`` listens on TCP ``port`` (None where the system cannot tell)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


#: the repeat penalty (over the last 64 tokens) every answer is sampled with; llama-server's own
#: default (none) lets SmolLM2 loop until max_tokens on most requests
REPEAT_PENALTY = 1.1
#: llama-server's host-memory prompt cache in MiB (its default, 8 GiB, is too much on a shared box)
CACHE_RAM_MIB = 256


def busy_cores(cpus: set[int], window: float = 1.0) -> float:
    """How many of ``cpus`` are busy now, measured over ``window`` seconds (not the load average:
    it trails by a minute, so right after a compile an idle machine would read busy)."""
    per = psutil.cpu_percent(interval=window, percpu=True)
    return sum(per[c] for c in cpus if c < len(per)) / 100.0


def free_cores(*, cpus: int | None = None, load: float | None = None) -> int:
    """The CPUs this process may run on (or ``cpus``) minus the busy ones (or ``load``), at least 1:
    llama.cpp waits for its slowest thread, so a thread on a busy core stalls the others."""
    try:
        mine = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = set(range(os.cpu_count() or 1))
    if cpus is None:
        cpus = len(mine)
    if load is None:
        load = busy_cores(mine)
    return max(1, min(cpus, cpus - int(load + 0.5)))


def choose_threads(n_threads: int | None = None, *, cpus: int | None = None, load: float | None = None) -> int:
    """Threads for a server: ``serve.n_threads`` when set (0: choose), else :func:`free_cores`."""
    return n_threads or free_cores(cpus=cpus, load=load)


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_llama_server(server_path: str | None = None) -> Path | None:
    """The llama-server binary: ``server_path``, else beside the Python interpreter, else on PATH; or None."""
    if server_path:
        p = Path(server_path).expanduser()
        return p if _executable(p) else None
    for d in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        if d and _executable(Path(d) / "llama-server"):
            return Path(d) / "llama-server"
    found = shutil.which("llama-server")
    return Path(found) if found else None


BUILD_HINT = "build it with `bash scripts/build_llama_server.sh` (negsynth source tree, ~6 min on 2 cores)"


def llama_server_binary(cfg: ServeConfig) -> Path:
    binary = find_llama_server(cfg.server_path)
    if binary is not None:
        return binary
    if cfg.server_path:
        raise UserError(f"serve.server_path {cfg.server_path}: no executable llama-server there; fix serve.server_path or {BUILD_HINT}")
    raise UserError(
        f"the embedded LLM needs llama.cpp's llama-server and none was found (beside {sys.executable} or on PATH); {BUILD_HINT}"
    )


def _model_path(cfg: ServeConfig) -> Path:
    from negsynth.resources import MissingResource, smollm2_gguf_path

    try:
        model = Path(cfg.model_path) if cfg.model_path else smollm2_gguf_path()
    except MissingResource as e:
        raise UserError(str(e)) from None
    if not model.is_file():
        raise UserError(f"serve.model_path {model}: no such GGUF file; fix serve.model_path")
    return model


PROMPT_NOTE = {"pinned": ", prompt prefix pinned", "on": ", prompt cache on (answers depend on the order)", "off": ""}


def server_command(
    cfg: ServeConfig,
    model_alias: str,
    port: int,
    *,
    binary: Path | None = None,
    slots: int = 1,
    threads: int | None = None,
    slot_dir: str | Path | None = None,
) -> list[str]:
    """The command line of the server on ``port``. ``slot_dir``: a pinned server's folder for saved
    prompt prefixes (:mod:`negsynth.llm.prefix_pin`; None: ``serve.prompt_cache = "pinned"`` means off)."""
    binary = binary or llama_server_binary(cfg)
    t = threads or choose_threads(cfg.n_threads)
    options = {
        "--model": str(_model_path(cfg)),
        "--alias": model_alias,
        "--host": cfg.host,
        "--port": str(port),
        "--ctx-size": str(cfg.n_ctx * slots),  # split evenly across the slots
        "--parallel": str(slots),
        "--threads": str(t),
        "--threads-batch": str(t),
        "--poll": "0",
        "--repeat-penalty": str(REPEAT_PENALTY),
        # a pinned slot must hold only what the client restored into it
        "--cache-ram": str(CACHE_RAM_MIB if cfg.prompt_cache == "on" else 0),
    }
    # off: every prompt evaluated whole, as on a fresh server; pinned: from its own restored prefix
    if cfg.prompt_cache == "on":
        cache = []
    elif slot_dir is not None and cfg.prompt_cache == "pinned":
        cache = ["--slot-save-path", str(slot_dir)]
    else:
        cache = ["--no-cache-prompt"]
    return [str(binary), *(word for pair in options.items() for word in pair), *cache, "--no-webui", *cfg.extra_args]


class _Started:
    """``with X(...) as x``: :meth:`start` on entry, :meth:`stop` on exit."""

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class EmbeddedServer(_Started):
    """Context manager: start one llama.cpp server, yield it, stop it. One slot unless
    ``serve.parallel`` asks for more (answers decoded together are not the answers decoded alone)."""

    def __init__(
        self,
        cfg: ServeConfig,
        model_alias: str,
        *,
        log_path: Path | None = None,
        threads: int | None = None,
        port: int | None = None,
        pin: bool = False,
    ):
        self.cfg = cfg
        self.alias = model_alias
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.port = port or cfg.port
        self.binary = llama_server_binary(cfg)
        self.slots = cfg.parallel or 1
        self.threads = threads or choose_threads(cfg.n_threads)
        #: the prompt prefix pinned: ``pin`` (this process is the only client), "pinned", one slot
        self.pinned = pin and cfg.prompt_cache == "pinned" and self.slots == 1
        self.slot_dir: str | None = None

    def describe(self) -> str:
        t = self.threads
        return f"llama-server ({self.binary}), {self.slots} slot{'s' * (self.slots != 1)}, {t} thread{'s' * (t != 1)}{PROMPT_NOTE[self.prompt_mode]}"

    @property
    def prompt_mode(self) -> str:
        return "pinned" if self.pinned else "on" if self.cfg.prompt_cache == "on" else "off"

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}/v1"

    #: how often start() moves to another port when a server not its own answers there
    PORT_RETRIES = 3

    def start(self) -> str:
        if not _port_free(self.cfg.host, self.port):
            self.port = _free_port(self.cfg.host)
        atexit.register(self.stop)  # also on an unhandled exit path: never leave an orphan server
        deadline = time.monotonic() + self.cfg.startup_timeout
        for _ in range(self.PORT_RETRIES + 1):
            self.spawn()
            if self.wait_ready(deadline):  # False: another process answers on that port
                self.registered()
                log.info("embedded server ready at %s: %s", self.base_url, self.describe())
                return self.base_url
            # another process took the port between the check and our bind (two runs starting together)
            self.stop()
            self.port = _free_port(self.cfg.host)
        raise UserError(f"the embedded llama.cpp server could not get a port of its own after {self.PORT_RETRIES + 1} tries (serve.port)")

    def registered(self) -> None:
        """A fresh guard for the server just (re)started (:mod:`negsynth.llm.prefix_pin`)."""
        prefix_pin.register(self.base_url, self.slot_dir if self.pinned else None)

    def spawn(self) -> None:
        if self.pinned and self.slot_dir is None:
            self.slot_dir = tempfile.mkdtemp(prefix="negsynth-slots-")
        cmd = server_command(
            self.cfg,
            self.alias,
            self.port,
            binary=self.binary,
            slots=self.slots,
            threads=self.threads,
            slot_dir=self.slot_dir,
        )
        if self.log_path:
            Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # the child holds its own copy

    def wait_ready(self, deadline: float) -> bool:
        """Wait until the server started by :meth:`spawn` answers (True), or another process
        answers on its port (False); a UserError when it exits or the deadline passes."""
        while time.monotonic() < deadline:
            proc = self.proc  # stop() (another thread: a fleet's watchdog) may clear it meanwhile
            if proc is None:
                raise UserError("the embedded llama.cpp server was stopped while it started")
            if proc.poll() is not None:
                if not _port_free(self.cfg.host, self.port):
                    return False  # it exited because the port was taken meanwhile
                raise UserError(f"the embedded llama.cpp server exited with code {proc.returncode}; see {self.log_path or 'its output'}")
            try:
                r = httpx.get(self.base_url + "/models", timeout=2.0)
                if r.status_code == 200:
                    # False: a server that is not ours answers here (None: /proc cannot tell)
                    return listens_on(proc.pid, self.port) is not False
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise UserError(
            f"the embedded llama.cpp server did not answer /v1/models within {self.cfg.startup_timeout:.0f} s (serve.startup_timeout)"
        )

    def rss_mib(self) -> float | None:
        """Resident memory in MiB (None where unknown)."""
        try:
            return psutil.Process(self.proc.pid).memory_info().rss / 2**20
        except (AttributeError, psutil.Error):
            return None

    def stop(self) -> None:
        prefix_pin.unregister(self.base_url)
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.slot_dir is not None:
            shutil.rmtree(self.slot_dir, ignore_errors=True)
            self.slot_dir = None


def fleet_llm_config(cfg: LLMConfig, url: str | None) -> LLMConfig:
    """``cfg`` with the fleet's space-separated ``url`` as its ``llm.endpoints`` (each server
    ``ceil(llm.max_concurrency / servers)`` in flight), or ``cfg`` when ``url`` is one server."""
    urls = (url or "").split()
    if len(urls) < 2:
        return cfg
    per = max(1, math.ceil(cfg.max_concurrency / len(urls)))
    eps = [EndpointConfig(base_url=u, max_concurrency=per) for u in urls]
    return cfg.model_copy(update={"base_url": urls[0], "endpoints": eps})


#: MiB of available memory asked per automatic server (each measured ~229 MiB resident with
#: SmolLM2-135M at ``serve.n_ctx`` 4096, half of it model pages shared by every server)
SERVER_MIB = 256


def available_mib() -> int:
    return psutil.virtual_memory().available // 2**20


def fleet_shape(cfg: ServeConfig, *, threads: int | None = None, cpus: int | None = None, load: float | None = None) -> tuple[int, int]:
    """``(servers, threads per server)``. Threads: ``threads`` (a run dir's first count), else
    ``serve.n_threads``, else 1; 0: the cores free. Servers: ``serve.servers``, else the cores free
    over the threads, at most one per :data:`SERVER_MIB` available (cores measured only if needed)."""
    t = threads or (cfg.n_threads if cfg.n_threads is not None else 1)
    if t and cfg.servers != "auto":
        return cfg.servers, t
    free = free_cores(cpus=cpus, load=load)
    t = t or free
    if cfg.servers != "auto":
        return cfg.servers, t
    return max(1, min(free // t, available_mib() // SERVER_MIB)), t


class EmbeddedFleet(_Started):
    """Context manager: start the servers, yield the fleet, stop them. ``threads``: a count the
    caller fixed (else :func:`fleet_shape`'s). ``log_dir``: for ``llama-server[-<i>].log``. ``pin``:
    this process is the servers' only client, so "pinned" may pin (else it means off)."""

    #: how often one server is started again after it exited (then the others carry its share)
    RESTARTS = 3
    #: seconds between the watchdog's looks at the servers
    WATCH_S = 1.0

    def __init__(
        self,
        cfg: ServeConfig,
        model_alias: str,
        *,
        log_dir: Path | None = None,
        threads: int | None = None,
        pin: bool = False,
    ):
        self.cfg = cfg
        self.binary = llama_server_binary(cfg)
        n, t = fleet_shape(cfg, threads=threads)
        self.threads = t
        names = ["llama-server.log"] if n == 1 else [f"llama-server-{i}.log" for i in range(n)]
        self.servers = [
            EmbeddedServer(
                cfg,
                model_alias,
                log_path=Path(log_dir) / name if log_dir else None,
                threads=t,
                port=min(65535, cfg.port + i),
                pin=pin,
            )
            for i, name in enumerate(names)
        ]
        self.slots = self.servers[0].slots
        self.restarts = [0] * n
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watch: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self.servers)

    @property
    def urls(self) -> list[str]:
        return [s.base_url for s in self.servers]

    @property
    def url(self) -> str:
        """What the stages are given (:func:`fleet_llm_config`)."""
        return " ".join(self.urls)

    def describe(self) -> str:
        if len(self.servers) == 1:
            return self.servers[0].describe()
        n, t, s = len(self.servers), self.threads, self.slots
        return f"{n} llama-servers ({self.binary}), {s} slot{'s' * (s != 1)} and {t} thread{'s' * (t != 1)} each{PROMPT_NOTE[self.prompt_mode]}"

    @property
    def prompt_mode(self) -> str:
        return self.servers[0].prompt_mode

    def rss_mib(self) -> list[float | None]:
        return [s.rss_mib() for s in self.servers]

    def start(self) -> None:
        """Start every server at once and wait until each answers; the first failure stops them all."""
        self._stopping.clear()
        if len(self.servers) == 1:  # in this thread: a Ctrl-C stops the start at once
            self.servers[0].start()
        else:
            with ThreadPoolExecutor(len(self.servers)) as pool:
                futures = [pool.submit(s.start) for s in self.servers]
            errors = [f.exception() for f in futures if f.exception() is not None]
            if errors:
                self.stop()
                raise errors[0]
        self._watch = threading.Thread(target=self._watchdog, name="negsynth-fleet-watchdog", daemon=True)
        self._watch.start()

    def _watchdog(self) -> None:
        while not self._stopping.wait(self.WATCH_S):
            for i, srv in enumerate(self.servers):
                proc = srv.proc
                if self._stopping.is_set():
                    return
                if proc is None or proc.poll() is None or self.restarts[i] > self.RESTARTS:
                    continue
                self.restarts[i] += 1
                if self.restarts[i] > self.RESTARTS:
                    log.warning(
                        "embedded server %s exited again (code %s); left out, the others serve its share", srv.base_url, proc.returncode
                    )
                    continue
                log.warning(
                    "embedded server %s exited (code %s); starting it again (%d of %d)",
                    srv.base_url,
                    proc.returncode,
                    self.restarts[i],
                    self.RESTARTS,
                )
                try:
                    with self._lock:
                        if self._stopping.is_set():
                            return
                        srv.spawn()
                    if srv.wait_ready(time.monotonic() + self.cfg.startup_timeout):
                        srv.registered()  # a fresh server: a fresh guard, or a pin that saves its prefixes again
                        log.warning("embedded server %s is up again", srv.base_url)
                    else:  # another process took its port meanwhile: ours cannot come back there
                        self.restarts[i] = self.RESTARTS + 1
                        log.warning("embedded server %s: its port was taken; left out", srv.base_url)
                except (UserError, OSError) as e:
                    log.warning("embedded server %s did not start again: %s", srv.base_url, e)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock, ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(lambda s: s.stop(), self.servers))
        if self._watch is not None and self._watch is not threading.current_thread():
            self._watch.join(timeout=self.cfg.startup_timeout)
            self._watch = None

    def wait(self) -> int:
        """Block until every server has exited for good (``negsynth serve``); Ctrl-C stops them."""
        try:
            while any(r <= self.RESTARTS for r in self.restarts):
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.stop()
            return 0
        codes = [p.returncode for p in (s.proc for s in self.servers) if p is not None]
        self.stop()
        return max(codes, default=0)
