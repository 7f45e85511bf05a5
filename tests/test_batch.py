"""`--mode batch`: the OpenAI Batch API path against the fake server's /v1/files and /v1/batches."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid, valid_answer
from helpers import brainstormed_once, generate_command, write_run_config
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import read_stage

runner = CliRunner()
REASK = "Your answer was rejected"
EXAMPLES = 15


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setenv("NEGSYNTH_BATCH_POLL_S", "0.01")


def write_config(tmp: Path, base_url: str) -> Path:
    return write_run_config(tmp, base_url, llm={"max_retries": 2, "max_attempts": 2}, generate={"examples": EXAMPLES, "min_per_type": 2})


def flaky():
    """STS answers are invalid at first (re-ask); long-long lines fail once (500); short-short lines
    are left unprocessed once (the batch expires). Deterministic by request body."""
    seen: set[str] = set()
    lock = threading.Lock()

    def responder(req, n):
        last = req["messages"][-1]["content"]
        if last.startswith(REASK):
            return Reply(content=valid_answer({"messages": req["messages"][:-2]}, n))
        key = json.dumps(req["messages"], sort_keys=True)
        with lock:
            first = key not in seen
            seen.add(key)
        if '"S1"' in last:
            return Reply(content='{"S1": "a b", "S2": "c d", "negatives": ["x y", "x y", "z w", "q r"]}')
        if first and _is_long_long(req):
            return Reply(status=500)
        if first and _is_short_short(req):
            return Reply(status=0) if _batch_mode[0] else Reply(status=503)
        return always_valid(req, n)

    return responder


_batch_mode = [True]


def _is_long_long(req) -> bool:
    return '"input": the input document.' in req["messages"][-1]["content"]


def _is_short_short(req) -> bool:
    return '"input": the input text.' in req["messages"][-1]["content"]


@pytest.fixture(scope="module")
def brainstormed(tmp_path_factory) -> Path:
    return brainstormed_once(tmp_path_factory, write_config)


def data_files(rd: Path) -> dict[str, bytes]:
    d = rd / "generate"
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted([*d.glob("shard-*.jsonl"), *(d / "rejects").glob("*.jsonl")])}


def test_batch_mode_validates_reasks_resubmits_and_matches_online(tmp_path, brainstormed):
    _batch_mode[0] = True
    rd = tmp_path / "batch"
    shutil.copytree(brainstormed, rd)
    with FakeOpenAI(flaky()) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        r = runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "--mode", "batch", "--json", "-q"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout)
        assert srv.requests == []  # nothing went through the live endpoint
        batches = list(srv.batches.values())
        lines = [[json.loads(x) for x in srv.files[b["input_file_id"]].decode().splitlines()] for b in batches]
    # round 0 holds every item; round 1 only the re-asks (STS) and the failed / expired lines
    assert len(batches) == 2
    assert len(lines[0]) == EXAMPLES
    n_sts = stats["planned_per_type"]["sts"]
    n_ll, n_ss = stats["planned_per_type"]["long-long"], stats["planned_per_type"]["short-short"]
    assert batches[0]["status"] == "expired" and batches[1]["status"] == "completed"
    assert len(lines[1]) == n_sts + n_ll + n_ss
    reasks = [x for x in lines[1] if x["body"]["messages"][-1]["content"].startswith(REASK)]
    assert len(reasks) == n_sts and all("are the same" in x["body"]["messages"][-1]["content"] for x in reasks)
    assert {x["custom_id"] for x in lines[1]} & {x["custom_id"] for x in lines[0]} == {x["custom_id"] for x in lines[1] if x not in reasks}
    # every item accounted for once, all valid in the end
    rows = list(read_stage(rd / "generate"))
    assert len(rows) == stats["valid"] == EXAMPLES and len({r["id"] for r in rows}) == EXAMPLES
    assert stats["this_run"]["transport_retries"] == {"batch_http_500": n_ll, "batch_expired": n_ss}
    state = json.loads((rd / "generate" / "_batch" / "state.json").read_text())
    assert [x["collected"] for x in state["rounds"]] == [True, True]

    # the same job online (same faults, as live errors) writes byte-identical shards
    _batch_mode[0] = False
    on = tmp_path / "online"
    shutil.copytree(brainstormed, on)
    with FakeOpenAI(flaky()) as srv2:
        cfg2 = write_config(tmp_path, srv2.base_url)
        r = runner.invoke(app, ["generate", "-c", str(cfg2), "-d", str(on), "-q"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
    assert data_files(on) == data_files(rd)

    # batch answers went through the request cache: an online rerun of the batch run dir is free
    with FakeOpenAI(always_valid) as srv3:
        cfg3 = write_config(tmp_path, srv3.base_url)
        r = runner.invoke(app, ["generate", "-c", str(cfg3), "-d", str(rd), "-q", "--overwrite"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert srv3.requests == [] and srv3.batches == {}
    assert data_files(on) == data_files(rd)


def test_batch_crash_between_submit_and_download_polls_again_instead_of_resubmitting(tmp_path, rd):
    _batch_mode[0] = True
    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        srv.batch_hold.clear()  # batches stay in_progress
        polled = threading.Event()
        srv.on_batch_poll = lambda b: polled.set()
        env = {**os.environ, "NEGSYNTH_BATCH_POLL_S": "0.05"}
        cmd = generate_command(cfg, rd, "--mode", "batch")
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert polled.wait(300), "the batch was never polled"
        finally:
            p.send_signal(signal.SIGKILL)
            _, err = p.communicate(timeout=300)
        assert p.returncode == -signal.SIGKILL, err
        assert len(srv.batches) == 1
        state = json.loads((rd / "generate" / "_batch" / "state.json").read_text())
        assert state["rounds"][0]["batch_id"] == "batch-0000" and not state["rounds"][0].get("collected")
        assert not list((rd / "generate").glob("shard-*.jsonl"))

        # the batch finishes while nobody is watching; the rerun polls it and downloads
        srv.on_batch_poll = None
        srv.batch_hold.set()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert len(srv.batches) == 1  # not resubmitted
        assert len(srv.batch_requests) == EXAMPLES and srv.requests == []  # each request run once, none live
    rows = list(read_stage(rd / "generate"))
    assert len(rows) == EXAMPLES and len({r["id"] for r in rows}) == EXAMPLES
    state = json.loads((rd / "generate" / "_batch" / "state.json").read_text())
    assert len(state["rounds"]) == 1 and state["rounds"][0]["collected"] and state["rounds"][0]["answered"] == EXAMPLES


def test_brainstorm_batch_mode(tmp_path):
    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        r = runner.invoke(
            app, ["brainstorm", "-c", str(cfg), "-d", str(tmp_path / "run"), "--mode", "batch", "--json", "-q"], catch_exceptions=False
        )
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout)
        assert srv.requests == [] and len(srv.batches) == 1 and len(srv.batch_requests) == 4
    assert stats["valid"] == 21 and stats["rejected"] == 0


def test_bad_mode_is_one_line(tmp_path):
    r = runner.invoke(app, ["generate", "-d", str(tmp_path / "r"), "--mode", "turbo"])
    assert r.exit_code == 2 and "--mode 'turbo'" in r.stderr and r.stderr.count("\n") == 1


def test_endpoint_without_batch_api_stops_in_one_line(tmp_path, rd):
    with FakeOpenAI(always_valid) as srv:
        srv.batch_api = False
        cfg = write_config(tmp_path, srv.base_url)
        r = runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "--mode", "batch", "-q"])
    assert r.exit_code == 2 and "refused the Batch API request (HTTP 404)" in r.stderr and r.stderr.count("\n") == 1
    assert not list((rd / "generate").glob("shard-*.jsonl")) and not list((rd / "generate").glob("*.partial"))
