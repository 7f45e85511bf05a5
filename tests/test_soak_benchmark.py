"""benchmarks/soak.py at a tiny scale: its own verdicts pass on a sound run, and each check fails
on the violation it is there to catch (a lost or duplicated document, a reject with no reason, a
re-sent answer beyond what was in flight, memory that grows)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from helpers import load_benchmark

soak = load_benchmark("soak")


@pytest.mark.slow
def test_a_tiny_soak_passes_its_own_checks(tmp_path):
    """60 documents, a quarter of the requests faulty, one SIGKILL and a 3 s outage: exit 0 and
    every verdict true."""
    out = tmp_path / "soak"
    argv = ["--docs", "60", "--kill-at", "0.3", "--outage-at", "0.6", "--outage-s", "3", "--sample-s", "0.1"]
    rc = soak.main([*argv, "--out", str(out), "--timeout", "3", "--run-timeout", "300"])
    res = json.loads((out / "results.json").read_text())
    assert rc == 0, res["checks"]
    assert res["passed"] and all(res["checks"].values())
    acc = res["accounting"]
    assert acc["documents"] == 60 and acc["records"] + acc["rejects"] == 60 and acc["lost"] == acc["duplicated"] == 0
    kill = res["kills"][0]
    assert len(res["kills"]) == 1 and kill["resent"] <= max(kill["in_flight"], kill["paid_unrecorded_requests"])
    assert res["requests"]["fault_share"] > 0 and res["verify"]["requests"] == 0
    assert res["outage"]["exit"] == 0


def _stats(n: int) -> dict:
    return {"complete": True, "items": n, "pending": 0}


def test_the_accounting_check_fails_on_a_lost_a_duplicated_or_an_unexplained_document():
    ids = ["a", "b", "c"]
    rec = {"reason": "too_few_mined"}
    good = soak.check_accounting(ids, Counter(ids), [("rej", rec)] * 3, _stats(3), 0)
    assert good["ok"]
    lost = soak.check_accounting(ids, Counter(["a", "b"]), [("rej", rec)] * 2, _stats(3), 0)
    assert not lost["ok"] and lost["lost"] == 1
    dup = soak.check_accounting(ids, Counter(["a", "b", "c", "c"]), [("rej", rec)] * 4, _stats(3), 0)
    assert not dup["ok"] and dup["duplicated"] == 1
    assert not soak.check_accounting(ids, Counter(ids), [("rej", {"reason": ""})] * 3, _stats(3), 0)["ok"]
    assert not soak.check_accounting(ids, Counter(ids), [("ok", {"id": "not an example"})] + [("rej", rec)] * 2, _stats(3), 0)["ok"]
    assert not soak.check_accounting(ids, Counter(ids), [("rej", rec)] * 3, _stats(3), 1)["ok"]  # a partial left
    assert not soak.check_accounting(ids, Counter(ids), [("rej", rec)] * 3, {**_stats(3), "pending": 1}, 0)["ok"]


def test_the_resend_check_charges_each_repaid_body_to_the_kill_before_it():
    b1, b2, b3 = b"1", b"2", b"3"
    ledger = [
        [0, b1, "a", "paid"],
        [0, b2, "b", "paid"],
        [0, b3, "c", "reset"],  # not answered: sending it again costs nothing
        [1, b1, "a", "paid"],  # re-sent after the kill of process 0
        [1, b3, "c", "paid"],
        [1, b3, "c", "paid"],  # paid twice by the same process
    ]
    kills, within = soak.count_resends(ledger, [{"process": 0, "in_flight": 1}])
    assert kills[0]["resent"] == kills[0]["repaid"] == 1 and kills[0]["ok"] and within == 1
    kills, _ = soak.count_resends(ledger + [[1, b2, "b", "paid"]], [{"process": 0, "in_flight": 1}])
    assert kills[0]["resent"] == 2 and not kills[0]["ok"]
    # one document re-asked before the kill (two answered bodies in flight): both may come again
    kills, _ = soak.count_resends(ledger + [[1, b2, "b", "paid"]], [{"process": 0, "in_flight": 1, "paid_unrecorded_requests": 2}])
    assert kills[0]["resent"] == 2 and kills[0]["ok"]
    # a re-sent body that meets a fault is retried: one body, however many sends
    retried = ledger + [[1, b2, "b", "reset"], [1, b2, "b", "http500"], [1, b2, "b", "paid"]]
    kills, _ = soak.count_resends(retried, [{"process": 0, "in_flight": 2}])
    assert kills[0]["resent"] == 2 and kills[0]["resent_requests"] == 4 and kills[0]["repaid"] == 2 and kills[0]["ok"]
    kills, _ = soak.count_resends(retried, [{"process": 0, "in_flight": 1}])
    assert not kills[0]["ok"]


def test_the_rss_check_fails_on_growth_and_passes_a_flat_run():
    def run(rss_at):  # one process, 100 documents, a sample per document
        return [(float(d), 0, rss_at(d), d, 0) for d in range(1, 101)]

    assert soak.check_rss(run(lambda d: 500_000), 100, 0.10)["ok"]
    grown = soak.check_rss(run(lambda d: 500_000 + 2_000 * d), 100, 0.10)
    assert not grown["ok"] and grown["growth"] > 0.10
