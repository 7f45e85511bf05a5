"""OpenAI Batch API transport: the same stage, validators, cache and shard writer, half the price.

``chat()`` parks each request here; when every item in progress waits, the parked requests become
one round (``RUN_DIR/<stage>/_batch/round-NNNN.jsonl``, ``custom_id`` = the cache key), run as a
batch and collected into the request cache. Re-asks and failed lines form the next round;
``_batch/state.json`` lets a killed process poll its open batch again instead of resubmitting
(docs/reliability.md, "OpenAI Batch API").
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai

from negsynth.data.shards import atomic_write_json, atomic_write_text, dumps_line
from negsynth.llm.client import answer_of
from negsynth.llm.errors import BudgetStop, LLMFatalError, TransportError

log = logging.getLogger(__name__)

TERMINAL = {"completed", "failed", "expired", "cancelled"}
ENDPOINT = "/v1/chat/completions"


def parse_result_line(row: dict) -> tuple[str, dict | None, str | None]:
    """``(custom_id, answer | None, failure_reason | None)`` for one line of an output/error file."""
    cid = row.get("custom_id", "")
    resp = row.get("response") or {}
    err = row.get("error")
    code = resp.get("status_code")
    if err or code != 200:
        why = f"http_{code}" if code and code != 200 else (err or {}).get("code") or "error"
        return cid, None, str(why)
    body = resp.get("body") or {}
    if not body.get("choices"):
        return cid, None, "empty_choices"
    return cid, answer_of(body), None


class BatchTransport:
    def __init__(self, client: Any, state_dir: Path, *, poll_s: float = 30.0, completion_window: str = "24h"):
        self.client = client
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.poll_s = poll_s
        self.window = completion_window
        self.state_path = self.dir / "state.json"
        self.state: dict[str, Any] = self._load()
        self.pending: dict[str, dict] = {}  # key -> payload
        self.futures: dict[str, list[asyncio.Future]] = {}
        self.outstanding = 0  # structured() calls in progress
        self.failures: Counter = Counter()  # key -> failed rounds
        self._round_task: asyncio.Task | None = None
        self._fatal: BaseException | None = None
        self.stats: Counter = Counter()

    def _load(self) -> dict[str, Any]:
        if self.state_path.exists():
            try:
                return json.loads(self.state_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                log.warning("%s is corrupt; starting a new batch state", self.state_path)
        return {"rounds": []}

    def _save(self) -> None:
        atomic_write_json(self.state_path, self.state)

    def begin(self) -> None:
        self.outstanding += 1

    def end(self) -> None:
        self.outstanding -= 1
        self._maybe_flush()

    async def submit(self, key: str, payload: dict) -> dict:
        if self._fatal is not None:
            raise self._fatal
        await self.client.count_request()
        fut = asyncio.get_running_loop().create_future()
        self.pending[key] = payload
        self.futures.setdefault(key, []).append(fut)
        self._maybe_flush()
        return await fut

    def _waiting(self) -> int:
        return sum(len(v) for v in self.futures.values())

    def _maybe_flush(self) -> None:
        if self._round_task is None and self.pending and self._waiting() >= self.outstanding:
            self._round_task = asyncio.get_running_loop().create_task(self._round())

    def _resolve(self, key: str, value: dict | None = None, exc: BaseException | None = None) -> None:
        self.pending.pop(key, None)
        for fut in self.futures.pop(key, []):
            if not fut.done():
                fut.set_exception(exc) if exc is not None else fut.set_result(value)

    async def _round(self) -> None:
        # let every item task that is about to park its request do so: one round, not many
        await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        if not (self.pending and self._waiting() >= self.outstanding):
            self._round_task = None
            return
        try:
            await self._collect_open_batches()
            todo = {k: p for k, p in self.pending.items() if k in self.futures}
            if todo:
                await self._run_batch(todo)
        except Exception as e:
            err: BaseException = e
            if isinstance(e, (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError)):
                # a refused key or an endpoint without the Batch API: no retry can fix it
                err = LLMFatalError(
                    f"{self.client.base_url} refused the Batch API request (HTTP {e.status_code}); check llm.api_key_env and that the endpoint offers /files and /batches"
                )
            if isinstance(err, (LLMFatalError, BudgetStop)):
                self._fatal = err
            else:  # an API error on files/batches: fail the waiting items as transport rejects
                log.warning("batch round failed: %s", e)
                err = TransportError("transport_batch_api", f"{type(e).__name__}: {str(e)[:200]}")
            for k in list(self.futures):
                self._resolve(k, exc=err)
        finally:
            self._round_task = None
        self._maybe_flush()

    async def _collect_open_batches(self) -> None:
        """A previous process submitted batches it never collected: poll them, don't resubmit."""
        for rnd in self.state["rounds"]:
            if rnd.get("collected"):
                continue
            if not rnd.get("batch_id"):
                if rnd.get("input_file_id"):
                    await self._create(rnd)
                else:
                    rnd["collected"] = True  # never uploaded: its requests are still pending
                    self._save()
                    continue
            self.stats["resumed_batches"] += 1
            await self._finish(rnd)

    async def _run_batch(self, todo: dict[str, dict]) -> None:
        oa = self.client.sdk
        n = len(self.state["rounds"])
        name = f"round-{n:04d}.jsonl"
        lines = [dumps_line({"custom_id": k, "method": "POST", "url": ENDPOINT, "body": p}) for k, p in todo.items()]
        data = "".join(lines)
        atomic_write_text(self.dir / name, data)
        rnd: dict[str, Any] = {"round": n, "file": name, "requests": len(lines), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        self.state["rounds"].append(rnd)
        self._save()
        f = await oa.files.create(file=(name, data.encode("utf-8"), "application/jsonl"), purpose="batch")
        rnd["input_file_id"] = f.id
        self._save()
        await self._create(rnd)
        self.stats["batches"] += 1
        await self._finish(rnd)

    async def _create(self, rnd: dict) -> None:
        oa = self.client.sdk
        b = await oa.batches.create(input_file_id=rnd["input_file_id"], endpoint=ENDPOINT, completion_window=self.window)
        rnd["batch_id"] = b.id
        rnd["status"] = b.status
        self._save()
        log.info("submitted batch %s (%d requests)", b.id, rnd.get("requests", 0))

    async def _finish(self, rnd: dict) -> None:
        oa = self.client.sdk
        while True:
            b = await oa.batches.retrieve(rnd["batch_id"])
            if b.status != rnd.get("status"):
                rnd["status"] = b.status
                self._save()
            if b.status in TERMINAL:
                break
            await asyncio.sleep(self.poll_s)
        answered: set[str] = set()
        failed: dict[str, str] = {}
        for fid in (b.output_file_id, b.error_file_id):
            if not fid:
                continue
            content = await oa.files.content(fid)
            for raw in content.text.splitlines():
                if not raw.strip():
                    continue
                cid, value, why = parse_result_line(json.loads(raw))
                if value is not None:
                    pt, ct = value["usage"]
                    self.client.stats.prompt_tokens += pt
                    self.client.stats.completion_tokens += ct
                    if self.client.ledger is not None:
                        self.client.ledger.add(pt, ct)
                    if self.client.cache is not None:
                        self.client.cache_answer(cid, value)
                    answered.add(cid)
                    self._resolve(cid, value)
                else:
                    failed[cid] = why or "error"
        # requests of this round neither answered nor failed were not run (expired/failed batch)
        sent = self._round_keys(rnd)
        for cid in sent - answered - set(failed):
            failed[cid] = b.status if b.status != "completed" else "missing"
        for cid, why in failed.items():
            self.stats[f"failed_{why}"] += 1
            self.client.stats.transport_retries[f"batch_{why}"] += 1
            self.failures[cid] += 1
            if cid in self.futures and self.failures[cid] > self.client.cfg.max_retries:
                self.client.stats.transport_failures[f"batch_{why}"] += 1
                self._resolve(cid, exc=TransportError(f"transport_batch_{why}", f"batch request failed {self.failures[cid]} times ({why})"))
            # else: stays pending and goes into the next round
        rnd["collected"] = True
        rnd["answered"] = len(answered)
        rnd["failed"] = len(failed)
        self._save()

    def _round_keys(self, rnd: dict) -> set[str]:
        p = self.dir / rnd["file"]
        if not p.exists():
            return set()
        return {json.loads(x)["custom_id"] for x in p.read_text(encoding="utf-8").splitlines() if x.strip()}

    async def aclose(self) -> None:
        if self._round_task is not None:
            self._round_task.cancel()
            try:
                await self._round_task
            except (asyncio.CancelledError, Exception):
                pass

    def as_dict(self) -> dict[str, Any]:
        return {"rounds": len(self.state["rounds"]), **dict(self.stats)}
