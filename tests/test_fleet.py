"""The embedded fleet (negsynth.llm.server): its shape (servers x threads), its servers started and
stopped together (a stand-in llama-server), one that dies started again, and the stage's
``[llm]`` with the fleet as its endpoints."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers import STAND_IN_LLAMA_SERVER

from negsynth.llm import server
from negsynth.llm.prefix_pin import RepeatGuard, guard
from negsynth.schemas.config import LLMConfig, RunConfig, ServeConfig


def _opt(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


# -- shape --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cpus", "load", "serve", "want"),
    [
        (2, 0.0, {}, (2, 1)),  # a quiet 2-core machine: two single-threaded servers
        (2, 1.7, {}, (1, 1)),  # one core busy: one server, still one thread
        (16, 3.2, {}, (13, 1)),
        (1, 0.0, {}, (1, 1)),
        (2, 9.0, {}, (1, 1)),  # at least one
        (8, 0.0, {"n_threads": 2}, (4, 2)),  # threads per server: the free cores shared out
        (2, 0.0, {"n_threads": 0}, (1, 2)),  # 0: the cores free, in one server (as before the fleet)
        (2, 1.7, {"servers": 3}, (3, 1)),  # a count is taken as given
    ],
)
def test_the_fleet_has_one_single_threaded_server_per_free_core(cpus, load, serve, want, monkeypatch):
    monkeypatch.setattr(server, "available_mib", lambda: 10**6)  # plenty
    assert server.fleet_shape(ServeConfig(**serve), cpus=cpus, load=load) == want


def test_automatic_servers_leave_memory_free(monkeypatch):
    monkeypatch.setattr(server, "available_mib", lambda: 3 * server.SERVER_MIB + 10)
    assert server.fleet_shape(ServeConfig(), cpus=16, load=0.0) == (3, 1)
    assert server.fleet_shape(ServeConfig(servers=8), cpus=16, load=0.0) == (8, 1)  # a count is the user's
    monkeypatch.setattr(server, "available_mib", lambda: 10)
    assert server.fleet_shape(ServeConfig(), cpus=16, load=0.0) == (1, 1)


def test_a_kept_thread_count_sets_threads_not_the_answer_count(monkeypatch):
    monkeypatch.setattr(server, "available_mib", lambda: 10**6)  # plenty
    assert server.fleet_shape(ServeConfig(), threads=2, cpus=4, load=0.0) == (2, 2)


def test_the_count_is_measured_only_when_needed(monkeypatch):
    monkeypatch.setattr(server, "free_cores", lambda **kw: (_ for _ in ()).throw(AssertionError("measured")))
    assert server.fleet_shape(ServeConfig(servers=2, n_threads=1)) == (2, 1)


def test_servers_must_be_auto_or_a_count():
    for bad in (0, -1, "many", 2.5, True, 2000):
        with pytest.raises(ValueError, match="auto"):
            ServeConfig(servers=bad)
    assert ServeConfig(servers=4).servers == 4 and RunConfig().serve.servers == "auto"


# -- the stage's [llm] --------------------------------------------------------------------------
def test_a_fleet_url_becomes_the_clients_endpoints():
    cfg = LLMConfig(max_concurrency=5)
    urls = ["http://127.0.0.1:8765/v1", "http://127.0.0.1:8766/v1"]
    got = server.fleet_llm_config(cfg, " ".join(urls))
    assert [e.base_url for e in got.endpoints] == urls and got.base_url == urls[0]
    assert [e.max_concurrency for e in got.endpoints] == [3, 3] and got.total_concurrency == 6
    assert server.fleet_llm_config(LLMConfig(max_concurrency=1), " ".join(urls)).total_concurrency == 2  # every server busy
    assert server.fleet_llm_config(cfg, urls[0]) is cfg and server.fleet_llm_config(cfg, None) is cfg  # one server: as before


def test_the_stage_sends_to_every_server_of_the_fleet(tmp_path):
    from negsynth.pipeline.context import StageContext
    from negsynth.pipeline.llm_stage import llm_config, stage_concurrency

    urls = "http://127.0.0.1:1/v1 http://127.0.0.1:2/v1 http://127.0.0.1:3/v1"
    ctx = StageContext(cfg=RunConfig.model_validate({"llm": {"max_concurrency": 2}}), run_dir=tmp_path, base_url=urls)
    assert len(llm_config(ctx).endpoints) == 3 and stage_concurrency(ctx, 10) == 3
    assert ctx.cfg.llm.endpoints == []  # the run's config (and its hashes) are not touched


# -- a stand-in llama-server fleet --------------------------------------------------------------


@pytest.fixture
def stand_in(tmp_path) -> tuple[ServeConfig, Path]:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "argv"
    out.mkdir()
    binary = tmp_path / "llama-server"
    binary.write_text(
        STAND_IN_LLAMA_SERVER.format(python=sys.executable, argv_path=repr(str(out)) + ' + "/argv-" + opt("--port") + ".json"')
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    cfg = ServeConfig(model_path=str(gguf), server_path=str(binary), port=server._free_port("127.0.0.1"), startup_timeout=60, servers=3)
    return cfg, out


def test_the_fleet_starts_its_servers_together_and_stops_them_together(stand_in, tmp_path):
    cfg, out = stand_in
    fleet = server.EmbeddedFleet(cfg, "smollm2-135m-instruct", log_dir=tmp_path / "logs")
    assert len(fleet) == 3 and fleet.threads == 1 and fleet.slots == 1
    with fleet:
        urls = fleet.urls
        assert len(set(urls)) == 3 and fleet.url.split() == urls
        for u in urls:
            assert httpx.get(u + "/models").json()["data"][0]["id"] == "smollm2-135m-instruct"
            assert isinstance(guard(u), RepeatGuard)  # each server its own exact-repeat guard
        argvs = [json.loads(p.read_text()) for p in sorted(out.glob("argv-*.json"))]
        assert len(argvs) == 3
        for argv in argvs:
            assert _opt(argv, "--threads") == _opt(argv, "--threads-batch") == "1" and _opt(argv, "--parallel") == "1"
        assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [f"llama-server-{i}.log" for i in range(3)]
        assert all(r is None or r > 0 for r in fleet.rss_mib())
        procs = [s.proc for s in fleet.servers]
        assert "3 llama-servers" in fleet.describe() and "1 thread each" in fleet.describe()
    assert all(p.poll() is not None for p in procs)
    assert all(guard(u) is None for u in urls)


def test_a_server_that_dies_is_started_again_on_its_port(stand_in, tmp_path, monkeypatch):
    cfg, _ = stand_in
    monkeypatch.setattr(server.EmbeddedFleet, "WATCH_S", 0.05)
    with server.EmbeddedFleet(cfg.model_copy(update={"servers": 2}), "m", log_dir=tmp_path / "logs") as fleet:
        dead = fleet.servers[1]
        url, old = dead.base_url, dead.proc
        os.kill(old.pid, signal.SIGKILL)
        old.wait()
        for _ in range(600):  # the watchdog's restart; bounded so that a broken one fails, not hangs
            p = dead.proc
            if p is not old and p is not None and fleet.restarts[1] == 1:
                try:
                    if httpx.get(url + "/models", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        else:
            pytest.fail("the dead server was not started again")
        assert dead.base_url == url and fleet.servers[0].proc.poll() is None
        assert isinstance(guard(url), RepeatGuard)


def test_without_a_llama_server_the_fleet_names_the_build_script(monkeypatch):
    monkeypatch.setattr(server, "find_llama_server", lambda server_path=None: None)
    with pytest.raises(server.UserError, match=r"bash scripts/build_llama_server\.sh"):
        server.EmbeddedFleet(ServeConfig(servers=4), "m")


def test_a_server_that_cannot_start_stops_the_others(stand_in, tmp_path, monkeypatch):
    cfg, _ = stand_in
    fleet = server.EmbeddedFleet(cfg.model_copy(update={"servers": 2}), "m", log_dir=tmp_path / "logs")
    real_start = server.EmbeddedServer.start

    def start(self):
        if self is fleet.servers[1]:
            raise server.UserError("the embedded llama.cpp server exited with code 1")
        return real_start(self)

    monkeypatch.setattr(server.EmbeddedServer, "start", start)
    with pytest.raises(server.UserError, match="exited"):
        fleet.start()
    assert all(s.proc is None for s in fleet.servers)
