"""score --executor ray: the embedding on Ray workers (one embedder each), everything that decides
what is kept (dedup in input order, decontamination, the policy, writing) in the driver.

A local 2-CPU Ray node, as in test_scaleout. The fast test ships score's own fake embedder
(tests/test_score.py) to the workers; the slow one loads MiniLM by name in each worker through
the CLI (`negsynth score` and `negsynth run`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w
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
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(test_score)
    yield
    cloudpickle.unregister_pickle_by_value(test_score)


def test_fake_embedder_on_two_ray_workers_gives_the_same_bytes(tmp_path, fake_by_value, monkeypatch):
    """The fake embedder a Python caller passes travels to both workers; the parts are dealt to
    them whole and re-assembled in order: every output file equals the one-process run's."""
    from negsynth.pipeline.ray_executor import RayEmbedder, run_on_ray

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
        ctx.embedder = FakeEmbedder(cos)
        stats[name] = run_stage(SCORE, ctx) if name == "one" else run_on_ray(SCORE, ctx, workers=2)
        out[name] = outputs(rd)
    assert seen and seen[0] >= 2  # the block went to the workers in several parts
    assert out["ray"] == out["one"]
    one, ray = stats["one"], stats["ray"]
    assert ray["executor"] == "ray" and ray["workers"] == 2 and ray["throughput"]["device"] == "ray:?,?"
    assert (ray["kept"], ray["rejected"], ray["levels"]) == (one["kept"], one["rejected"], one["levels"])
    assert one["rejects_by_reason"] == {"false_negative": 1} and one["kept"] == 5


def test_ray_refuses_embedder_devices_in_one_line(tmp_path):
    write_jsonl(tmp_path / "generate" / "shard-00000.jsonl", [example(0)])
    r = runner.invoke(app, ["score", "-d", str(tmp_path), "-q", "--executor", "ray", "--set", "embedder.devices=2"])
    assert r.exit_code == 2 and "remove embedder.devices" in r.stderr and r.stderr.count("\n") == 1
    r = runner.invoke(app, ["curriculum", "-d", str(tmp_path), "-q", "--executor", "ray"])
    assert r.exit_code == 2  # curriculum takes no --executor


def test_more_workers_than_the_cluster_has_cpus_is_one_line(tmp_path, fake_by_value, monkeypatch):
    from negsynth.errors import UserError
    from negsynth.pipeline.ray_executor import run_on_ray

    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))
    write_generate(tmp_path, [[example()]])
    ctx = make_ctx(tmp_path)
    ctx.embedder = FakeEmbedder(HAND)
    with pytest.raises(UserError, match=r"--workers 3: the Ray cluster has 2 CPU\(s\) .*use --workers 2"):
        run_on_ray(SCORE, ctx, workers=3)  # the third actor would wait for a CPU forever
    assert not (tmp_path / "score" / "shard-00000.jsonl").exists()


class SlowFake(FakeEmbedder):
    """score's fake, 0.3 s per call: time to kill a worker in the middle of a block."""

    def _encode(self, texts, *, batch_size, show_progress):
        import time

        time.sleep(0.3)
        return super()._encode(texts, batch_size=batch_size, show_progress=show_progress)


def test_a_worker_killed_mid_block_stops_in_one_line_and_a_rerun_resumes(tmp_path, fake_by_value, monkeypatch):
    """SIGKILL one embedding worker while a block's parts are in flight: the stage stops with one
    line (nothing of that block written), and the same call again finishes with the one-process bytes."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    from ray import cloudpickle

    from negsynth.errors import UserError
    from negsynth.pipeline.ray_executor import run_on_ray

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # SlowFake travels by value too
    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))
    cos = {**HAND, "m1": 0.89, "m2": 0.88}
    shards = [[example(i, q=f"Q{i}", negs=("m1", "m2", "n3", "n4") if i % 3 == 0 else ("n1", "n2", "n3", "n4"))] for i in range(6)]
    ref = tmp_path / "one"
    write_generate(ref, shards)
    ctx = make_ctx(ref, policy="filter", min_negatives=3, filter_flags=["false_negative"])
    ctx.cfg.embedder.batch_size = 1
    ctx.embedder = FakeEmbedder(cos)
    run_stage(SCORE, ctx)
    rd = tmp_path / "ray"
    write_generate(rd, shards)
    killed = []

    def kill_one():
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            pids = subprocess.run(["pgrep", "-f", "ray::_EmbedWorker.encode_part"], capture_output=True, text=True).stdout.split()
            if pids:
                os.kill(int(pids[0]), signal.SIGKILL)
                killed.append(int(pids[0]))
            time.sleep(0.05)

    def ctx_for(emb):
        c = make_ctx(rd, policy="filter", min_negatives=3, filter_flags=["false_negative"])
        c.cfg.embedder.batch_size = 1
        c.embedder = emb
        return c

    t = threading.Thread(target=kill_one)
    t.start()
    try:
        with pytest.raises(UserError, match=r"an embedding worker failed .*rerun the same command to resume"):
            run_on_ray(SCORE, ctx_for(SlowFake(cos)), workers=2)
    finally:
        t.join()
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert killed and not (rd / "score" / "shard-00000.jsonl").exists()  # one block: nothing of it was written
    run_on_ray(SCORE, ctx_for(FakeEmbedder(cos)), workers=2)
    assert outputs(rd) == outputs(ref)


TOPICS = ["tides and the moon", "vaccines and immunity", "volcanoes", "bees and pollen", "black holes", "ocean currents",
          "glaciers", "the printing press", "photosynthesis", "earthquakes", "coral reefs", "the roman empire"]  # fmt: skip


def write_inputs(rd: Path) -> None:
    """12 examples in 3 shards, a false negative in every 4th, two near-duplicate queries."""
    rows = []
    for i, t in enumerate(TOPICS):
        pos = f"A passage explaining {t} in detail."
        negs = [f"A passage about {u}." for u in TOPICS if u != t][:3]
        negs = [pos, *negs] if i % 4 == 0 else [*negs, f"Some words on {t}."]
        rows.append({"id": f"ex-{i}", "task": "find the passage", "task_type": "short-long", "query": f"what about {t}?", "positive": pos,
                     "negatives": negs})  # fmt: skip
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
