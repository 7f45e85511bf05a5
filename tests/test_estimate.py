"""negsynth estimate: requests, tokens, wall time and USD per LLM stage before any request is
sent, checked against what the same stages then send to the real-socket fake server."""

from __future__ import annotations

import json
import math
import sqlite3
from collections import Counter

import pytest
from fake_openai import FakeOpenAI, always_valid
from helpers import write_run_config
from typer.testing import CliRunner

from negsynth.cli import app

runner = CliRunner()


def est(*args) -> dict:
    r = runner.invoke(app, ["estimate", *[str(a) for a in args], "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def sent_prompt_tokens(reqs: list[dict]) -> int:
    """What the requests the server got weigh, counted the way the estimate counts (chars / 4)."""
    return sum(sum(math.ceil(len(m["content"]) / 4) + 4 for m in q["messages"]) + 3 for q in reqs)


def test_brainstorm_and_generate_estimates_match_what_is_sent(tmp_path):
    rd = tmp_path / "run"
    with FakeOpenAI(always_valid) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, generate={"examples": 20}, llm={"max_attempts": 3})
        before = est(cfg, "-d", rd, "--stages", "brainstorm,generate")
        assert srv.requests == [] and not rd.exists()  # nothing sent, nothing written
        assert before["assumptions"]["tokenizer"].startswith(("approx: characters / 4", "tiktoken"))
        bs = before["stages"]["brainstorm"]
        r = runner.invoke(app, ["brainstorm", "-c", str(cfg), "-d", str(rd), "-q"])
        assert r.exit_code == 0, r.output
        assert bs["requests"] == len(srv.requests)
        if before["assumptions"]["tokenizer"].startswith("approx"):
            assert bs["prompt_tokens"] == sent_prompt_tokens(srv.requests)
        # before brainstorm ran, generate was planned with stand-in tasks: same requests, close tokens
        after = est(cfg, "-d", rd)
        assert after["stages"]["brainstorm"]["done"] is True and after["stages"]["brainstorm"]["requests"] == 0
        gen, gen0 = after["stages"]["generate"], before["stages"]["generate"]
        assert gen["requests"] == gen0["requests"] and "tasks from RUN_DIR/brainstorm" in gen["basis"]
        assert abs(gen0["prompt_tokens"] - gen["prompt_tokens"]) <= 0.25 * gen["prompt_tokens"]
        n0 = len(srv.requests)
        r = runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "-q"])
        assert r.exit_code == 0, r.output
        sent = srv.requests[n0:]
    assert gen["requests"] == len(sent)  # every answer valid: no re-ask
    if after["assumptions"]["tokenizer"].startswith("approx"):
        assert gen["prompt_tokens"] == sent_prompt_tokens(sent)
    assert gen["requests_max"] == 3 * gen["requests"] and gen["prompt_tokens_max"] > 3 * gen["prompt_tokens"]
    from negsynth.schemas.config_io import load_config

    assert gen["completion_tokens_max"] == gen["requests_max"] * load_config(cfg).llm.max_tokens
    assert 0 < gen["completion_tokens"] < gen["completion_tokens_max"]
    # an interrupted generate (its stats say incomplete): completion tokens from its cached answers
    # (the fake server reports 20 per answer), the brainstorm answers not mixed in
    stats = json.loads((rd / "generate" / "stats.json").read_text())
    (rd / "generate" / "stats.json").write_text(json.dumps({**stats, "complete": False}))
    again = est(cfg, "-d", rd)["stages"]["generate"]
    assert again["completion_tokens"] == 20 * again["requests"] and any("request cache (20 tokens)" in b for b in again["basis"])
    # each cached answer names the stage that asked for it (not part of its key); an answer cached
    # before answers were so recorded names none and is not counted
    with sqlite3.connect(rd / "cache" / "llm.sqlite") as con:
        rows = con.execute("SELECT key, value FROM responses").fetchall()
        assert Counter(json.loads(v).get("stage") for _, v in rows) == {"brainstorm": bs["requests"], "generate": gen["requests"]}
        con.executemany(
            "UPDATE responses SET value = ? WHERE key = ?", [(json.dumps({**json.loads(v), "stage": None}), k) for k, v in rows]
        )
    con.close()
    assert not any("request cache" in b for b in est(cfg, "-d", rd)["stages"]["generate"]["basis"])
    # complete but stopped by a budget: not done either (the pipeline's one rule), so it is estimated
    (rd / "generate" / "stats.json").write_text(json.dumps({**stats, "complete": True, "stopped_by": "max_requests"}))
    assert est(cfg, "-d", rd)["stages"]["generate"]["done"] is False
    (rd / "generate" / "stats.json").write_text(json.dumps(stats))
    assert est(cfg, "-d", rd)["stages"]["generate"]["done"] is True


def test_corpus_estimate_is_one_request_per_sampled_document(tmp_path, minilm):
    from test_corpus import answer, write_corpus

    folder = write_corpus(tmp_path)
    rd = tmp_path / "run"
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        cfg = write_run_config(
            tmp_path,
            srv.base_url,
            corpus={"inputs": [{"path": str(folder)}], "queries_per_doc": 2, "max_docs": 6, "mining": {"relative_margin": 0.0}},
        )
        e = est(cfg, "-d", rd, "--stages", "corpus")
        assert srv.requests == []
        c = e["stages"]["corpus"]
        assert c["items"] == 12 and c["requests"] == 6
        r = runner.invoke(app, ["corpus", "-c", str(cfg), "-d", str(rd), "-q"])
        assert r.exit_code == 0, r.output
    assert len(srv.requests) == c["requests"]
    if e["assumptions"]["tokenizer"].startswith("approx"):
        # the stage cuts documents with the embedder's tokenizer, the estimate by words: these are short
        assert abs(c["prompt_tokens"] - sent_prompt_tokens(srv.requests)) <= 0.05 * c["prompt_tokens"]


def test_prices_rate_and_json_table(tmp_path):
    cfg = write_run_config(
        tmp_path,
        "http://127.0.0.1:9/v1",
        generate={"examples": 10},
        llm={"price": {"input_per_mtok": 2.0, "output_per_mtok": 8.0}, "max_concurrency": 4},
    )
    e = est(cfg, "-d", tmp_path / "run", "--stages", "brainstorm,generate", "--latency", "2")
    for s in e["stages"].values():
        assert s["cost_usd"] == pytest.approx((s["prompt_tokens"] * 2 + s["completion_tokens"] * 8) / 1e6, abs=1e-6)
        assert s["wall_s"] == pytest.approx(s["requests"] / 2.0, abs=0.1)  # 4 in flight, 2 s each
    assert e["assumptions"]["price_basis"] == "llm.price"
    e2 = est(cfg, "-d", tmp_path / "run", "--stages", "generate", "--price-in", "0.5", "--price-out", "1", "--rps", "10")
    g = e2["stages"]["generate"]
    assert g["cost_usd"] == pytest.approx((g["prompt_tokens"] * 0.5 + g["completion_tokens"]) / 1e6, abs=1e-6)
    assert g["wall_s"] == pytest.approx(g["requests"] / 10, abs=0.1) and e2["total"]["requests"] == g["requests"]
    # the run file as a positional argument, and the table
    r = runner.invoke(app, ["estimate", str(cfg), "-d", str(tmp_path / "run"), "--stages", "generate"])
    assert r.exit_code == 0, r.output
    assert "estimate before any request is sent" in r.stdout and "generate" in r.stdout and "worst case" in r.stdout
    assert not (tmp_path / "run").exists()


def test_rpm_caps_the_rate_and_a_non_llm_stage_is_one_line(tmp_path):
    cfg = write_run_config(tmp_path, "http://127.0.0.1:9/v1", generate={"examples": 10}, llm={"rpm": 60})
    e = est(cfg, "-d", tmp_path / "run", "--stages", "generate", "--rps", "100")
    assert e["assumptions"]["rate_rps"] == 1.0
    r = runner.invoke(app, ["estimate", str(cfg), "-d", str(tmp_path / "run"), "--stages", "train"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "--stages train" in r.stderr


def toy_stage(estimate=None):
    """A stage that calls the LLM, with ``estimate`` as its estimator (None: it has none)."""
    from negsynth.pipeline import Stage

    class Toy(Stage):
        name = "toy"
        summary = "a toy LLM stage"

        def uses_llm(self, cfg):
            return True

    if estimate is not None:
        Toy.estimate = lambda self, ctx, tally: estimate(ctx, tally)
    return Toy()


def test_an_llm_stage_without_an_estimator_is_refused_not_counted_at_zero(tmp_path, monkeypatch):
    """A stage that calls the LLM and counts no requests would be estimated at 0 requests / $0:
    estimate stops naming it instead."""
    import negsynth.stages
    from negsynth.estimate import estimate
    from negsynth.pipeline import StageContext
    from negsynth.schemas.config_io import load_config

    monkeypatch.setattr(negsynth.stages, "METHOD", (*negsynth.stages.METHOD, toy_stage()))
    cfg = load_config(write_run_config(tmp_path, "http://127.0.0.1:9/v1"))
    with pytest.raises(NotImplementedError, match="'toy' calls the LLM but counts no requests"):
        estimate(StageContext(cfg=cfg, run_dir=tmp_path / "run"), ["toy"], rps=1)


def test_every_llm_stage_counts_its_requests():
    from negsynth.pipeline import Stage
    from negsynth.schemas.config import RunConfig
    from negsynth.stages import METHOD

    every = RunConfig()  # each stage that may call the LLM does
    assert all(type(s).estimate is not Stage.estimate for s in METHOD if s.uses_llm(every))


def test_a_new_llm_stage_is_estimated_through_its_declaration(tmp_path, monkeypatch):
    """``negsynth estimate`` knows a stage added to ``METHOD`` with no edit of estimate.py: it runs
    the stage's own estimator."""
    import negsynth.stages
    from negsynth.estimate import estimate
    from negsynth.pipeline import StageContext
    from negsynth.schemas.config_io import load_config

    msgs = [{"role": "user", "content": "x" * 400}, {"role": "assistant", "content": "y" * 40}, {"role": "user", "content": "z" * 40}]

    def toy_estimate(ctx, tally):
        tally.request(msgs, n=3)
        tally.note("three requests")

    monkeypatch.setattr(negsynth.stages, "METHOD", (*negsynth.stages.METHOD, toy_stage(toy_estimate)))
    cfg = load_config(write_run_config(tmp_path, "http://127.0.0.1:9/v1", generate={"examples": 4}, llm={"max_attempts": 2}))
    out = estimate(StageContext(cfg=cfg, run_dir=tmp_path / "run"), ["generate", "toy"], rps=1)
    t = out["stages"]["toy"]
    assert t["items"] == 1 and t["requests"] == 3 and t["requests_max"] == 6 and t["basis"] == ["three requests"]
    if out["assumptions"]["tokenizer"].startswith("approx"):
        assert t["completion_tokens"] == 3 * 10  # the worked example's answer, 40 characters / 4
    assert out["stages"]["generate"]["items"] == 4
    assert out["total"]["requests"] == 3 + out["stages"]["generate"]["requests"]


def test_the_embedded_llms_wall_time_is_timed_on_this_machine(tmp_path, monkeypatch):
    """With the embedded LLM and neither --rps nor --latency, estimate starts the servers a run
    would start, times a tiny, a long-prompt and a long-answer request on each, and converts its own token
    counts to seconds. Here the "servers" are the fake, which takes 5 ms per prompt token and 40 ms
    per answer token (as the estimate counts them: slow enough that HTTP on a loaded machine is a small
    part of a request). Brainstorm and generate run against it first,
    two requests at a time; a fresh run dir holding their request cache (so the estimate knows the
    fake's answer sizes, as it would a model's) is then estimated within 30 % of the time the fake
    spent per request of the stages."""
    import contextlib
    import shutil
    import threading

    from fake_openai import Reply

    import negsynth.pipeline.embedded as embedded
    from negsynth.estimate import estimate
    from negsynth.pipeline.context import StageContext
    from negsynth.pipeline.progress import Reporter
    from negsynth.schemas.config_io import load_config

    busy: list[tuple[str, float]] = []
    lock = threading.Lock()

    def tokens(text: str) -> int:
        return math.ceil(len(text) / 4)

    def slow(req, n):
        last = req["messages"][-1]["content"]
        calibration = last.endswith(("Say yes.", "separated by commas.", "what is the text about?"))
        content = ("one, two, three, " * req["max_tokens"])[: 4 * req["max_tokens"]] if calibration else always_valid(req, n).content
        s = 0.005 * sum(tokens(m["content"]) for m in req["messages"]) + 0.04 * tokens(content)
        with lock:
            busy.append(("calibration" if calibration else "stage", s))
        # usage as a server reports it (the estimate reads answer sizes from the cache's usage)
        return Reply(
            content=content, delay=s, prompt_tokens=sum(tokens(m["content"]) for m in req["messages"]), completion_tokens=tokens(content)
        )

    with FakeOpenAI(slow) as srv:
        ran = tmp_path / "ran"
        spent = {}
        cfg_path = write_run_config(tmp_path, srv.base_url, generate={"examples": 4}, llm={"max_concurrency": 2})
        for stage in ("brainstorm", "generate"):
            n0 = len(busy)
            r = runner.invoke(app, [stage, "-c", str(cfg_path), "-d", str(ran), "-q"])
            assert r.exit_code == 0, r.output
            spent[stage] = (sum(s for _, s in busy[n0:]) / 2, len(busy) - n0)

        @contextlib.contextmanager
        def fake_fleet(cfg, run_dir, reporter, needed=True):
            yield f"{srv.base_url} {srv.base_url}"  # two "servers", as a 2-core machine starts

        monkeypatch.setattr(embedded, "llm_endpoint", fake_fleet)
        rd = tmp_path / "run"
        rd.mkdir()
        shutil.copytree(ran / "cache", rd / "cache")
        cfg = load_config(write_run_config(tmp_path, "embedded", generate={"examples": 4}, llm={"max_concurrency": 2}))
        n0 = len(busy)
        out = estimate(StageContext(cfg=cfg, run_dir=rd, reporter=Reporter(quiet=True)), ["brainstorm", "generate"])
        assert out["assumptions"]["rate_rps"] is None and out["assumptions"]["rate_basis"].startswith("measured on this machine: 2 ")
        assert [k for k, _ in busy[n0:]] == ["calibration"] * 8  # warm-up, tiny, long prompt, long answer on each server
        for stage in ("brainstorm", "generate"):
            # per request: how many requests brainstorm's later rounds add is the planner's
            # question (tested above), the seconds each takes is this one's
            s, n = spent[stage]
            e = out["stages"][stage]
            assert abs(e["wall_s"] / e["requests"] - s / n) <= 0.3 * s / n, (stage, e["wall_s"], e["requests"], s, n)
        # --latency still means what it says, and nothing is timed
        n0 = len(busy)
        fixed = estimate(StageContext(cfg=cfg, run_dir=rd, reporter=Reporter(quiet=True)), ["brainstorm"], latency_s=5.0)
        assert fixed["assumptions"]["rate_rps"] == 0.4 and len(busy) == n0


def test_a_pinned_embedded_server_is_timed_without_the_shared_prefix():
    """The pinned fleet restores each request's system prompt and worked example instead of
    evaluating them: the measured speed times only the rest of the prompt, and the stage counts
    how many of its prompt tokens that prefix is (the worst case: on every attempt)."""
    from negsynth.pipeline.embedded_speed import EmbeddedSpeed
    from negsynth.pipeline.tally import StageEstimate, TokenCounter

    tc = TokenCounter("smollm2-135m-instruct")
    msgs = [
        {"role": "system", "content": "You write search queries. " * 20},
        {"role": "user", "content": "Document: an example"},
        {"role": "assistant", "content": '{"query": "example"}'},
        {"role": "user", "content": "Document: the item"},
    ]
    est = StageEstimate(stage="corpus")
    est.add(msgs, 10, tc, attempts=3, max_tokens=64, reask_tokens=20, n=2)
    prefix = tc.messages(msgs[:3])
    assert est.prefix_tokens == 2 * prefix and est.prefix_tokens_max == 2 * 3 * prefix
    assert 0 < est.prefix_tokens < est.prompt_tokens
    whole = EmbeddedSpeed(0.01, 0.05, 0.1, 2, "x")
    pinned = EmbeddedSpeed(0.01, 0.05, 0.1, 2, "x", pinned=True)
    args = (est.requests, est.prompt_tokens, est.completion_tokens, est.prefix_tokens)
    assert whole.seconds(*args) == whole.seconds(*args[:3])  # whole prompts: every token evaluated
    assert abs(whole.seconds(*args) - pinned.seconds(*args) - est.prefix_tokens * 0.01 / 2) < 1e-9
