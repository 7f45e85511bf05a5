"""Fault tolerance: every fault the fake server can inject, through the real CLI and a real socket.

Each test asserts: no crash (exit 0), every input accounted for exactly once (as an example or a
reject with its reason), retries bounded (the server's request count), and the right reason
counted in stats.json. Transport faults are never shown to the model; validation faults are.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid, valid_answer
from helpers import brainstormed_once, write_run_config
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import read_stage

runner = CliRunner()
EXAMPLES = 10
MAX_RETRIES = 2
MAX_ATTEMPTS = 2
REASK = "Your answer was rejected"
# llm.timeout is 5 s (so a slow, loaded CI machine never times out by accident) except in the
# hang tests: there it is SHORT and the server holds its answer HANG seconds. SHORT must cover a
# valid answer's round trip on a loaded machine: at 0.75 s a CI run at load ~4 saw retries time out too
SHORT, HANG = 2.0, 6.0


def timeout_for(name: str) -> float:
    return SHORT if "hang" in name else 5.0


def write_config(tmp: Path, base_url: str, timeout: float = 5.0) -> Path:
    return write_run_config(
        tmp,
        base_url,
        llm={"timeout": timeout, "connect_timeout": 2, "max_retries": MAX_RETRIES, "max_attempts": MAX_ATTEMPTS},
        brainstorm={"max_requests_per_type": 2},
        generate={"examples": EXAMPLES},
    )


@pytest.fixture(scope="module")
def brainstormed(tmp_path_factory) -> Path:
    """A run dir with a finished brainstorm, copied by each test."""
    return brainstormed_once(tmp_path_factory, write_config)


def _prompt_key(req: dict) -> str:
    """What identifies one item's request across transport retries (not across re-asks)."""
    return json.dumps(req["messages"], sort_keys=True)


def first_time(fault, then=always_valid):
    """A responder that answers each distinct request with ``fault`` once, then with ``then``."""
    seen: set[str] = set()
    lock = threading.Lock()

    def responder(req, n):
        k = _prompt_key(req)
        with lock:
            new = k not in seen
            seen.add(k)
        return fault(req, n) if new else then(req, n)

    return responder


def first_answer(bad_content):
    """Validation fault: the first answer of every item is ``bad_content(valid_obj)``; re-asks get a valid one."""

    def responder(req, n):
        if req["messages"][-1]["content"].startswith(REASK):
            return Reply(content=valid_answer({"messages": req["messages"][:-2]}, n))
        return Reply(content=bad_content(json.loads(valid_answer(req, n))))

    return responder


def always_answer(bad_content):
    def responder(req, n):
        base = {"messages": [m for m in req["messages"] if not m["content"].startswith(REASK)]}
        msgs = base["messages"]
        # the task prompt is the last user turn before any re-ask
        while msgs and msgs[-1]["role"] == "assistant":
            msgs = msgs[:-1]
        return Reply(content=bad_content(json.loads(valid_answer({"messages": msgs}, n))))

    return responder


def neg_key(obj: dict) -> str:
    return next(k for k, v in obj.items() if isinstance(v, list))


def with_negs(fn):
    def bad(obj):
        k = neg_key(obj)
        obj[k] = fn(obj[k])
        return json.dumps(obj, ensure_ascii=False)

    return bad


def run_generate(tmp: Path, brainstormed: Path, responder, timeout: float = 5.0, *, exit_code: int = 0, sets: tuple = ()):
    rd = tmp / "run"
    shutil.copytree(brainstormed, rd)
    with FakeOpenAI(responder) as srv:
        cfg = write_config(tmp, srv.base_url, timeout)
        args = [a for kv in sets for a in ("--set", kv)]
        r = runner.invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "--json", "-q", *args], catch_exceptions=False)
        assert r.exit_code == exit_code, r.output
        stats = json.loads(r.stdout)
        requests = list(srv.requests)
    return rd, stats, requests


def accounted(rd: Path, stats: dict, complete: bool = True) -> tuple[list[dict], list[dict]]:
    """Every planned item appears exactly once, as a record or a reject."""
    recs = list(read_stage(rd / "generate"))
    rejs = list(read_stage(rd / "generate" / "rejects"))
    ids = [r["id"] for r in recs] + [r["id"] for r in rejs]
    assert len(ids) == len(set(ids)) == EXAMPLES == stats["items"]
    assert stats["valid"] == len(recs) and stats["rejected"] == len(rejs)
    assert stats["complete"] is complete
    assert not list((rd / "generate").glob("*.partial"))
    return recs, rejs


# -- transport faults: retried with backoff, never shown to the model ------------------------
TRANSPORT = {
    "429_retry_after": (lambda q, n: Reply(status=429, headers={"Retry-After": "0.01"}), "rate_limited"),
    "429_no_retry_after": (lambda q, n: Reply(status=429), "rate_limited"),
    "500": (lambda q, n: Reply(status=500), "http_500"),
    "502": (lambda q, n: Reply(status=502), "http_502"),
    "503": (lambda q, n: Reply(status=503), "http_503"),
    "hang_past_timeout": (lambda q, n: Reply(content=valid_answer(q, n), delay=HANG), "timeout"),
    "reset_mid_response": (lambda q, n: Reply(reset=True), "connection"),
    "empty_choices": (lambda q, n: Reply(empty_choices=True), "empty_choices"),
}


@pytest.mark.parametrize("name", list(TRANSPORT))
def test_transient_transport_fault_is_retried_invisibly(tmp_path, brainstormed, name):
    fault, kind = TRANSPORT[name]
    rd, stats, reqs = run_generate(tmp_path, brainstormed, first_time(fault), timeout=timeout_for(name))
    recs, rejs = accounted(rd, stats)
    assert len(recs) == EXAMPLES and not rejs
    tr = stats["this_run"]
    assert tr["transport_retries"] == {kind: EXAMPLES}  # exactly one retry per item, of the right kind
    assert tr["transport_failures"] == {} and tr["reasks"] == 0
    assert len(reqs) == 2 * EXAMPLES  # bounded: one fault + one success per item
    assert not any(m["content"].startswith(REASK) for q in reqs for m in q["messages"])  # never shown to the model
    assert all(r["usage"]["attempts"] == 1 for r in recs)


@pytest.mark.parametrize("name", ["503", "reset_mid_response", "429_no_retry_after"])
def test_persistent_transport_fault_leaves_every_item_pending_after_bounded_retries(tmp_path, brainstormed, name):
    """Retries run out: the items are pending (not rejected), their shards unfinished, exit 4.
    (llm.max_consecutive_failures is raised so that every item gets its bounded retries.)"""
    fault, kind = TRANSPORT[name]
    rd, stats, reqs = run_generate(tmp_path, brainstormed, fault, exit_code=4, sets=("llm.max_consecutive_failures=1000",))
    assert not list(read_stage(rd / "generate")) and not list((rd / "generate" / "rejects").glob("*.jsonl"))
    assert stats["complete"] is False and stats["rejected"] == 0 and stats["valid"] == 0
    assert stats["pending"] == EXAMPLES and stats["pending_by_reason"] == {f"transport_{kind}": EXAMPLES}
    assert len(reqs) == EXAMPLES * (MAX_RETRIES + 1)  # bounded, and no re-ask for a transport fault
    assert stats["this_run"]["transport_retries"] == {kind: EXAMPLES * MAX_RETRIES}
    assert stats["this_run"]["transport_failures"] == {kind: EXAMPLES}
    partial = [json.loads(x) for p in (rd / "generate").glob("*.partial") for x in p.read_text().splitlines()]
    assert len(partial) == EXAMPLES and all(p["r"]["input"]["task_type"] for p in partial)  # what to redo


# -- validation faults: re-asked with the error, bounded by max_attempts -----------------------
def truncated(obj):
    s = json.dumps(obj)
    return s[: len(s) // 2]


VALIDATION = {
    "truncated_json": (truncated, "invalid_json", "not valid JSON"),
    "three_negatives": (with_negs(lambda n: n[:3]), "wrong_negative_count", "exactly 4"),
    "duplicate_negatives": (with_negs(lambda n: [n[0], n[0], n[2], n[3]]), "duplicate_negatives", "are the same"),
    "empty_strings": (with_negs(lambda n: ["", n[1], n[2], n[3]]), "empty_text", "empty"),
    "wrong_types": (with_negs(lambda n: [1, 2, 3, 4]), "schema", "valid string"),
    "negatives_not_a_list": (with_negs(lambda n: "a, b, c, d"), "schema", "valid list"),
    "prose": (lambda obj: "Sure! Here is a great example of a query and documents for your task.", "invalid_json", "not valid JSON"),
    "too_long": (with_negs(lambda n: [n[0] + " x" * 4000, n[1], n[2], n[3]]), "too_long", "more than"),
}


@pytest.mark.parametrize("name", list(VALIDATION))
def test_validation_fault_is_reasked_with_the_error(tmp_path, brainstormed, name):
    bad, reason, shown = VALIDATION[name]
    rd, stats, reqs = run_generate(tmp_path, brainstormed, first_answer(bad))
    recs, rejs = accounted(rd, stats)
    assert len(recs) == EXAMPLES and not rejs
    tr = stats["this_run"]
    assert tr["failed_attempts"] == {reason: EXAMPLES} and tr["reasks"] == EXAMPLES
    assert len(reqs) == 2 * EXAMPLES
    reasks = [q for q in reqs if q["messages"][-1]["content"].startswith(REASK)]
    assert len(reasks) == EXAMPLES and all(shown in q["messages"][-1]["content"] for q in reasks)
    assert all(r["meta"]["failed_attempts"] == [reason] and r["usage"]["attempts"] == 2 for r in recs)


@pytest.mark.parametrize("name", ["truncated_json", "duplicate_negatives", "wrong_types"])
def test_persistent_validation_fault_rejects_with_reason_and_raw(tmp_path, brainstormed, name):
    bad, reason, _ = VALIDATION[name]
    # no valid output at all: the stage fails (exit 2), its rejects are final and kept
    rd, stats, reqs = run_generate(tmp_path, brainstormed, always_answer(bad), exit_code=2)
    recs, rejs = accounted(rd, stats, complete=False)
    assert stats["failed"].startswith(f"generate: 0 valid outputs of {EXAMPLES} items")
    assert not recs and stats["rejects_by_reason"] == {reason: EXAMPLES}
    assert len(reqs) == EXAMPLES * MAX_ATTEMPTS  # bounded by max_attempts
    assert all(r["reason"] == reason and r["raw"] and r["usage"]["attempts"] == MAX_ATTEMPTS for r in rejs)


def test_finish_reason_length_is_reasked_as_truncated(tmp_path, brainstormed):
    def responder(req, n):
        if req["messages"][-1]["content"].startswith(REASK):
            return Reply(content=valid_answer({"messages": req["messages"][:-2]}, n))
        return Reply(content=valid_answer(req, n)[:40], finish_reason="length")

    rd, stats, reqs = run_generate(tmp_path, brainstormed, responder)
    recs, _ = accounted(rd, stats)
    assert len(recs) == EXAMPLES
    assert stats["this_run"]["failed_attempts"] == {"truncated": EXAMPLES}
    assert sum("token limit" in q["messages"][-1]["content"] for q in reqs) == EXAMPLES


# -- answers that must be ACCEPTED as they are -------------------------------------------------
def test_json_in_markdown_fences_is_accepted(tmp_path, brainstormed):
    rd, stats, reqs = run_generate(
        tmp_path, brainstormed, lambda q, n: Reply(content="Here you go:\n```json\n" + valid_answer(q, n) + "\n```\n")
    )
    recs, _ = accounted(rd, stats)
    assert len(recs) == EXAMPLES and stats["this_run"]["reasks"] == 0 and len(reqs) == EXAMPLES


def test_control_characters_inside_strings_are_accepted(tmp_path, brainstormed):
    def responder(req, n):
        obj = json.loads(valid_answer(req, n))
        k = neg_key(obj)
        obj[k][1] = obj[k][1] + "\twith a tab\nand a newline"
        # raw (unescaped) control characters inside a JSON string, as models emit them
        text = json.dumps(obj).replace("\\t", "\t").replace("\\n", "\n")
        return Reply(content=text)

    rd, stats, reqs = run_generate(tmp_path, brainstormed, responder)
    recs, _ = accounted(rd, stats)
    assert len(recs) == EXAMPLES and len(reqs) == EXAMPLES
    assert all(r["negatives"][1].endswith("\twith a tab\nand a newline") for r in recs)


def test_non_english_and_long_output_is_accepted_verbatim(tmp_path, brainstormed):
    long_text = "Ein sehr langer Absatz über Datenbanken. " * 120  # ~4,900 chars, under max_chars

    def responder(req, n):
        obj = json.loads(valid_answer(req, n))
        k = neg_key(obj)
        obj[k] = [f"{n} 数据库索引的工作原理", f"{n} كيف تعمل فهارس قواعد البيانات", f"{n} {long_text}", f"{n} Как работают индексы 🙂"]
        return Reply(content=json.dumps(obj, ensure_ascii=False))

    rd, stats, reqs = run_generate(tmp_path, brainstormed, responder)
    recs, _ = accounted(rd, stats)
    assert len(recs) == EXAMPLES and stats["this_run"]["reasks"] == 0
    assert all("数据库" in r["negatives"][0] and "🙂" in r["negatives"][3] and len(r["negatives"][2]) > 4000 for r in recs)
    assert "数据库".encode() in (rd / "generate" / "shard-00000.jsonl").read_bytes()  # stored as UTF-8, not escaped


# -- brainstorm under faults -------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, fault, kind",
    [
        ("429", lambda q, n: Reply(status=429, headers={"Retry-After": "0"}), "rate_limited"),
        ("hang", lambda q, n: Reply(content=valid_answer(q, n), delay=HANG), "timeout"),
        ("reset", lambda q, n: Reply(reset=True), "connection"),
        ("502", lambda q, n: Reply(status=502), "http_502"),
    ],
)
def test_brainstorm_survives_transient_transport_faults(tmp_path, name, fault, kind):
    with FakeOpenAI(first_time(fault)) as srv:
        cfg = write_config(tmp_path, srv.base_url, timeout=timeout_for(name))
        r = runner.invoke(app, ["brainstorm", "-c", str(cfg), "-d", str(tmp_path / "run"), "--json", "-q"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout)
        n_req = len(srv.requests)
    # four types, one list request each; each retried exactly once
    assert stats["this_run"]["transport_retries"] == {kind: 4} and n_req == 8
    assert stats["tasks_per_type"] == {"sts": 1, **{t: 5 for t in ("short-long", "long-short", "long-long", "short-short")}}
    assert stats["rejected"] == 0 and stats["valid"] == 21  # + the fixed STS task


def test_brainstorm_accounts_every_request_under_persistent_faults(tmp_path):
    """Every list request of one type answers prose: each is re-asked, then becomes one reject."""

    def responder(req, n):
        prompt = req["messages"][-1]["content"]
        if prompt.startswith(REASK):
            return Reply(content="still prose, sorry")
        if prompt.startswith("Brainstorm a list of potentially useful text classification"):
            return Reply(content="Here are some tasks: classify things.")
        return always_valid(req, n)

    with FakeOpenAI(responder) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        r = runner.invoke(app, ["brainstorm", "-c", str(cfg), "-d", str(tmp_path / "run"), "--json", "-q"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout)
        n_req = len(srv.requests)
    rejs = list(read_stage(tmp_path / "run" / "brainstorm" / "rejects"))
    tasks = list(read_stage(tmp_path / "run" / "brainstorm"))
    assert stats["items"] == stats["valid"] + stats["rejected"] == len(tasks) + len(rejs)
    assert len({r["id"] for r in rejs}) == len(rejs) == 2  # max_requests_per_type lists, one reject each
    assert "long-short" not in stats["tasks_per_type"]
    assert stats["rejects_by_reason"] == {"invalid_json": 2}
    assert stats["this_run"]["failed_attempts"] == {"invalid_json": 2 * MAX_ATTEMPTS}
    assert n_req == 3 + 2 * MAX_ATTEMPTS  # three good types once, the bad one bounded
