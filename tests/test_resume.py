"""Crash-safe resume: SIGKILL a real `negsynth generate` process at several points, rerun it.

The fake server lives in this test process; the CLI runs as a subprocess. Kill points:

* **early** and **mid-shard**: when the server receives request N it freezes (answers nothing
  more), lets the client finish handling what was already answered, then SIGKILLs it;
* **inside a shard finalize**: ``NEGSYNTH_CRASH_AT=before_final`` (rejects and per-shard stats
  written, shard not yet renamed) and ``after_final`` (shard renamed, ``.partial`` not yet
  removed) make the runner SIGKILL itself there.

The resumed output must be byte-identical to an uninterrupted run with the same seed, with no
duplicate ids, no truncated shard, and the server must never answer the same request twice
(the multiset of answered request bodies equals that of the uninterrupted run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid, valid_answer
from helpers import brainstormed_once, generate_command, write_run_config
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import iter_jsonl, read_stage

REASK = "Your answer was rejected"
EXAMPLES = 24
SHARD = 5


def write_config(tmp: Path, base_url: str) -> Path:
    return write_run_config(
        tmp,
        base_url,
        llm={"timeout": 10, "max_attempts": 2},
        pipeline={"shard_size": SHARD},
        generate={"examples": EXAMPLES, "min_per_type": 2},
    )


def answer(req: dict, n: int) -> Reply:
    """Deterministic by request body: STS items are wrong at first (a re-ask), one type always fails."""
    last = req["messages"][-1]["content"]
    if last.startswith(REASK):
        if "misleading_labels" in req["messages"][-3]["content"]:
            return Reply(content='{"input_text": "x", "label": "y", "misleading_labels": ["a"]}')
        return Reply(content=valid_answer({"messages": req["messages"][:-2]}, n))
    if '"S1"' in last:
        return Reply(content='{"S1": "a b", "S2": "c d", "negatives": ["x y", "x y", "z w", "q r"]}')
    if "misleading_labels" in last:
        return Reply(content='{"input_text": "x", "label": "y", "misleading_labels": ["a"]}')
    return Reply(content=valid_answer(req, n))


def body_key(req: dict) -> str:
    return json.dumps(req, sort_keys=True)


class Server:
    """The fake server plus a kill switch and a log of the requests it actually answered."""

    def __init__(self) -> None:
        self.answered: list[str] = []
        self.kill_at: int | None = None
        self.proc: subprocess.Popen | None = None
        self.frozen = threading.Event()
        self.killed = threading.Event()
        self.lock = threading.Lock()
        self.fake = FakeOpenAI(self.respond)
        #: the killed run dir's request cache; when its process started: the answers the cache
        #: held and the requests answered so far
        self.cache: Path | None = None
        self.mark = (0, 0)

    def respond(self, req: dict, n: int) -> Reply:
        with self.lock:
            if not self.frozen.is_set() and self.kill_at is not None and n >= self.kill_at:
                self.frozen.set()
                threading.Thread(target=self._kill, daemon=True).start()
            frozen = self.frozen.is_set()
            if not frozen:
                self.answered.append(body_key(req))
        if frozen:  # hang until the client is dead: never answered
            self.killed.wait(30)
            return Reply(reset=True)
        return answer(req, n)

    def stored(self) -> int:
        """Answers in the run dir's request cache (what a reader sees committed)."""
        if self.cache is None or not self.cache.exists():
            return 0
        try:
            with contextlib.closing(sqlite3.connect(self.cache, timeout=5)) as db:  # reads only
                return db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        except sqlite3.Error:
            return 0

    def _kill(self) -> None:
        # let the client store what was answered before the freeze: wait until the cache holds
        # every answer (a fixed pause is outrun by a loaded machine), then kill
        assert self.proc is not None
        while self.proc.poll() is None:
            with self.lock:
                want = self.mark[0] + len(set(self.answered[self.mark[1] :]))
            if self.stored() >= want:
                break
            time.sleep(0.05)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.killed.set()


def cli(cfg: Path, rd: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    e = {**os.environ, **(env or {})}
    return subprocess.Popen(generate_command(cfg, rd, *extra), env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outputs(rd: Path) -> dict[str, bytes]:
    """Every data file of the stage (shards, rejects, per-shard stats), by relative path."""
    d = rd / "generate"
    files = [*d.glob("shard-*.jsonl"), *(d / "rejects").glob("*.jsonl"), *(d / "_shards").glob("*.json")]
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(files)}


@pytest.fixture(scope="module")
def brainstormed(tmp_path_factory) -> Path:
    return brainstormed_once(tmp_path_factory, write_config)


def test_sigkill_at_several_points_then_resume_equals_uninterrupted_run(tmp_path, brainstormed):
    srv = Server()
    with srv.fake:
        # the reference: one uninterrupted run
        ref = tmp_path / "ref"
        shutil.copytree(brainstormed, ref)
        cfg = write_config(tmp_path, srv.fake.base_url)
        p = cli(cfg, ref)
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        ref_answered = Counter(srv.answered)
        ref_out = outputs(ref)
        stats = json.loads((ref / "generate" / "stats.json").read_text())
        assert stats["complete"] and stats["items"] == EXAMPLES and stats["rejected"] > 0 and stats["this_run"]["reasks"] > 0
        n_ref = len(srv.answered)

        # the same job, killed again and again
        srv.answered.clear()
        rd = tmp_path / "run"
        shutil.copytree(brainstormed, rd)
        srv.cache = rd / "cache" / "llm.sqlite"
        kills = [
            ("early", {"server_at": 3}),
            ("inside finalize, before the shard is renamed", {"env": "before_final"}),
            ("mid-shard", {"server_after": 7}),
            ("inside finalize, after the rename, before the partial is removed", {"env": "after_final"}),
        ]
        for what, how in kills:
            srv.frozen.clear()
            srv.killed.clear()
            srv.kill_at = None
            env, extra = {}, []
            if "server_at" in how:
                srv.kill_at = how["server_at"]
            elif "server_after" in how:
                srv.kill_at = len(srv.fake.requests) + how["server_after"]
            else:
                env = {"NEGSYNTH_CRASH_AT": how["env"]}
                extra = ["--set", "llm.max_concurrency=1"]  # no answer can be in flight when it dies
            srv.mark = (srv.stored(), len(srv.answered))
            p = srv.proc = cli(cfg, rd, *extra, env=env)
            _, err = p.communicate(timeout=120)
            assert p.returncode == -signal.SIGKILL, f"{what}: expected a SIGKILL, got {p.returncode}: {err}"
            assert "Traceback" not in err
            # the dead client's last requests may still sit in the server's queue on a loaded
            # machine: let them meet the frozen server (unanswered), not the next run's
            srv.fake.quiesce()
            # a killed run leaves only whole shards: every finished shard parses completely
            for f in (rd / "generate").glob("shard-*.jsonl"):
                list(iter_jsonl(f))
        assert list((rd / "generate").glob("*.partial")), "the kills should have left work in progress"

        srv.frozen.clear()
        srv.kill_at = None
        p = cli(cfg, rd)
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err

    assert outputs(rd) == ref_out  # byte-identical shards, rejects and per-shard stats
    assert not list((rd / "generate").glob("*.partial"))
    rows = list(read_stage(rd / "generate")) + list(read_stage(rd / "generate" / "rejects"))
    assert len(rows) == EXAMPLES and len({r["id"] for r in rows}) == EXAMPLES
    # no request the server answered was sent again: the answered multiset equals the reference
    assert Counter(srv.answered) == ref_answered and len(srv.answered) == n_ref
    final = json.loads((rd / "generate" / "stats.json").read_text())
    assert final["complete"] and final["items"] == EXAMPLES and final["valid"] == stats["valid"]


def test_transport_rejects_of_an_unfinished_shard_are_retried_on_resume(tmp_path, rd):
    """An outage turns items into transport_* rejects; a rerun retries them (unlike model failures)."""
    runner = CliRunner()
    with FakeOpenAI(lambda q, n: Reply(status=503)) as down:
        cfg = write_config(tmp_path, down.base_url)
        r = runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "-q", "--set", "llm.max_retries=0", "--max-requests", "3"])
        assert r.exit_code == 3, r.output
    partial = [json.loads(x) for x in (rd / "generate" / "shard-00000.jsonl.partial").read_text().splitlines()]
    assert len(partial) == 3 and all(p["r"]["reason"] == "transport_http_503" for p in partial)
    with FakeOpenAI(always_valid) as up:
        cfg = write_config(tmp_path, up.base_url)
        r = runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "-q", "--json"])
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout)
    assert stats["valid"] == EXAMPLES and stats["rejected"] == 0
    assert len(list(read_stage(rd / "generate"))) == EXAMPLES
