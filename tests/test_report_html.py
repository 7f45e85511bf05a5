"""negsynth inspect --html: one self-contained page; its filters checked in a real headless chromium."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from helpers import scored_example
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import atomic_write_json, write_jsonl

runner = CliRunner()


def scored(i: int, tt: str = "short-long", **kw) -> dict:
    return scored_example(i, tt, task="Retrieve a passage.", query="query {i} <b>bold?</b>", **kw)


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    rows = [
        scored(0),
        scored(1, fn=(True, False, False, False), cos=(0.95, 0.7, 0.6, 0.5)),
        scored(2, tt="sts", cos=(0.6, 0.7, 0.2, 0.05), easy=(False, False, False, True), mono=False, tau=2 / 3),
        # reordered: the negative written first is the LLM's level 2, and it is the false negative
        scored(3, tt="sts", cos=(0.9, 0.8, 0.3, 0.2), order=[1, 0, 2, 3], fn=(True, False, False, False), mono=False, tau=2 / 3),
    ]
    write_jsonl(d / "generate" / "shard-00000.jsonl", [{k: v for k, v in r.items() if k != "score"} for r in rows])
    write_jsonl(
        d / "generate" / "rejects" / "shard-00000.jsonl",
        [
            {
                "id": "r1",
                "stage": "generate",
                "reason": "schema",
                "detail": "missing negatives",
                "raw": '{"query": "x"}',
                "input": {"task_type": "sts", "task": "t"},
            },
            {
                "id": "r2",
                "stage": "generate",
                "reason": "schema",
                "detail": "bad json",
                "raw": "</script><script>alert(1)</script>",
                "input": {"task_type": "short-long"},
            },
            {"id": "r3", "stage": "generate", "reason": "copied_example", "detail": "", "raw": "", "input": {"task_type": "sts"}},
        ],
    )
    atomic_write_json(
        d / "generate" / "stats.json", {"tokens": {"prompt": 1000, "completion": 250}, "estimated_cost_usd": 0.0125, "wall_time_s": 3.5}
    )
    write_jsonl(d / "score" / "shard-00000.jsonl", rows)
    rej = scored(9, tt="sts")
    write_jsonl(
        d / "score" / "rejects" / "shard-00000.jsonl",
        [{"id": "ex-9", "stage": "score", "reason": "near_duplicate", "detail": "same as ex-2", "raw": None, "input": rej}],
    )
    atomic_write_json(d / "score" / "stats.json", {"embedder": "fake", "wall_time_s": 1.0})
    return d


@pytest.fixture
def page(run_dir, tmp_path):
    out = tmp_path / "report.html"
    r = runner.invoke(app, ["inspect", str(run_dir), "--html", str(out)])
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.output.replace("\n", "")
    return out


def test_page_is_self_contained(page):
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text) and "<link" not in text  # nothing fetched
    assert text.count("data:image/png;base64,") >= 3  # cos by level, flags, kendall tau (+ task-type mix)
    for s in ("Stages", "Reject reasons", "copied_example", "per LLM level", "level 4"):
        assert s in text
    assert "<script>alert(1)" not in text  # texts are data, never markup


def _browser() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def dump_dom(browser: str, url: str, profile) -> str:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--dump-dom",
        url,
    ]
    r = subprocess.run([browser, *flags], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def shown(dom: str) -> list[str]:
    box = dom[dom.index('id="examples"') :]
    return re.findall(r'<div class="ex[^"]*" data-id="([^"]+)"', box)


def test_filters_in_headless_chromium(page, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no chromium on this machine (apt-get install -y chromium)")
    url = page.resolve().as_uri()
    profile = tmp_path / "profile"
    dom = dump_dom(browser, url, profile)
    assert shown(dom) == ["ex-0", "ex-1", "ex-2", "ex-3"]  # kept examples by default
    assert "4 shown of 8" in dom and "alert(1)" not in shown(dom)
    # false negative at LLM level 2: only ex-3 (its first-written negative is the LLM's level 2)
    dom = dump_dom(browser, url + "#flag=false_negative&level=2", profile)
    assert shown(dom) == ["ex-3"]
    assert re.search(r'<tr class="neg hl"><td class="lab">level 2 <span class="badge fn">', dom)
    assert shown(dump_dom(browser, url + "#flag=false_negative", profile)) == ["ex-1", "ex-3"]
    assert shown(dump_dom(browser, url + "#task_type=sts&flag=non_monotonic", profile)) == ["ex-2", "ex-3"]
    assert shown(dump_dom(browser, url + "#flag=too_easy&level=4", profile)) == ["ex-2"]
    dom = dump_dom(browser, url + "#reason=schema", profile)
    assert shown(dom) == ["r1", "r2"] and "&lt;/script&gt;&lt;script&gt;alert(1)" in dom
    dom = dump_dom(browser, url + "#reason=near_duplicate", profile)
    assert shown(dom) == ["ex-9"] and "query 9 &lt;b&gt;bold?&lt;/b&gt;" in dom
    assert shown(dump_dom(browser, url + "#reason=*&task_type=sts", profile)) == ["r1", "r3", "ex-9"]
