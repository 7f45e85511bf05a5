"""Several LLM servers (``llm.endpoints``): spread by free capacity, a dead one taken out and
probed back in, every item once, nothing paid twice, the cache blind to which server answered.

All against real-socket fake servers (tests/fake_openai.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid, sts_reasked_once
from helpers import brainstormed_once, generate_files, reference_run, request_bodies, start_local_ray, write_run_config
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import read_stage

runner = CliRunner()
EXAMPLES = 22
SHARD = 4


def write_config(tmp: Path, base_url: str | None = None, endpoints: list | None = None, **llm) -> Path:
    settings = {"max_concurrency": 3, "max_attempts": 2, "max_retries": 3, "connect_timeout": 1, **llm}
    if endpoints is not None:
        settings["endpoints"] = endpoints
    cfg = write_run_config(
        tmp, base_url or "embedded", llm=settings, pipeline={"shard_size": SHARD}, generate={"examples": EXAMPLES, "min_per_type": 2}
    )
    return cfg


def gen(cfg: Path, rd: Path, *extra: str):
    return runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "-q", *extra])


@pytest.fixture(scope="module")
def brainstormed(tmp_path_factory) -> Path:
    return brainstormed_once(tmp_path_factory, write_config)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, brainstormed):
    """One server, one process: the data files and the requests a run needs."""
    files, _, bodies = reference_run(tmp_path_factory, brainstormed, write_config, sts_reasked_once)
    return files, bodies


# -- config ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "llm, says",
    [
        (
            {"base_url": ["http://a:8000/v1", "http://b:8000/v1"]},
            "[llm] base_url: takes one URL; for several servers list them in llm.endpoints",
        ),
        (
            {"endpoints": ["http://a:8000/v1", "http://a:8000/v1/"]},
            "[llm] endpoints: lists http://a:8000/v1 twice (entries 0 and 1); list each server once",
        ),
        (
            {"base_url": "http://c:8000/v1", "endpoints": ["http://a:8000/v1"]},
            "llm.base_url=http://c:8000/v1 is not one of them; list every server in llm.endpoints and remove llm.base_url",
        ),
        ({"endpoints": [{"base_url": "embedded"}]}, "[llm.endpoints.0] base_url: must be an http(s):// URL"),
        (
            {"endpoints": [{"base_url": "http://a:8000/v1", "weight": 2}]},
            "[llm.endpoints.0] unknown key 'weight' (allowed: base_url, max_concurrency, api_key_env, api_key_file)",
        ),
        ({"endpoints": [{"base_url": "http://a:8000/v1", "max_concurrency": 0}]}, "[llm.endpoints.0] max_concurrency:"),
        ({"endpoints": [{"max_concurrency": 4}]}, "[llm.endpoints.0] base_url: Field required"),
    ],
)
def test_config_errors_are_one_line_naming_the_field_and_the_fix(tmp_path, llm, says):
    import tomli_w

    cfg = tmp_path / "run.toml"
    cfg.write_text(tomli_w.dumps({"llm": llm}))
    r = gen(cfg, tmp_path / "run")
    assert r.exit_code == 2, r.output
    assert says in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_endpoints_config_reads_as_expected():
    from negsynth.schemas.config_io import load_config

    cfg = load_config(
        None, ['llm.endpoints=["http://a:8000/v1/", {base_url = "http://b:8000/v1", max_concurrency = 5}]', "llm.max_concurrency=3"]
    ).llm
    assert cfg.base_url == "http://a:8000/v1"  # the first endpoint: the embedded server is not started
    assert [e.base_url for e in cfg.endpoints] == ["http://a:8000/v1", "http://b:8000/v1"]
    assert cfg.total_concurrency == 3 + 5
    # the config survives the trip to a worker (Ray ships it as JSON)
    from negsynth.schemas.config import LLMConfig

    assert LLMConfig.model_validate(cfg.model_dump(mode="json")) == cfg


def test_an_endpoint_key_that_is_not_set_is_named(tmp_path, rd):
    with FakeOpenAI(sts_reasked_once) as a, FakeOpenAI(sts_reasked_once) as b:
        cfg = write_config(tmp_path, endpoints=[a.base_url, {"base_url": b.base_url, "api_key_env": "NEGSYNTH_TEST_UNSET_KEY_B"}])
        r = gen(cfg, rd)
        assert r.exit_code == 2, r.output
        assert "NEGSYNTH_TEST_UNSET_KEY_B (llm.endpoints[1].api_key_env) is not set" in r.stderr and r.stderr.count("\n") == 1
        assert not a.requests and not b.requests


# -- a fleet with one server dying mid-run -------------------------------------------------------
def test_three_servers_one_dies_mid_run_every_item_once_nothing_paid_twice(tmp_path, rd, reference):
    ref_files, ref_bodies = reference
    K = 4  # the dying server answers this many requests, then goes away (its next one is reset)
    holder: dict = {}

    def dying(req, n):
        if n == K:
            holder["srv"].go_down()
            return Reply(reset=True)
        return sts_reasked_once(req, n)

    a, c = FakeOpenAI(sts_reasked_once), FakeOpenAI(sts_reasked_once)
    b = holder["srv"] = FakeOpenAI(dying)
    with a, b, c:
        # one request at a time per server: what the dying one answered is exactly its first K
        cfg = write_config(
            tmp_path, endpoints=[{"base_url": s.base_url, "max_concurrency": 1} for s in (a, b, c)], max_consecutive_failures=3
        )
        r = gen(cfg, rd, "--json")
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout)
    assert stats["complete"] and stats["pending"] == 0 and stats["valid"] == sum(1 for _ in read_stage(rd / "generate"))
    # every item once, the same bytes as one server gives
    assert generate_files(rd) == ref_files
    rows = list(read_stage(rd / "generate"))
    assert len({x["id"] for x in rows}) == len(rows)
    # every request answered exactly once, over the three servers: none paid twice, none lost
    answered = request_bodies(a.requests) + request_bodies(c.requests) + request_bodies(b.requests[:K])
    assert answered == ref_bodies
    assert len(b.requests) == K + 1  # after its death nothing more reached it (probes are GETs)
    # its share moved to the two others
    total = sum(ref_bodies.values())
    assert len(a.requests) > total / 3 and len(c.requests) > total / 3, (len(a.requests), len(c.requests), total)
    tr = stats["this_run"]
    assert tr["endpoint_taken_out"][b.base_url] >= 1 and tr["endpoint_taken_out"][a.base_url] == 0
    assert tr["endpoint_requests"][a.base_url] == len(a.requests) and tr["endpoint_requests"][c.base_url] == len(c.requests)
    assert tr["requests"] == sum(tr["endpoint_requests"].values())

    # a rerun is served by the cache whichever servers are configured now: other ports, another
    # order, or one plain base_url
    for setting in ("endpoints", "base_url"):
        with FakeOpenAI(sts_reasked_once) as d, FakeOpenAI(sts_reasked_once) as e:
            cfg = (
                write_config(tmp_path, e.base_url) if setting == "base_url" else write_config(tmp_path, endpoints=[e.base_url, d.base_url])
            )
            r = gen(cfg, rd, "--overwrite", "--json")
            assert r.exit_code == 0, r.output
            assert not d.requests and not e.requests
            assert json.loads(r.stdout)["this_run"]["cache_hits"] == total
        assert generate_files(rd) == ref_files


def test_requests_spread_by_free_capacity(tmp_path, rd, reference):
    """A server with 3 slots beside one with 1: it gets about three times the requests, and
    neither ever has more in flight than its own max_concurrency."""
    _, ref_bodies = reference
    peak: dict[int, int] = {}
    now: dict[int, int] = {}
    lock = threading.Lock()

    def counting(i):
        def r(req, n):
            with lock:
                now[i] = now.get(i, 0) + 1
                peak[i] = max(peak.get(i, 0), now[i])
            time.sleep(0.02)
            with lock:
                now[i] -= 1
            return sts_reasked_once(req, n)

        return r

    with FakeOpenAI(counting(0)) as big, FakeOpenAI(counting(1)) as small:
        cfg = write_config(
            tmp_path, endpoints=[{"base_url": small.base_url, "max_concurrency": 1}, {"base_url": big.base_url, "max_concurrency": 3}]
        )
        r = gen(cfg, rd)
        assert r.exit_code == 0, r.output
    assert request_bodies(big.requests) + request_bodies(small.requests) == ref_bodies
    assert peak[0] <= 3 and peak[1] == 1
    assert len(big.requests) > 2 * len(small.requests) > 0, (len(big.requests), len(small.requests))


def test_a_fleet_down_as_a_whole_stops_like_one_server(tmp_path, rd):
    holder: dict = {}

    def down_after(k):
        def r(req, n):
            if n >= k:
                for s in holder["all"]:
                    s.go_down()
                return Reply(reset=True)
            return sts_reasked_once(req, n)

        return r

    a, b = FakeOpenAI(down_after(3)), FakeOpenAI(down_after(3))
    holder["all"] = (a, b)
    with a, b:
        cfg = write_config(tmp_path, endpoints=[a.base_url, b.base_url], max_retries=1, max_consecutive_failures=3)
        r = gen(cfg, rd, "--json")
    assert r.exit_code == 4, r.output
    assert "requests in a row failed" in r.stderr and "rerun the same command" in r.stderr and r.stderr.count("\n") == 1
    st = json.loads(r.stdout)
    assert st["outage"] and st["rejects_by_reason"] == {}


def test_no_endpoint_answers_at_start(tmp_path, rd):
    srv = FakeOpenAI(sts_reasked_once)
    url = srv.base_url  # never started: connections are refused
    srv.server.server_close()
    with FakeOpenAI(sts_reasked_once) as other:
        other.go_down()
        cfg = write_config(tmp_path, endpoints=[url, other.base_url])
        r = gen(cfg, rd)
    assert r.exit_code == 2, r.output
    assert (
        "none of the 2 llm.endpoints answers" in r.stderr
        and "start the servers or fix llm.endpoints" in r.stderr
        and r.stderr.count("\n") == 1
    )


# -- probed back in ---------------------------------------------------------------------------------
@asynccontextmanager
async def two_endpoint_client(a, b, **backoff):
    """An LLM client over fake servers ``a`` and ``b`` (two requests at once each), checked."""
    from negsynth.llm.client import LLMClient
    from negsynth.schemas.config import LLMConfig

    cfg = LLMConfig(model="fake", endpoints=[a.base_url, b.base_url], max_concurrency=2, max_retries=3, connect_timeout=1, **backoff)
    async with LLMClient(cfg, base_url=cfg.base_url) as c:
        await c.preflight()
        yield c


def ask_one(c, i: int):
    """One chat request whose body is told apart by ``i``."""
    return c.chat(c.payload([{"role": "user", "content": f"q{i}"}], response_format=None, temperature=None, sample_index=0))


def test_an_endpoint_taken_out_is_probed_back_in():
    """Unit level, with the client itself: B goes down, everything goes to A; B comes back on
    the same port, a probe (GET /models) finds it, and it gets requests again."""

    def ok(req, n):
        return Reply(content='{"ok": 1}')

    async def main(a, b):
        async with two_endpoint_client(a, b, backoff_initial=0.01, backoff_max=0.05) as c:

            def ask(i):
                return ask_one(c, i)

            await asyncio.gather(*(ask(i) for i in range(8)))
            # the first four fill both endpoints (two each: no endpoint gets more than its own
            # max_concurrency); where the other four go depends on which replies come back first
            assert len(a.requests) + len(b.requests) == 8
            assert min(len(a.requests), len(b.requests)) >= 2, (len(a.requests), len(b.requests))
            b.go_down()
            await asyncio.gather(*(ask(i) for i in range(8, 20)))
            eb = c.router.endpoints[1]
            assert eb.out and eb.taken_out == 1
            n_b = len(b.requests)
            b.come_back()
            deadline = time.monotonic() + 10
            while eb.out and time.monotonic() < deadline:
                await ask(len(a.requests) + 100)  # acquiring a slot starts the probe that is due
                await asyncio.sleep(0.02)
            assert not eb.out
            await asyncio.gather(*(ask(i) for i in range(1000, 1008)))
            assert len(b.requests) > n_b
            return c.router.as_dict()

    with FakeOpenAI(ok) as a, FakeOpenAI(ok) as b:
        counts = asyncio.run(main(a, b))
    assert counts["endpoint_taken_out"] == {a.base_url: 0, b.base_url: 1}


def test_an_endpoint_answering_5xx_is_taken_out_and_its_requests_answered_elsewhere():
    """B passes its health check but answers every chat request 503: each request it fails is
    retried on A, once; B is taken out again after each probe, with a growing wait."""

    async def main(a, b):
        async with two_endpoint_client(a, b, backoff_initial=0.05, backoff_max=1.0) as c:
            outs = await asyncio.gather(*(ask_one(c, i) for i in range(30)))
            return outs, c.stats, c.router.endpoints[1]

    with FakeOpenAI(lambda req, n: Reply(content='{"ok": 1}')) as a, FakeOpenAI(lambda req, n: Reply(status=503)) as b:
        outs, stats, eb = asyncio.run(main(a, b))
    assert len(outs) == 30 and all(o["text"] == '{"ok": 1}' for o in outs)
    assert len(a.requests) == 30
    assert len({json.dumps(r["messages"]) for r in a.requests}) == 30  # each answered once
    # out at its first failure (the two requests it had at once), then one trial request per probe
    assert 1 <= eb.taken_out <= len(b.requests) <= eb.taken_out + 1, (eb.taken_out, len(b.requests))
    assert stats.transport_retries == {"http_503": len(b.requests)} and not stats.transport_failures


# -- secrets --------------------------------------------------------------------------------------
def test_per_endpoint_keys_are_sent_and_never_written(tmp_path):
    key_a, key_b = "sk-endpoint-A-SECRET-4c1d9e7a2b", "sk-endpoint-B-SECRET-8f0e3a6c5d"

    def quoting(key):
        seen = []

        def r(req, n):
            if not req["messages"][-1]["content"].startswith("Brainstorm"):
                seen.append(n)
                if len(seen) == 1:  # a server that quotes the key it got in an error (a reject's detail)
                    return Reply(status=400, body={"error": {"message": f"bad request for key {key}"}})
            return always_valid(req, n)

        return r

    env = {**os.environ, "NEGSYNTH_TEST_KEY_A": key_a, "NEGSYNTH_TEST_KEY_B": key_b}
    with FakeOpenAI(quoting(key_a), require_key=key_a) as a, FakeOpenAI(quoting(key_b), require_key=key_b) as b:
        cfg = write_config(
            tmp_path,
            endpoints=[
                {"base_url": a.base_url, "api_key_env": "NEGSYNTH_TEST_KEY_A"},
                {"base_url": b.base_url, "api_key_env": "NEGSYNTH_TEST_KEY_B"},
            ],
            max_retries=0,
        )
        rd = tmp_path / "run"
        outs = []
        for args in (["brainstorm"], ["generate", "--json"]):
            p = subprocess.run(
                [sys.executable, "-m", "negsynth.cli", *args, "-c", str(cfg), "-d", str(rd), "-vv"],
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert p.returncode == 0, p.stderr
            outs += [p.stdout, p.stderr]
        # each server got its own key, and both served
        assert a.requests and b.requests
        assert all({k.lower(): v for k, v in h.items()}["authorization"] == f"Bearer {key_a}" for h in a.headers)
        assert all({k.lower(): v for k, v in h.items()}["authorization"] == f"Bearer {key_b}" for h in b.headers)
    assert "bad_request" in (rd / "generate" / "stats.json").read_text()  # the quoting answers were recorded
    for key in (key_a, key_b):
        for path in rd.rglob("*"):
            if path.is_file():
                assert key[-16:].encode() not in path.read_bytes(), f"the key leaked into {path}"
        assert all(key[-16:] not in text for text in outs)


# -- Ray workers -----------------------------------------------------------------------------------
def test_ray_workers_share_the_endpoint_list(tmp_path, rd, reference):
    """--executor ray: the endpoint list travels with the config; every worker spreads over the
    same servers with 1/n of each one's slots; the union equals a one-server run, each request
    answered once."""
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'negsynth[ray]')")
    from negsynth.pipeline.ray_executor import worker_config
    from negsynth.schemas.config_io import load_config

    ref_files, ref_bodies = reference
    with FakeOpenAI(sts_reasked_once) as a, FakeOpenAI(sts_reasked_once) as b:
        cfg = write_config(tmp_path, endpoints=[{"base_url": a.base_url, "max_concurrency": 2}, b.base_url])
        split = worker_config(load_config(cfg), 2).llm
        assert [e.base_url for e in split.endpoints] == [a.base_url, b.base_url]
        assert [split.endpoint_concurrency(e) for e in split.endpoints] == [1, 2]  # 2 -> 1, llm.max_concurrency 3 -> 2
        start_local_ray()
        try:
            r = gen(cfg, rd, "--executor", "ray", "--workers", "2", "--json")
        finally:
            ray.shutdown()
        assert r.exit_code == 0, r.output
    assert generate_files(rd) == ref_files
    assert request_bodies(a.requests) + request_bodies(b.requests) == ref_bodies
    assert a.requests and b.requests
    merged = json.loads(r.stdout)["this_run"]
    assert merged["endpoint_requests"] == {a.base_url: len(a.requests), b.base_url: len(b.requests)}


def test_an_endpoint_key_gets_the_same_checks_as_the_llm_key(monkeypatch, tmp_path):
    """A pasted invisible character in an endpoint's key is refused naming the setting, as for
    ``llm.api_key_env``; the key itself is never in the message."""
    from negsynth.errors import UserError
    from negsynth.llm.endpoints import endpoint_key
    from negsynth.schemas.config import LLMConfig

    monkeypatch.setenv("EP_KEY", "sk-abc\u200bdef")
    (tmp_path / "k").write_text("sk-file-key\n")
    cfg = LLMConfig(
        endpoints=[{"base_url": "http://a/v1", "api_key_env": "EP_KEY"}, {"base_url": "http://b/v1", "api_key_file": str(tmp_path / "k")}]
    )
    with pytest.raises(UserError, match=r"llm\.endpoints\[0\]\.api_key_env.*U\+200B ZERO WIDTH SPACE at position 7") as e:
        endpoint_key(cfg, 0, "default")
    assert "sk-abc" not in str(e.value)
    assert endpoint_key(cfg, 1, "default") == ("sk-file-key", "llm.endpoints[1].api_key_file")


# -- a fleet down as a whole is waited out (llm.outage_wait) -------------------------------------
def fleet_down_for(k: int, seconds: float, holder: dict):
    """Every server answers until the fleet has had ``k`` requests, then all go away together and
    come back on their ports ``seconds`` later. Counts the answers per request body (only answers
    that reach the client: the answers given before the outage are out before the servers go)."""
    answered: Counter = Counter()
    lock = threading.Lock()
    state = {"n": 0, "down": False, "back": False}

    def back_later():
        time.sleep(seconds)
        for s in holder["all"]:
            s.come_back()
        with lock:
            state["back"] = True

    def r(req, n):
        with lock:
            state["n"] += 1
            trigger = state["n"] > k and not state["down"]
            state["down"] = state["down"] or trigger
            down = state["down"] and not state["back"]
            if not down:
                answered[json.dumps(req, sort_keys=True)] += 1
        if trigger:
            time.sleep(0.3)  # the answers already given reach their clients first
            for s in holder["all"]:
                s.go_down()
            threading.Thread(target=back_later, daemon=True).start()
        return Reply(reset=True) if down else sts_reasked_once(req, n)

    return r, answered


def generate_through_fleet_outage(tmp_path, brainstormed, k: int, seconds: float, outage_wait: float, *flags: str):
    """generate on a copy of ``brainstormed`` against two servers that go down together as
    :func:`fleet_down_for` says: the result, the seconds it took, the answers counted, the run dir."""
    rd = tmp_path / "run"
    shutil.copytree(brainstormed, rd)
    holder: dict = {}
    r_fn, answered = fleet_down_for(k, seconds, holder)
    a, b = FakeOpenAI(r_fn), FakeOpenAI(r_fn)
    holder["all"] = (a, b)
    with a, b:
        cfg = write_config(tmp_path, endpoints=[a.base_url, b.base_url], max_retries=1, max_consecutive_failures=3, outage_wait=outage_wait)
        t0 = time.monotonic()
        r = runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), *flags, "--json"])
        took = time.monotonic() - t0
    return r, took, answered, rd


def test_a_fleet_down_as_a_whole_is_waited_out_and_the_stage_resumes_by_itself(tmp_path, brainstormed, reference):
    r, took, answered, rd = generate_through_fleet_outage(tmp_path, brainstormed, 5, 2.5, 60)
    assert r.exit_code == 0, r.output
    st = json.loads(r.stdout)
    assert st["complete"] is True and st["pending"] == 0 and st["outage"] is None
    tr = st["this_run"]
    assert tr["outage_waits"] >= 1 and 1.0 < tr["outage_wait_s"]  # it waited (how long is the machine's load)
    assert "waiting: the LLM server is not answering" in r.stderr and "resumed: the LLM server answers again" in r.stderr
    # every request answered exactly as often as one healthy server answers it (never paid twice),
    # and the same data
    assert answered == reference[1]
    assert generate_files(rd) == reference[0]


def test_a_fleet_that_stays_down_stops_after_the_wait(tmp_path, brainstormed):
    r, took, _, _ = generate_through_fleet_outage(tmp_path, brainstormed, 3, 3600, 2, "-q")
    assert r.exit_code == 4, r.output
    assert 2 <= took  # it waited llm.outage_wait before it stopped
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("error:") and "waited 2 s for it: llm.outage_wait" in lines[-1] and "rerun the same command" in lines[-1]
    st = json.loads(r.stdout)
    assert st["complete"] is False and st["outage"] and st["rejects_by_reason"] == {}


def test_a_fleet_whose_chat_hangs_names_the_hanging_endpoints(tmp_path, brainstormed):
    """Both endpoints answer GET /models, neither answers a chat request within llm.timeout: the
    stage stops at the wait's first probe naming them, not as an outage of servers that are down."""
    rd = tmp_path / "run"
    shutil.copytree(brainstormed, rd)
    hang = lambda req, n: Reply(content="{}", delay=20)  # noqa: E731
    a, b = FakeOpenAI(hang), FakeOpenAI(hang)
    with a, b:
        cfg = write_config(
            tmp_path, endpoints=[a.base_url, b.base_url], timeout=1, max_retries=0, max_consecutive_failures=2, outage_wait=3
        )
        r = gen(cfg, rd)
    assert r.exit_code == 4, r.output
    last = [x for x in r.stderr.splitlines() if x.strip()][-1]
    assert "took chat requests and answered none within llm.timeout=1 s: the server hangs" in last, r.stderr
    assert f"llm.endpoints[0] ({a.base_url})" in last and f"llm.endpoints[1] ({b.base_url})" in last
