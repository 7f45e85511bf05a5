"""The outage bookkeeping of :class:`~negsynth.llm.client.LLMClient`: failures in a row, the
breaker, and riding out a server that went away, with one held request at a time as the probe
(the rules: docs/reliability.md, "What is guaranteed").
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from negsynth.llm.endpoints import EndpointSet
from negsynth.llm.errors import FATAL_KINDS, OutageStop, TransportError, outage_message
from negsynth.schemas.config import LLMConfig

#: the client's log: a wait's notices keep the logger name they always had
log = logging.getLogger("negsynth.llm.client")


class OutageWatch:
    """Failures in a row and the waits for the server, mixed into the client (the pipeline reads
    ``outage``, ``outage_fatal``, ``last_failure`` and calls :meth:`again`). Around each request the
    client calls :meth:`_held`, then :meth:`_note_failure` or :meth:`_note_answer`, then :meth:`_trial_done`."""

    cfg: LLMConfig
    stats: Any  # ClientStats
    base_url: str
    router: EndpointSet | None
    transport: Any | None
    on_wait: Callable[[str, bool], None] | None
    _opened: Callable[[], bool]

    #: times an item is sent again after failing while the server answered others; then it is left pending
    SPORADIC_RETRIES = 2

    def _init_watch(self) -> None:
        #: requests in a row whose retries ran out (an answer to one sent before the run began does not reset it)
        self.consecutive_failures = 0
        self._sent = 0  # requests sent so far, in order (the send order decides "before")
        self._streak_from = 0  # send number of the first failed request of the current run
        self.failure_kinds: Counter = Counter()  # reason -> requests, in the current run of failures
        self.last_failure: str = ""
        #: set once ``llm.max_consecutive_failures`` is reached: the one-line reason the stage stopped
        self.outage: str | None = None
        self.outage_fatal = False
        #: waiting out an outage (llm.outage_wait): requests are held (:meth:`_held`) meanwhile
        self._waiting = False
        self._wake = asyncio.Event()  # set (and replaced) whenever a held request should look again
        #: the probe: True while the next held request may go alone; its outcome goes to ``_trial``
        self._trial_open = False
        self._trial: asyncio.Future | None = None
        self._wait_task: asyncio.Task | None = None
        #: when the current run of failures began: past ``llm.outage_wait`` from there, an outage
        self._outage_since: float | None = None
        self.answers = 0  # requests answered so far (an item's failures between two answers are an outage's)
        #: item -> (answers when it last failed, times it failed while others were answered, times sent again)
        self._item_fails: dict[Any, tuple[int, int, int]] = {}

    async def _held(self) -> asyncio.Future | None:
        """Wait while the server is waited for. None: send as usual; a future: this request is the
        wait's probe (sent alone, without retries; its outcome is set on the future)."""
        while self._waiting:
            if self._trial_open:
                self._trial_open = False
                return self._trial
            await self._wake.wait()
        if self.outage is not None:
            raise OutageStop(self.outage, self.outage_fatal)
        return None

    def _signal(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    def _trial_done(self, trial: asyncio.Future | None) -> None:
        """The probe ended with neither an answer nor a transport failure (a budget, a fatal error)."""
        if trial is not None and not trial.done():
            trial.set_result("other")

    def _note_failure(self, e: TransportError, sent: int, trial: asyncio.Future | None = None) -> None:
        """Request number ``sent`` failed for good; at ``llm.max_consecutive_failures`` in a row, stop or wait."""
        if self.consecutive_failures == 0:
            self._streak_from = sent
        if self._outage_since is None:
            self._outage_since = time.monotonic()
        self.consecutive_failures += 1
        self.failure_kinds[e.reason] += 1
        self.last_failure = e.detail
        if trial is not None and not trial.done():
            trial.set_result(e.reason)
        if self.outage is None and not self._waiting and self.consecutive_failures >= self.cfg.max_consecutive_failures:
            fatal = self.failure_kinds.most_common(1)[0][0] in FATAL_KINDS
            message = self._outage_message()
            if fatal or not self._can_wait():
                self.outage_fatal, self.outage = fatal, message
            else:
                self._start_wait(message)

    def _note_answer(self, sent: int, trial: asyncio.Future | None = None) -> None:
        """Request number ``sent`` was answered: the run of failures is over, unless it was sent before."""
        self.answers += 1
        if trial is not None and not trial.done():
            trial.set_result(None)
        if self.consecutive_failures == 0 or sent > self._streak_from:
            self.consecutive_failures = 0
            self.failure_kinds.clear()
            self._outage_since = None

    async def _stop_waiting(self) -> None:
        if self._wait_task is not None and not self._wait_task.done():
            self._wait_task.cancel()
            try:
                await self._wait_task
            except (asyncio.CancelledError, Exception):
                pass

    def _outage_message(self, hanging: bool = False) -> str:
        where = ((self.router.hanging() if self.router is not None else None) or self.base_url) if hanging else None
        return outage_message(self.base_url, self.cfg, self.consecutive_failures, self.failure_kinds, self.last_failure, hanging=where)

    def _can_wait(self) -> bool:
        """``llm.outage_wait`` set, not in batch mode, and the client open (a probe is a request)."""
        return self.cfg.outage_wait > 0 and self.transport is None and self._opened()

    def _start_wait(self, message: str) -> None:
        """Hold every request and probe the server until it answers, hangs or ``llm.outage_wait`` passed."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
        left = self._outage_since + self.cfg.outage_wait - now
        if left <= 0:
            self.outage = self._waited(message)
            return
        self._waiting = True
        self._wait_task = asyncio.ensure_future(self._wait_for_server(message, now + left))

    async def _wait_for_server(self, message: str, deadline: float) -> None:
        t0, delay = time.monotonic(), max(0.05, min(self.cfg.backoff_initial, 5.0))
        cause = message.split(":", 1)[0]
        self._tell(
            f"the LLM server is not answering ({cause}); waiting for it, probing with backoff for up to {deadline - t0:.0f} s more (llm.outage_wait)",
            True,
        )
        try:
            while True:
                pause = min(delay, deadline - time.monotonic())
                if pause <= 0:
                    self.outage = self._waited(self._outage_message())
                    break
                await asyncio.sleep(pause)
                delay = min(delay * 2, 30.0, max(self.cfg.backoff_max, 0.05))
                # the probe: the next held request goes alone; a request already sent may take
                # up to llm.timeout (and a connection llm.connect_timeout) to end
                self._trial = asyncio.get_running_loop().create_future()
                self._trial_open = True
                self._signal()
                limit = max(0.0, deadline - time.monotonic()) + self.cfg.timeout + self.cfg.connect_timeout
                try:
                    outcome = await asyncio.wait_for(asyncio.shield(self._trial), limit)
                except TimeoutError:
                    outcome = "none"  # no request came to be sent
                self._trial_open = False
                if outcome is None or outcome in FATAL_KINDS:  # it answers (wrongly: the breaker will say so)
                    self.stats.outage_waits += 1
                    self._tell(f"the LLM server answers again after {time.monotonic() - t0:.0f} s; resuming", False)
                    break
                if outcome == "transport_timeout":  # taken, never answered: a wait does not cure a hang
                    self.outage = self._outage_message(hanging=True)
                    break
        finally:
            self.stats.outage_wait_s += time.monotonic() - t0
            self._waiting = self._trial_open = False
            self._signal()

    def _waited(self, message: str) -> str:
        return f"{message} (waited {self.cfg.outage_wait:g} s for it: llm.outage_wait)"

    def _tell(self, line: str, waiting: bool) -> None:
        log.info(line)
        if self.on_wait is not None:
            self.on_wait(line, waiting)

    async def again(self, item: Any) -> bool:
        """An item whose own transport retries ran out: True (after a pause, waited here) when it
        should go back in the queue, False to leave it pending (a rerun does it)."""
        if self.outage is not None or not self._can_wait():
            return False
        if self.failure_kinds and self.failure_kinds.most_common(1)[0][0] in FATAL_KINDS:
            return False  # the server answers, wrongly: a setting to fix, not an outage to wait out
        seen, sporadic, sent = self._item_fails.get(item, (self.answers, 0, 0))
        if self.answers > seen:
            sporadic += 1
            if sporadic > self.SPORADIC_RETRIES:
                return False
        sent += 1
        if self._outage_since is not None and time.monotonic() - self._outage_since >= self.cfg.outage_wait and not self._waiting:
            self.outage = self._waited(self._outage_message())
            return False
        delay = random.uniform(0.5, 1.0) * min(max(self.cfg.backoff_max, 0.05), max(self.cfg.backoff_initial, 0.01) * 2 ** (sent - 1))
        await asyncio.sleep(delay)
        self._item_fails[item] = (self.answers, sporadic, sent)
        if self.outage is not None:
            return False
        self.stats.requeued += 1
        return True
