"""Run work items through an async function into deterministic, resumable shards.

Item ``i`` belongs to shard ``i // shard_size``; rank ``k`` of ``n`` handles the shards ``s`` with
``s % n == k``. Each finished item is appended to ``shard-XXXXX.jsonl.partial`` (one line, even for
an item that gives several rows); a shard whose items are all done is written sorted by item index
and the partial removed. A rerun skips finished shards and the items in partial files.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from negsynth.data.shards import (
    PartialWriter,
    atomic_write_json,
    iter_jsonl,
    shard_name,
    write_jsonl,
)
from negsynth.errors import UserError
from negsynth.faults import crash_point
from negsynth.llm.errors import BudgetStop, OutageStop
from negsynth.pipeline.context import StageContext

#: failures that are not the model's: the item stays *pending*, its shard unfinished, a rerun retries it
PENDING = ("transport_",)
#: an HTTP-level refusal (4xx): final only when the stage as a whole succeeds
HTTP_LEVEL = ("bad_request",)
#: reject reasons of an unfinished shard that a rerun retries
RETRY_ON_RESUME = PENDING + HTTP_LEVEL


def storage_error(e: OSError, what: Path | str) -> UserError:
    """A full disk or an unwritable folder, as one line naming the file and the fix."""
    import errno

    where = e.filename or what
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space (or move the run dir) and rerun the same command to resume"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable (or use another --run-dir) and rerun the same command to resume"
    else:
        fix = "check the disk and rerun the same command to resume"
    return UserError(f"cannot write {where}: {e.strerror or e}; {fix}")


@contextmanager
def storing(what: Path | str) -> Iterator[None]:
    """An ``OSError`` in the block raised as :func:`storage_error` naming ``what``."""
    try:
        yield
    except OSError as e:
        raise storage_error(e, what) from None


@dataclass
class WorkItem:
    index: int
    id: str
    payload: dict[str, Any]


#: the partial-file kind of an item that gave several rows (:attr:`Outcome.records` / ``rejects``)
MANY = "many"


@dataclass
class Outcome:
    """What one item gave: one ``record`` or ``reject``, or several ``records`` and ``rejects`` with
    ``usage``, what all its requests cost. An item holding a :data:`PENDING` reject is pending whole."""

    record: dict | None = None
    reject: dict | None = None
    records: list[dict] | None = None
    rejects: list[dict] | None = None
    usage: dict[str, int] | None = None

    def entry(self) -> tuple[str, dict]:
        """(kind, row) as the partial file and the runner keep it."""
        if self.records is not None or self.rejects is not None:
            return MANY, {"ok": list(self.records or []), "rej": list(self.rejects or []), "usage": dict(self.usage or {})}
        return ("ok", self.record) if self.record is not None else ("rej", self.reject)

    @property
    def pending(self) -> bool:
        return failed_with(*self.entry(), PENDING)


def rows_of(kind: str, row: dict) -> list[tuple[str, dict]]:
    """The (kind, row) pairs one item gave: itself, or the records then rejects of a ``MANY`` item."""
    if kind == MANY:
        return [("ok", r) for r in row["ok"]] + [("rej", r) for r in row["rej"]]
    return [(kind, row)]


def _rejected_with(kind: str, row: dict, prefixes: tuple[str, ...]) -> bool:
    return kind == "rej" and str(row.get("reason", "")).startswith(prefixes)


def failed_with(kind: str, row: dict, prefixes: tuple[str, ...]) -> bool:
    """Whether one of the item's rejects has a reason starting with one of ``prefixes``."""
    return any(_rejected_with(k, r, prefixes) for k, r in rows_of(kind, row))


@dataclass
class RunReport:
    stage: str
    items: int = 0
    valid: int = 0
    rejected: int = 0
    reasons: Counter = field(default_factory=Counter)
    shards_done: int = 0
    shards_total: int = 0
    usage: Counter = field(default_factory=Counter)  # prompt/completion tokens, requests, cached, attempts
    stopped_by: str | None = None
    wall_time_s: float = 0.0
    pending: int = 0
    pending_reasons: Counter = field(default_factory=Counter)
    outage: str | None = None  # why too many requests in a row failed (the stage stopped)
    failed: str | None = None  # why the stage as a whole failed (no valid output, too many 4xx)
    details: dict[str, str] = field(default_factory=dict)  # reason -> the first detail seen

    @property
    def complete(self) -> bool:
        """Every shard of this worker written and the stage not failed (stats.json's ``complete``)."""
        return self.shards_done == self.shards_total and not self.failed

    @property
    def finished(self) -> bool:
        """Complete and not stopped early (:func:`negsynth.pipeline.stage.finished_stats`'s rule)."""
        return self.complete and not (self.outage or self.stopped_by or self.pending)

    def count(self, kind: str, row: dict) -> None:
        """Count one item: its row, or a ``MANY`` item's rows and usage (pending: its transport failures only)."""
        if kind != MANY:
            return self._count(kind, row)
        pending = failed_with(kind, row, PENDING)
        for k, r in rows_of(kind, row):
            if not pending or _rejected_with(k, r, PENDING):
                self._count(k, r, usage=False)
        if not pending:
            self.usage.update(row.get("usage") or {})

    def _count(self, kind: str, row: dict, *, usage: bool = True) -> None:
        if _rejected_with(kind, row, PENDING):
            self.pending += 1
            self.pending_reasons[row["reason"]] += 1
            return
        self.items += 1
        if kind == "ok":
            self.valid += 1
        else:
            self.rejected += 1
            self.reasons[row["reason"]] += 1
            self.details.setdefault(row["reason"], str(row.get("detail") or "")[:160])
        if usage:
            self.usage.update(row.get("usage") or {})

    def add_shard(self, st: dict) -> None:
        self.items += st.get("items", 0)
        self.valid += st.get("valid", 0)
        self.rejected += st.get("rejected", 0)
        self.reasons.update(st.get("reasons", {}))
        self.usage.update(st.get("usage", {}))


def shard_assignment(n_items: int, shard_size: int, world_size: int, rank: int) -> list[int]:
    total = (n_items + shard_size - 1) // shard_size
    return [s for s in range(total) if s % world_size == rank]


@dataclass
class _RunState:
    """The bookkeeping of one :meth:`ShardedRunner.run`, shared by its workers."""

    rep: RunReport
    #: each unfinished shard's items so far: item index -> (kind, row)
    state: dict[int, dict[int, tuple[str, dict]]] = field(default_factory=dict)
    remaining: dict[int, int] = field(default_factory=dict)
    writers: dict[int, PartialWriter] = field(default_factory=dict)
    #: all items done, but holding an HTTP-level refusal (or waiting for the stage's verdict): decided at the end
    deferred: set[int] = field(default_factory=set)
    todo: list[WorkItem] = field(default_factory=list)
    done_items: int = 0  # for the progress bar: items, not rows
    #: why the workers stopped early: a budget (``why``), an outage (``outage``; ``fatal``: the stage failed)
    stop: dict[str, Any] = field(default_factory=lambda: {"why": None, "outage": None})
    queue: asyncio.Queue[WorkItem | None] = field(default_factory=asyncio.Queue)
    n_workers: int = 1
    left: int = 0  # items not yet recorded: the workers end when none is left

    def wake_all(self) -> None:
        for _ in range(self.n_workers):
            self.queue.put_nowait(None)


class ShardedRunner:
    """Drive ``process(item) -> Outcome`` over items with bounded concurrency and resumable shards."""

    def __init__(
        self,
        ctx: StageContext,
        stage: str,
        folder: Path,
        *,
        concurrency: int,
        budget_check: Callable[[], str | None] | None = None,
        again: Callable[[int], Awaitable[bool]] | None = None,
        verdict: Callable[[RunReport, list[tuple[str, dict]]], str | None] | None = None,
    ):
        self.ctx = ctx
        self.stage = stage
        self.dir = folder
        self.concurrency = max(1, concurrency)
        self.budget_check = budget_check or (lambda: None)
        #: ``await again(index)`` for an item that failed at the transport level: True to queue it again
        self.again = again
        self.shard_size = ctx.cfg.pipeline.shard_size
        #: the stage's own verdict on all its rows instead of :func:`failure_message`: its items are
        #: one shard, finished only when the verdict passes
        self.verdict = verdict

    def _mine(self, n_items: int) -> list[int]:
        if self.verdict is not None:
            self.shard_size = max(1, n_items)
            return shard_assignment(n_items, self.shard_size, 1, 0)
        return shard_assignment(n_items, self.shard_size, self.ctx.world_size, self.ctx.rank)

    def _partial(self, s: int) -> Path:
        return self.dir / (shard_name(s) + ".partial")

    def _final(self, s: int) -> Path:
        return self.dir / shard_name(s)

    def _finalize(self, s: int, rows: dict[int, tuple[str, dict]]) -> None:
        ordered = [rows[i] for i in sorted(rows)]
        flat = [kr for kind, r in ordered for kr in rows_of(kind, r)]
        records = [r for kind, r in flat if kind == "ok"]
        rejects = [r for kind, r in flat if kind == "rej"]
        reasons = Counter(r["reason"] for r in rejects)
        usage: Counter = Counter()
        for _, r in ordered:  # an item's usage: its row's, or a MANY item's own
            usage.update(r.get("usage") or {})
        stats = {
            "shard": s,
            "items": len(flat),
            "valid": len(records),
            "rejected": len(rejects),
            "reasons": dict(reasons),
            "usage": dict(usage),
        }
        with storing(self._final(s)):
            write_jsonl(self.dir / "rejects" / shard_name(s), rejects)
            atomic_write_json(self.dir / "_shards" / f"{s:05d}.json", stats)
            crash_point("before_final")
            write_jsonl(self._final(s), records)  # its presence marks the shard done: written last
            crash_point("after_final")
            self._partial(s).unlink(missing_ok=True)

    def has_work(self, n_items: int) -> bool:
        """Whether a shard this worker owns is unfinished."""
        mine = self._mine(n_items)
        return not all(self._final(s).exists() for s in mine)

    async def run(self, items: Sequence[WorkItem], process: Callable[[WorkItem], Awaitable[Outcome]]) -> RunReport:
        """Every item of this worker's shards through ``process``, ``concurrency`` at a time."""
        t0 = time.monotonic()
        with storing(self.dir):
            self.dir.mkdir(parents=True, exist_ok=True)
        mine = self._mine(len(items))
        run = _RunState(RunReport(stage=self.stage, shards_total=len(mine)))
        for s in mine:
            self._resume_shard(run, items, s)
        total_items = sum(min(len(items), (s + 1) * self.shard_size) - s * self.shard_size for s in mine)
        for it in run.todo:
            run.queue.put_nowait(it)
        run.n_workers = min(self.concurrency, max(1, len(run.todo)))
        run.left = len(run.todo)
        with self.ctx.reporter.progress(self.stage, total_items) as bar:
            bar.update(advance=run.done_items, valid=run.rep.valid, rejected=run.rep.rejected)
            try:
                if run.todo:
                    await asyncio.gather(*(self._work(run, process, bar) for _ in range(run.n_workers)))
            finally:
                for w in run.writers.values():
                    w.close()
        self._conclude(run)
        run.rep.wall_time_s = time.monotonic() - t0
        return run.rep

    def _resume_shard(self, run: _RunState, items: Sequence[WorkItem], s: int) -> None:
        """Take up shard ``s`` where an earlier run left it: count a finished one, queue what a partial lacks."""
        rep = run.rep
        lo, hi = s * self.shard_size, min(len(items), (s + 1) * self.shard_size)
        if self._final(s).exists():
            rep.shards_done += 1
            rep.add_shard(self._shard_stats(s))
            run.done_items += hi - lo
            if self._partial(s).exists():  # killed between the final rename and the unlink
                os.unlink(self._partial(s))
            return
        done = self._read_partial(s, lo, hi)
        run.state[s] = done
        run.remaining[s] = (hi - lo) - len(done)
        for kind, r in done.values():
            rep.count(kind, r)
        run.done_items += len(done)
        run.todo.extend(items[i] for i in range(lo, hi) if i not in done)
        if run.remaining[s] == 0:
            self._shard_done(run, s)

    def _read_partial(self, s: int, lo: int, hi: int) -> dict[int, tuple[str, dict]]:
        """The items of shard ``s`` its partial file holds, but those a rerun retries (:data:`RETRY_ON_RESUME`)."""
        done: dict[int, tuple[str, dict]] = {}
        if not self._partial(s).exists():
            return done
        for row in iter_jsonl(self._partial(s), tolerate_truncated_tail=True):
            if not (lo <= row.get("i", -1) < hi):
                continue
            if failed_with(row["k"], row["r"], RETRY_ON_RESUME):
                done.pop(row["i"], None)
                continue
            done[row["i"]] = (row["k"], row["r"])
        return done

    def _shard_done(self, run: _RunState, s: int) -> None:
        """Every item of shard ``s`` is recorded: write it, leave it unfinished (a pending item) or
        defer it to the end of the run (an HTTP-level refusal, or the stage's verdict)."""
        rows = run.state[s]
        if any(failed_with(k, r, PENDING) for k, r in rows.values()):
            return
        if self.verdict is not None or any(failed_with(k, r, HTTP_LEVEL) for k, r in rows.values()):
            run.deferred.add(s)
            return
        self._finalize(s, run.state.pop(s))
        run.rep.shards_done += 1

    async def _work(self, run: _RunState, process: Callable[[WorkItem], Awaitable[Outcome]], bar: Any) -> None:
        """One worker: items from the queue through ``process`` until none is left, or a budget or
        an outage stops every worker (the item in hand stays unfinished)."""
        stop = run.stop
        while True:
            if stop["why"] is None and stop["outage"] is None:
                stop["why"] = self.budget_check()
            if stop["why"] is not None or stop["outage"] is not None:
                run.wake_all()
                return
            it = await run.queue.get()
            if it is None:
                return
            try:
                out = await process(it)
            except OutageStop as e:
                stop["outage"] = e.reason
                stop["fatal"] = e.fatal
                run.wake_all()
                return
            except BudgetStop as e:
                stop["why"] = e.reason
                run.wake_all()
                return
            if out.pending and self.again is not None and stop["why"] is None and stop["outage"] is None:
                if await self.again(it.index):  # an outage being ridden out: back in the queue
                    run.queue.put_nowait(it)
                    continue
            self._record(run, it, out, bar)
            run.left -= 1
            if run.left == 0:
                run.wake_all()

    def _record(self, run: _RunState, it: WorkItem, out: Outcome, bar: Any) -> None:
        """Append one item's outcome to its shard's partial file and count it; the last finishes the shard."""
        s = it.index // self.shard_size
        kind, row = out.entry()  # one line, whatever the item gave: a kill never leaves half of it
        with storing(self._partial(s)):
            w = run.writers.get(s)
            if w is None:
                w = run.writers[s] = PartialWriter(self._partial(s))
            w.write({"i": it.index, "k": kind, "r": row})
        run.state[s][it.index] = (kind, row)
        run.remaining[s] -= 1
        run.rep.count(kind, row)
        bar.update(advance=1, valid=run.rep.valid, rejected=run.rep.rejected)
        if run.remaining[s] == 0:
            w.close()
            run.writers.pop(s, None)
            self._shard_done(run, s)

    def _conclude(self, run: _RunState) -> None:
        """After the workers: how the run ended, and, when nothing stopped it, the verdict on the
        deferred shards, written if it passes."""
        rep, stop, state = run.rep, run.stop, run.state
        if stop.get("fatal"):
            rep.failed = f"{self.stage}: {stop['outage']}"
        else:
            rep.outage = stop["outage"]
        if stop["outage"] is None and stop["why"] is None:
            held = [kr for s in sorted(run.deferred) for i in sorted(state[s]) for kr in rows_of(*state[s][i])] if self.verdict else []
            rep.failed = self._verdict(rep, held)
            if rep.failed is None:
                for s in sorted(run.deferred):
                    self._finalize(s, state.pop(s))
                    rep.shards_done += 1
        rep.stopped_by = stop["why"] if rep.shards_done < rep.shards_total and stop["outage"] is None else None

    def _verdict(self, rep: RunReport, held: list[tuple[str, dict]]) -> str | None:
        """None, or why the stage failed as a whole: no valid output, too many HTTP-level refusals,
        or the stage's own verdict on the held rows (none held: it passed when they were written)."""
        if rep.pending or rep.items == 0:
            return None
        if self.verdict is not None:
            return self.verdict(rep, held) if held else None
        return failure_message(self.stage, rep, self.ctx, self.dir)

    def _shard_stats(self, s: int) -> dict:
        p = self.dir / "_shards" / f"{s:05d}.json"
        try:
            st = json.loads(p.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            n = sum(1 for _ in iter_jsonl(self._final(s)))
            return {"items": n, "valid": n, "rejected": 0, "reasons": {}}
        rejects = self.dir / "rejects" / shard_name(s)
        if "reasons" not in st and st.get("rejected") and rejects.exists():
            # a shard brainstorm finished before it ran on this runner counted only its rows
            st["reasons"] = dict(Counter(r["reason"] for r in iter_jsonl(rejects)))
        return st


def failure_message(stage: str, rep: RunReport, ctx: StageContext, folder: Path) -> str | None:
    """One line when a stage produced nothing usable: the counts and the likely cause."""
    cfg = ctx.cfg.llm
    url = ctx.base_url or cfg.base_url
    http = sum(n for r, n in rep.reasons.items() if r.startswith(HTTP_LEVEL))
    if rep.valid > 0 and http <= cfg.max_failure_rate * rep.items:
        return None
    what = ", ".join(f"{r} {n}" for r, n in rep.reasons.most_common(3))
    if http * 2 >= rep.items:
        detail = next((rep.details[r] for r in rep.reasons if r.startswith(HTTP_LEVEL) and rep.details.get(r)), "")
        hint = (
            f"{url} refuses the requests ({detail or 'HTTP 4xx'}); check llm.model={cfg.model!r}, "
            "llm.structured_output and llm.extra_body (or llm.base_url)"
        )
    elif not any(rep.usage.get(k) for k in ("attempts", "requests", "cached")):  # no LLM involved (mined negatives)
        top = rep.reasons.most_common(1)[0][0] if rep.reasons else ""
        first = f"{top}: {rep.details[top]}; " if rep.details.get(top) else ""
        hint = f"no LLM request was made; {first}every reject with its reason is in {folder}/rejects/"
    else:
        hint = (
            f"the model {cfg.model!r} at {url} answers but never validly; check llm.model (a chat/instruct "
            f"model?) and llm.structured_output, and read {folder}/rejects/"
        )
    if rep.valid == 0:
        return f"{stage}: 0 valid outputs of {rep.items} items ({what}): {hint}"
    return (
        f"{stage}: {http} of {rep.items} items were refused at the HTTP level, above "
        f"llm.max_failure_rate={cfg.max_failure_rate:g} ({what}): {hint}"
    )
