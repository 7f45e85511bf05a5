"""The runner's items that give several rows (brainstorm's task types): one line of the partial
shard per item, flattened in item order when the shard is finished; a kill mid-line, a budget
stop and a transport failure leave the item to be done again; a one-shard stage with its own
verdict finishes its shard only when the verdict passes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from negsynth.data.shards import iter_jsonl
from negsynth.inspect.report import _pending
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.progress import Reporter
from negsynth.pipeline.runner import MANY, Outcome, ShardedRunner, WorkItem
from negsynth.schemas.config_io import load_config


def _ctx(tmp_path: Path, shard_size: int = 10) -> StageContext:
    cfg = load_config(None, [f"pipeline.shard_size={shard_size}"])
    return StageContext(cfg=cfg, run_dir=tmp_path / "run", reporter=Reporter(quiet=True))


def _items(n: int) -> list[WorkItem]:
    return [WorkItem(index=i, id=f"it{i}", payload={}) for i in range(n)]


def _many(i: int, *, pending: bool = False) -> Outcome:
    """Item ``i``: two records, one reject (usage 5 each, not summed) and its own usage."""
    recs = [{"id": f"r{i}-{j}", "usage": {"prompt_tokens": 5}} for j in range(2)]
    rej = [{"id": f"x{i}", "reason": "transport_timeout" if pending else "too_short", "usage": {"prompt_tokens": 5}}]
    return Outcome(records=recs, rejects=rej, usage={"prompt_tokens": 100 + i, "list_requests": 1})


def _single(i: int) -> Outcome:
    return Outcome(record={"id": f"s{i}", "usage": {"prompt_tokens": 1}})


def _run(ctx, items, process, **kw):
    return asyncio.run(ShardedRunner(ctx, "st", ctx.run_dir / "st", concurrency=2, **kw).run(items, process))


def test_an_item_with_several_rows_is_one_line_and_flattens_in_item_order(tmp_path):
    ctx = _ctx(tmp_path)
    calls: list[int] = []

    async def process(it):
        calls.append(it.index)
        return _single(it.index) if it.index == 2 else _many(it.index)

    rep = _run(ctx, _items(4), process)
    d = ctx.run_dir / "st"
    assert rep.shards_done == 1 and not (d / "shard-00000.jsonl.partial").exists()
    assert [r["id"] for r in iter_jsonl(d / "shard-00000.jsonl")] == ["r0-0", "r0-1", "r1-0", "r1-1", "s2", "r3-0", "r3-1"]
    assert [r["id"] for r in iter_jsonl(d / "rejects" / "shard-00000.jsonl")] == ["x0", "x1", "x3"]
    st = json.loads((d / "_shards" / "00000.json").read_text())
    # rows counted; usage: the items' own (the rows' is not summed), a single row's as before
    assert (st["items"], st["valid"], st["rejected"], st["reasons"]) == (10, 7, 3, {"too_short": 3})
    assert st["usage"] == {"prompt_tokens": 100 + 101 + 1 + 103, "list_requests": 3}
    assert (rep.items, rep.valid, rep.rejected, rep.usage["prompt_tokens"]) == (10, 7, 3, 305)


def test_a_budget_stop_leaves_one_line_per_finished_item_and_a_rerun_does_the_rest(tmp_path):
    ctx = _ctx(tmp_path)
    done: list[int] = []

    async def process(it):
        done.append(it.index)
        return _many(it.index)

    rep = asyncio.run(
        ShardedRunner(ctx, "st", ctx.run_dir / "st", concurrency=1, budget_check=lambda: "max_requests=2" if len(done) >= 2 else None).run(
            _items(4), process
        )
    )
    part = ctx.run_dir / "st" / "shard-00000.jsonl.partial"
    lines = part.read_text().splitlines()
    assert rep.stopped_by == "max_requests=2" and len(lines) == 2  # one line per item, all of its rows in it
    assert [json.loads(x)["k"] for x in lines] == [MANY, MANY] and len(json.loads(lines[0])["r"]["ok"]) == 2
    done.clear()
    rep = _run(ctx, _items(4), process)
    assert sorted(done) == [2, 3] and rep.shards_done == 1 and (rep.items, rep.valid) == (12, 8)


def test_a_kill_in_the_middle_of_an_items_line_redoes_that_item(tmp_path):
    ctx = _ctx(tmp_path)

    async def process(it):
        return _many(it.index)

    ref = tmp_path / "ref"
    _run(_ctx(ref), _items(3), process)
    d = ctx.run_dir / "st"
    d.mkdir(parents=True)
    line = lambda i: json.dumps({"i": i, "k": MANY, "r": _many(i).entry()[1]})  # noqa: E731
    (d / "shard-00000.jsonl.partial").write_text(line(0) + "\n" + line(1)[:40])  # killed while writing item 1
    seen: list[int] = []

    async def counting(it):
        seen.append(it.index)
        return await process(it)

    _run(ctx, _items(3), counting)
    assert sorted(seen) == [1, 2]
    for f in ("shard-00000.jsonl", "rejects/shard-00000.jsonl", "_shards/00000.json"):
        assert (d / f).read_bytes() == (ref / "run" / "st" / f).read_bytes(), f


def test_an_item_with_a_transport_failure_stays_pending_and_a_rerun_retries_it(tmp_path):
    ctx = _ctx(tmp_path)
    fail = {1}
    seen: list[int] = []

    async def process(it):
        seen.append(it.index)
        return _many(it.index, pending=it.index in fail)

    rep = _run(ctx, _items(3), process)
    d = ctx.run_dir / "st"
    # the pending item counts its transport failure only: none of its rows is valid or rejected
    assert rep.pending == 1 and dict(rep.pending_reasons) == {"transport_timeout": 1}
    assert (rep.items, rep.valid, rep.rejected, rep.shards_done) == (6, 4, 2, 0)
    assert not (d / "shard-00000.jsonl").exists()
    assert _pending(d) == {"transport_timeout": 1}  # what `negsynth inspect` reports of the partial
    fail.clear()
    seen.clear()
    rep = _run(ctx, _items(3), process)
    assert seen == [1] and rep.shards_done == 1 and rep.pending == 0 and rep.valid == 6


def test_an_all_or_nothing_stage_waits_for_its_verdict(tmp_path):
    ctx = _ctx(tmp_path, shard_size=2)  # a verdict: every item in shard 0 whatever the shard size
    seen: list[int] = []
    verdicts: list[list] = []

    async def process(it):
        seen.append(it.index)
        return _many(it.index)

    def no(rep, rows):
        verdicts.append(rows)
        return "st: no"

    rep = _run(ctx, _items(5), process, verdict=no)
    d = ctx.run_dir / "st"
    assert rep.failed == "st: no" and rep.shards_total == 1 and rep.shards_done == 0
    assert [r["id"] for k, r in verdicts[0] if k == "rej"] == [f"x{i}" for i in range(5)]
    assert not (d / "shard-00000.jsonl").exists() and (d / "shard-00000.jsonl.partial").exists()
    seen.clear()
    rep = _run(ctx, _items(5), process, verdict=lambda rep, rows: None)
    assert seen == [] and rep.failed is None and rep.shards_done == 1  # the rerun judged the kept items again
    assert len(list(iter_jsonl(d / "shard-00000.jsonl"))) == 10


def test_report_finished_is_the_stats_rule():
    """``RunReport.finished`` (what ``--overwrite`` swaps in on) and ``finished_stats`` (what a
    relaunch reuses and ``estimate`` skips) are one rule: every combination of a report's stops."""
    import itertools

    from negsynth.pipeline.llm_stage import report_stats
    from negsynth.pipeline.runner import RunReport
    from negsynth.pipeline.stage import finished_stats

    seen = set()
    for done, failed, outage, stopped, pending in itertools.product((2, 3), (None, "f"), (None, "o"), (None, "budget"), (0, 1)):
        rep = RunReport(
            stage="generate", shards_total=3, shards_done=done, failed=failed, outage=outage, stopped_by=stopped, pending=pending
        )
        assert rep.finished == finished_stats(report_stats("generate", rep)), rep
        assert rep.complete == report_stats("generate", rep)["complete"]
        seen.add(rep.finished)
    assert seen == {True, False}
    assert finished_stats({"stage": "curriculum"})  # a stage without shards: no "complete" key
