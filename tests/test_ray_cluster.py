"""--executor ray on a real two-node Ray cluster: a head and a second node, each started by
`ray start` as its own processes on this machine (1 CPU each, so two workers must use both),
negsynth pointed at it by address like any remote cluster.

- generate's two shard workers and score's two embedding workers run one on each node (the node
  ids negsynth returns in ``ray_nodes``), and the outputs equal a one-process run's bytes;
- the second node killed (its raylet and everything under it, by pid) while its generate worker
  has requests in flight: Ray retries that task on the surviving node, it resumes from its
  ``.partial`` shards and the request cache, and the data equals the one-process run;
- the second node killed while its score embedding actor encodes a part: the part is redone by the
  head's actor, Ray restarts the lost actor on the head when it has a CPU free (else the head's
  actor finishes alone), and the output equals the one-process run's bytes.

The run dir is on the local disk, which both "nodes" see (docs/scale.md: on a real cluster it
must be a shared filesystem). Slow: two `ray start`s, ~25 s each on a loaded core.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, sts_reasked_once
from helpers import by_value, generate_files
from test_scaleout import brainstormed, gen, reference, write_config  # noqa: F401 - fixtures
from test_score import HAND, FakeEmbedder, example, make_ctx, write_generate

from negsynth.stages import get, run_stage

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A head and node ``b``, each a `ray start --block` process (its own process group; what it
    starts are its descendants, so one node can be killed alone, by pid)."""

    def __init__(self, root: Path):
        self.root = root
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.node_ids: dict[str, str] = {}
        # the worktree's negsynth (and tests/, for what travels by reference) in every Ray worker;
        # token auth off (on by default once ~/.ray/auth_token exists; node b would lack the token;
        # tests/conftest.py turns it off for the driver)
        path = [str(TESTS.parent), str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)

    def start(self, name: str, *args: str, cpus: int = 1) -> None:
        log = self.root / f"{name}.log"
        cmd = ["ray", "start", "--block", "--num-cpus", str(cpus), "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
        cmd += ["--resources", json.dumps({f"node_{name}": 1}), *args]
        with log.open("w") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs[name] = p
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            if p.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start ({name}) did not come up:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def pids(self, name: str) -> list[int]:
        """The `ray start` process of node ``name`` and everything it started (raylet, agents, workers)."""
        import psutil

        try:
            top = psutil.Process(self.procs[name].pid)
            return [top.pid, *(c.pid for c in top.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def kill(self, name: str) -> None:
        """SIGKILL node ``name``: every process of it at once (a worker must not outlive its raylet)."""
        for pid in self.pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs[name].wait(timeout=30)

    def sweep(self) -> None:
        """Anything still running from this cluster's temp dir (reparented after its parent died)."""
        import psutil

        for p in psutil.process_iter(["pid", "cmdline"]):
            if p.pid != os.getpid() and str(self.root) in " ".join(p.info["cmdline"] or []):
                try:
                    p.kill()
                except psutil.Error:
                    pass


@pytest.fixture
def cluster(request):
    """A two-node cluster (node ``head`` and node ``b``, 1 CPU each; a test parametrized
    indirectly with ``{"head_cpus": n}`` gets n on the head), killed whole at teardown, pass or fail
    (only its own processes: `ray stop` would also stop other Ray instances on this machine)."""
    head_cpus = getattr(request, "param", {}).get("head_cpus", 1)
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'negsynth[ray]')")
    pytest.importorskip("psutil")
    if shutil.which("ray") is None:
        pytest.skip("the `ray` command is not on PATH")
    # short: Ray's unix sockets live under it (108-byte limit), and its own address file
    # (ray_current_cluster) goes there, so no other ray.init() on this machine finds this cluster
    root = Path(tempfile.mkdtemp(prefix="nsray-", dir="/tmp"))
    c = Cluster(root)
    try:
        c.start("head", "--head", "--port", str(c.port), "--temp-dir", str(root), "--include-dashboard", "false", cpus=head_cpus)
        c.start("b", "--address", c.address)
        ray.init(address=c.address, log_to_driver=False, configure_logging=False)
        deadline = time.monotonic() + 60
        while len(c.node_ids) < 2:
            c.node_ids = {k[5:]: n["NodeID"] for n in ray.nodes() if n["Alive"] for k in n["Resources"] if k in ("node_head", "node_b")}
            assert time.monotonic() < deadline, ray.nodes()
            time.sleep(0.2)
        ray.shutdown()  # negsynth connects itself, by address
        yield c
    finally:
        ray.shutdown()
        for name in reversed(list(c.procs)):
            with contextlib.suppress(Exception):  # one node's trouble must not leave the other running
                c.kill(name)
        c.sweep()
        shutil.rmtree(root, ignore_errors=True)


def slow(req, n):
    """test_scaleout's answers, 0.15 s each: the workers overlap, and a kill lands mid-run."""
    r = sts_reasked_once(req, n)
    r.delay = 0.15
    return r


def test_generate_and_score_on_two_nodes_equal_one_process(tmp_path, cluster, rd, reference, monkeypatch):  # noqa: F811
    import test_score

    from negsynth.pipeline.executor import RayExecutor

    ref_files, _, _ = reference
    both = {cluster.node_ids["head"], cluster.node_ids["b"]}
    # generate: two shard workers, one per node ($RAY_ADDRESS, as a user points at a cluster)
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    with FakeOpenAI(slow) as srv:
        r = gen(write_config(tmp_path, srv.base_url), rd, "--executor", "ray", "--workers", "2", "--json")
    assert r.exit_code == 0, r.output
    st = json.loads(r.stdout)
    assert st["executor"] == "ray" and st["complete"] and set(st["ray_nodes"]) == both
    assert generate_files(rd) == ref_files
    import ray

    ray.shutdown()
    monkeypatch.delenv("RAY_ADDRESS")

    # score: two embedding actors, one per node (--ray-address), score's fake embedder shipped by value
    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))
    cos = {**HAND, "m1": 0.89, "m2": 0.88, "e1": 0.7, "e2": 0.6, "e3": 0.4, "e4": 0.3}
    shards = [
        [example(0, q="Q0"), example(1, q="Q1", negs=("m1", "m2", "n3", "n4"))],
        [example(2, q="Q2", negs=("e1", "e2", "e3", "e4")), example(3, q="Q3", tt="sts")],
        [example(4, q="Q4", negs=("e1", "n2", "e3", "n4"), pos="pos"), example(5, q="Q5", negs=("m2", "e2", "e3", "e4"))],
    ]
    out, stats = {}, {}
    with by_value(test_score):
        for name in ("one", "ray"):
            sd = tmp_path / f"score-{name}"
            write_generate(sd, shards)
            ctx = make_ctx(sd, policy="filter", min_negatives=3, filter_flags=["false_negative"])
            ctx.cfg.embedder.batch_size = 1  # parts of 8 texts: several parts for the two workers
            ctx = replace(ctx, embedder=FakeEmbedder(cos))
            score = get("score")
            stats[name] = run_stage(score, ctx) if name == "one" else run_stage(score, ctx, executor=RayExecutor(2, cluster.address))
            d = sd / "score"
            files = [*d.glob("shard-*.jsonl"), *(d / "rejects").glob("*.jsonl"), *(d / "_shards").glob("*")]
            out[name] = {str(p.relative_to(d)): p.read_bytes() for p in sorted(files)}
    assert stats["ray"]["workers"] == 2 and set(stats["ray"]["ray_nodes"]) == both
    assert out["ray"] == out["one"] and stats["ray"]["kept"] == stats["one"]["kept"] == 5


def test_a_node_killed_mid_generate_is_retried_on_the_other(tmp_path, cluster, rd, reference, monkeypatch):  # noqa: F811
    """Node b dies (SIGKILL to its raylet and every process under it) while its worker has
    requests in flight: Ray retries that task on the head, and the data equals a one-process run."""
    ref_files, _, _ = reference
    with FakeOpenAI(slow) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        out: dict = {}
        args = ("--executor", "ray", "--workers", "2", "--ray-address", cluster.address, "--json")
        t = threading.Thread(target=lambda: out.setdefault("r", gen(cfg, rd, *args)))
        t.start()
        killed_at = None
        deadline = time.monotonic() + 120
        while killed_at is None and t.is_alive() and time.monotonic() < deadline:
            on_b = [pid for pid in cluster.pids("b")[1:] if "ray::_rank" in _cmdline(pid)]
            if on_b and len(srv.requests) >= 6:  # node b's worker is sending
                killed_at = len(srv.requests)
                cluster.kill("b")
            time.sleep(0.05)
        t.join(timeout=300)
        assert not t.is_alive(), "generate did not finish after the node was killed"
    assert killed_at is not None, "node b's worker was never seen running"
    r = out["r"]
    assert r.exit_code == 0, r.output  # Ray retried the lost task on the head: no rerun needed
    st = json.loads(r.stdout)
    assert st["complete"] and set(st["ray_nodes"]) == {cluster.node_ids["head"]}
    assert killed_at < len(srv.requests)  # the kill came before the end of the run
    assert generate_files(rd) == ref_files


@pytest.mark.parametrize("cluster", [{"head_cpus": 2}], indirect=True, ids=["head-2-cpus"])
@pytest.mark.parametrize("spare", [True, False], ids=["spare-cpu-on-head", "no-spare-cpu"])
def test_a_node_killed_mid_score_is_survived(tmp_path, cluster, spare, monkeypatch):
    """Node b dies (SIGKILL to its raylet and every process under it) while its embedding worker
    encodes a part: the part is redone by the head's worker and score finishes with the
    one-process bytes. The head has 2 CPUs, one held by a placeholder actor while the workers
    start (so they start one per node). ``spare``: the placeholder is killed just before node b,
    Ray restarts the lost worker on the head and it answers again (the last node of both workers
    is the head); else the restart has no CPU to go to and the head's worker finishes alone."""
    import ray
    import test_score
    import test_score_ray
    from test_score_ray import SlowFake

    from negsynth.pipeline.executor import RayExecutor

    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))
    head, b = cluster.node_ids["head"], cluster.node_ids["b"]
    # 30 examples, 6 texts each, all hand-set (the fake's hashed fallback differs between processes):
    # 162 distinct texts, ~21 parts of 8, one fake call each (1 s, or 3 s): the kill lands mid-run
    cos = {**HAND, "m1": 0.89, "m2": 0.88}
    rows = []
    for i in range(30):
        negs = [f"n{i}{c}" for c in "abcd"]
        cos.update({f"p{i}": 0.9 - i % 5 * 0.01, **{n: 0.8 - j * 0.15 - i % 7 * 0.01 for j, n in enumerate(negs)}})
        rows.append(example(i, q=f"Q{i}", pos=f"p{i}", negs=("m1", "m2", *negs[2:]) if i % 3 == 0 else negs))
    shards = [rows[k : k + 10] for k in range(0, 30, 10)]
    out = {}

    def score_in(d, emb):
        write_generate(d, shards)
        ctx = make_ctx(d, policy="filter", min_negatives=3, filter_flags=["false_negative"])
        ctx.cfg.embedder.batch_size = 1
        return replace(ctx, embedder=emb)

    run_stage(get("score"), score_in(tmp_path / "one", FakeEmbedder(cos)))
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)  # negsynth uses this connection

    class Placeholder:
        def ping(self) -> bool:
            return True

    holder = ray.remote(num_cpus=1, resources={"node_head": 0.5})(Placeholder).remote()
    assert ray.get(holder.ping.remote(), timeout=60)
    slow = SlowFake(cos)
    slow.delay = 3.0 if spare else 1.0  # with a spare CPU: time for Ray to see the node dead and restart the worker
    ctx = score_in(tmp_path / "ray", slow)

    def score_on_ray():
        try:
            out["stats"] = run_stage(get("score"), ctx, executor=RayExecutor(2, cluster.address))
        except Exception as e:  # noqa: BLE001 - shown by the assertion below
            out["error"] = e

    with by_value(test_score, test_score_ray):
        t = threading.Thread(target=score_on_ray)
        t.start()
        killed = False
        deadline = time.monotonic() + 120
        while not killed and t.is_alive() and time.monotonic() < deadline:
            if any("ray::_EmbedWorker.encode_part" in _cmdline(pid) for pid in cluster.pids("b")[1:]):  # node b's worker encodes a part
                if spare:
                    ray.kill(holder)
                cluster.kill("b")
                killed = True
            time.sleep(0.05)
        t.join(timeout=400)
        assert not t.is_alive(), "score did not finish after the node was killed"
    assert killed, "node b's worker was never seen encoding"
    assert "error" not in out, out.get("error")  # the stage finished without a rerun
    st = out["stats"]
    assert st["complete"] and st["workers"] == 2
    assert sorted(st["ray_nodes"]) == sorted([head, head] if spare else [head, b])  # where each worker last answered
    d = {name: tmp_path / name / "score" for name in ("one", "ray")}
    files = {
        name: {
            str(p.relative_to(x)): p.read_bytes()
            for p in sorted([*x.glob("shard-*.jsonl"), *(x / "rejects").glob("*.jsonl"), *(x / "_shards").glob("*")])
        }
        for name, x in d.items()
    }
    assert files["ray"] == files["one"]
    assert st["kept"] > 0


def _cmdline(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:  # gone meanwhile
        return ""
