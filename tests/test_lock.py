"""One process per run dir (negsynth.pipeline.lock).

The holder is a real second process (a few lines of Python holding the lock until its stdin
closes), because a flock excludes other processes, not this one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, always_valid
from test_cli_pipeline import invoke, runner, write_config

from negsynth.cli import app
from negsynth.errors import UserError
from negsynth.pipeline.lock import LOCK_NAME, hold, lock_path, token

REPO = Path(__file__).resolve().parents[1]
HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from negsynth.pipeline.lock import hold
    run_dir, stage, k, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with hold(run_dir, stage=stage or None, shard=(k, n) if n > 1 else None):
        print("held", flush=True)
        sys.stdin.read()  # until the test closes our stdin (or kills us)
    """
)


@contextmanager
def other_process_holds(run_dir: Path, stage: str = "", shard: tuple[int, int] = (0, 1)):
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir), stage, str(shard[0]), str(shard[1])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        line = p.stdout.readline()
        assert line.strip() == "held", p.stderr.read()
        yield p
    finally:
        if p.poll() is None:
            p.stdin.close()
            p.wait(timeout=300)


def test_a_second_command_on_a_held_run_dir_stops_in_one_line_and_sends_nothing(tmp_path):
    with FakeOpenAI(always_valid) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        rd = tmp_path / "run"
        with other_process_holds(rd) as holder:
            for cmd in (["generate"], ["brainstorm"], ["run", "--stages", "brainstorm,generate"]):
                r = runner.invoke(app, [*cmd, "-c", str(cfg), "-d", str(rd), "-q"])
                assert r.exit_code == 2, (cmd, r.output)
                line = r.stderr
                assert line.count("\n") == 1 and "Traceback" not in line, line
                assert f"PID {holder.pid} on host {socket.gethostname()}" in line and str(rd / LOCK_NAME) in line, line
            assert srv.requests == [] and srv.headers == []  # not even the endpoint check
            assert sorted(p.name for p in rd.iterdir()) == [LOCK_NAME]  # nothing written: no manifest, no stage folder
        # released when the holder exits: the same command now runs, and leaves no lock behind
        assert not (rd / LOCK_NAME).exists()
        assert invoke("brainstorm", "-c", str(cfg), "-d", str(rd), "-q").exit_code == 0
        assert srv.requests and not (rd / LOCK_NAME).exists()


def test_the_lock_of_a_killed_holder_is_taken_over_with_a_line(tmp_path):
    rd = tmp_path / "run"
    with other_process_holds(rd) as holder:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=300)
    left = json.loads((rd / LOCK_NAME).read_text())  # a SIGKILL leaves the file (the kernel drops the flock)
    assert left["pid"] == holder.pid and left["host"] == socket.gethostname()
    lines: list[str] = []
    with hold(rd, warn=lines.append):
        assert json.loads((rd / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert len(lines) == 1 and f"PID {holder.pid}" in lines[0] and "no longer running" in lines[0] and "took over" in lines[0]
    assert not (rd / LOCK_NAME).exists()


def test_workers_of_a_split_run_share_the_run_dir_but_not_a_shard(tmp_path):
    rd = tmp_path / "run"
    with other_process_holds(rd, "generate", (0, 2)) as worker0:
        with hold(rd, stage="generate", shard=(1, 2)):  # another worker of the same split: runs beside it
            assert lock_path(rd, "generate", (1, 2)).exists()
        with pytest.raises(UserError, match=f"PID {worker0.pid}"):
            with hold(rd, stage="generate", shard=(0, 2)):  # the same shard twice
                pass
        with pytest.raises(UserError, match=rf"PID {worker0.pid} .*a worker of a split run"):
            with hold(rd):  # a whole-run-dir command while a worker runs
                pass
    with other_process_holds(rd) as whole:
        with pytest.raises(UserError, match=f"PID {whole.pid}"):
            with hold(rd, stage="generate", shard=(1, 2)):  # a worker while a whole-run-dir command runs
                pass
    assert list(rd.glob(".negsynth*")) == []


WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from negsynth.errors import UserError
    from negsynth.pipeline.lock import hold
    run_dir, under = Path(sys.argv[1]), sys.argv[2] or None
    try:
        with hold(run_dir, stage="generate", shard=(0, 2), under=under):
            print("ran")
    except UserError as e:
        print(f"refused: {e}")
    """
)


def worker_under(run_dir: Path, under: str | None) -> str:
    """A worker in another process, launched with the lock token ``under`` (as a Ray task is)."""
    p = subprocess.run([sys.executable, "-c", WORKER, str(run_dir), under or ""], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_workers_the_holder_launches_run_under_it_and_no_one_else(tmp_path):
    """`negsynth run --executor ray`: the process holding the run dir passes its lock token to
    its workers, which then run beside it; a worker without it, or with another token, is
    refused as before, and so is one whose token belonged to a holder that has let go."""
    rd = tmp_path / "run"
    assert token(rd) is None
    with hold(rd):
        tok = token(rd)
        assert tok and json.loads((rd / LOCK_NAME).read_text())["token"] == tok
        assert worker_under(rd, tok) == "ran"
        assert worker_under(rd, None).startswith(f"refused: {rd}: in use by PID {os.getpid()}")
        assert worker_under(rd, "0" * 32).startswith("refused:")
    assert token(rd) is None
    with other_process_holds(rd) as whole:  # an independent holder: the old token means nothing
        assert worker_under(rd, tok).startswith(f"refused: {rd}: in use by PID {whole.pid}")
        with pytest.raises(UserError, match=f"PID {whole.pid}"):
            with hold(rd, stage="generate", shard=(1, 2), under=tok):
                pass
    assert list(rd.glob(".negsynth*")) == []


def test_the_lock_is_reentrant_in_one_process(tmp_path):
    rd = tmp_path / "run"
    with hold(rd):
        with hold(rd):  # `negsynth run` holds it and each of its stages asks again
            pass
        assert (rd / LOCK_NAME).exists()
    assert not (rd / LOCK_NAME).exists()
