"""score --executor ray: the embedding on Ray workers (one embedder each), everything that decides
what is kept (dedup in input order, decontamination, the policy, writing) in the driver.

A local 2-CPU Ray node, as in test_scaleout. The fast test ships score's own fake embedder
(tests/test_score.py) to the workers; the slow one loads MiniLM by name in each worker through
the CLI (`negsynth score` and `negsynth run`)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import tomli_w
from helpers import by_value
from test_score import HAND, FakeEmbedder, example, make_ctx, write_generate
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import read_stage, write_jsonl
from negsynth.stages import get, run_stage

runner = CliRunner()
SCORE = get("score")


def outputs(rd: Path) -> dict[str, bytes]:
    d = rd / "score"
    files = [*d.glob("shard-*.jsonl"), *(d / "rejects").glob("*.jsonl"), *(d / "_shards").glob("*")]
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(files)}


@pytest.fixture
def fake_by_value(ray_node):
    """The workers cannot import tests/test_score.py: its fake travels by value while a test runs
    (a user's embedder class must be importable on the workers, or registered the same way)."""
    import test_score

    with by_value(test_score):
        yield


def test_fake_embedder_on_two_ray_workers_gives_the_same_bytes(tmp_path, fake_by_value, monkeypatch):
    """The fake embedder a Python caller passes travels to both workers; the parts are dealt to
    them whole and re-assembled in order: every output file equals the one-process run's."""
    from negsynth.pipeline.executor import RayExecutor
    from negsynth.pipeline.ray_embed import RayEmbedder

    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))
    cos = {**HAND, "m1": 0.89, "m2": 0.88, "e1": 0.7, "e2": 0.6, "e3": 0.4, "e4": 0.3}
    shards = [
        [example(0, q="Q0"), example(1, q="Q1", negs=("m1", "m2", "n3", "n4"))],  # ex-1: two false negatives -> rejected
        [example(2, q="Q2", negs=("e1", "e2", "e3", "e4")), example(3, q="Q3", tt="sts")],
        [example(4, q="Q4", negs=("e1", "n2", "e3", "n4"), pos="pos"), example(5, q="Q5", negs=("m2", "e2", "e3", "e4"))],
    ]
    seen = []
    real = RayEmbedder.encode_parts

    def spy(self, parts, **kw):
        seen.append(len(parts))
        return real(self, parts, **kw)

    monkeypatch.setattr(RayEmbedder, "encode_parts", spy)
    out, stats = {}, {}
    for name in ("one", "ray"):
        rd = tmp_path / name
        write_generate(rd, shards)
        ctx = make_ctx(rd, policy="filter", min_negatives=3, filter_flags=["false_negative"])
        ctx.cfg.embedder.batch_size = 1  # parts of 8 texts: several parts for two workers
        ctx = replace(ctx, embedder=FakeEmbedder(cos))
        stats[name] = run_stage(SCORE, ctx) if name == "one" else run_stage(SCORE, ctx, executor=RayExecutor(2))
        out[name] = outputs(rd)
    assert seen and seen[0] >= 2  # the block went to the workers in several parts
    assert out["ray"] == out["one"]
    one, ray = stats["one"], stats["ray"]
    assert ray["executor"] == "ray" and ray["workers"] == 2 and ray["throughput"]["device"] == "ray:?,?"
    assert (ray["kept"], ray["rejected"], ray["levels"]) == (one["kept"], one["rejected"], one["levels"])
    assert one["rejects_by_reason"] == {"false_negative": 1} and one["kept"] == 5


def test_curriculum_takes_no_executor(tmp_path):
    write_jsonl(tmp_path / "generate" / "shard-00000.jsonl", [example(0)])
    r = runner.invoke(app, ["curriculum", "-d", str(tmp_path), "-q", "--executor", "ray"])
    assert r.exit_code == 2  # curriculum takes no --executor


def test_more_workers_than_the_cluster_has_cpus_is_one_line(tmp_path, fake_by_value, monkeypatch):
    from negsynth.errors import UserError
    from negsynth.pipeline.executor import RayExecutor

    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))
    write_generate(tmp_path, [[example()]])
    ctx = make_ctx(tmp_path)
    ctx = replace(ctx, embedder=FakeEmbedder(HAND))
    with pytest.raises(UserError, match=r"--workers 3: the Ray cluster has 2 CPU\(s\) .*use --workers 2"):
        run_stage(SCORE, ctx, executor=RayExecutor(3))  # the third actor would wait for a CPU forever
    assert not (tmp_path / "score" / "shard-00000.jsonl").exists()


class SlowFake(FakeEmbedder):
    """score's fake, ``delay`` s per call (0.3): time to kill a worker in the middle of a block."""

    delay = 0.3

    def _encode(self, texts, *, batch_size, show_progress):
        import time

        time.sleep(self.delay)
        return super()._encode(texts, batch_size=batch_size, show_progress=show_progress)


class StuckOnRestart(SlowFake):
    """SlowFake whose copy never finishes loading in a worker started once the file ``gate`` exists
    (a restarted worker that never comes back)."""

    gate = ""

    def __setstate__(self, state):
        import os
        import time

        self.__dict__.update(state)
        while self.gate and os.path.exists(self.gate):
            time.sleep(0.5)


def _kill_loop(stop, killed, once: bool, gate: str = "") -> None:
    """SIGKILL an embedding worker busy with a part (once, or every one seen until ``stop``); the
    file ``gate``, when given, is made before the first kill."""
    import os
    import signal
    import time

    from helpers import own_processes

    # until the stage ends (``stop``): on a loaded machine the workers may take minutes to start
    while not stop.is_set() and not (once and killed):
        pids = own_processes("ray::_EmbedWorker.encode_part")
        for pid in pids[:1] if once else pids:
            if gate:
                Path(gate).touch()
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _slow_run(tmp_path, monkeypatch, *, once: bool, stuck: bool = False):
    """The 6-example reference in one process, then score on 2 Ray workers (SlowFake, or
    StuckOnRestart with ``stuck``) into ``tmp_path/ray`` while workers are SIGKILLed; returns (the
    reference dir, the run dir, a fresh ctx for the run dir, killed pids, what the Ray run returned
    or raised)."""
    import sys
    import threading

    from negsynth.pipeline.executor import RayExecutor

    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))
    cos = {**HAND, "m1": 0.89, "m2": 0.88}
    shards = [[example(i, q=f"Q{i}", negs=("m1", "m2", "n3", "n4") if i % 3 == 0 else ("n1", "n2", "n3", "n4"))] for i in range(6)]
    ref = tmp_path / "one"
    write_generate(ref, shards)
    rd = tmp_path / "ray"
    write_generate(rd, shards)

    def ctx_for(d, emb):
        c = make_ctx(d, policy="filter", min_negatives=3, filter_flags=["false_negative"])
        c.cfg.embedder.batch_size = 1
        return replace(c, embedder=emb)

    run_stage(SCORE, ctx_for(ref, FakeEmbedder(cos)))
    emb = StuckOnRestart(cos) if stuck else SlowFake(cos)
    gate = str(tmp_path / "gate") if stuck else ""
    emb.gate = gate
    killed: list[int] = []
    stop = threading.Event()
    t = threading.Thread(target=_kill_loop, args=(stop, killed, once, gate))
    t.start()
    try:
        with by_value(sys.modules[__name__]):  # SlowFake travels by value too
            got = run_stage(SCORE, ctx_for(rd, emb), executor=RayExecutor(2))
    except Exception as e:  # noqa: BLE001 - the caller checks what it is
        got = e
    finally:
        stop.set()
        t.join()
        if gate:
            Path(gate).unlink(missing_ok=True)
    return ref, rd, (lambda: ctx_for(rd, FakeEmbedder(cos))), killed, got


def test_a_worker_killed_mid_block_is_restarted_and_the_stage_finishes(tmp_path, fake_by_value, monkeypatch):
    """SIGKILL one embedding worker while it encodes a part: its part goes to the other worker, Ray
    restarts the dead one, and the stage finishes with the one-process bytes (no rerun)."""
    ref, rd, _, killed, got = _slow_run(tmp_path, monkeypatch, once=True)
    assert killed, "no worker was seen encoding"
    assert isinstance(got, dict), got
    assert got["complete"] and got["workers"] == 2 and len(got["ray_nodes"]) == 2
    assert outputs(rd) == outputs(ref)


def test_workers_killed_past_their_restarts_stop_in_one_line_and_a_rerun_resumes(tmp_path, fake_by_value, monkeypatch):
    """No restarts left (``MAX_RESTARTS = 0``) and every worker SIGKILLed as it encodes: the stage stops
    with one line (nothing of the block written), and the same call again gives the one-process bytes."""
    from negsynth.errors import UserError
    from negsynth.pipeline import ray_embed
    from negsynth.pipeline.executor import RayExecutor

    monkeypatch.setattr(ray_embed, "MAX_RESTARTS", 0)
    ref, rd, ctx_again, killed, got = _slow_run(tmp_path, monkeypatch, once=False)
    assert len(set(killed)) >= 2
    assert isinstance(got, UserError), got
    assert re.fullmatch(
        r"--executor ray: an embedding worker failed \(.*\), and no embedding worker is left; finished shards are kept, rerun the same command to resume",
        str(got),
    )
    assert not (rd / "score" / "shard-00000.jsonl").exists()  # one block: nothing of it was written
    monkeypatch.setattr(ray_embed, "MAX_RESTARTS", 3)
    run_stage(SCORE, ctx_again(), executor=RayExecutor(2))
    assert outputs(rd) == outputs(ref)


def test_workers_lost_and_not_back_within_the_wait_stop_in_one_line(tmp_path, fake_by_value, monkeypatch):
    """Every worker SIGKILLed and their restarts never finish loading: the stage does not wait
    forever (pytest's timeout would fail it); after ``RESTART_WAIT`` s with no worker it stops
    with one line."""
    from negsynth.errors import UserError
    from negsynth.pipeline import ray_embed

    monkeypatch.setattr(ray_embed, "RESTART_WAIT", 3.0)
    _, rd, _, killed, got = _slow_run(tmp_path, monkeypatch, once=False, stuck=True)
    assert len(set(killed)) >= 2
    assert isinstance(got, UserError), got
    assert re.fullmatch(
        r"--executor ray: an embedding worker failed \(.*\), and none came back within 3 s; finished shards are kept, rerun the same command to resume",
        str(got),
    )
    assert not (rd / "score" / "shard-00000.jsonl").exists()


def test_a_worker_whose_embedder_cannot_load_is_one_line_not_a_restart_loop(tmp_path, ray_node, monkeypatch):
    """``__init__`` raising is not a death Ray restarts: the stage stops at once with the worker's line."""
    from negsynth.errors import UserError
    from negsynth.pipeline import ray_embed
    from negsynth.pipeline.executor import RayExecutor

    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))
    # unlimited restarts: were an actor whose __init__ raised restarted, this would never end
    # (pytest's timeout fails it; no bound of its own, since a start alone took 200-300 s at load 6)
    monkeypatch.setattr(ray_embed, "MAX_RESTARTS", -1)
    write_generate(tmp_path, [[example()]])
    ctx = make_ctx(tmp_path)
    ctx.cfg.embedder.model = str(tmp_path / "no-such-model")
    with pytest.raises(UserError, match=r"^--executor ray: the embedding workers could not start \(") as e:
        run_stage(SCORE, ctx, executor=RayExecutor(2))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "score" / "shard-00000.jsonl").exists()


TOPICS = [
    "tides and the moon",
    "vaccines and immunity",
    "volcanoes",
    "bees and pollen",
    "black holes",
    "ocean currents",
    "glaciers",
    "the printing press",
    "photosynthesis",
    "earthquakes",
    "coral reefs",
    "the roman empire",
]


def write_inputs(rd: Path) -> None:
    """12 examples in 3 shards, a false negative in every 4th, two near-duplicate queries."""
    rows = []
    for i, t in enumerate(TOPICS):
        pos = f"A passage explaining {t} in detail."
        negs = [f"A passage about {u}." for u in TOPICS if u != t][:3]
        negs = [pos, *negs] if i % 4 == 0 else [*negs, f"Some words on {t}."]
        rows.append(
            {
                "id": f"ex-{i}",
                "task": "find the passage",
                "task_type": "short-long",
                "query": f"what about {t}?",
                "positive": pos,
                "negatives": negs,
            }
        )
    rows += [{**rows[1], "id": "ex-dup1", "query": "what about vaccines and immunity ?"}, {**rows[5], "id": "ex-dup5"}]
    for k in range(3):
        write_jsonl(rd / "generate" / f"shard-{k:05d}.jsonl", rows[k * 5 : (k + 1) * 5])


@pytest.mark.slow  # MiniLM loaded by three processes, three score runs
def test_minilm_score_and_run_on_two_ray_workers_equal_one_process(tmp_path, ray_node, minilm):
    """`negsynth score --executor ray --workers 2` and `negsynth run --stages score --executor ray`
    (MiniLM loaded by name in each worker): the same kept ids, rejects, levels and flags as one
    process, cosines within 1e-5 (docs/reliability.md: equal up to float rounding)."""
    cfg = tmp_path / "run.toml"
    sections = {
        "embedder": {"model": minilm, "device": "cpu", "batch_size": 4},
        "score": {"decontam_sets": [], "policy": "filter", "min_negatives": 3, "filter_flags": ["false_negative"]},
    }
    cfg.write_text(tomli_w.dumps(sections))
    cmds = {
        "one": ["score"],
        "score-ray": ["score", "--executor", "ray", "--workers", "2"],
        "run-ray": ["run", "--stages", "score", "--executor", "ray", "--workers", "2"],
    }
    res = {}
    for name, cmd in cmds.items():
        rd = tmp_path / name
        write_inputs(rd)
        r = runner.invoke(app, [*cmd, "-c", str(cfg), "-d", str(rd), "-q", "--json"])
        assert r.exit_code == 0, r.output
        st = json.loads(r.stdout)
        st = st.get("score", st)  # run: stats per stage
        kept = [(x["id"], x["negatives"], x["score"]) for x in read_stage(rd / "score")]
        rejects = [(x["id"], x["reason"]) for p in sorted((rd / "score" / "rejects").glob("*.jsonl")) for x in map(json.loads, p.open())]
        res[name] = (st, kept, rejects)
    st1, kept1, rej1 = res["one"]
    assert st1["throughput"]["device"] == "cpu" and st1["negatives_dropped"] > 0 and st1["clean"]["near_duplicate"] == 2
    assert sorted(rej1) == [("ex-dup1", "near_duplicate"), ("ex-dup5", "near_duplicate")]
    for name in ("score-ray", "run-ray"):
        st, kept, rejects = res[name]
        assert st["executor"] == "ray" and st["workers"] == 2 and st["throughput"]["device"] == "ray:cpu,cpu"
        assert rejects == rej1
        assert [(i, n) for i, n, _ in kept] == [(i, n) for i, n, _ in kept1]  # ids and the negatives kept, in order
        for k in ("kept", "rejected", "rejects_by_reason", "negatives_dropped", "clean", "reordered"):
            assert st[k] == st1[k], k
        assert [lv["n"] for lv in st["levels"]] == [lv["n"] for lv in st1["levels"]]
        for a, b in zip((s for *_, s in kept), (s for *_, s in kept1), strict=True):
            for f in ("false_negative", "too_easy", "llm_order", "monotonic"):
                assert a[f] == b[f], f
            assert (
                abs(a["cos_pos"] - b["cos_pos"]) < 1e-5 and max(abs(x - y) for x, y in zip(a["cos_neg"], b["cos_neg"], strict=True)) < 1e-5
            )


def test_without_an_address_ray_starts_a_node_of_its_own(monkeypatch):
    """--ray-address, else $RAY_ADDRESS, else "local": Ray's own default (None) would join the
    cluster started last on this machine, e.g. another job's."""
    from negsynth.pipeline.ray_connect import ray_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(None) == "local"
    assert ray_address("10.0.0.1:6379") == "10.0.0.1:6379"
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    assert ray_address(None) == "head:6379" and ray_address("other:1") == "other:1"
