"""Riding out an outage (llm.outage_wait): the server goes away mid-stage and comes back on the
same port; the stage waits, probing it, and finishes by itself, every item answered once (an
answered request is never sent again). A server that stays away stops the stage as before, after
the configured wait; 0 keeps today's stop at once."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid
from helpers import OUTAGE_EXAMPLES, outage_config, write_run_config
from test_outage import brainstormed  # noqa: F401 - the fixture: one brainstormed run dir setup for the outage modules
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import read_stage

runner = CliRunner()


def generate(cfg: Path, rd: Path, *extra: str):
    return runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "--json", *extra])


def down_for(k: int, seconds: float, srv_holder: dict):
    """Answer ``k`` requests, then go away for ``seconds`` and come back on the same port."""
    answered: dict[str, int] = {}
    lock = threading.Lock()

    def back_later():
        time.sleep(seconds)
        srv_holder["srv"].come_back()

    def responder(req, n):
        if n == k:
            srv_holder["srv"].go_down()
            threading.Thread(target=back_later, daemon=True).start()
            return Reply(reset=True)
        key = json.dumps(req, sort_keys=True)
        with lock:
            answered[key] = answered.get(key, 0) + 1
        return always_valid(req, n)

    return responder, answered


def test_an_outage_is_waited_out_and_the_stage_finishes_by_itself(tmp_path, rd):
    holder: dict = {}
    responder, answered = down_for(4, 2.5, holder)
    srv = holder["srv"] = FakeOpenAI(responder)
    with srv:
        cfg = outage_config(tmp_path, srv.base_url, outage_wait=60)
        r = generate(cfg, rd)
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["complete"] is True and stats["valid"] == OUTAGE_EXAMPLES and stats["pending"] == 0 and stats["rejected"] == 0
    assert len(list(read_stage(rd / "generate"))) == OUTAGE_EXAMPLES and not list((rd / "generate").glob("*.partial"))
    tr = stats["this_run"]
    assert tr["outage_waits"] >= 1 and 1.0 < tr["outage_wait_s"]  # it waited (how long is the machine's load)
    # never paid twice: every answered request was answered once
    assert answered and max(answered.values()) == 1
    assert "waiting: the LLM server is not answering" in r.stderr and "llm.outage_wait" in r.stderr
    assert "resumed: the LLM server answers again" in r.stderr and "Traceback" not in r.stderr
    # a rerun sends nothing: every answer is in the cache and the stage is finished
    n = len(srv.requests)
    with FakeOpenAI(always_valid) as again:
        r = generate(outage_config(tmp_path, again.base_url, outage_wait=60), rd)
        assert r.exit_code == 0 and again.requests == []
    assert len(srv.requests) == n


def test_a_server_that_stays_away_stops_the_stage_after_the_wait(tmp_path, rd):
    holder: dict = {}
    responder, _ = down_for(3, 3600, holder)
    srv = holder["srv"] = FakeOpenAI(responder)
    with srv:
        cfg = outage_config(tmp_path, srv.base_url, outage_wait=2)
        t0 = time.monotonic()
        r = generate(cfg, rd, "-q")
        took = time.monotonic() - t0
    assert r.exit_code == 4, r.output
    assert 2 <= took  # it waited llm.outage_wait before it stopped
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines[0].startswith("waiting: the LLM server is not answering") and lines[-1].startswith("error:")
    assert (
        "requests in a row failed" in lines[-1]
        and "waited 2 s for it: llm.outage_wait" in lines[-1]
        and "rerun the same command" in lines[-1]
    )
    stats = json.loads(r.stdout)
    assert stats["complete"] is False and stats["outage"] and stats["rejected"] == 0
    # nothing but the probes is sent while waiting: one held request at a time, never answered
    assert stats["this_run"]["outage_waits"] == 0


def test_outage_wait_zero_stops_at_once(tmp_path, rd):
    holder: dict = {}
    responder, _ = down_for(3, 3600, holder)
    srv = holder["srv"] = FakeOpenAI(responder)
    with srv:
        r = generate(outage_config(tmp_path, srv.base_url, outage_wait=0), rd, "-q")
    assert r.exit_code == 4
    assert "waiting" not in r.stderr and r.stderr.count("\n") == 1
    assert json.loads(r.stdout)["this_run"]["outage_wait_s"] == 0  # stopped at once: never waited


def test_the_default_waits_a_few_minutes():
    from negsynth.schemas.config import LLMConfig

    assert 60 <= LLMConfig().outage_wait <= 900


@pytest.mark.parametrize("stage", ["brainstorm", "generate"])
def test_a_small_stage_failing_alike_exits_2_naming_the_cause_whatever_the_wait(tmp_path, rd, stage):
    """6 items against an HTML page (fewer than llm.max_consecutive_failures): exit 2 naming it,
    as 20 items do; never waited for nor resent (the server answers, wrongly)."""
    html = lambda req, n: Reply(raw=b"<html><body>Welcome to nginx</body></html>")  # noqa: E731
    with FakeOpenAI(html) as srv:
        cfg = write_run_config(
            tmp_path, srv.base_url, llm={"max_retries": 1, "outage_wait": 60}, generate={"examples": 6, "min_per_type": 1}
        )
        if stage == "brainstorm":
            shutil.rmtree(rd)
        r = runner.invoke(app, [stage, "-c", str(cfg), "-d", str(rd), "-q"])
        sent = len(srv.requests)
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "not with chat completions" in r.stderr and "pending" not in r.stderr
    assert "waiting" not in r.stderr
    if stage == "generate":
        assert sent <= 6 * 2  # each item's request and its one retry, no second pass


@pytest.mark.parametrize("seconds, trip", [(2, 1000), (5, 3)])
def test_a_short_outage_is_ridden_out_inside_the_run(tmp_path, rd, seconds, trip):
    """The server is away for a few seconds mid-run: the items whose own retries ran out go back
    in the queue (with ``trip`` 1000 the breaker never trips: nothing else would wait for the
    server), the stage finishes with exit 0, every item done once and no answered request sent
    twice."""
    holder: dict = {}
    responder, answered = down_for(5, seconds, holder)
    srv = holder["srv"] = FakeOpenAI(responder)
    with srv:
        cfg = outage_config(tmp_path, srv.base_url, outage_wait=20, max_consecutive_failures=trip)
        r = generate(cfg, rd, "-q")
        dropped = srv.dropped
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["complete"] is True and stats["pending"] == 0 and stats["rejected"] == 0
    assert stats["valid"] == OUTAGE_EXAMPLES
    ids = [x["id"] for x in read_stage(rd / "generate")]
    assert len(ids) == OUTAGE_EXAMPLES == len(set(ids)) and not list((rd / "generate").glob("*.partial"))
    assert answered and max(answered.values()) == 1  # never paid twice
    assert stats["this_run"]["transport_failures"] and stats["this_run"]["requeued"] >= 1  # the outage was met, not missed
    assert dropped + len(answered) >= OUTAGE_EXAMPLES
    # the request cache holds every answer: a rerun sends nothing
    with FakeOpenAI(always_valid) as again:
        r = generate(outage_config(tmp_path, again.base_url, outage_wait=20), rd, "-q")
        assert r.exit_code == 0 and again.requests == []


@pytest.mark.parametrize("trip", [3, 1000])
def test_an_outage_longer_than_the_wait_exits_4(tmp_path, rd, trip):
    holder: dict = {}
    responder, _ = down_for(3, 3600, holder)
    srv = holder["srv"] = FakeOpenAI(responder)
    with srv:
        r = generate(outage_config(tmp_path, srv.base_url, outage_wait=2, max_consecutive_failures=trip), rd, "-q")
    assert r.exit_code == 4, r.output
    last = [x for x in r.stderr.splitlines() if x.strip()][-1]
    assert last.startswith("error:") and "llm.outage_wait" in last and "rerun the same command" in last
    stats = json.loads(r.stdout)
    assert stats["complete"] is False and stats["outage"] and stats["rejected"] == 0 and stats["pending"] > 0


def test_a_server_whose_chat_hangs_is_reported_once_and_stops_fast(tmp_path, rd):
    """``GET /models`` answers, every chat request hangs past llm.timeout: the wait's probe is a
    chat request, so the stage says "waiting" once, never "resumed", and stops at that probe
    (not after llm.outage_wait) naming the hanging server, not as an outage to rerun blindly."""
    with FakeOpenAI(lambda req, n: Reply(content="{}", delay=20)) as srv:
        cfg = outage_config(tmp_path, srv.base_url, outage_wait=120, timeout=1)
        t0 = time.monotonic()
        r = generate(cfg, rd)
        took = time.monotonic() - t0
    assert r.exit_code == 4, r.output
    assert took < 60  # 3 requests' two tries, then one probe: seconds, not llm.outage_wait
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert sum("waiting: the LLM server is not answering" in x for x in lines) == 1 and "resumed" not in r.stderr
    last = lines[-1]
    assert srv.base_url in last and "took chat requests and answered none within llm.timeout=1 s" in last
    assert "the server hangs" in last and "Traceback" not in r.stderr
    assert json.loads(r.stdout)["this_run"]["outage_waits"] == 0
