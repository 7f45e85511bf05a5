"""Scale-out (--executor ray: ranks) and budgets (--max-requests/-tokens/-cost)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, always_valid, sts_reasked_once
from helpers import (
    brainstormed_once,
    generate_files,
    own_processes,
    reference_run,
    request_bodies,
    start_local_ray,
    write_run_config,
)
from typer.testing import CliRunner

from negsynth.cli import EXIT_BUDGET, app
from negsynth.data.shards import read_stage

runner = CliRunner()
EXAMPLES = 22
SHARD = 4  # 6 shards


def write_config(tmp: Path, base_url: str) -> Path:
    return write_run_config(
        tmp,
        base_url,
        llm={"max_concurrency": 3, "max_attempts": 2, "price": {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}},
        pipeline={"shard_size": SHARD},
        generate={"examples": EXAMPLES, "min_per_type": 2},
    )


@pytest.fixture(scope="module")
def brainstormed(tmp_path_factory) -> Path:
    return brainstormed_once(tmp_path_factory, write_config)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, brainstormed):
    """One uninterrupted single-worker run: its data files, stats and the requests it needed."""
    return reference_run(tmp_path_factory, brainstormed, write_config, sts_reasked_once)


def gen(cfg: Path, rd: Path, *extra: str):
    return runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "-q", *extra])


def ray_gen(ray, cfg: Path, rd: Path, *extra: str):
    """``gen`` with ``--executor ray`` on a local Ray node started for it (and shut down after)."""
    start_local_ray()
    try:
        return gen(cfg, rd, "--executor", "ray", *extra)
    finally:
        ray.shutdown()


# -- scale-out ----------------------------------------------------------------------------------
def test_a_run_resumed_by_another_world_size_and_an_overwrite_on_ray_give_the_same_bytes(tmp_path, rd, reference):
    """A stage stopped in one process is finished by 3 Ray ranks (every shard is the same whichever
    rank writes it: no request paid twice), and an --overwrite by 2 ranks builds beside the old
    outputs, from the cache, and swaps them in."""
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'negsynth[ray]')")
    ref_files, ref_stats, ref_bodies = reference
    with FakeOpenAI(sts_reasked_once) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        assert gen(cfg, rd, "--max-requests", "5").exit_code == EXIT_BUDGET
        start_local_ray()
        try:
            r = gen(cfg, rd, "--executor", "ray", "--workers", "3", "--json")
            assert r.exit_code == 0, r.output
            assert request_bodies(srv.requests) == ref_bodies and generate_files(rd) == ref_files
            n = len(srv.requests)
            r = gen(cfg, rd, "--executor", "ray", "--workers", "2", "--overwrite", "--json")
        finally:
            ray.shutdown()
    assert r.exit_code == 0, r.output
    assert len(srv.requests) == n and generate_files(rd) == ref_files  # redone from the cache
    st = json.loads(r.stdout)
    assert st["complete"] and st["num_shards"] == 2 and st["valid"] == ref_stats["valid"] and "overwrite_pending" not in st
    assert not (rd / ".generate.overwrite").exists()
    assert json.loads((rd / "manifest.json").read_text())["stages"]["generate"]["num_shards"] == 2
    rows = list(read_stage(rd / "generate"))
    assert len({r["id"] for r in rows}) == len(rows) == ref_stats["valid"]


def test_ray_executor_union_equals_single_worker_run(tmp_path, rd, reference):
    """--executor ray: the ranks as Ray tasks on a local cluster, their stats summed by the
    driver; byte-identical data and exactly one process's requests; concurrency split among the
    ranks, rpm / tpm one pair of buckets they share."""
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'negsynth[ray]')")
    from negsynth.pipeline.ray_executor import worker_config
    from negsynth.schemas.config_io import load_config

    ref_files, ref_stats, ref_bodies = reference
    with FakeOpenAI(sts_reasked_once) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        # llm.rpm / llm.tpm set: the workers pace through one pair of buckets (a RateLedger actor)
        r = ray_gen(ray, cfg, rd, "--workers", "3", "--set", "llm.rpm=6000", "--set", "llm.tpm=10000000", "--json")
        assert r.exit_code == 0, r.output
        bodies = request_bodies(srv.requests)
    assert generate_files(rd) == ref_files and bodies == ref_bodies
    merged = json.loads(r.stdout)
    lim = merged["this_run"]["rate_limiter"]
    assert lim["shared"] is True and (lim["rpm"], lim["tpm"]) == (6000, 10000000)  # the whole rate, shared: no 1/n split
    assert merged["executor"] == "ray" and merged["num_shards"] == 3 and merged["valid"] == ref_stats["valid"] and merged["complete"]
    split = worker_config(load_config(cfg, ["llm.rpm=100", "llm.tpm=7"]), 3).llm
    # concurrency is split (each worker's connections are its own); rpm / tpm stay whole: the
    # workers share one pair of buckets in a RateLedger actor
    assert (split.max_concurrency, split.rpm, split.tpm) == (1, 100, 7)


def test_ray_workers_share_one_budget_and_a_rerun_finishes(tmp_path, rd, reference):
    """--executor ray --max-requests N: one budget for all workers (a Ray actor counts every
    request before it is sent), so together they send at most N, stop like one process (stopped_by,
    exit 3, finished work written), and a rerun without the budget finishes with every item once
    and no request sent twice (the request cache)."""
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'negsynth[ray]')")

    ref_files, ref_stats, ref_bodies = reference
    with FakeOpenAI(sts_reasked_once) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        start_local_ray()
        try:
            r = gen(cfg, rd, "--executor", "ray", "--workers", "2", "--max-requests", "7", "--json")
            assert r.exit_code == EXIT_BUDGET, r.output
            sent = len(srv.requests)
            assert sent == 7  # never more than the budget, with 2 workers x 2 requests in flight
            st = json.loads(r.stdout)
            assert st["stopped_by"] == "max_requests=7" and st["executor"] == "ray"
            assert st["budget"]["used"]["requests"] == 7 and st["budget"]["scope"].startswith("this invocation, shared")
            assert "stopped by budget max_requests=7" in r.stderr and "rerun" in r.stderr
            assert st["this_run"]["requests"] == 7  # no static split: the ranks' counts add up to it
            assert 0 < st["items"] < EXAMPLES
            r = gen(cfg, rd, "--executor", "ray", "--workers", "2", "--json")
        finally:
            ray.shutdown()
        assert r.exit_code == 0, r.output
        bodies = request_bodies(srv.requests)
    assert bodies == ref_bodies  # over both runs each request was sent once: none paid twice
    assert generate_files(rd) == ref_files
    final = json.loads(r.stdout)
    assert (
        final["complete"]
        and final["stopped_by"] is None
        and final["valid"] == ref_stats["valid"]
        and final["budget"]["max_requests"] is None
    )
    rows = list(read_stage(rd / "generate"))
    assert len({r["id"] for r in rows}) == len(rows) == ref_stats["valid"]  # every item once: no duplicate id


def test_budget_ledger_checks_and_counts_in_one_call():
    """The shared budget's counts (the Ray actor's class, here without Ray): a request is counted
    only when no limit is reached; tokens and cost stop the next one; a request never sent is given back."""
    from negsynth.pipeline.context import Budget
    from negsynth.pipeline.ray_executor import BudgetLedger

    led = BudgetLedger(Budget(max_requests=2), 1000.0, 1000.0)
    assert [led.reserve() for _ in range(3)] == [None, None, "max_requests=2"] and led.requests == 2
    led.unreserve()
    assert led.reserve() is None and led.reserve() == "max_requests=2"
    led = BudgetLedger(Budget(max_tokens=50, max_cost=0.04), 1000.0, 1000.0)
    assert led.reserve() is None
    led.add(20, 10)
    assert led.reserve() is None and led.used() == {"requests": 2, "tokens": 30, "cost_usd": 0.03}
    led.add(5, 5)
    assert led.reserve() == "max_cost=0.04" and led.used()["requests"] == 2
    led = BudgetLedger(Budget(max_tokens=50), 0.0, 0.0)
    led.add(30, 20)
    assert led.reserve() == "max_tokens=50"


@pytest.mark.slow
def test_ray_worker_killed_mid_run_is_retried_and_resumes(tmp_path, rd, reference):
    """SIGKILL one Ray worker process while its requests are in flight: Ray retries the task, it
    resumes from its .partial shards and the cache, and the data equals a one-process run."""
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'negsynth[ray]')")
    import signal
    import threading
    import time

    ref_files, _, _ = reference

    def slow(req, n):
        r = sts_reasked_once(req, n)
        r.delay = 0.15
        return r

    with FakeOpenAI(slow) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        start_local_ray()
        try:
            out = {}
            t = threading.Thread(target=lambda: out.setdefault("r", gen(cfg, rd, "--executor", "ray", "--workers", "2", "--json")))
            t.start()
            killed = None
            deadline = time.monotonic() + 180  # Ray starts its workers slowly on a loaded machine
            while killed is None and time.monotonic() < deadline:
                if len(srv.requests) >= 4:  # both workers are sending
                    pids = own_processes("ray::_rank")
                    if pids:
                        killed = int(pids[0])
                        os.kill(killed, signal.SIGKILL)
                time.sleep(0.05)
            t.join(timeout=240)
        finally:
            ray.shutdown()
    assert killed is not None, "no Ray worker process was found to kill"
    r = out["r"]
    assert r.exit_code == 0, r.output
    assert generate_files(rd) == ref_files  # the retried task resumed and finished its shards
    assert json.loads((rd / "generate" / "stats.json").read_text())["complete"]  # summed by the driver


# -- budgets ------------------------------------------------------------------------------------
def test_max_requests_stops_cleanly_and_a_larger_budget_continues(tmp_path, rd, reference):
    ref_files, ref_stats, ref_bodies = reference
    with FakeOpenAI(sts_reasked_once) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        r = gen(cfg, rd, "--max-requests", "9", "--json")
        assert r.exit_code == EXIT_BUDGET, r.output
        assert "stopped by budget max_requests=9" in r.stderr and "rerun" in r.stderr
        assert len(srv.requests) == 9  # never overshoots, even with 3 requests in flight
        st = json.loads((rd / "generate" / "stats.json").read_text())
        assert st["stopped_by"] == "max_requests=9" and not st["complete"] and st["this_run"]["requests"] == 9
        done = list(read_stage(rd / "generate")) + [
            json.loads(x)["r"] for p in (rd / "generate").glob("*.partial") for x in p.read_text().splitlines()
        ]
        assert 0 < len(done) == st["items"] < EXAMPLES  # everything finished is written
        # a second, still small budget makes progress again
        r = gen(cfg, rd, "--max-requests", "5")
        assert r.exit_code == EXIT_BUDGET and len(srv.requests) == 14
        # a large enough budget finishes the job: same data as an uninterrupted run, nothing resent
        r = gen(cfg, rd, "--max-requests", "1000", "--json")
        assert r.exit_code == 0, r.output
        final = json.loads(r.stdout)
        assert final["complete"] and final["stopped_by"] is None
        assert request_bodies(srv.requests) == ref_bodies
    assert generate_files(rd) == ref_files


@pytest.mark.parametrize("flag, value, why", [("--max-tokens", "200", "max_tokens=200"), ("--max-cost", "0.2", "max_cost=0.2")])
def test_token_and_cost_budgets_stop_cleanly(tmp_path, rd, flag, value, why):
    with FakeOpenAI(sts_reasked_once) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        r = gen(cfg, rd, flag, value)
        assert r.exit_code == EXIT_BUDGET, r.output
        st = json.loads((rd / "generate" / "stats.json").read_text())
        assert st["stopped_by"] == why and not st["complete"]
        # 30 tokens per request (fake usage): the budget stops within the requests in flight
        assert 200 / 30 <= len(srv.requests) <= 200 / 30 + 3
        r = gen(cfg, rd)
        assert r.exit_code == 0 and json.loads((rd / "generate" / "stats.json").read_text())["complete"]


def test_brainstorm_budget_writes_nothing_partial_and_rerun_completes(tmp_path):
    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        rd = tmp_path / "run"
        r = runner.invoke(app, ["brainstorm", "-c", str(cfg), "-d", str(rd), "-q", "--max-requests", "2"])
        assert r.exit_code == EXIT_BUDGET, r.output
        assert not (rd / "brainstorm" / "shard-00000.jsonl").exists()
        assert json.loads((rd / "brainstorm" / "stats.json").read_text())["stopped_by"] == "max_requests=2"
        assert len(srv.requests) == 2
        r = runner.invoke(app, ["brainstorm", "-c", str(cfg), "-d", str(rd), "-q"])
        assert r.exit_code == 0, r.output
        assert len(srv.requests) == 4  # the two answered requests came from the cache
    assert len(list(read_stage(rd / "brainstorm"))) == 21
