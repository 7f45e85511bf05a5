"""Run a list of work items through an async function into deterministic, resumable shards.

Item ``i`` belongs to shard ``i // shard_size``; with ``--num-shards n --shard-index k`` this
process handles the shards ``s`` with ``s % n == k``, so n machines split one run. While a shard
is in progress each finished item is appended to ``shard-XXXXX.jsonl.partial``; when all its
items are done the shard is written sorted by item index (temp file + rename) and the partial
removed. A rerun skips finished shards and the items found in partial files, so a killed run
resumes without repeating work; the LLM request cache covers the requests of unfinished items.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from negsynth.data.shards import (
    PartialWriter,
    atomic_write_json,
    iter_jsonl,
    list_shards,
    shard_name,
    write_jsonl,
)
from negsynth.llm.client import BudgetStop
from negsynth.pipeline.context import StageContext


#: reject reasons of an unfinished shard that a rerun retries (outages, not model failures)
RETRY_ON_RESUME = ("transport_",)


def _crash_point(name: str) -> None:
    """Fault injection for the resume tests: ``NEGSYNTH_CRASH_AT=<name>`` SIGKILLs us here."""
    if _CRASH_AT is not None and _CRASH_AT == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


_CRASH_AT = os.environ.get("NEGSYNTH_CRASH_AT") or None


@dataclass
class WorkItem:
    index: int
    id: str
    payload: dict[str, Any]


@dataclass
class Outcome:
    """Exactly one of ``record`` / ``reject`` is set. ``usage`` = (prompt, completion, requests)."""

    record: dict | None = None
    reject: dict | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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

    def count(self, kind: str, row: dict) -> None:
        self.items += 1
        if kind == "ok":
            self.valid += 1
        else:
            self.rejected += 1
            self.reasons[row["reason"]] += 1
        self.usage.update(row.get("usage") or {})

    def add_shard(self, st: dict) -> None:
        self.items += st.get("items", 0)
        self.valid += st.get("valid", 0)
        self.rejected += st.get("rejected", 0)
        self.reasons.update(st.get("reasons", {}))
        self.usage.update(st.get("usage", {}))


def shard_assignment(n_items: int, shard_size: int, num_shards: int, shard_index: int) -> list[int]:
    total = (n_items + shard_size - 1) // shard_size
    return [s for s in range(total) if s % num_shards == shard_index]


class ShardedRunner:
    """Drive ``process(item) -> Outcome`` over items with bounded concurrency and resumable shards."""

    def __init__(self, ctx: StageContext, stage: str, *, concurrency: int, budget_check: Callable[[], str | None] | None = None):
        self.ctx = ctx
        self.stage = stage
        self.dir = ctx.stage_dir(stage)
        self.concurrency = max(1, concurrency)
        self.budget_check = budget_check or (lambda: None)
        self.shard_size = ctx.cfg.pipeline.shard_size

    def _partial(self, s: int) -> Path:
        return self.dir / (shard_name(s) + ".partial")

    def _final(self, s: int) -> Path:
        return self.dir / shard_name(s)

    def _finalize(self, s: int, rows: dict[int, tuple[str, dict]]) -> dict:
        ordered = [rows[i] for i in sorted(rows)]
        records = [r for kind, r in ordered if kind == "ok"]
        rejects = [r for kind, r in ordered if kind == "rej"]
        write_jsonl(self.dir / "rejects" / shard_name(s), rejects)
        reasons = Counter(r["reason"] for r in rejects)
        usage: Counter = Counter()
        for _, r in ordered:
            usage.update(r.get("usage") or {})
        stats = {
            "shard": s,
            "items": len(ordered),
            "valid": len(records),
            "rejected": len(rejects),
            "reasons": dict(reasons),
            "usage": dict(usage),
        }
        atomic_write_json(self.dir / "_shards" / f"{s:05d}.json", stats)
        _crash_point("before_final")
        write_jsonl(self._final(s), records)  # its presence marks the shard done: written last
        _crash_point("after_final")
        try:
            os.unlink(self._partial(s))
        except FileNotFoundError:
            pass
        return stats

    async def run(self, items: Sequence[WorkItem], process: Callable[[WorkItem], Awaitable[Outcome]], *, description: str | None = None) -> RunReport:
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        rep = RunReport(stage=self.stage)
        mine = shard_assignment(len(items), self.shard_size, self.ctx.num_shards, self.ctx.shard_index)
        rep.shards_total = len(mine)
        todo: list[WorkItem] = []
        state: dict[int, dict[int, tuple[str, dict]]] = {}
        remaining: dict[int, int] = {}
        writers: dict[int, PartialWriter] = {}
        for s in mine:
            lo, hi = s * self.shard_size, min(len(items), (s + 1) * self.shard_size)
            if self._final(s).exists():
                rep.shards_done += 1
                rep.add_shard(self._shard_stats(s))
                if self._partial(s).exists():  # killed between the final rename and the unlink
                    os.unlink(self._partial(s))
                continue
            done: dict[int, tuple[str, dict]] = {}
            if self._partial(s).exists():
                for row in iter_jsonl(self._partial(s), tolerate_truncated_tail=True):
                    if not (lo <= row.get("i", -1) < hi):
                        continue
                    if row["k"] == "rej" and str(row["r"].get("reason", "")).startswith(RETRY_ON_RESUME):
                        done.pop(row["i"], None)  # the server failed, not the model: try it again
                        continue
                    done[row["i"]] = (row["k"], row["r"])
            state[s] = done
            remaining[s] = (hi - lo) - len(done)
            for kind, r in done.values():
                rep.count(kind, r)
            todo.extend(items[i] for i in range(lo, hi) if i not in done)
            if remaining[s] == 0:
                self._finalize(s, done)
                rep.shards_done += 1
        total_items = sum(min(len(items), (s + 1) * self.shard_size) - s * self.shard_size for s in mine)
        queue: asyncio.Queue[WorkItem | None] = asyncio.Queue()
        for it in todo:
            queue.put_nowait(it)
        stop = {"why": None}

        with self.ctx.reporter.progress(description or self.stage, total_items) as bar:
            bar.update(advance=rep.items, valid=rep.valid, rejected=rep.rejected)

            async def worker() -> None:
                while True:
                    if stop["why"] is None:
                        stop["why"] = self.budget_check()
                    if stop["why"] is not None:
                        return
                    try:
                        it = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    try:
                        out = await process(it)
                    except BudgetStop as e:  # the item stays unfinished: a rerun does it
                        stop["why"] = e.reason
                        return
                    s = it.index // self.shard_size
                    kind, row = ("ok", out.record) if out.record is not None else ("rej", out.reject)
                    w = writers.get(s)
                    if w is None:
                        w = writers[s] = PartialWriter(self._partial(s))
                    w.write({"i": it.index, "k": kind, "r": row})
                    state[s][it.index] = (kind, row)
                    remaining[s] -= 1
                    rep.count(kind, row)
                    bar.update(advance=1, valid=rep.valid, rejected=rep.rejected)
                    if remaining[s] == 0:
                        w.close()
                        writers.pop(s, None)
                        self._finalize(s, state.pop(s))
                        rep.shards_done += 1

            try:
                await asyncio.gather(*(worker() for _ in range(min(self.concurrency, max(1, len(todo))))))
            finally:
                for w in writers.values():
                    w.close()
        rep.stopped_by = stop["why"] if rep.shards_done < rep.shards_total else None
        rep.wall_time_s = time.monotonic() - t0
        return rep

    def _shard_stats(self, s: int) -> dict:
        p = self.dir / "_shards" / f"{s:05d}.json"
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            n = sum(1 for _ in iter_jsonl(self._final(s)))
            return {"items": n, "valid": n, "rejected": 0, "reasons": {}}

    def finished_shards(self) -> list[Path]:
        return list_shards(self.dir)
