"""The default transport (http1) and aiohttp behave the same where a user meets them: an API key
with a non-ASCII or invisible character, 307/308 redirects (and the ones not to follow), an
untrusted TLS certificate, and export's --out errors. Every case runs the real CLI against the
real-socket fake server (tests/fake_openai.py) on both transports."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import threading
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid
from helpers import self_signed_cert, write_run_config
from typer.testing import CliRunner

from negsynth.cli import app

runner = CliRunner()
TRANSPORTS = ["http1", "aiohttp"]


def brainstorm(tmp, url: str, transport: str, **llm):
    cfg = write_run_config(
        tmp, url, llm={"transport": transport, "max_retries": 1, "connect_timeout": 2, "max_consecutive_failures": 3, **llm}
    )
    return runner.invoke(app, ["brainstorm", "-c", str(cfg), "-d", str(tmp / "run"), "-q", "--json"])


def one_line(r) -> str:
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


# ---------------------------------------------------------------------------- the API key


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_visible_non_ascii_key_is_sent_as_utf8_like_aiohttp(tmp_path, transport, monkeypatch):
    key = "sk-тест-1234"  # a Cyrillic key: aiohttp sends it as UTF-8, and so does http1
    monkeypatch.setenv("NEGSYNTH_TEST_KEY", key)
    with FakeOpenAI(always_valid) as srv:
        r = brainstorm(tmp_path, srv.base_url, transport, api_key_env="NEGSYNTH_TEST_KEY")
        assert r.exit_code == 0, r.output
        # http.server reads header bytes as Latin-1: the UTF-8 bytes of the key arrived intact
        assert srv.headers and {h["Authorization"].encode("latin-1").decode("utf-8") for h in srv.headers} == {f"Bearer {key}"}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_refused_non_ascii_key_names_the_character_not_the_key(tmp_path, transport, monkeypatch):
    key = "sk-\u0430bcdef123456"  # a Cyrillic 'а' in place of a Latin 'a'
    monkeypatch.setenv("NEGSYNTH_TEST_KEY", key)
    with FakeOpenAI(always_valid, require_key="sk-abcdef123456") as srv:
        r = brainstorm(tmp_path, srv.base_url, transport, api_key_env="NEGSYNTH_TEST_KEY")
    assert r.exit_code == 2, r.output
    line = one_line(r)
    assert "refused the API key" in line and "U+0430 CYRILLIC SMALL LETTER A" in line and "position 4" in line
    assert key not in r.output and "bcdef123456" not in r.output


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    "bad, name",
    [("\u200b", "U+200B ZERO WIDTH SPACE"), ("\u00a0", "U+00A0 NO-BREAK SPACE"), ("\ufeff", "U+FEFF ZERO WIDTH NO-BREAK SPACE")],
)
def test_an_invisible_character_in_the_key_is_refused_at_start_up(tmp_path, transport, bad, name, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_TEST_KEY", f"sk-live-{bad}secret9876")
    with FakeOpenAI(always_valid) as srv:
        r = brainstorm(tmp_path, srv.base_url, transport, api_key_env="NEGSYNTH_TEST_KEY")
        assert srv.requests == []
    assert r.exit_code == 2, r.output
    line = one_line(r)
    assert "NEGSYNTH_TEST_KEY (llm.api_key_env)" in line and name in line and "position 9" in line
    assert "secret9876" not in r.output


# ---------------------------------------------------------------------------- redirects


def redirect_once(location: str, status: int = 307):
    """Each distinct request is first answered with a redirect to ``location``, then served."""
    seen: set[str] = set()
    lock = threading.Lock()

    def responder(req, n):
        k = json.dumps(req, sort_keys=True)
        with lock:
            first = k not in seen
            seen.add(k)
        if first:
            return Reply(status=status, headers={"Location": location}, body={"moved": True})
        return always_valid(req, n)

    return responder


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("status", [307, 308])
def test_307_and_308_on_the_same_origin_are_followed_with_the_same_method_and_body(tmp_path, transport, status):
    with FakeOpenAI(redirect_once("/v1/chat/completions", status)) as srv:
        r = brainstorm(tmp_path, srv.base_url, transport)
        reqs = [json.dumps(x, sort_keys=True) for x in srv.requests]
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["complete"] is True
    # every body went twice (redirected, then followed with the same POST body), none three times
    assert reqs and all(reqs.count(x) == 2 for x in set(reqs))


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", ["other_host", "301", "no_location"])
def test_a_redirect_not_to_follow_is_one_line_naming_it(tmp_path, transport, case):
    with FakeOpenAI(always_valid) as srv:
        other = srv.base_url.replace("127.0.0.1", "localhost")  # another origin, same server
        loc, status = {"other_host": (other + "/chat/completions", 307), "301": ("/v2/chat/completions", 301), "no_location": ("", 307)}[
            case
        ]
        srv.responder = lambda req, n: Reply(status=status, headers={"Location": loc} if loc else {}, body={"moved": True})
        r = brainstorm(tmp_path, srv.base_url, transport)
        sent = len(srv.requests)
    assert r.exit_code == 2, r.output
    line = one_line(r)
    assert "llm.base_url" in line and "llm.model" not in line
    expect = {"other_host": f"to another host, {other}", "301": "(301) to", "no_location": "without a Location"}[case]
    assert expect in line, line
    assert sent <= 8  # stopped at the first redirects, not after every item's retries


# ---------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_untrusted_certificate_is_named_as_tls_with_the_host(tmp_path, transport, self_signed, monkeypatch):
    key, cert = self_signed
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    srv = FakeOpenAI(always_valid)
    srv.server.socket = ctx.wrap_socket(srv.server.socket, server_side=True)
    with srv:
        url = srv.base_url.replace("http://", "https://")
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "none.pem"))
        monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
        r = brainstorm(tmp_path, url, transport)
        assert r.exit_code == 2, r.output
        line = one_line(r)
        assert "TLS" in line and f"127.0.0.1:{srv.port}" in line and "certificate" in line and "refused" not in line
        assert srv.requests == []
        if transport == "aiohttp":
            return  # aiohttp builds its default TLS context once, at import: SSL_CERT_FILE is read then
        # trusted, the same server answers
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        shutil.rmtree(tmp_path / "run")
        r = brainstorm(tmp_path, url, transport)
    assert r.exit_code == 0, r.output


# ---------------------------------------------------------------------------- --out


@pytest.fixture
def curriculum_run(tmp_path):
    """A run dir with a curriculum (export's dataset part needs nothing more)."""
    from test_export import scored

    from negsynth.data.curriculum import build_curriculum, save_curriculum
    from negsynth.data.shards import write_jsonl

    d = tmp_path / "run"
    exs = [scored(i) for i in range(17)]
    write_jsonl(d / "score" / "shard-00000.jsonl", exs)
    rows = build_curriculum(exs, batch_size=4, seed=0)
    save_curriculum(rows, d / "curriculum", stats=dict(rows.stats))
    return d


def test_export_out_that_is_a_file_names_out(tmp_path, curriculum_run):
    f = tmp_path / "afile"
    f.write_text("x")
    r = runner.invoke(app, ["export", "-d", str(curriculum_run), "--out", str(f), "--only", "dataset"])
    assert r.exit_code == 2, r.output
    line = one_line(r)
    assert line.startswith("error: --out") and "not a folder" in line and "--run-dir" not in line
    f2 = tmp_path / "sub"
    f2.write_text("x")  # a file where a parent folder is expected
    r = runner.invoke(app, ["export", "-d", str(curriculum_run), "--out", str(f2 / "out"), "--only", "dataset"])
    assert r.exit_code == 2 and one_line(r).startswith("error: --out") and "--run-dir" not in r.stderr


def test_export_unwritable_out_names_out(tmp_path, curriculum_run):
    if os.geteuid() == 0:  # root ignores permissions: /proc refuses even root a new folder
        outs = [Path("/proc/negsynth-export")] if Path("/proc/self").is_dir() else []
    else:
        outs = [tmp_path / "locked", tmp_path / "locked" / "new"]
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o555)
    try:
        for out in outs:
            r = runner.invoke(app, ["export", "-d", str(curriculum_run), "--out", str(out), "--only", "dataset"])
            assert r.exit_code == 2, r.output
            line = one_line(r)
            assert line.startswith("error: --out") and ("writable" in line or "cannot create" in line) and "--run-dir" not in line
    finally:
        os.chmod(locked, 0o755)
    r = runner.invoke(app, ["export", "-d", str(curriculum_run), "--out", str(tmp_path / "ok"), "--only", "dataset"])
    assert r.exit_code == 0, r.output
