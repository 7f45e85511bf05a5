"""benchmarks/llm_fleet.py's ceiling: llama-batched-bench's table read into requests/s (B
sequences over the run's total time), with a stand-in binary that prints the tool's table."""

from __future__ import annotations

import stat

import pytest
from helpers import load_benchmark

fleet = load_benchmark("llm_fleet")

TABLE = """
main: n_kv_max = 2496, n_batch = 2048, n_ubatch = 512

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   100 |     20 |    1 |    120 |    0.608 |   164.36 |    0.412 |    48.58 |    1.000 |   117.64 |
|   100 |     20 |    4 |    480 |    2.400 |   166.67 |    0.800 |   100.00 |    3.200 |   150.00 |
"""


def _stand_in(tmp_path, text: str):
    out = tmp_path / "table.txt"
    out.write_text(text)
    binary = tmp_path / "llama-batched-bench"
    binary.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\ncat {out}\n')
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return binary


def test_the_ceiling_is_b_requests_over_the_total_time(tmp_path):
    rows = fleet.batched_ceiling(_stand_in(tmp_path, TABLE), 100, 20, [1, 4], threads=2)
    assert [r["batch"] for r in rows] == [1, 4]
    assert rows[0]["req_s"] == pytest.approx(1.0) and rows[1]["req_s"] == pytest.approx(1.25)
    argv = (tmp_path / "argv").read_text().split()
    assert argv[argv.index("-npp") + 1] == "100" and argv[argv.index("-ntg") + 1] == "20"
    assert argv[argv.index("-npl") + 1] == "1,4" and argv[argv.index("-t") + 1] == "2"
    assert int(argv[argv.index("-c") + 1]) >= 4 * 120  # room for every sequence's tokens
    assert "-pps" not in argv
    fleet.batched_ceiling(_stand_in(tmp_path, TABLE), 100, 20, [1, 4], threads=2, shared=True)
    assert "-pps" in (tmp_path / "argv").read_text().split()  # the shared-prompt bound


def test_a_run_with_no_table_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no table"):
        fleet.batched_ceiling(_stand_in(tmp_path, "error: failed to load model\n"), 100, 20, [1], threads=1)
