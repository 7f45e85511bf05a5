"""The embedded llama-server: finding the binary, its command line, its thread and slot choice, and
a stand-in llama-server started through EmbeddedServer."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path

import httpx
import pytest
from helpers import STAND_IN_LLAMA_SERVER
from pydantic import ValidationError

from negsynth.errors import UserError
from negsynth.llm import server
from negsynth.schemas.config import RunConfig, ServeConfig


def _opt(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


@pytest.fixture
def gguf(tmp_path) -> Path:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")
    return p


def _executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def fake_binary(tmp_path) -> Path:
    return _executable(tmp_path / "llama-server")


@pytest.fixture
def no_llama_server(monkeypatch):
    monkeypatch.setattr(server, "find_llama_server", lambda server_path=None: None)


# -- thread and slot choice ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cpus", "load", "want"),
    [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.7, 1), (2, 9.0, 1), (16, 3.2, 13), (1, 0.0, 1)],
)
def test_threads_are_the_cores_the_load_leaves_free(cpus, load, want):
    assert server.choose_threads(None, cpus=cpus, load=load) == want


def test_serve_n_threads_overrides_the_choice():
    assert server.choose_threads(3, cpus=2, load=1.9) == 3
    assert server.choose_threads(0, cpus=4, load=0.0) == 4  # 0 = choose


def test_threads_read_what_is_busy_now_not_the_trailing_load_average(monkeypatch):
    # over the sampled second cpu0 was busy throughout, cpu1 idle, cpu2 half busy; cpu3 is outside
    # this process's affinity, so it does not count
    monkeypatch.setattr(server.psutil, "cpu_percent", lambda interval, percpu: [100.0, 0.0, 50.0, 100.0])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 0.0, 0.0))
    assert server.busy_cores({0, 1, 2}) == pytest.approx(1.5)
    monkeypatch.setattr(server.psutil, "cpu_percent", lambda interval, percpu: [10.0, 0.0])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert server.choose_threads() == 2  # 0.1 busy: both cores are free although the load average reads 3


def test_one_slot_unless_serve_parallel_asks_for_more(fake_binary):
    cfg = ServeConfig(server_path=str(fake_binary))
    assert server.EmbeddedServer(cfg, "m", threads=1).slots == 1  # answers decoded together depend on their batch-mates
    assert server.EmbeddedServer(cfg.model_copy(update={"parallel": 12}), "m", threads=1).slots == 12


# -- the binary ----------------------------------------------------------------------------------
def test_the_built_binary_is_used(fake_binary):
    assert server.llama_server_binary(ServeConfig(server_path=str(fake_binary))) == fake_binary


def test_no_binary_is_one_line_naming_the_build_script(no_llama_server):
    with pytest.raises(UserError, match=r"bash scripts/build_llama_server\.sh") as e:
        server.llama_server_binary(ServeConfig())
    assert "\n" not in str(e.value)


def test_a_wrong_server_path_is_an_error_not_a_silent_fallback(tmp_path):
    not_exec = tmp_path / "llama-server"
    not_exec.write_text("")
    for p in (tmp_path / "missing", not_exec):
        with pytest.raises(UserError, match="serve.server_path"):
            server.llama_server_binary(ServeConfig(server_path=str(p)))


def test_the_binary_is_found_beside_the_interpreter(tmp_path, monkeypatch):
    _executable(tmp_path / "llama-server")
    monkeypatch.setattr(server.sysconfig, "get_path", lambda name: str(tmp_path))
    assert server.find_llama_server() == tmp_path / "llama-server"


def test_config_rejects_bad_counts():
    for bad in ({"parallel": 0}, {"n_threads": -1}):
        with pytest.raises(ValidationError):
            ServeConfig(**bad)


# -- command lines -------------------------------------------------------------------------------
def test_llama_server_command(gguf, fake_binary):
    cfg = ServeConfig(model_path=str(gguf), server_path=str(fake_binary), n_ctx=4096, host="127.0.0.1")
    cmd = server.server_command(cfg, "smollm2-135m-instruct", 9001, slots=3, threads=2)
    assert cmd[0] == str(fake_binary)
    assert _opt(cmd, "--model") == str(gguf) and _opt(cmd, "--alias") == "smollm2-135m-instruct"
    assert _opt(cmd, "--port") == "9001" and _opt(cmd, "--host") == "127.0.0.1"
    assert _opt(cmd, "--parallel") == "3"
    assert _opt(cmd, "--ctx-size") == str(4096 * 3)  # llama-server splits the context across its slots
    assert _opt(cmd, "--threads") == _opt(cmd, "--threads-batch") == "2"
    assert _opt(cmd, "--poll") == "0"  # idle threads sleep: no spinning on a shared core
    assert _opt(cmd, "--repeat-penalty") == "1.1"  # the penalty every answer so far was sampled with
    # no slot folder (a server other processes talk to): "pinned" means off, every prompt evaluated
    # whole, so an answer does not depend on what the server served before (docs/llm_server.md)
    assert cfg.prompt_cache == "pinned"
    assert "--no-cache-prompt" in cmd and _opt(cmd, "--cache-ram") == "0" and "--slot-save-path" not in cmd
    # pinned (a slot folder given): prompt caching allowed, the prefix files saved there, no host cache
    cmd = server.server_command(cfg, "m", 9001, slots=1, threads=1, slot_dir="/tmp/slots")
    assert "--no-cache-prompt" not in cmd and _opt(cmd, "--slot-save-path") == "/tmp/slots" and _opt(cmd, "--cache-ram") == "0"
    off = cfg.model_copy(update={"prompt_cache": "off"})
    assert "--no-cache-prompt" in server.server_command(off, "m", 9001, slots=1, threads=1, slot_dir="/tmp/slots")
    cmd = server.server_command(cfg.model_copy(update={"prompt_cache": "on"}), "m", 9001, slots=1, threads=1)
    assert "--no-cache-prompt" not in cmd and _opt(cmd, "--cache-ram") == str(server.CACHE_RAM_MIB)


def test_llama_server_command_takes_serve_n_threads(gguf, fake_binary):
    cfg = ServeConfig(model_path=str(gguf), server_path=str(fake_binary), n_threads=5)
    assert _opt(server.server_command(cfg, "m", 1), "--threads") == "5"


def test_serve_extra_args_end_the_command_line(gguf, fake_binary):
    """``serve.extra_args`` reach the server as given, after negsynth's own flags (so one of them
    can be overridden: llama-server takes the last value of a repeated flag)."""
    extra = ["--spec-type", "ngram-simple", "--threads", "1"]
    cmd = server.server_command(ServeConfig(model_path=str(gguf), server_path=str(fake_binary), extra_args=extra), "m", 1, threads=2)
    assert cmd[-4:] == extra and _opt(cmd, "--threads") == "2"
    assert ServeConfig().extra_args == []


def test_a_missing_model_is_a_user_error(tmp_path, fake_binary):
    with pytest.raises(UserError, match="serve.model_path"):
        server.server_command(ServeConfig(model_path=str(tmp_path / "none.gguf"), server_path=str(fake_binary)), "m", 1)


# -- a stand-in llama-server through EmbeddedServer --------------------------------------------


def test_embedded_server_starts_and_stops_llama_server(tmp_path, gguf):
    argv_file = tmp_path / "argv.json"
    binary = _executable(tmp_path / "llama-server", STAND_IN_LLAMA_SERVER.format(python=sys.executable, argv_path=repr(str(argv_file))))
    cfg = ServeConfig(model_path=str(gguf), server_path=str(binary), port=server._free_port("127.0.0.1"), startup_timeout=30, parallel=2)
    es = server.EmbeddedServer(cfg, "smollm2-135m-instruct", log_path=tmp_path / "logs" / "llama-server.log")
    assert es.binary == binary and es.slots == 2 and es.threads >= 1
    with es:
        assert httpx.get(es.base_url + "/models").json()["data"][0]["id"] == "smollm2-135m-instruct"
        argv = json.loads(argv_file.read_text())
        assert _opt(argv, "--parallel") == "2" and _opt(argv, "--ctx-size") == str(cfg.n_ctx * 2)
        assert _opt(argv, "--threads") == str(es.threads)
        proc = es.proc
    assert proc.poll() is not None  # stopped on exit


# -- a run dir keeps its first server's thread count ---------------------------------------------
class _Quiet:
    def __init__(self):
        self.lines: list[str] = []
        self.warnings: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)


def test_a_run_dir_keeps_the_threads_per_server_of_its_first_servers(tmp_path, gguf, monkeypatch):
    """llama.cpp's answers change with its thread count. Every server has one thread by default
    (so the load at start changes how many servers, never the answers); a run dir begun with
    another count (serve.n_threads, or the single multi-threaded server of earlier versions)
    keeps it per server when resumed, so it writes what an uninterrupted run would. serve.n_threads
    still wins; the Python server keeps no record."""
    from negsynth.pipeline.embedded import SERVER_RECORD, llm_endpoint

    argv_file = tmp_path / "argv.json"
    binary = _executable(tmp_path / "llama-server", STAND_IN_LLAMA_SERVER.format(python=sys.executable, argv_path=repr(str(argv_file))))
    run_dir = tmp_path / "run"
    monkeypatch.setattr("negsynth.llm.server.free_cores", lambda **kw: 1)  # one server: one argv file

    def start(**serve) -> tuple[str, str]:
        cfg = RunConfig.model_validate(
            {
                "llm": {"base_url": "embedded"},
                "serve": {
                    "model_path": str(gguf),
                    "server_path": str(binary),
                    "startup_timeout": 30,
                    "port": server._free_port("127.0.0.1"),
                    **serve,
                },
            }
        )
        rep = _Quiet()
        with llm_endpoint(cfg, run_dir, rep) as url:
            assert url is not None
        return _opt(json.loads(argv_file.read_text()), "--threads"), rep.lines[0]

    threads, line = start()  # the default: one thread, whatever the load
    build = hashlib.sha256(binary.read_bytes()).hexdigest()[:16]
    record = json.loads((run_dir / SERVER_RECORD).read_text())
    assert threads == "1" and record == {"engine": "llama-server", "threads": 1, "servers": 1, "prompt": "pinned", "build": build}
    assert "first count" not in line
    (run_dir / SERVER_RECORD).write_text(
        json.dumps({"engine": "llama-server", "threads": 2})
    )  # begun by an earlier version's 2-thread server
    threads, line = start()
    assert threads == "2" and "this run dir's first count" in line
    assert start(n_threads=1)[0] == "1"  # the explicit setting wins
    assert json.loads((run_dir / SERVER_RECORD).read_text())["threads"] == 2  # and does not rewrite the record
    (run_dir / SERVER_RECORD).write_text("{not json")  # an unreadable record: as for a new run dir
    assert start()[0] == "1"


def test_a_run_dir_keeps_the_prompt_mode_of_its_first_servers_and_ray_evaluates_prompts_whole(gguf, tmp_path, monkeypatch):
    """A pinned prefix gives other answers than a prompt evaluated whole: a new run dir is pinned
    (the servers save prefixes in a folder of their own), a run dir begun before the pin (its
    record has no "prompt") stays whole when resumed, and servers whose requests come from other
    processes (Ray's workers) are never pinned: nothing could keep another request from reaching
    the slot between the restore and the request."""
    from negsynth.pipeline.embedded import SERVER_RECORD, llm_endpoint

    argv_file = tmp_path / "argv.json"
    binary = _executable(tmp_path / "llama-server", STAND_IN_LLAMA_SERVER.format(python=sys.executable, argv_path=repr(str(argv_file))))
    monkeypatch.setattr("negsynth.llm.server.free_cores", lambda **kw: 1)

    def start(run_dir, *, in_process=True, **serve) -> tuple[list[str], str]:
        serve = {
            "model_path": str(gguf),
            "server_path": str(binary),
            "startup_timeout": 30,
            "port": server._free_port("127.0.0.1"),
            **serve,
        }
        cfg = RunConfig.model_validate({"llm": {"base_url": "embedded"}, "serve": serve})
        rep = _Quiet()
        with llm_endpoint(cfg, run_dir, rep, in_process=in_process):
            pass
        return json.loads(argv_file.read_text()), rep.lines[0]

    argv, line = start(tmp_path / "new")
    assert _opt(argv, "--slot-save-path") and "--no-cache-prompt" not in argv and "prompt prefix pinned" in line
    assert json.loads((tmp_path / "new" / SERVER_RECORD).read_text())["prompt"] == "pinned"
    assert not Path(_opt(argv, "--slot-save-path")).exists()  # the prefix files go with the servers
    old = tmp_path / "old"
    old.mkdir()
    (old / SERVER_RECORD).write_text(json.dumps({"engine": "llama-server", "threads": 1, "servers": 2}))
    argv, line = start(old)
    assert "--no-cache-prompt" in argv and "--slot-save-path" not in argv and "this run dir's first mode" in line
    argv, line = start(tmp_path / "ray", in_process=False)
    assert "--no-cache-prompt" in argv and "under Ray every prompt is evaluated whole" in line
    assert json.loads((tmp_path / "ray" / SERVER_RECORD).read_text())["prompt"] == "off"
    argv, line = start(tmp_path / "new", in_process=False)  # a pinned run dir resumed under Ray: said
    assert "--no-cache-prompt" in argv and "may differ from this run dir's pinned ones" in line
    argv, _ = start(tmp_path / "new", prompt_cache="off")  # the explicit setting is honoured
    assert "--no-cache-prompt" in argv


def test_a_resume_on_another_llama_server_build_is_told_so(tmp_path, gguf, monkeypatch):
    """Another build (other CPU instructions) writes other text for the same request: a run dir
    records its first build, and a start with another one warns in one line (the same build, or a
    record from before builds were recorded, says nothing)."""
    from negsynth.pipeline.embedded import SERVER_RECORD, llm_endpoint

    argv_file = tmp_path / "argv.json"
    source = STAND_IN_LLAMA_SERVER.format(python=sys.executable, argv_path=repr(str(argv_file)))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _executable(tmp_path / "a" / "llama-server", source)
    second = _executable(tmp_path / "b" / "llama-server", source + "# another build\n")
    run_dir = tmp_path / "run"
    monkeypatch.setattr("negsynth.llm.server.free_cores", lambda **kw: 1)

    def start(binary) -> list[str]:
        serve = {"model_path": str(gguf), "server_path": str(binary), "startup_timeout": 30, "port": server._free_port("127.0.0.1")}
        cfg = RunConfig.model_validate({"llm": {"base_url": "embedded"}, "serve": serve})
        rep = _Quiet()
        with llm_endpoint(cfg, run_dir, rep):
            pass
        return rep.warnings

    assert start(first) == [] and start(first) == []
    (warning,) = start(second)
    assert "another llama-server build" in warning and "\n" not in warning
    (run_dir / SERVER_RECORD).write_text(json.dumps({"engine": "llama-server", "threads": 1, "servers": 1}))  # an older record
    assert start(second) == []


def test_a_record_of_the_python_server_of_earlier_versions_carries_nothing(tmp_path):
    """A run dir begun on llama-cpp-python's server (an engine since removed) resumes on llama-server
    as a new run dir would: its thread count and prompt mode were not llama-server's."""
    from negsynth.pipeline.embedded import SERVER_RECORD, kept_prompt_mode, kept_threads

    (tmp_path / SERVER_RECORD).write_text(json.dumps({"engine": "llama-cpp-python", "threads": 4, "servers": 1}))
    assert kept_threads(tmp_path) is None and kept_prompt_mode(tmp_path) is None
