"""Outputs that check themselves, and a manifest that records only what finished.

A finished stage records each output shard's size, hash and mtime in the manifest; a relaunch
checks them (sizes always, hashes with --verify or when an mtime moved) and makes a damaged shard
again: an LLM stage from its request cache (the fake server is sent nothing), score by scoring it
again. A run dir made before outputs were recorded resumes as it did. A stage that fails
records no manifest entry.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid
from helpers import brainstormed_once, outage_config
from test_score import HAND, FakeEmbedder, example, make_ctx, run_score, write_generate
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.pipeline.manifest import read_manifest

runner = CliRunner()


@pytest.fixture(scope="module")
def brainstormed(tmp_path_factory) -> Path:
    return brainstormed_once(tmp_path_factory, outage_config)


@pytest.fixture(scope="module")
def generated(tmp_path_factory, brainstormed) -> Path:
    """A finished generate (three shards), made once; each test copies it."""
    import shutil

    tmp = tmp_path_factory.mktemp("gen")
    rd = tmp / "run"
    shutil.copytree(brainstormed, rd)
    with FakeOpenAI(always_valid) as srv:
        r = generate(outage_config(tmp, srv.base_url), rd)
    assert r.exit_code == 0, r.output
    return rd


@pytest.fixture
def gd(tmp_path, generated) -> Path:
    import shutil

    d = tmp_path / "run"
    shutil.copytree(generated, d)
    return d


def generate(cfg: Path, rd: Path, *extra: str):
    return runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "-q", *extra])


def rerun(tmp_path: Path, rd: Path, *extra: str):
    """generate again against a fresh server: (result, the requests it was sent)."""
    with FakeOpenAI(always_valid) as srv:
        r = generate(outage_config(tmp_path, srv.base_url), rd, *extra)
        return r, list(srv.requests)


def said(r) -> str:
    """stderr with the console's line wrapping undone."""
    return r.stderr.replace("\n", "")


def shard_bytes(rd: Path) -> dict[str, bytes]:
    d = rd / "generate"
    return {p.name: p.read_bytes() for p in sorted(d.glob("shard-*.jsonl"))}


def test_a_finished_stage_records_its_outputs(gd):
    entry = read_manifest(gd)["stages"]["generate"]
    outs = entry["outputs"]
    assert "shard-00001.jsonl" in outs and len([k for k in outs if k.startswith("shard-")]) == 3
    p = gd / "generate" / "shard-00001.jsonl"
    assert outs["shard-00001.jsonl"]["size"] == p.stat().st_size and len(outs["shard-00001.jsonl"]["sha256"]) == 64


def test_a_truncated_shard_is_made_again_from_the_request_cache(tmp_path, gd):
    before = shard_bytes(gd)
    p = gd / "generate" / "shard-00001.jsonl"
    data = p.read_bytes()
    p.write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 1 + 10])  # the last line cut short
    # inspect names the command that repairs it
    r = runner.invoke(app, ["inspect", str(gd / "generate")])
    assert r.exit_code == 2 and f"negsynth generate -d {gd} --verify" in r.output, r.output
    r, sent = rerun(tmp_path, gd)
    assert r.exit_code == 0, r.output
    assert "shard-00001.jsonl is not what the stage wrote (1" in said(r) and "up to date" not in r.output
    assert sent == []  # every answer came from the request cache: nothing paid twice
    assert shard_bytes(gd) == before
    r, sent = rerun(tmp_path, gd)
    assert r.exit_code == 0 and sent == [] and "not what the stage wrote" not in said(r)


def test_same_size_damage_is_found_by_its_hash(tmp_path, gd):
    before = shard_bytes(gd)
    p = gd / "generate" / "shard-00000.jsonl"
    st = p.stat()
    data = bytearray(p.read_bytes())
    i = data.index(b'"query":"') + len(b'"query":"')
    data[i] = ord("#") if data[i] != ord("#") else ord("%")
    p.write_bytes(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime put back: only a hash can tell
    r, _ = rerun(tmp_path, gd)
    assert r.exit_code == 0 and "not what the stage wrote" not in said(r)
    assert shard_bytes(gd) != before  # sizes alone do not see it
    r, sent = rerun(tmp_path, gd, "--verify")
    assert r.exit_code == 0, r.output
    assert "shard-00000.jsonl is not what the stage wrote (its content changed" in said(r) and sent == []
    assert shard_bytes(gd) == before
    # an edit that moves the mtime is hashed without --verify
    p.write_bytes(bytes(data))
    r, sent = rerun(tmp_path, gd)
    assert r.exit_code == 0 and "not what the stage wrote" in said(r) and sent == []
    assert shard_bytes(gd) == before


def test_a_run_dir_without_recorded_outputs_resumes_as_before(tmp_path, gd):
    man = json.loads((gd / "manifest.json").read_text())
    del man["stages"]["generate"]["outputs"]
    (gd / "manifest.json").write_text(json.dumps(man))
    (gd / "generate" / "_entry.json").unlink()
    before = shard_bytes(gd)
    r, sent = rerun(tmp_path, gd)
    assert r.exit_code == 0, r.output
    assert sent == [] and "not what the stage wrote" not in said(r) and "--overwrite" not in r.stderr
    assert shard_bytes(gd) == before


def test_a_failing_llm_stage_records_no_manifest_entry(tmp_path, brainstormed):
    import shutil

    rd = tmp_path / "run"
    shutil.copytree(brainstormed, rd)
    with FakeOpenAI(lambda req, n: Reply(status=404)) as srv:
        r = generate(outage_config(tmp_path, srv.base_url), rd)
    assert r.exit_code == 2 and "404" in r.stderr, r.output
    assert "generate" not in read_manifest(rd)["stages"] and "brainstorm" in read_manifest(rd)["stages"]


@pytest.fixture
def _no_eval_data(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))


@pytest.mark.usefixtures("_no_eval_data")
def test_a_score_failing_on_a_corrupt_shard_records_nothing_then_a_damaged_output_is_scored_again(tmp_path):
    from negsynth.errors import UserError

    write_generate(tmp_path, [[example(0), example(1)], [example(2)]])
    good = (tmp_path / "generate" / "shard-00000.jsonl").read_text()
    p = tmp_path / "generate" / "shard-00000.jsonl"
    lines = good.splitlines(keepends=True)
    p.write_text(lines[0][:20] + "\n" + lines[1])  # a corrupt line mid-file
    with pytest.raises(UserError):
        run_score(make_ctx(tmp_path), FakeEmbedder(HAND))
    assert "score" not in read_manifest(tmp_path).get("stages", {})
    p.write_text(good)
    run_score(make_ctx(tmp_path), FakeEmbedder(HAND))
    assert "shard-00001.jsonl" in read_manifest(tmp_path)["stages"]["score"]["outputs"]
    out = tmp_path / "score" / "shard-00001.jsonl"
    before = out.read_bytes()
    out.write_bytes(before[:-5])
    emb = FakeEmbedder(HAND)
    run_score(make_ctx(tmp_path), emb)
    assert out.read_bytes() == before and emb.seen  # scored again
    emb = FakeEmbedder(HAND)
    assert run_score(make_ctx(tmp_path), emb).get("reused") and not emb.seen


@pytest.mark.usefixtures("_no_eval_data")
def test_a_read_only_stage_dir_is_found_before_any_work(tmp_path):
    from negsynth.errors import UserError

    write_generate(tmp_path, [[example(0)]])
    out = tmp_path / "score"
    out.mkdir()
    out.chmod(0o555)
    try:
        if os.access(out, os.W_OK):
            pytest.skip("this user writes a read-only folder anyway (root)")
        emb = FakeEmbedder(HAND)
        with pytest.raises(UserError, match=f"cannot write {out}: .*make it writable"):
            run_score(make_ctx(tmp_path), emb)
        assert not emb.seen and "score" not in read_manifest(tmp_path).get("stages", {})
    finally:
        out.chmod(0o755)


@pytest.mark.usefixtures("_no_eval_data")
def test_an_unwritable_stage_dir_stops_the_stage_before_it_embeds(tmp_path, monkeypatch):
    """The same as root, who writes a read-only folder anyway: the folder refuses every new file
    (a read-only mount); the stage stops with one line before the embedder sees a text."""
    import errno
    import tempfile

    from negsynth.errors import UserError

    write_generate(tmp_path, [[example(0)]])
    out = tmp_path / "score"
    (out / "_shards").mkdir(parents=True)
    real = tempfile.mkstemp

    def refuse(*a, dir=None, **kw):  # noqa: A002 - mkstemp's own keyword
        if dir is not None and Path(dir) == out / "_shards":
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    emb = FakeEmbedder(HAND)
    with pytest.raises(UserError, match=f"^cannot write {out / '_shards'}: Read-only file system; make it writable"):
        run_score(make_ctx(tmp_path), emb)
    assert not emb.seen and "score" not in read_manifest(tmp_path).get("stages", {})
