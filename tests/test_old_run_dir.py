"""A run dir made by an older negsynth resumes with no LLM request paid again.

``tests/data/old_run_dir`` was written by ``tests/data/make_old_run_dir.py`` with an earlier
negsynth (``git log`` of the folder says which): its run file, its documents and pairs, and the
run dir of brainstorm, generate, regenerate, corpus, score and curriculum with its manifest (each
stage's fingerprint and its outputs' sizes and hashes) and its request cache. Never remake it to
make this test pass: a run dir a user made with that version is what the test stands for. Rerun
with the same run file through the public API against an LLM that answers nothing, every stage
must be found up to date: no request reaches the server, no file of the run dir is written again.
A stage whose fingerprint drifted (a config default, a prompt, what the hash covers) is refused
with its old and new hash, or, for derived data, made again under a new manifest entry: either
way the failure names the stage. And the LLM stages made again (``--overwrite``) find every answer
in the run dir's request cache: the request bodies, its keys, are the ones the old code sent.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fake_openai import FakeOpenAI, Reply

import negsynth
from negsynth.errors import UserError

FIXTURE = Path(__file__).parent / "data" / "old_run_dir"
STAGES = ["brainstorm", "generate", "regenerate", "corpus", "score", "curriculum"]
LLM_STAGES = STAGES[:4]
#: what is recorded of a stage besides what its outputs are made from
NOT_FINGERPRINT = ("updated", "outputs")


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def outputs(root: Path) -> dict[str, bytes]:
    """A stage folder's shards and rejects."""
    return {p: b for p, b in files(root).items() if p.startswith(("shard-", "rejects/"))}


def fingerprints(run: Path) -> dict[str, dict]:
    stages = json.loads((run / "manifest.json").read_text())["stages"]
    return {name: {k: v for k, v in entry.items() if k not in NOT_FINGERPRINT} for name, entry in stages.items()}


def old_run_dir(tmp_path: Path, monkeypatch) -> Path:
    """A copy of the fixture, entered (the run file's paths are relative, as its fingerprints recorded them)."""
    shutil.copytree(FIXTURE, tmp_path / "old")
    monkeypatch.chdir(tmp_path / "old")
    return Path("run")


def test_an_old_run_dir_is_reused_stage_by_stage_with_no_request(tmp_path, monkeypatch):
    run = old_run_dir(tmp_path, monkeypatch)
    before = files(run)
    recorded = fingerprints(run)
    assert sorted(recorded) == sorted(STAGES)
    drifted: dict[str, str] = {}
    with FakeOpenAI(lambda req, n: Reply(status=400)) as srv:
        for stage in STAGES:
            try:
                negsynth.run("run.toml", run, stages=[stage], overrides=[f"llm.base_url={srv.base_url}"], quiet=True)
            except UserError as e:  # a resumable stage made from another config is refused: "config_hash OLD != NEW"
                drifted[stage] = str(e)
                continue
            now = fingerprints(run).get(stage)
            if now != recorded[stage]:  # derived data is made again, under its new fingerprint
                drifted[stage] = f"manifest entry {recorded[stage]} became {now}"
            changed = [p for p, b in files(run / stage).items() if before.get(f"{stage}/{p}") != b]
            if changed and stage not in drifted:
                drifted[stage] = f"wrote {changed}"
        asked = len(srv.requests)
    assert drifted == {}, "stages not reused as the old run dir recorded them:\n" + "\n".join(f"{k}: {v}" for k, v in drifted.items())
    assert asked == 0
    assert files(run) == before  # the manifest and every shard, byte for byte


def same_records(a: bytes | None, b: bytes | None) -> bool:
    """Two shard files hold the same records: every field equal, an embedder's float within 1e-5
    (the fixture's scores were computed with another torch build and CPU, whose float sums can
    move a score's 6th decimal; what the LLM wrote must be equal to the byte)."""
    if a is None or b is None:
        return a == b
    la, lb = a.decode().splitlines(), b.decode().splitlines()
    return len(la) == len(lb) and all(_close(json.loads(x), json.loads(y)) for x, y in zip(la, lb))


def _close(x, y) -> bool:
    if isinstance(x, float) or isinstance(y, float):
        return isinstance(x, (int, float)) and isinstance(y, (int, float)) and abs(x - y) <= 1e-5
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_close(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_close(i, j) for i, j in zip(x, y))
    return x == y


def test_the_llm_stages_made_again_find_every_answer_in_the_old_request_cache(tmp_path, monkeypatch):
    run = old_run_dir(tmp_path, monkeypatch)
    before = {stage: outputs(run / stage) for stage in LLM_STAGES}
    missed: dict[str, str] = {}
    with FakeOpenAI(lambda req, n: Reply(status=400)) as srv:
        for stage in LLM_STAGES:
            sent = len(srv.requests)
            try:
                negsynth.run("run.toml", run, stages=[stage], overrides=[f"llm.base_url={srv.base_url}"], overwrite=True, quiet=True)
            except UserError as e:
                missed[stage] = str(e)
            if len(srv.requests) > sent:
                missed[stage] = f"{len(srv.requests) - sent} requests not in the cache, the first: {json.dumps(srv.requests[sent])[:300]}"
            after = outputs(run / stage)
            changed = sorted(p for p in {*before[stage], *after} if not same_records(before[stage].get(p), after.get(p)))
            if changed and stage not in missed:
                missed[stage] = f"made {changed} differently"
    assert missed == {}, "LLM stages made again from the old request cache:\n" + "\n".join(f"{k}: {v}" for k, v in missed.items())
