"""The embedded LLM as a fleet: one single-threaded, single-slot llama-server per core.

``EmbeddedFleet(serve_cfg, model_alias)`` starts ``serve.servers`` llama-servers side by side
(``"auto"``: one per core free), each with ``serve.n_threads`` threads (default 1) and one slot,
and stops them together. The stage gets their URLs as one string (:func:`join_urls`), which
:func:`fleet_llm_config` turns into ``llm.endpoints``: the client's router spreads the requests.
One thread per server computes every answer the same way on a quiet or a busy machine (llama.cpp's
answers change with its thread count), and K servers on K cores answer ~K requests at once
(docs/llm_server.md). A server that exits is started again on its own port, at most
:attr:`EmbeddedFleet.RESTARTS` times; then the others carry its share.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from negsynth.errors import UserError
from negsynth.llm.server import PROMPT_NOTE, EmbeddedServer, free_cores, llama_server_binary
from negsynth.schemas.config import EndpointConfig, LLMConfig, ServeConfig

log = logging.getLogger(__name__)


def join_urls(urls: list[str]) -> str:
    """A fleet's servers as one endpoint string (URLs never hold a space)."""
    return " ".join(urls)


def split_urls(url: str) -> list[str]:
    return url.split()


def fleet_llm_config(cfg: LLMConfig, url: str | None) -> LLMConfig:
    """``cfg`` with the fleet ``url`` (:func:`join_urls`) as its ``llm.endpoints`` (each server
    ``ceil(llm.max_concurrency / servers)`` in flight), or ``cfg`` when ``url`` is one server."""
    urls = split_urls(url or "")
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
    divided by the threads, at most one per :data:`SERVER_MIB` available, at least 1. The cores
    free are measured (one second) only when needed."""
    free: int | None = None

    def cores() -> int:
        nonlocal free
        if free is None:
            free = free_cores(cpus=cpus, load=load)
        return free

    t = threads or (cfg.n_threads if cfg.n_threads is not None else 1) or cores()
    if cfg.servers != "auto":
        return cfg.servers, t
    n = cores() // t
    n = min(n, available_mib() // SERVER_MIB)
    return max(1, n), t


class EmbeddedFleet:
    """Context manager: start the fleet, yield it (``url``: its servers' URLs as one string), stop it.

    ``servers`` / ``threads``: counts the caller fixed, else :func:`fleet_shape` chooses. ``log_dir``:
    each server's output goes to ``llama-server.log`` (one server) or ``llama-server-<i>.log``.
    ``pin``: this process is the servers' only client, so "pinned" may pin (else it means off)."""

    #: how often one server is started again after it exited
    RESTARTS = 3
    #: seconds between the watchdog's looks at the servers
    WATCH_S = 1.0

    def __init__(
        self,
        cfg: ServeConfig,
        model_alias: str,
        *,
        log_dir: Path | None = None,
        servers: int | None = None,
        threads: int | None = None,
        pin: bool = False,
    ):
        self.cfg = cfg
        self.binary = llama_server_binary(cfg)
        n, t = fleet_shape(cfg if servers is None else cfg.model_copy(update={"servers": servers}), threads=threads)
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
        """What the stages are given: one URL, or several joined by spaces (:func:`fleet_llm_config`)."""
        return join_urls(self.urls)

    def describe(self) -> str:
        if len(self.servers) == 1:
            return self.servers[0].describe()
        n, t, s = len(self.servers), self.threads, self.slots
        return f"{n} llama-servers ({self.binary}), {s} slot{'s' * (s != 1)} and {t} thread{'s' * (t != 1)} each{PROMPT_NOTE[self.prompt_mode]}"

    @property
    def prompt_mode(self) -> str:
        return self.servers[0].prompt_mode

    def rss_mib(self) -> list[float | None]:
        """Each server's resident memory in MiB (None where unknown)."""
        return [s.rss_mib() for s in self.servers]

    def start(self) -> str:
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
        return self.url

    def _watchdog(self) -> None:
        """Start a server that exited again on its own port (at most :attr:`RESTARTS` times)."""
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

    def __enter__(self) -> EmbeddedFleet:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait(self) -> int:
        """Block until every server has exited for good (``negsynth serve``); Ctrl-C stops them."""
        try:
            # a server is done for good once it exited and its restarts are used up
            while any(r <= self.RESTARTS for r in self.restarts):
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.stop()
            return 0
        codes = [p.returncode for p in (s.proc for s in self.servers) if p is not None]
        self.stop()
        return max(codes, default=0)
