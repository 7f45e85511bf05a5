"""The API key never lands in a shard, manifest, stats, cache, batch file or log (-vv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fake_openai import FakeOpenAI, Reply, always_valid
from helpers import write_run_config

KEY = "sk-planted-SECRET-7f3a9c1e5b2d4086"


def write_config(tmp: Path, base_url: str, key_setting: dict) -> Path:
    return write_run_config(tmp, base_url, llm={**key_setting, "max_retries": 1, "max_attempts": 2})


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "negsynth.cli", *args], env=env, capture_output=True, text=True, timeout=180)


def responder(req, n):
    # some faults, so error paths and reject records are exercised too
    if n % 5 == 1:
        return Reply(status=500, body={"error": {"message": "internal error"}})
    if n % 7 == 3:
        return Reply(content="not json at all")
    return always_valid(req, n)


def assert_nowhere(rd: Path, outputs: list[str]) -> int:
    n = 0
    for p in rd.rglob("*"):
        if p.is_file():
            n += 1
            data = p.read_bytes()
            assert KEY.encode() not in data, f"the key leaked into {p}"
            assert KEY[-16:].encode() not in data, f"part of the key leaked into {p}"
    for text in outputs:
        assert KEY not in text and KEY[-16:] not in text
    return n


def test_key_from_env_never_written(tmp_path):
    env = {**os.environ, "NEGSYNTH_TEST_API_KEY": KEY, "NEGSYNTH_BATCH_POLL_S": "0.01"}
    with FakeOpenAI(responder, require_key=KEY) as srv:
        cfg = write_config(tmp_path, srv.base_url, {"api_key_env": "NEGSYNTH_TEST_API_KEY"})
        rd = tmp_path / "run"
        outs = []
        # batch first, while the cache holds no generate answers, so a batch is really submitted
        for args in (["brainstorm"], ["generate", "--mode", "batch"], ["generate", "--overwrite"], ["generate", "--json"]):
            p = cli(*args, "-c", str(cfg), "-d", str(rd), "-vv", env=env)
            assert p.returncode == 0, p.stderr
            outs += [p.stdout, p.stderr]
        assert len(srv.requests) >= 4 and len(srv.batch_requests) >= 8 and len(srv.batches) >= 1
        # the server really required the key: every request carried it
        assert all({k.lower(): v for k, v in h.items()}["authorization"] == f"Bearer {KEY}" for h in srv.headers)
    assert any("DEBUG" in o for o in outs)  # -vv really logged
    n_files = assert_nowhere(rd, outs)
    assert n_files > 10 and (rd / "cache" / "llm.sqlite").exists() and (rd / "manifest.json").exists()


def test_key_from_file_and_a_server_that_echoes_a_wrong_key(tmp_path):
    keyfile = tmp_path / "secret" / "key.txt"
    keyfile.parent.mkdir()
    keyfile.write_text(KEY + "\n")

    def echo(req, n):  # some servers put the key they got into the error message
        return Reply(status=401, body={"error": {"message": f"Incorrect API key provided: {KEY}"}})

    env = dict(os.environ)
    with FakeOpenAI(always_valid, require_key=KEY) as srv:
        cfg = write_config(tmp_path, srv.base_url, {"api_key_file": str(keyfile)})
        rd = tmp_path / "run"
        p = cli("brainstorm", "-c", str(cfg), "-d", str(rd), "-vv", env=env)
        assert p.returncode == 0, p.stderr
        outs = [p.stdout, p.stderr]
    # the endpoint accepts /models but refuses chat with an error that quotes the key
    with FakeOpenAI(echo) as srv:
        cfg = write_config(tmp_path, srv.base_url, {"api_key_file": str(keyfile)})
        p = cli("generate", "-c", str(cfg), "-d", str(rd), "-vv", env=env)
        assert p.returncode == 2 and "refused the API key" in p.stderr, p.stderr
        outs += [p.stdout, p.stderr]
    # a 400 whose message quotes the key becomes a reject record: the key is redacted there (and
    # in the one line that says the stage failed: every request was refused, exit 2; the
    # refusals stay in the unfinished shard, retried by a rerun)
    with FakeOpenAI(lambda q, n: Reply(status=400, body={"error": {"message": f"bad request from {KEY}"}}), require_key=None) as srv:
        cfg = write_config(tmp_path, srv.base_url, {"api_key_file": str(keyfile)})
        p = cli("generate", "-c", str(cfg), "-d", str(rd), "-vv", env=env)
        assert p.returncode == 2 and "[redacted]" in p.stderr, p.stderr
        outs += [p.stdout, p.stderr]
    rejects = (rd / "generate" / "shard-00000.jsonl.partial").read_text()
    assert "bad_request" in rejects and "[redacted]" in rejects
    assert_nowhere(rd, outs)
    assert KEY not in json.dumps(json.loads((rd / "manifest.json").read_text()))
