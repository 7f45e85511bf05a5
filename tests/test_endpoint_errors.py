"""What a user meets at the LLM endpoint's door, each in one line naming the setting to fix: an API
key with a look-alike or invisible character (refused at start-up, before anything is sent), a
redirect (never followed: the line names the llm.base_url to set), an untrusted TLS certificate
(named as TLS, with the host). Every case runs the real CLI against the real-socket fake server
(tests/fake_openai.py)."""

from __future__ import annotations

import json
import shutil
import ssl

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid
from helpers import self_signed_cert, write_run_config
from typer.testing import CliRunner

from negsynth.cli import app

runner = CliRunner()


def brainstorm(tmp, url: str, **llm):
    cfg = write_run_config(tmp, url, llm={"max_retries": 1, "connect_timeout": 2, "max_consecutive_failures": 3, **llm})
    return runner.invoke(app, ["brainstorm", "-c", str(cfg), "-d", str(tmp / "run"), "-q", "--json"])


def one_line(r) -> str:
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


# ---------------------------------------------------------------------------- the API key


@pytest.mark.parametrize(
    "bad, name, at",
    [
        ("\u200b", "U+200B ZERO WIDTH SPACE", 9),
        ("\u00a0", "U+00A0 NO-BREAK SPACE", 9),
        ("\ufeff", "U+FEFF ZERO WIDTH NO-BREAK SPACE", 9),
        ("\u0430", "U+0430 CYRILLIC SMALL LETTER A", 9),  # a look-alike of the Latin 'a'
    ],
)
def test_a_key_with_a_character_no_key_has_is_refused_at_start_up(tmp_path, bad, name, at, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_TEST_KEY", f"sk-live-{bad}secret9876")
    with FakeOpenAI(always_valid) as srv:
        r = brainstorm(tmp_path, srv.base_url, api_key_env="NEGSYNTH_TEST_KEY")
        assert srv.requests == []
    assert r.exit_code == 2, r.output
    line = one_line(r)
    assert "NEGSYNTH_TEST_KEY (llm.api_key_env)" in line and name in line and f"position {at}" in line
    assert "secret9876" not in r.output


def test_a_refused_key_names_the_setting_not_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_TEST_KEY", "sk-wrong-123456789")
    with FakeOpenAI(always_valid, require_key="sk-right-123456789") as srv:
        r = brainstorm(tmp_path, srv.base_url, api_key_env="NEGSYNTH_TEST_KEY")
    assert r.exit_code == 2, r.output
    line = one_line(r)
    assert "refused the API key" in line and "llm.api_key_env" in line and "123456789" not in r.output


# ---------------------------------------------------------------------------- redirects


@pytest.mark.parametrize("case", ["same_origin_307", "same_origin_308", "other_host", "301", "no_location"])
def test_a_redirect_is_one_line_naming_the_base_url_to_set(tmp_path, case):
    """No request follows a redirect (a 301/302/303 would turn the POST into a GET; the key is never
    sent to another host): the stage stops at the first ones, naming where llm.base_url should point."""
    with FakeOpenAI(always_valid) as srv:
        other = srv.base_url.replace("127.0.0.1", "localhost")  # another origin, same server
        loc, status = {
            "same_origin_307": ("/v2/chat/completions", 307),
            "same_origin_308": ("/v2/chat/completions", 308),
            "other_host": (other + "/chat/completions", 307),
            "301": ("/v2/chat/completions", 301),
            "no_location": ("", 307),
        }[case]
        srv.responder = lambda req, n: Reply(status=status, headers={"Location": loc} if loc else {}, body={"moved": True})
        r = brainstorm(tmp_path, srv.base_url)
        sent = len(srv.requests)
    assert r.exit_code == 2, r.output
    line = one_line(r)
    assert "llm.base_url" in line and "llm.model" not in line
    v2 = srv.base_url.replace("/v1", "/v2")
    expect = {
        "same_origin_307": f"redirects (307) to {v2}; set llm.base_url = '{v2}'",
        "same_origin_308": f"redirects (308) to {v2}",
        "other_host": f"to another host, {other}",
        "301": "(301) to",
        "no_location": "without a Location",
    }[case]
    assert expect in line, line
    assert sent <= 8  # stopped at the first redirects, not after every item's retries


def test_a_redirect_of_the_models_list_is_named_at_start_up(tmp_path):
    with FakeOpenAI(always_valid) as srv:
        srv.models_redirect = srv.base_url.replace("127.0.0.1", "localhost") + "/models"
        r = brainstorm(tmp_path, srv.base_url)
        assert srv.requests == []
    assert r.exit_code == 2, r.output
    assert "redirects (307) to another host" in one_line(r)


# ---------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


def test_an_untrusted_certificate_is_named_as_tls_with_the_host(tmp_path, self_signed, monkeypatch):
    key, cert = self_signed
    _, other = self_signed_cert(tmp_path)  # a trust store that does not hold the server's certificate
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    srv = FakeOpenAI(always_valid)
    srv.server.socket = ctx.wrap_socket(srv.server.socket, server_side=True)
    with srv:
        url = srv.base_url.replace("http://", "https://")
        monkeypatch.setenv("SSL_CERT_FILE", str(other))
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        r = brainstorm(tmp_path, url)
        assert r.exit_code == 2, r.output
        line = one_line(r)
        assert "TLS" in line and f"127.0.0.1:{srv.port}" in line and "certificate" in line and "refused" not in line
        assert srv.requests == []
        # trusted, the same server answers
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        shutil.rmtree(tmp_path / "run")
        r = brainstorm(tmp_path, url)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["complete"] is True


def test_a_trust_store_that_cannot_be_read_names_ssl_cert_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "none.pem"))
    with FakeOpenAI(always_valid) as srv:
        r = brainstorm(tmp_path, srv.base_url)
        assert srv.requests == []
    assert r.exit_code == 2, r.output
    line = one_line(r)
    assert f"SSL_CERT_FILE={tmp_path / 'none.pem'}" in line and "No such file" in line
