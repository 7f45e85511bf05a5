"""Several servers of one model behind one client (``llm.endpoints``), and the API keys they use.

Each attempt goes to the endpoint with the most free capacity; a transport fault takes one out
until ``GET /models`` answers again; with every endpoint out, the one due soonest is tried, so a
fleet down as a whole is one server down (the client's outage wait). The cache key never names
the endpoint. Behaviour as users see it: docs/configuration.md, "Several LLM servers".
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from negsynth.errors import UserError
from negsynth.llm.errors import refused, status_code, transport_kind

log = logging.getLogger(__name__)


def read_key(env: str | None, file: str | None, where: str, error: type[Exception] = UserError) -> str | None:
    """The key from ``{where}.api_key_env`` or ``{where}.api_key_file`` (None when neither is set);
    anything wrong with it raises ``error`` with one line naming the setting and the fix."""
    if env:
        v = os.environ.get(env, "").strip()
        if not v:
            raise error(f"environment variable {env} ({where}.api_key_env) is not set; export it or change {where}.api_key_env")
        return one_line_key(v, f"environment variable {env} ({where}.api_key_env)", error)
    if file:
        try:
            v = open(os.path.expanduser(file), encoding="utf-8").read().strip()
        except OSError as e:
            raise error(f"cannot read {where}.api_key_file {file}: {e.strerror}; fix the path") from None
        except UnicodeDecodeError:
            raise error(f"{where}.api_key_file {file} is not UTF-8 text; it must hold the key on one line") from None
        if not v:
            raise error(f"{where}.api_key_file {file} is empty; put the key in it")
        return one_line_key(v, f"{where}.api_key_file {file}", error)
    return None


def one_line_key(key: str, where: str, error: type[Exception] = UserError) -> str:
    """``key``, or ``error`` naming a control, invisible or other non-ASCII character in it (a pasted
    zero-width space, a look-alike letter), instead of a 401 later."""
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise error(f"the API key in {where} contains a line break or control character; it must be one line (never shown here)")
    for i, c in enumerate(key):
        if ord(c) <= 127:
            continue
        name = f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}"
        if c.isspace() or unicodedata.category(c) in ("Cf", "Zs", "Zl", "Zp", "Cc", "Co", "Cn"):
            raise error(
                f"the API key in {where} contains the invisible character {name} at position {i + 1} "
                "(a copy-paste accident?); remove it (the key is never shown here)"
            )
        raise error(
            f"the API key in {where} has the non-ASCII character {name} at position {i + 1}, which API keys never have "
            "(a look-alike letter pasted?); fix it (the key is never shown here)"
        )
    return key


def public_url(url: str) -> str:
    """``url`` without a ``user:password@`` part (safe for logs and stats)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def endpoint_key(cfg: Any, i: int, default_key: str) -> tuple[str, str]:
    """The API key of ``cfg.endpoints[i]`` and the setting it came from (for messages, never the key)."""
    ep = cfg.endpoints[i]
    where = f"llm.endpoints[{i}]"
    key = read_key(ep.api_key_env, ep.api_key_file, where)
    if key is not None:
        return key, f"{where}.api_key_env" if ep.api_key_env else f"{where}.api_key_file"
    return default_key, "llm.api_key_env" if cfg.api_key_env else "llm.api_key_file" if cfg.api_key_file else f"{where}.api_key_env"


@dataclass(eq=False)
class Endpoint:
    index: int
    url: str
    concurrency: int
    key_source: str  # the setting the key came from, for messages
    client: Any = field(repr=False)  # an LLMClient for this URL alone: its transport and health check
    in_flight: int = 0
    out: bool = False  # taken out: only a probe (or, with every endpoint out, a request) reaches it
    retry_at: float = 0.0  # when it is next probed
    backoff: float = 0.0  # seconds from its last failure to its next probe; reset by an answer
    why: str = ""
    probing: bool = False
    trial: bool = False  # back in by a probe, no answer yet: one request at a time until one comes
    requests: int = 0  # requests sent to it (this run)
    taken_out: int = 0

    @property
    def label(self) -> str:
        return f"llm.endpoints[{self.index}] ({public_url(self.url)})"


class EndpointSet:
    """``make_client(url, key, max_concurrency)``: the single-URL client that carries an endpoint's requests."""

    def __init__(self, cfg: Any, default_key: str, make_client: Callable[[str, str, int], Any]):
        self.endpoints: list[Endpoint] = []
        for i, e in enumerate(cfg.endpoints):
            key, source = endpoint_key(cfg, i, default_key)
            n = cfg.endpoint_concurrency(e)
            self.endpoints.append(Endpoint(i, e.base_url, n, source, client=make_client(e.base_url, key, n)))
        self.backoff_initial = max(0.01, cfg.backoff_initial)
        self.backoff_max = max(self.backoff_initial, cfg.backoff_max)
        self.probe_timeout = cfg.connect_timeout
        self._changed = asyncio.Event()
        self._probes: set[asyncio.Task] = set()
        self.opened = False  # the endpoints' transports are open (the client may wait out an outage)

    def keys(self) -> list[str]:
        return [e.client._api_key for e in self.endpoints]

    def describe(self) -> str:
        return ", ".join(public_url(e.url) for e in self.endpoints)

    async def open(self) -> None:
        for e in self.endpoints:
            await e.client.__aenter__()
        self.opened = True

    async def close(self) -> None:
        self.opened = False
        for t in list(self._probes):
            t.cancel()
        for t in list(self._probes):
            try:
                await t
            except BaseException:  # noqa: BLE001 - a cancelled probe
                pass
        for e in self.endpoints:
            await e.client.__aexit__(None, None, None)

    async def _health(self, e: Endpoint, timeout: float) -> str | None:
        """None when ``GET /models`` answers (a redirect or a refused key is no answer), else a short reason."""
        try:
            async with asyncio.timeout(timeout):
                await e.client.sdk.get("/models", cast_to=bytes, options={"timeout": timeout})
            return None
        except Exception as err:
            code = status_code(err)
            if code in (401, 403):
                return "refused the API key"
            if code is not None and not 300 <= code < 400:
                return None
            if refused(err):
                return "connection refused"
            return f"no answer within {timeout:g} s" if transport_kind(err) == "timeout" else "unreachable"

    async def preflight(self, timeout: float) -> None:
        """Check every endpoint at once: a refused key or none answering stops the run, one unreachable is taken out."""
        whys = await asyncio.gather(*(self._health(e, timeout) for e in self.endpoints))
        for e, why in zip(self.endpoints, whys):
            if why == "refused the API key":
                raise UserError(f"{e.label} refused the API key; check {e.key_source}")
        if all(whys):
            listed = "; ".join(f"{public_url(e.url)}: {why}" for e, why in zip(self.endpoints, whys))
            raise UserError(f"none of the {len(self.endpoints)} llm.endpoints answers ({listed}); start the servers or fix llm.endpoints")
        for e, why in zip(self.endpoints, whys):
            if why:
                self._take_out(e, why)

    def _take_out(self, e: Endpoint, why: str) -> None:
        now = time.monotonic()
        if e.out:
            e.retry_at = max(e.retry_at, now + e.backoff)
            return
        e.backoff = min(self.backoff_max, e.backoff * 2 if e.backoff else self.backoff_initial)
        e.out, e.why, e.retry_at = True, why, now + e.backoff
        e.taken_out += 1
        log.warning("%s taken out (%s); probing it again in %.2g s", e.label, why, e.backoff)

    def _back_in(self, e: Endpoint, how: str, trial: bool) -> None:
        e.trial = trial
        if e.out:
            e.out = False
            log.warning("%s is back (%s)", e.label, how)
        self._changed.set()

    async def _probe(self, e: Endpoint) -> None:
        try:
            why = await self._health(e, self.probe_timeout)
        finally:
            e.probing = False
        if why is None:
            self._back_in(e, "its health check answered", trial=True)
        else:
            e.backoff = min(self.backoff_max, e.backoff * 2 if e.backoff else self.backoff_initial)
            e.retry_at = time.monotonic() + e.backoff
            log.debug("%s still out (%s); next probe in %.2g s", e.label, why, e.backoff)
            self._changed.set()

    def _start_due_probes(self) -> float | None:
        """Start the probes that are due; the seconds until the next one (None: none pending)."""
        now = time.monotonic()
        wait = None
        for e in self.endpoints:
            if not e.out or e.probing:
                continue
            if e.retry_at <= now:
                e.probing = True
                t = asyncio.get_running_loop().create_task(self._probe(e))
                self._probes.add(t)
                t.add_done_callback(self._probes.discard)
            else:
                wait = e.retry_at - now if wait is None else min(wait, e.retry_at - now)
        return wait

    def _pick(self) -> Endpoint | None:
        eps = self.endpoints
        free = [e for e in eps if not e.out and e.in_flight < (1 if e.trial else e.concurrency)]
        if free:
            return min(free, key=lambda e: (e.in_flight / e.concurrency, -e.concurrency, e.index))
        if any(not e.out for e in eps):
            return None  # the endpoints that are in are busy: wait for one
        # every endpoint is out: the one due soonest, as one server that is down would be tried
        spare = [e for e in eps if e.in_flight < e.concurrency]
        return min(spare, key=lambda e: (e.retry_at, e.in_flight / e.concurrency, e.index)) if spare else None

    async def acquire(self) -> Endpoint:
        """The endpoint for the next attempt, with one of its slots taken (give it back with :meth:`release`)."""
        while True:
            wait = self._start_due_probes()
            e = self._pick()
            if e is not None:
                e.in_flight += 1
                return e
            self._changed.clear()
            try:
                async with asyncio.timeout(wait):
                    await self._changed.wait()
            except TimeoutError:
                pass

    def failed(self, e: Endpoint, kind: str | None, never_sent: bool) -> None:
        """The attempt on ``e`` raised; a transport fault that says the endpoint is unwell takes it out."""
        if never_sent:
            e.requests -= 1
        if kind in ("connection", "timeout", "bad_response") or (kind or "").startswith("http_5"):
            self._take_out(e, kind)

    def answered(self, e: Endpoint) -> None:
        e.backoff = 0.0
        e.trial = False
        if e.out:
            self._back_in(e, "it answered a request", trial=False)

    def release(self, e: Endpoint) -> None:
        e.in_flight -= 1
        self._changed.set()

    def hanging(self) -> str | None:
        """The endpoints last taken out for a timeout."""
        return ", ".join(e.label for e in self.endpoints if e.why == "timeout") or None

    def as_dict(self) -> dict[str, dict[str, int]]:
        """Flat counters per endpoint URL (``merge`` sums them over workers)."""
        return {
            "endpoint_requests": {public_url(e.url): e.requests for e in self.endpoints},
            "endpoint_taken_out": {public_url(e.url): e.taken_out for e in self.endpoints},
        }
