"""`negsynth run --executor ray`: the whole pipeline on Ray from one command.

Each stage that splits (here generate) runs as --workers Ray tasks merged by the driver, which
holds the run dir for the whole run; the data equal a local `negsynth run` byte for byte, a rerun
reuses every stage without starting a worker, the run's one budget carries into the workers, and
a second independent process on the run dir is still refused. A local 2-CPU Ray node, as in
test_scaleout (score's embedding on Ray through `negsynth run` is test_score_ray's MiniLM test).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from fake_openai import FakeOpenAI, Reply, sts_reasked_once
from helpers import request_bodies
from test_lock import other_process_holds
from test_scaleout import write_config
from typer.testing import CliRunner

from negsynth.cli import EXIT_BUDGET, app

runner = CliRunner()
STAGES = "brainstorm,generate"


def deterministic(req, n):
    """test_scaleout's answers, with brainstorm's made from its prompt alone (the fake's own number
    them in arrival order, which differs between two runs sending requests concurrently)."""
    prompt = next(m["content"] for m in reversed(req["messages"]) if m["role"] == "user")
    if prompt.startswith("Brainstorm"):
        tag = hashlib.sha256(prompt.encode()).hexdigest()[:8]
        return Reply(content=json.dumps({"tasks": [f"Task {i} about topic {tag} for retrieval" for i in range(5)]}))
    return sts_reasked_once(req, n)


def data_files(rd: Path) -> dict[str, bytes]:
    out = {}
    for stage in STAGES.split(","):
        d = rd / stage
        files = [*d.glob("shard-*.jsonl"), *(d / "rejects").glob("*.jsonl"), *(d / "_shards").glob("*.json")]
        out |= {f"{stage}/{p.relative_to(d)}": p.read_bytes() for p in sorted(files)}
    return out


def run(cfg: Path, rd: Path, *extra: str, stages: str = STAGES):
    return runner.invoke(app, ["run", "-c", str(cfg), "-d", str(rd), "--stages", stages, *extra])


def test_run_on_ray_equals_a_local_run_and_a_rerun_reuses_everything(tmp_path, ray_node):
    with FakeOpenAI(deterministic) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        r = run(cfg, tmp_path / "local", "--json")
        assert r.exit_code == 0, r.output
        local = json.loads(r.stdout)
        local_bodies = request_bodies(srv.requests)
        srv.requests.clear()

        rd = tmp_path / "ray"
        r = run(cfg, rd, "--executor", "ray", "--workers", "2", "--json")
        assert r.exit_code == 0, r.output
        ray_bodies = request_bodies(srv.requests)
        out = json.loads(r.stdout)
        # generate ran as 2 Ray ranks under the driver's run-dir lock, their stats summed
        gen = out["generate"]
        assert gen["executor"] == "ray" and gen["workers"] == 2 and gen["num_shards"] == 2 and len(gen["ray_nodes"]) == 2
        assert "executor" not in out["brainstorm"]  # a stage that does not split runs in the driver
        assert data_files(rd) == data_files(tmp_path / "local")  # byte for byte
        assert ray_bodies == local_bodies  # and exactly the requests a local run sends
        for k in ("items", "valid", "rejected"):
            assert gen[k] == local["generate"][k], k
        assert gen["this_run"]["requests"] == local["generate"]["this_run"]["requests"]
        assert list(rd.glob(".negsynth*")) == []  # every lock let go

        # a rerun: every stage up to date, no worker launched, nothing sent; the summaries printed as locally
        srv.requests.clear()
        r = run(cfg, rd, "--executor", "ray", "--workers", "2")
        assert r.exit_code == 0, r.output
        assert srv.requests == []
        assert "brainstorm: up to date" in r.stderr and "generate: up to date" in r.stderr and "Ray task" not in r.stderr
        assert r.stderr.count("estimated cost") == 2 and re.search(rf"valid\W+{gen['valid']}\b", r.stderr)

        # a second, independent process on the run dir is refused, nothing sent
        with other_process_holds(rd) as holder:
            r = run(cfg, rd, "-q", "--executor", "ray", "--workers", "2", "--overwrite")
        assert r.exit_code == 2 and f"in use by PID {holder.pid}" in r.stderr and srv.requests == []


def test_one_budget_for_the_whole_run_carries_into_the_ray_workers(tmp_path, ray_node):
    """--max-requests covers the run: brainstorm (in the driver) spends its share, and generate's
    Ray workers get what is left (one BudgetLedger actor), stopping like a local run (exit 3)."""
    with FakeOpenAI(deterministic) as srv:
        cfg = write_config(tmp_path, srv.base_url)
        r = run(cfg, tmp_path / "bs", "--json", stages="brainstorm")
        assert r.exit_code == 0, r.output
        spent = json.loads(r.stdout)["brainstorm"]["this_run"]["requests"]
        srv.requests.clear()
        cap = spent + 3
        r = run(cfg, tmp_path / "ray", "--json", "--executor", "ray", "--workers", "2", "--max-requests", str(cap))
        assert r.exit_code == EXIT_BUDGET, r.output
        assert len(srv.requests) == cap  # never more than the run's budget
        st = json.loads(r.stdout)["stages"]["generate"]
        assert st["stopped_by"] == f"max_requests={cap}" and st["executor"] == "ray"
        assert st["budget"]["used"]["requests"] == 3  # generate's workers got what brainstorm left
