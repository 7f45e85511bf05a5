"""Brainstorm on the shared item-stage shape: one task type is one item whose outcome holds all of
its tasks and rejects (one line of the partial shard), the fixed STS task the last item, and one
shard finished only when brainstorm's own verdict passes (the runner's side:
``test_runner_many.py``).

Its outputs, a kill in the middle of a type, a type left pending, the one-line failure, and a
run dir whose brainstorm the previous code (its own loop and shard writer) finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, _last_user, always_valid
from helpers import write_run_config
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import read_stage

runner = CliRunner()
TYPES = ("short-long", "long-short", "long-long", "short-short")
#: tasks per type with :func:`lists`: the classification type (long-short) keeps both of its lists
PER_TYPE = {"short-long": 5, "long-short": 9, "long-long": 5, "short-short": 5}


def lists(req: dict, n: int) -> Reply:
    """Brainstorm lists decided by the request body alone (the same answers run to run): the
    classification type's first list repeats a task, so that type is asked a second round."""
    prompt = _last_user(req)
    if not prompt.startswith("Brainstorm"):
        return always_valid(req, n)
    tag = hashlib.sha1(prompt.encode()).hexdigest()[:6]
    seed = req.get("seed", 0)
    tasks = [f"Find the passages of topic {tag} that answer question {seed}-{i} well" for i in range(5)]
    if "classification" in prompt and seed == 0:
        tasks[4] = tasks[3]  # a duplicate: 4 distinct of 5, a second list is asked
    return Reply(content=json.dumps({"tasks": tasks}))


def _config(tmp_path: Path, url: str, **kw) -> Path:
    return write_run_config(tmp_path, url, llm={"seed": 0, **kw.pop("llm", {})}, **kw)


def _brainstorm(cfg: Path, rd: Path, *extra: str):
    return runner.invoke(app, ["brainstorm", "-c", str(cfg), "-d", str(rd), "-q", "--json", *extra])


def _files(rd: Path) -> dict[str, bytes]:
    d = rd / "brainstorm"
    return {f: (d / f).read_bytes() for f in ("shard-00000.jsonl", "rejects/shard-00000.jsonl")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    """One uninterrupted brainstorm with :func:`lists`: its run dir and stats."""
    tmp = tmp_path_factory.mktemp("bsref")
    with FakeOpenAI(lists) as srv:
        r = _brainstorm(_config(tmp, srv.base_url), tmp / "run")
        assert r.exit_code == 0, r.output
        assert len(srv.requests) == 5  # one list per type, a second for classification
    return tmp / "run", json.loads(r.stdout)


def test_brainstorm_writes_types_in_order_by_id_then_the_fixed_sts_task(reference):
    rd, stats = reference
    tasks = list(read_stage(rd / "brainstorm"))
    assert [t["task_type"] for t in tasks] == [t for t in TYPES for _ in range(PER_TYPE[t])] + ["sts"]
    for tt in TYPES:
        ids = [t["id"] for t in tasks if t["task_type"] == tt]
        assert ids == sorted(ids)
    assert tasks[-1]["id"] == "task-sts-fixed" and tasks[-1]["model"] == "fixed"
    rejs = list(read_stage(rd / "brainstorm" / "rejects"))
    assert [r["reason"] for r in rejs] == ["duplicate_task"]
    assert stats["tasks_per_type"] == {**PER_TYPE, "sts": 1}
    assert (stats["items"], stats["valid"], stats["rejected"], stats["complete"]) == (26, 25, 1, True)
    assert stats["rejects_by_reason"] == {"duplicate_task": 1} and stats["tokens"] == {"prompt": 50, "completion": 100}
    assert stats["shards_done"] == stats["shards_total"] == 1 and stats["pending"] == 0
    man = json.loads((rd / "manifest.json").read_text())["stages"]["brainstorm"]
    assert (man["shard_size"], man["num_shards"], man["items"]) == (None, 1, 5)


def _kill_when(proc: subprocess.Popen, *conds) -> None:
    """SIGKILL ``proc`` once each of ``conds`` held, in turn (waiting on what the process wrote,
    not for a fixed time a loaded machine outruns; pytest's timeout bounds a wait that never ends)."""
    for cond in conds:
        while not cond():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _cached(rd: Path) -> int:
    """Answers committed to the run dir's request cache."""
    import contextlib
    import sqlite3

    p = rd / "cache" / "llm.sqlite"
    if not p.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(p, timeout=5)) as db:  # reads only
            return db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_a_kill_in_the_middle_of_a_type_resumes_with_its_answers_from_the_cache(tmp_path, reference):
    """Killed while the classification type waits for its second round: the types it finished
    are kept (one line each), its first round comes from the cache, and the shard equals an
    uninterrupted run's."""
    ref, _ = reference
    release = threading.Event()

    def held(req, n):
        if "classification" in _last_user(req) and req.get("seed") == 1:
            release.wait(60)
        return lists(req, n)

    rd = tmp_path / "run"
    with FakeOpenAI(held) as srv:
        cfg = _config(tmp_path, srv.base_url)
        cmd = [sys.executable, "-m", "negsynth.cli", "brainstorm", "-c", str(cfg), "-d", str(rd), "-q"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            part = rd / "brainstorm" / "shard-00000.jsonl.partial"
            _kill_when(
                proc,
                lambda: any(q.get("seed") == 1 for q in srv.requests) and len(srv.requests) >= 5,
                # every answer but the held one committed, and the other four types' lines written
                lambda: _cached(rd) >= len(srv.requests) - 1 and part.exists() and part.read_bytes().count(b"\n") >= 4,
            )
        finally:
            release.set()
        part = rd / "brainstorm" / "shard-00000.jsonl.partial"
        lines = [json.loads(x) for x in part.read_text().splitlines()]
        assert sorted(x["i"] for x in lines) == [0, 2, 3, 4] and not (rd / "brainstorm" / "shard-00000.jsonl").exists()
        n0 = len(srv.requests)
        r = _brainstorm(cfg, rd)
        assert r.exit_code == 0, r.output
        sent = srv.requests[n0:]
    # only the round the kill cut short is sent again; the first round's answer is cached
    assert [(q.get("seed"), "classification" in _last_user(q)) for q in sent] == [(1, True)]
    assert json.loads(r.stdout)["this_run"]["cache_hits"] == 1
    assert _files(rd) == _files(ref)


def test_a_type_failing_at_the_transport_level_stays_pending_and_a_rerun_asks_only_it(tmp_path, reference):
    ref, ref_stats = reference
    down = {"on": True}

    def flaky(req, n):
        if down["on"] and "text matching tasks where the queries are long" in _last_user(req):
            return Reply(status=502)
        return lists(req, n)

    rd = tmp_path / "run"
    with FakeOpenAI(flaky) as srv:
        cfg = _config(tmp_path, srv.base_url, llm={"max_retries": 1})
        r = _brainstorm(cfg, rd)
        assert r.exit_code != 0
        st = json.loads((rd / "brainstorm" / "stats.json").read_text())
        # every list of the type failed (max_requests_per_type of them, as the layered config says): pending, none rejected
        from negsynth.schemas.config_io import load_config

        n = load_config(cfg).brainstorm.max_requests_per_type
        assert st["pending"] == n and st["pending_by_reason"] == {"transport_http_502": n} and not st["complete"]
        assert (st["valid"], st["rejected"]) == (20, 1)  # the three other types (5 + 9 + 5) and the STS task, kept
        assert "tasks_per_type" not in st and not (rd / "brainstorm" / "shard-00000.jsonl").exists()
        down["on"] = False
        n0 = len(srv.requests)
        r = _brainstorm(cfg, rd)
        assert r.exit_code == 0, r.output
        assert len(srv.requests) - n0 == 1  # the long-long type's one list; the others are kept
    assert _files(rd) == _files(ref)
    st = json.loads(r.stdout)
    assert st["tasks_per_type"] == ref_stats["tasks_per_type"] and st["tokens"] == ref_stats["tokens"]


def test_no_usable_list_fails_in_one_line_and_leaves_no_finished_shard(tmp_path):
    prose = lambda req, n: Reply(content="Here are some tasks, in prose.")  # noqa: E731
    rd = tmp_path / "run"
    with FakeOpenAI(prose) as srv:
        cfg = _config(tmp_path, srv.base_url, llm={"max_attempts": 1}, brainstorm={"max_requests_per_type": 2})
        r = _brainstorm(cfg, rd)
        assert r.exit_code == 2, r.output
        assert r.stderr.count("\n") == 1
        # judged by the list requests (4 types x 2), not by the fixed STS task
        assert r.stderr.startswith("error: brainstorm: 0 valid outputs of 8 items (invalid_json 8)"), r.stderr
        assert not (rd / "brainstorm" / "shard-00000.jsonl").exists()
        n0 = len(srv.requests)
        r = _brainstorm(cfg, rd)
        assert r.exit_code == 2 and r.stderr.startswith("error: brainstorm: 0 valid outputs of 8 items") and len(srv.requests) == n0


def test_a_brainstorm_the_previous_code_finished_is_reused_and_the_run_goes_on(tmp_path, reference):
    """The previous brainstorm wrote its shard itself: manifest entry without ``items``, per-shard
    stats with counts only. It is reused as it is, re-read when its stats.json is gone, and
    ``negsynth run`` goes on to generate; nothing is asked again."""
    import shutil

    ref, ref_stats = reference
    rd = tmp_path / "run"
    shutil.copytree(ref, rd)
    man = json.loads((rd / "manifest.json").read_text())
    entry = man["stages"]["brainstorm"]
    man["stages"]["brainstorm"] = {"config_hash": entry["config_hash"], "shard_size": None, "num_shards": 1, "updated": entry["updated"]}
    (rd / "manifest.json").write_text(json.dumps(man))
    (rd / "brainstorm" / "_shards" / "00000.json").write_text(json.dumps({"items": 26, "valid": 25, "rejected": 1}))
    old = (rd / "manifest.json").read_bytes()
    with FakeOpenAI(lists) as srv:
        cfg = _config(tmp_path, srv.base_url)
        r = _brainstorm(cfg, rd)
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["reused"] and (rd / "manifest.json").read_bytes() == old
        (rd / "brainstorm" / "stats.json").unlink()
        r = _brainstorm(cfg, rd)
        assert r.exit_code == 0, r.output
        st = json.loads(r.stdout)
        assert st["complete"] and (st["valid"], st["rejected"]) == (25, 1) and st["tasks_per_type"] == ref_stats["tasks_per_type"]
        assert st["rejects_by_reason"] == {"duplicate_task": 1}  # recounted from the rejects: the old record had none
        assert srv.requests == []
        r = runner.invoke(app, ["run", "-c", str(cfg), "-d", str(rd), "-q", "--stages", "brainstorm,generate"])
        assert r.exit_code == 0, r.output
        assert srv.requests and all(not _last_user(q).startswith("Brainstorm") for q in srv.requests)
    assert _files(rd) == _files(ref) and list(read_stage(rd / "generate"))
