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

from fake_openai import FakeOpenAI, always_valid
from test_cli_pipeline import invoke, runner, write_config

from negsynth.cli import app
from negsynth.pipeline.lock import LOCK_NAME, hold

REPO = Path(__file__).resolve().parents[1]
HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from negsynth.pipeline.lock import hold
    with hold(Path(sys.argv[1])):
        print("held", flush=True)
        sys.stdin.read()  # until the test closes our stdin (or kills us)
    """
)


@contextmanager
def other_process_holds(run_dir: Path):
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)],
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


def test_the_lock_is_reentrant_in_one_process(tmp_path):
    rd = tmp_path / "run"
    with hold(rd):
        with hold(rd):  # `negsynth run` holds it and each of its stages asks again
            pass
        assert (rd / LOCK_NAME).exists()
    assert not (rd / LOCK_NAME).exists()


def test_the_lock_is_released_when_a_nested_holder_leaves_last(tmp_path):
    """A stage's worker thread that asks again and leaves after the run's own hold: the last to
    leave releases the run dir, whichever took it."""
    import threading

    rd = tmp_path / "run"
    entered, outer_left = threading.Event(), threading.Event()

    def nested():
        with hold(rd):
            entered.set()
            outer_left.wait(30)

    with hold(rd):
        t = threading.Thread(target=nested)
        t.start()
        assert entered.wait(30)
    assert (rd / LOCK_NAME).exists()  # the nested holder still holds it
    outer_left.set()
    t.join(30)
    assert not (rd / LOCK_NAME).exists()
    with other_process_holds(rd):  # and another process can take it
        pass
