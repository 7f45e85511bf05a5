"""Never strand or delete work: outages, --overwrite, request deadlines, all-failed stages.

Every test drives the real CLI against the real-socket fake server (tests/fake_openai.py): a
server that goes away mid-run and comes back on the same port, one that trickles its answer
byte by byte, one that answers 400 or an HTML page, and a run dir whose outputs must survive
a failed --overwrite.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid, valid_answer
from helpers import OUTAGE_EXAMPLES, brainstormed_once, generate_command, outage_config
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import read_stage

runner = CliRunner()


@pytest.fixture(scope="module")
def brainstormed(tmp_path_factory) -> Path:
    return brainstormed_once(tmp_path_factory, outage_config)


def generate(cfg: Path, rd: Path, *extra: str):
    return runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "-q", "--json", *extra])


def one_line(r) -> str:
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


def all_rejects(rd: Path, stage: str = "generate") -> list[dict]:
    out = []
    for p in sorted((rd / stage / "rejects").glob("shard-*.jsonl")):
        out += [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return out


def outputs(rd: Path, stage: str = "generate") -> dict[str, bytes]:
    d = rd / stage
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def down_after(k: int, holder: dict):
    """Answer ``k`` requests, then the server goes away (refused connections, resets)."""

    def responder(req, n):
        if n == k:
            holder["srv"].go_down()
            return Reply(reset=True)
        return always_valid(req, n)

    return responder


# ---------------------------------------------------------------------------- 1. outages


def test_outage_stops_the_stage_and_a_plain_rerun_finishes_every_item(tmp_path, rd):
    holder: dict = {}
    srv = holder["srv"] = FakeOpenAI(down_after(5, holder))
    with srv:
        cfg = outage_config(tmp_path, srv.base_url)
        r = generate(cfg, rd)
        assert r.exit_code == 4, r.output
        assert "requests in a row failed" in one_line(r) and "rerun the same command" in r.stderr
        stats = json.loads(r.stdout)
        assert stats["complete"] is False and stats["outage"] and stats["failed"] is None
        # refused connections are not requests: the count is what reached the server (give or
        # take the connections in flight while it shut down), far fewer than the attempts made
        tr = stats["this_run"]
        attempts = 5 + sum(tr["transport_retries"].values()) + sum(tr["transport_failures"].values())
        assert len(srv.requests) + srv.dropped <= tr["requests"] <= len(srv.requests) + srv.dropped + 4 < attempts, (
            tr,
            len(srv.requests),
            srv.dropped,
        )
        # no transport failure became a reject, in a finished shard or anywhere
        assert not any(x["reason"].startswith("transport_") for x in all_rejects(rd))
        assert stats["rejects_by_reason"] == {}
        assert stats["valid"] < OUTAGE_EXAMPLES and list((rd / "generate").glob("*.partial"))
        # the manifest records finished stages only; what the partial outputs are made from is
        # in the stage folder (a relaunch with another config is refused against it)
        man = json.loads((rd / "manifest.json").read_text())
        assert "generate" not in man["stages"] and (rd / "generate" / "_entry.json").is_file()

        srv.come_back()  # the same server, on the same port
        srv.responder = always_valid
        r = generate(cfg, rd)
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["complete"] is True and stats["valid"] == OUTAGE_EXAMPLES and stats["rejected"] == 0 and stats["pending"] == 0
    assert len(list(read_stage(rd / "generate"))) == OUTAGE_EXAMPLES and all_rejects(rd) == []
    assert not list((rd / "generate").glob("*.partial"))
    assert "generate" in json.loads((rd / "manifest.json").read_text())["stages"]


def test_sporadic_transport_failures_are_pending_not_rejected(tmp_path, rd):
    """Retries run out for a few items (a 503 to their first two requests): they stay pending."""
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def responder(req, n):
        key = json.dumps(req["messages"])
        with lock:
            seen[key] = seen.get(key, 0) + 1
            first = seen[key] <= 2
        if first and "misleading_labels" in req["messages"][-1]["content"]:
            return Reply(status=503)
        return always_valid(req, n)

    with FakeOpenAI(responder) as srv:
        cfg = outage_config(tmp_path, srv.base_url, max_consecutive_failures=50)
        r = generate(cfg, rd)
        assert r.exit_code == 4, r.output
        assert "pending, not rejected" in one_line(r)
        stats = json.loads(r.stdout)
        n = stats["pending"]
        assert n > 0 and stats["pending_by_reason"] == {"transport_http_503": n} and stats["rejected"] == 0
        rep = runner.invoke(app, ["inspect", str(rd), "--json"])
        assert rep.exit_code == 0, rep.output
        assert json.loads(rep.stdout)["stages"]["generate"]["pending"] == n
        r = generate(cfg, rd)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["valid"] == OUTAGE_EXAMPLES and all_rejects(rd) == []


def test_outage_in_batch_mode_keeps_items_pending_and_a_rerun_finishes(tmp_path, rd, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_BATCH_POLL_S", "0.01")
    with FakeOpenAI(always_valid) as srv:
        polls = {"n": 0}

        def on_poll(b):
            polls["n"] += 1
            if polls["n"] == 1:
                srv.go_down()

        srv.on_batch_poll = on_poll
        cfg = outage_config(tmp_path, srv.base_url)
        r = generate(cfg, rd, "--mode", "batch")
        assert r.exit_code == 4, r.output
        one_line(r)
        stats = json.loads(r.stdout)
        assert stats["complete"] is False and stats["rejected"] == 0
        assert not any(x["reason"].startswith("transport_") for x in all_rejects(rd))
        srv.on_batch_poll = None
        srv.come_back()
        r = generate(cfg, rd, "--mode", "batch")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["valid"] == OUTAGE_EXAMPLES and all_rejects(rd) == []


# ---------------------------------------------------------------------------- 2. --overwrite


@pytest.fixture
def finished(tmp_path, rd) -> tuple[Path, dict[str, bytes], str]:
    with FakeOpenAI(always_valid) as srv:
        cfg = outage_config(tmp_path, srv.base_url)
        r = generate(cfg, rd)
        assert r.exit_code == 0, r.output
    return rd, outputs(rd), (rd / "manifest.json").read_text()


def _dead_url() -> str:
    with FakeOpenAI(always_valid) as srv:
        return srv.base_url  # closed on exit: connections are refused


@pytest.mark.parametrize("case", ["unset_key_env", "missing_key_file", "refused", "corrupt_cache"])
def test_a_failed_overwrite_check_touches_nothing(tmp_path, finished, case, monkeypatch):
    rd, before, manifest = finished
    with FakeOpenAI(always_valid) as srv:
        url = srv.base_url if case != "refused" else _dead_url()
        llm = {}
        if case == "unset_key_env":
            monkeypatch.delenv("NEGSYNTH_TEST_NO_SUCH_KEY", raising=False)
            llm = {"api_key_env": "NEGSYNTH_TEST_NO_SUCH_KEY"}
        elif case == "missing_key_file":
            llm = {"api_key_file": str(tmp_path / "no-such-key")}
        elif case == "corrupt_cache":
            (rd / "cache" / "llm.sqlite").write_bytes(b"this is not a database" * 100)
            for extra in ("-wal", "-shm"):
                (rd / "cache" / f"llm.sqlite{extra}").unlink(missing_ok=True)
        cfg = outage_config(tmp_path, url, **llm)
        r = generate(cfg, rd, "--overwrite", "--set", "generate.seed=7")
        assert srv.requests == []
    assert r.exit_code == 2, r.output
    line = one_line(r)
    if case == "corrupt_cache":
        assert "llm.sqlite" in line
    assert outputs(rd) == before and (rd / "manifest.json").read_text() == manifest


def test_an_overwrite_stopped_by_an_outage_keeps_the_old_outputs_then_swaps(tmp_path, finished):
    rd, before, manifest = finished
    holder: dict = {}
    srv = holder["srv"] = FakeOpenAI(down_after(3, holder))
    with srv:
        cfg = outage_config(tmp_path, srv.base_url)
        r = generate(cfg, rd, "--overwrite", "--set", "generate.seed=7")
        assert r.exit_code == 4, r.output
        assert outputs(rd) == before and (rd / "manifest.json").read_text() == manifest
        srv.come_back()
        srv.responder = always_valid
        r = generate(cfg, rd, "--overwrite", "--set", "generate.seed=7")
    assert r.exit_code == 0, r.output
    after = outputs(rd)
    assert after != before and len(list(read_stage(rd / "generate"))) == OUTAGE_EXAMPLES
    assert not list(rd.glob(".generate.*"))  # the staging folder was swapped in
    man = json.loads((rd / "manifest.json").read_text())
    assert man["stages"]["generate"]["seed"] == 7


def test_batch_overwrite_against_a_server_without_batch_api_keeps_the_outputs(tmp_path, finished, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_BATCH_POLL_S", "0.01")
    rd, before, manifest = finished
    with FakeOpenAI(always_valid) as srv:
        srv.batch_api = False
        r = generate(outage_config(tmp_path, srv.base_url), rd, "--overwrite", "--mode", "batch", "--set", "generate.seed=7")
    assert r.exit_code == 2, r.output
    one_line(r)
    assert outputs(rd) == before and (rd / "manifest.json").read_text() == manifest


# ---------------------------------------------------------------------------- 3. deadline


def test_llm_timeout_is_a_deadline_for_a_trickling_server(tmp_path, rd):
    with FakeOpenAI(lambda req, n: Reply(content=valid_answer(req, n), trickle=0.3)) as srv:
        cfg = outage_config(tmp_path, srv.base_url, timeout=1, max_retries=0, max_consecutive_failures=2)
        t0 = time.monotonic()
        r = generate(cfg, rd)
        took = time.monotonic() - t0
    assert r.exit_code == 4, r.output
    # without the deadline one trickled answer alone takes minutes (0.3 s a byte): a generous bound
    assert took < 120
    assert "did not answer within llm.timeout=1 s" in one_line(r)
    stats = json.loads(r.stdout)
    assert stats["this_run"]["transport_failures"].get("timeout", 0) >= 2


# ---------------------------------------------------------------------------- 4. all-failed stages


@pytest.mark.parametrize(
    "name, reply, expect",
    [
        (
            "bad_request",
            lambda req, n: Reply(status=400, body={"error": {"message": "unknown parameter response_format"}}),
            "refuses the requests as bad",
        ),
        ("html", lambda req, n: Reply(raw=b"<html><body>Welcome to nginx</body></html>"), "not with chat completions"),
        ("garbage", lambda req, n: Reply(content="I am a base model and I like trains"), "0 valid outputs"),
    ],
)
def test_a_stage_where_every_item_failed_exits_non_zero_naming_the_cause(tmp_path, rd, name, reply, expect):
    with FakeOpenAI(reply) as srv:
        cfg = outage_config(tmp_path, srv.base_url)
        r = generate(cfg, rd)
        assert r.exit_code == 2, r.output
        assert expect in one_line(r)
        stats = json.loads(r.stdout)
        assert stats["complete"] is False and stats["failed"]
        # `negsynth run` stops there: score never runs on nothing
        r = runner.invoke(app, ["run", "-c", str(cfg), "-d", str(rd), "-q", "--stages", "generate,score"])
        assert r.exit_code == 2, r.output
        assert not (rd / "score").exists()


def test_failure_rate_of_http_refusals_above_the_threshold_fails(tmp_path, rd):
    def responder(req, n):
        if "misleading_labels" in req["messages"][-1]["content"] or '"S1"' in req["messages"][-1]["content"]:
            return Reply(status=400, body={"error": {"message": "context length exceeded"}})
        return always_valid(req, n)

    with FakeOpenAI(responder) as srv:
        cfg = outage_config(tmp_path, srv.base_url, max_consecutive_failures=100, max_failure_rate=0.1)
        r = generate(cfg, rd)
        assert r.exit_code == 2, r.output
        assert "above llm.max_failure_rate=0.1" in one_line(r)
        # under the threshold the refusals are final rejects and the stage completes
        cfg = outage_config(tmp_path, srv.base_url, max_consecutive_failures=100, max_failure_rate=0.9)
        r = generate(cfg, rd)
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["complete"] is True and stats["rejects_by_reason"].get("bad_request", 0) > 0


# ---------------------------------------------------------------------------- 5. one line, not a traceback


def test_corrupt_cache_is_one_line_and_a_finished_stage_relaunch_needs_neither_cache_nor_server(tmp_path, finished):
    rd, before, _ = finished
    (rd / "cache" / "llm.sqlite").write_bytes(b"garbage" * 1000)
    r = generate(outage_config(tmp_path, _dead_url()), rd)  # no server, a corrupt cache: nothing needed
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["valid"] == OUTAGE_EXAMPLES and outputs(rd)["shard-00000.jsonl"] == before["shard-00000.jsonl"]
    shutil.rmtree(rd / "generate")
    with FakeOpenAI(always_valid) as srv:
        r = generate(outage_config(tmp_path, srv.base_url), rd)
    assert r.exit_code == 2 and "llm.sqlite" in one_line(r) and "move it away" in r.stderr


def test_api_key_with_a_line_break_is_one_line(tmp_path, rd, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_TEST_KEY", "sk-abc\ndef-ghijkl")
    with FakeOpenAI(always_valid) as srv:
        r = generate(outage_config(tmp_path, srv.base_url, api_key_env="NEGSYNTH_TEST_KEY"), rd)
    assert r.exit_code == 2 and "line break" in one_line(r) and "sk-abc" not in r.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unwritable_stage_folder_is_one_line(tmp_path, rd):
    (rd / "generate").mkdir()
    os.chmod(rd / "generate", 0o555)
    try:
        with FakeOpenAI(always_valid) as srv:
            r = generate(outage_config(tmp_path, srv.base_url), rd)
    finally:
        os.chmod(rd / "generate", 0o755)
    line = one_line(r)
    assert r.exit_code == 2 and line.startswith(f"error: cannot write {rd / 'generate'}") and "make it writable" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_inspect_on_an_unreadable_shard_is_one_line(tmp_path, finished):
    rd = finished[0]
    shard = rd / "generate" / "shard-00000.jsonl"
    os.chmod(shard, 0)
    try:
        r = runner.invoke(app, ["inspect", str(rd)])
    finally:
        os.chmod(shard, 0o644)
    assert r.exit_code != 0 and "shard-00000.jsonl" in one_line(r)


# ---------------------------------------------------------------------------- 6. smaller ones


def test_zero_examples_is_refused(tmp_path, rd):
    r = generate(outage_config(tmp_path, _dead_url()), rd, "--set", "generate.examples=0")
    assert r.exit_code == 2 and "generate.examples = 0" in one_line(r)


def test_a_stage_failing_its_checks_does_not_touch_the_manifest(tmp_path, rd, monkeypatch):
    monkeypatch.delenv("NEGSYNTH_TEST_NO_SUCH_KEY", raising=False)
    before = (rd / "manifest.json").read_text()
    r = generate(outage_config(tmp_path, _dead_url()), rd)
    assert r.exit_code == 2, r.output
    one_line(r)
    assert (rd / "manifest.json").read_text() == before and not (rd / "generate").exists()


@pytest.mark.parametrize("signals, code", [(("SIGTERM",), 143), (("SIGINT", "SIGINT"), 130)])
def test_sigterm_and_a_double_ctrl_c_exit_with_one_line(tmp_path, rd, signals, code):
    import signal
    import subprocess

    started = threading.Event()

    def slow(req, n):
        started.set()
        return Reply(content=valid_answer(req, n), delay=0.5)

    with FakeOpenAI(slow) as srv:
        cfg = outage_config(tmp_path, srv.base_url)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
        p = subprocess.Popen(
            generate_command(cfg, rd),
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert started.wait(300), "no request arrived"
            for name in signals:
                p.send_signal(getattr(signal, name))
                time.sleep(0.05)
            _, err = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == code, err
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert "rerun the same command" in err or "interrupted" in err


def test_disk_full_mid_stage_is_one_line_and_a_rerun_pays_for_nothing_twice(tmp_path, rd, monkeypatch):
    """ENOSPC while a shard is written (root cannot be refused a write, so the disk is simulated):
    one line naming the file and the fix, exit 2; the rerun finishes from the request cache."""
    import errno

    from negsynth.data import shards

    real_write = shards.PartialWriter.write
    calls = {"n": 0}

    def full_after_three(self, obj):
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        return real_write(self, obj)

    with FakeOpenAI(always_valid) as srv:
        cfg = outage_config(tmp_path, srv.base_url, max_concurrency=1)
        monkeypatch.setattr(shards.PartialWriter, "write", full_after_three)
        r = generate(cfg, rd)
        line = one_line(r)
        assert r.exit_code == 2 and "cannot write" in line and ".partial" in line and "free some space" in line, line
        paid = len(srv.requests)
        monkeypatch.setattr(shards.PartialWriter, "write", real_write)
        r = generate(cfg, rd)
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["valid"] == OUTAGE_EXAMPLES
        # the answer whose write failed came from the cache: every item was paid for once
        assert len(srv.requests) == OUTAGE_EXAMPLES, (paid, len(srv.requests))
