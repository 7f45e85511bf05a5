"""Several servers of one model behind one client (``llm.endpoints``).

A team that generates on its own GPUs runs several vLLM or llama.cpp servers of the same model.
With ``llm.endpoints`` the client sends each request, attempt by attempt, to the endpoint with
the most free capacity: the fewest requests in flight relative to its ``max_concurrency``
(ties: the larger endpoint, then the first listed). No endpoint is ever sent more than its own
``max_concurrency`` at once; the client as a whole keeps their sum in flight.

An endpoint is **taken out** when its health check fails at start (``GET /models`` refused or
unanswered) or when a request to it meets a transport fault: a refused or reset connection, a
timeout, a 5xx, a 200 that is not a chat completion. Nothing more is sent to it until a probe
(``GET /models``) answers; the first probe comes ``llm.backoff_initial`` seconds after it went
out, each failed probe doubles the wait up to ``llm.backoff_max``. Back in by a probe, it gets
one request at a time until one is answered, and only a real answer resets its wait (so an
endpoint whose health check passes but whose chat requests fail costs one attempt per probe,
ever more rarely). A 429 does not take an endpoint out: the rate limiter slows down.

What does not change with several endpoints:

* the request cache key is the request (model, messages, sampling, sample index), never the
  endpoint: a rerun is served from the cache whichever server answered, so every endpoint must
  serve the same ``llm.model``;
* each transport attempt goes to one endpoint; a retry after a fault goes to the endpoint then
  best placed (so the requests a dying server drops are answered by the others, once); the
  request count, budgets and the outage breaker are the client's, across endpoints;
* when every endpoint is out, a request still goes to the one whose probe is due soonest, so a
  fleet that is down as a whole is met as one server that is down: after
  ``llm.max_consecutive_failures`` failed requests in a row the client holds every request and
  waits the outage out (``llm.outage_wait``, :mod:`negsynth.llm.outage`): after each pause one
  held request goes, to the endpoint due soonest, and the endpoints' own probes keep running; the
  first answer resumes the stage. Past ``llm.outage_wait`` (or with it 0) the stage stops (exit 4).

Keys: an endpoint's own ``api_key_env`` / ``api_key_file``, else ``llm.api_key_env`` /
``llm.api_key_file``. They are never logged or written; stats and logs name an endpoint by
its URL without any ``user:password@`` part.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from negsynth.errors import UserError
from negsynth.llm.keys import read_key

log = logging.getLogger(__name__)


def public_url(url: str) -> str:
    """``url`` without a ``user:password@`` part (safe for logs and stats)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def takes_out(kind: str | None) -> bool:
    """Whether a transport fault of ``kind`` (see ``errors.transport_kind``) says the endpoint is unwell."""
    return kind in ("connection", "timeout", "bad_response") or (kind or "").startswith("http_5")


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
    """The endpoints of one client: picks one per attempt, takes faulty ones out, probes them back.

    ``make_client(url, key, max_concurrency)`` builds the single-URL client whose transport an
    endpoint's requests use (an :class:`~negsynth.llm.client.LLMClient` without endpoints).
    """

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

    # -- lifetime ------------------------------------------------------------------------------
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

    # -- health --------------------------------------------------------------------------------
    async def _health(self, e: Endpoint, timeout: float) -> str | None:
        """None when ``GET /models`` answers, else a short reason."""
        try:
            await e.client.preflight(timeout=timeout)
        except UserError as err:
            msg = str(err)
            for reason in ("refused the API key", "connection refused"):  # said as the client says it
                if reason in msg:
                    return reason
            return f"no answer within {timeout:g} s" if "did not answer" in msg else "unreachable"
        return None

    async def preflight(self, timeout: float) -> None:
        """Check every endpoint at once: a refused key stops the run (a setting to fix), an
        unreachable endpoint is taken out (and probed later), all unreachable stops the run."""
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
        """Start the probes that are due; the seconds until the next one is (None: none pending)."""
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

    # -- one attempt ---------------------------------------------------------------------------
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
        """The attempt on ``e`` raised; a transport fault of the kinds :func:`takes_out` names takes it out."""
        if never_sent:
            e.requests -= 1
        if takes_out(kind):
            self._take_out(e, kind or "transport")

    def answered(self, e: Endpoint) -> None:
        e.backoff = 0.0
        e.trial = False
        if e.out:
            self._back_in(e, "it answered a request", trial=False)

    def release(self, e: Endpoint) -> None:
        e.in_flight -= 1
        self._changed.set()

    def hanging(self) -> str | None:
        """The endpoints last taken out for a timeout (named when a request was taken and never
        answered), or None."""
        return ", ".join(e.label for e in self.endpoints if e.why == "timeout") or None

    def as_dict(self) -> dict[str, dict[str, int]]:
        """Flat counters per endpoint URL (``merge`` sums them over workers)."""
        return {
            "endpoint_requests": {public_url(e.url): e.requests for e in self.endpoints},
            "endpoint_taken_out": {public_url(e.url): e.taken_out for e in self.endpoints},
        }
