"""The llm-likelihood teacher through an OpenAI-compatible endpoint (``corpus.likelihood = "llm"``):
the query's mean log-probability is read from the prompt log-probs a ``/completions`` request
echoes, only over the query's tokens; scores are cached; a server that echoes none is refused in
one line; and the corpus stage scores its examples with it."""

from __future__ import annotations

import json
import re

import pytest
from fake_openai import FakeOpenAI, Reply
from helpers import write_run_config
from test_corpus import DOCS, invoke, write_corpus

from negsynth.data.shards import read_stage
from negsynth.errors import UserError
from negsynth.llm.likelihood import EndpointLikelihood

#: prompt tokens before the query score this: were they averaged in, every score would move
PREFIX_LP, GENERATED_LP = -9.0, -7.0


def echo(req: dict) -> dict:
    """A server that echoes prompt log-probs: whitespace tokens; a query word found in the
    passage scores -0.5, any other -3.0 (the query is what follows the prompt's "Question:")."""
    prompt = req["prompt"]
    q_start = prompt.index("Question:") + len("Question:")
    passage = prompt[:q_start].lower()
    offsets, values, tokens = [], [], []
    for m in re.finditer(r"\s*\S+", prompt):
        offsets.append(m.start())
        tokens.append(m.group())
        word = m.group().strip().lower().strip("?.,")
        values.append(PREFIX_LP if m.start() < q_start else (-0.5 if word in passage else -3.0))
    values[0] = None  # the first token has no log-probability, as in the OpenAI format
    offsets.append(len(prompt))
    tokens.append(" the")
    values.append(GENERATED_LP)
    lp = {"tokens": tokens, "token_logprobs": values, "text_offset": offsets, "top_logprobs": None}
    return {"object": "text_completion", "choices": [{"index": 0, "text": " the", "logprobs": lp, "finish_reason": "length"}]}


def test_the_score_is_the_mean_over_the_query_tokens_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("LIK_KEY", "sk-test")
    with FakeOpenAI(lambda r, n: Reply("{}"), require_key="sk-test") as srv:
        srv.completions = echo
        lm = EndpointLikelihood(srv.base_url, "served-model", "sk-test", cache=tmp_path / "lik.sqlite")
        docs = ["Volcanoes erupt lava from their vents.", "Glaciers carve valleys slowly."]
        assert lm.scores("lava vents erupt", docs) == [pytest.approx(-0.5), pytest.approx(-3.0)]
        assert lm.scores("lava glaciers", docs) == [pytest.approx(-1.75), pytest.approx(-1.75)]
        sent = list(srv.completion_requests)
        assert len(sent) == 4
        assert all(r["echo"] is True and r["logprobs"] and r["max_tokens"] == 1 and r["model"] == "served-model" for r in sent)
        assert sent[0]["prompt"].endswith("Question: lava vents erupt")
        # a second ask, and another scorer on the same file: answered from the cache, nothing sent
        EndpointLikelihood(srv.base_url, "served-model", "sk-test", cache=tmp_path / "lik.sqlite").scores("lava vents erupt", docs)
        assert lm.scores("lava vents erupt", docs[:1]) == [pytest.approx(-0.5)] and len(srv.completion_requests) == 4
        # another model's scores are not the same scores
        EndpointLikelihood(srv.base_url, "other-model", "sk-test", cache=tmp_path / "lik.sqlite").scores("lava vents erupt", docs[:1])
        assert len(srv.completion_requests) == 5


def test_a_server_that_echoes_no_prompt_log_probs_is_refused_in_one_line():
    def llama_server(req: dict) -> dict:  # llama-server's answer: the generated token's log-prob only
        lp = {"content": [{"id": 47, "token": "?", "logprob": -0.8, "top_logprobs": []}]}
        return {"choices": [{"index": 0, "text": "?", "logprobs": lp, "finish_reason": "length"}]}

    with FakeOpenAI(lambda r, n: Reply("{}")) as srv:
        srv.completions = llama_server
        with pytest.raises(UserError, match=r"echoes no prompt log-probs .*corpus.likelihood = 'embedded'") as e:
            EndpointLikelihood(srv.base_url, "m").scores("a query", ["a document"])
        assert "\n" not in str(e.value)


def test_the_corpus_stage_asks_the_endpoint_for_its_teacher_scores(tmp_path, minilm):
    folder = write_corpus(tmp_path)
    subject = next(x for i, _, x in DOCS if i == "d4").split()[0]

    def responder(req, n):
        return Reply(json.dumps({"queries": [f"what is known about {subject.lower()} in case {n}?"]}))  # one query per document

    with FakeOpenAI(responder) as srv:
        srv.completions = echo
        corpus = {
            "negatives": "mined",
            "teacher": "llm-likelihood",
            "teacher_k": 0,
            "likelihood": "llm",
            "mining": {"relative_margin": 0.0},
        }
        cfg = write_run_config(tmp_path, srv.base_url, corpus=corpus)
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
        assert r.exit_code == 0, r.output
        recs = list(read_stage(tmp_path / "run" / "corpus"))
        assert recs and len(srv.completion_requests) == 5 * len(recs)  # the document and its 4 negatives, each once
        for rec in recs:
            label = rec["meta"]["teacher_label"]
            assert len(label) == 5 and all(-3.0 <= x <= -0.5 for x in label)
        assert (tmp_path / "run" / "cache" / "likelihood.sqlite").is_file()


def test_the_embedded_server_is_refused_for_endpoint_likelihood(tmp_path, minilm):
    folder = write_corpus(tmp_path)
    corpus = {"negatives": "mined", "teacher": "llm-likelihood", "likelihood": "llm"}
    cfg = write_run_config(tmp_path, "embedded", corpus=corpus)
    r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder)
    assert r.exit_code != 0
    assert "the embedded llama-server echoes no prompt log-probs" in r.output and "Traceback" not in r.output


def _scripted(statuses: list[int], retry_after: str | None = None):
    """An httpx transport answering each POST with the next status (the last one repeats);
    a 200 echoes prompt log-probs the way :func:`echo` does."""
    import httpx

    sent: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        req = json.loads(request.content)
        sent.append(req)
        status = statuses[min(len(sent) - 1, len(statuses) - 1)]
        if status == 200:
            return httpx.Response(200, json=echo(req))
        headers = {"retry-after": retry_after} if retry_after else {}
        return httpx.Response(status, text=f"status {status}", headers=headers)

    return httpx.MockTransport(handle), sent


def test_a_rate_limit_or_a_server_error_is_retried_with_the_servers_wait():
    transport, sent = _scripted([429, 503, 200], retry_after="2")
    waits: list[float] = []
    lm = EndpointLikelihood("http://lik.test/v1", "m", transport=transport, sleep=waits.append, backoff_initial=0.5, backoff_max=1.5)
    assert lm.scores("lava vents erupt", ["Volcanoes erupt lava from their vents."]) == [pytest.approx(-0.5)]
    assert len(sent) == 3 and lm.retries == 2
    assert waits == [1.5, 1.5]  # Retry-After (2 s) capped at backoff_max


def test_a_request_the_server_refuses_is_not_retried_and_the_last_failure_is_one_line():
    transport, sent = _scripted([400])
    lm = EndpointLikelihood("http://lik.test/v1", "m", transport=transport, sleep=lambda s: None, setting="regenerate.likelihood")
    with pytest.raises(UserError, match=r"^regenerate.likelihood = 'llm': .* answered HTTP 400: status 400$"):
        lm.score("a query", "a document")
    assert len(sent) == 1
    transport, sent = _scripted([502])
    waits: list[float] = []
    lm = EndpointLikelihood("http://lik.test/v1", "m", transport=transport, sleep=waits.append, max_retries=2, backoff_initial=1.0)
    with pytest.raises(UserError, match=r"answered HTTP 502 after 3 tries") as e:
        lm.score("a query", "a document")
    assert len(sent) == 3 and "\n" not in str(e.value)
    assert 0.0 <= waits[0] <= 1.0 and 0.0 <= waits[1] <= 2.0  # full-jitter exponential


def test_a_dropped_connection_is_retried():
    import httpx

    calls = {"n": 0}

    def handle(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("connection reset", request=request)
        return httpx.Response(200, json=echo(json.loads(request.content)))

    lm = EndpointLikelihood("http://lik.test/v1", "m", transport=httpx.MockTransport(handle), sleep=lambda s: None)
    assert lm.score("lava vents erupt", "Volcanoes erupt lava from their vents.") == pytest.approx(-0.5)
    assert calls["n"] == 2
    lm = EndpointLikelihood("http://lik.test/v1", "m", transport=httpx.MockTransport(handle), sleep=lambda s: None, max_retries=0)
    calls["n"] = 0
    with pytest.raises(UserError, match=r"unreachable after 1 try \(ConnectError\)"):
        lm.score("a query", "a document")
