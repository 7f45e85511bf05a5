"""The embedded LLM's shapes side by side on negsynth's own stages: a fleet of single-threaded servers
against one multi-threaded server, the prompt cache on, off or pinned.

Each arm is a ``--set`` of ``[serve]`` for the same ``negsynth`` command on a fresh run dir:

``single``        one llama-server with ``--single-threads`` threads (default: every usable CPU),
                  its prompt cache on; ``singleT``: T threads; ``single-auto``: the threads chosen
                  from the cores free at its start (``serve.n_threads = 0``)
``fleetK``        K single-threaded, single-slot servers behind the endpoint router, each request's
                  shared prefix pinned (``serve.prompt_cache = "pinned"``: the default shape)
``fleetK-whole``  the same with every prompt evaluated whole (``serve.prompt_cache = "off"``)
``fleetK-pc``     the same with llama-server's plain prompt cache (answers depend on each server's history)

Workloads (``--workloads``): ``corpus``, ``negsynth corpus`` on the first ``--docs`` documents of
``--input`` (default: SciFact's corpus), the default config; ``generate``, the demo's ``generate``
stage (the default config, ``--examples`` items) from one brainstormed run dir copied per run.

Every repetition runs every arm, the order rotated. Reported, medians over ``--repeats``: the
stage's own ``wall_time_s``, documents (items) per minute, requests/s, prompt and completion
tokens/s, the ratio to the first arm, the servers' peak resident memory (sampled from ``/proc``),
the load before each run; and the output shards compared byte for byte across repetitions and
arms (``fleet1`` and ``fleet2`` must agree, as must ``fleet1-whole`` and ``fleet2-whole``)::

    python benchmarks/llm_fleet.py --workloads corpus --docs 150 --repeats 3 --out /tmp/llm-fleet
    python benchmarks/llm_fleet.py --workloads corpus,generate --docs 40 --examples 24 --arms single,fleet2 --out /tmp/llm-fleet
    python benchmarks/llm_fleet.py --workloads corpus --docs 160 --arms fleet1,fleet2,fleet4,fleet8,single8 --out /tmp/cores
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import harness


def arm_sets(arm: str, single_threads: int) -> list[str]:
    """An arm's ``[serve]`` overrides; an unknown arm stops the run in one line."""
    if m := re.fullmatch(r"fleet(\d+)(-whole|-pc)?", arm):
        cache = {None: "pinned", "-whole": "off", "-pc": "on"}[m.group(2)]
        return [f"serve.servers={m.group(1)}", "serve.n_threads=1", f"serve.prompt_cache={cache}"]
    if m := re.fullmatch(r"single(\d+|-auto)?", arm):
        threads = {None: single_threads, "-auto": 0}.get(m.group(1), m.group(1))
        return ["serve.servers=1", f"serve.n_threads={threads}", "serve.prompt_cache=true"]
    sys.exit(f"llm_fleet: unknown arm {arm!r}; use single, singleT, single-auto, fleetK, fleetK-whole or fleetK-pc")


class ServerRSS:
    """Peak resident memory (MiB) of each llama-server process among the children of ``pid``, sampled."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid, self.peak, self._stop = pid, {}, threading.Event()
        self._t = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._t.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            for p in Path("/proc").iterdir():
                try:
                    if p.name.isdigit() and int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == self.pid:
                        status = dict(line.split(":", 1) for line in (p / "status").read_text().splitlines() if ":" in line)
                        if status["Name"].strip().startswith("llama-server"):
                            self.peak[p.name] = max(self.peak.get(p.name, 0.0), int(status["VmRSS"].split()[0]) / 1024)
                except (OSError, ValueError, IndexError, KeyError):
                    continue

    def stop(self) -> list[float]:
        self._stop.set()
        self._t.join()
        return sorted(self.peak.values())


def negsynth(args: list[str]) -> tuple[float, list[float]]:
    """``negsynth ARGS --quiet --json``: its wall time and its servers' peak RSS (MiB)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        harness.negsynth_cli(*args, "--quiet", "--json"), cwd=harness.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    mem = ServerRSS(p.pid)
    _, err = p.communicate()
    rss = mem.stop()
    if p.returncode != 0:
        sys.exit(f"llm_fleet: negsynth {' '.join(args)} failed ({p.returncode}): {err.strip()[-600:]}")
    return time.perf_counter() - t0, rss


def shard_digest(stage_dir: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(stage_dir.glob("shard-*.jsonl")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def run_workload(a, workload: str, sets: list[str], d: Path) -> dict:
    """One run of ``workload`` in ``d`` with ``sets``: the stage's figures."""
    shutil.rmtree(d, ignore_errors=True)
    sets = [*([f"llm.max_concurrency={a.concurrency}"] if a.concurrency else []), *sets]
    if workload == "corpus":
        cmd = ["corpus", "--input", str(a.corpus), "-d", str(d)]
    else:
        shutil.copytree(a.out / "brainstormed", d)
        (d / "embedded-server.json").unlink(missing_ok=True)  # brainstorm's servers are not this run's
        cmd, sets = ["run", "-d", str(d), "--stages", "generate"], [f"generate.examples={a.examples}", *sets]
    wall, rss = negsynth([*cmd, *(x for s in sets for x in ("--set", s))])
    st = json.loads((d / workload / "stats.json").read_text())
    s, tok = st["wall_time_s"], st.get("tokens") or {}
    units = a.docs if workload == "corpus" else st.get("items", a.examples)
    return {
        "stage_s": s,
        "command_s": round(wall, 1),
        "per_min": units / s * 60,
        "requests": st.get("attempts"),
        "req_s": (st.get("attempts") or 0) / s,
        "prompt_tok_s": tok.get("prompt", 0) / s,
        "completion_tok_s": tok.get("completion", 0) / s,
        "valid": st.get("valid"),
        "server_rss_mib": [round(x) for x in rss],
        "digest": shard_digest(d / workload),
    }


def report(workload: str, runs: dict[str, list[dict]], a) -> None:
    names = list(runs)
    unit = "docs" if workload == "corpus" else "items"
    ref = harness.median(runs[names[0]], "per_min")
    rows = []
    for n, rs in runs.items():
        rss = sorted({x for r in rs for x in r["server_rss_mib"]}) or ["?"]
        med = {k: harness.median(rs, k) for k in ("stage_s", "per_min", "req_s", "prompt_tok_s", "completion_tok_s", "requests")}
        rows.append(
            [
                n,
                f"{med['stage_s']:.1f}",
                f"{med['per_min']:.1f}",
                f"{med['per_min'] / ref:.2f}x",
                f"{med['req_s']:.2f}",
                f"{med['prompt_tok_s']:.0f}",
            ]
            + [
                f"{med['completion_tok_s']:.1f}",
                f"{med['requests']:.0f}",
                f"{rss[0]}-{rss[-1]}",
                "yes" if len({r["digest"] for r in rs}) == 1 else "NO",
            ]
        )
    print(
        f"\n{workload} ({a.docs if workload == 'corpus' else a.examples} {unit}; load before each run {min(r['load'] for rs in runs.values() for r in rs):.2f}-{max(r['load'] for rs in runs.values() for r in rs):.2f})\n"
    )
    head = [
        "arm",
        "stage s",
        f"{unit}/min",
        f"vs {names[0]}",
        "requests/s",
        "prompt tok/s",
        "completion tok/s",
        "requests",
        "server RSS MiB",
        "same shards every rep",
    ]
    print(harness.table(head, rows))
    digests = {n: {r["digest"] for r in rs} for n, rs in runs.items()}
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            print(f"shards {x} vs {y}: {'identical' if digests[x] == digests[y] and len(digests[x]) == 1 else 'differ'}")


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--workloads", default="corpus", help="corpus, generate or both (comma-separated)")
    ap.add_argument("--arms", default="single,fleet2,fleet1", help="the first is the reference")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--docs", type=int, default=150, help="corpus: the first N documents of --input")
    ap.add_argument("--input", type=Path, default=None, help="corpus: a BEIR corpus.jsonl (default: the shared data's SciFact)")
    ap.add_argument("--examples", type=int, default=72, help="generate: generate.examples (the demo's default config: 72 items)")
    ap.add_argument("--concurrency", type=int, default=None, help="llm.max_concurrency (default: the config's)")
    ap.add_argument("--single-threads", type=int, default=len(os.sched_getaffinity(0)), help="threads of the single server")
    ap.add_argument("--server-path", default=None, help="serve.server_path for every arm (default: the built llama-server)")
    ap.add_argument("--out", type=Path, required=True, help="run dirs and results.json go here")
    a = ap.parse_args(argv)
    names = [x.strip() for x in a.arms.split(",") if x.strip()]
    sets = {n: arm_sets(n, a.single_threads) + ([f"serve.server_path={a.server_path}"] if a.server_path else []) for n in names}
    workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    if bad := [w for w in workloads if w not in ("corpus", "generate")]:
        sys.exit(f"llm_fleet: unknown workload(s) {bad}; use corpus and/or generate")
    a.out.mkdir(parents=True, exist_ok=True)
    start = harness.machine()
    if "corpus" in workloads:  # the first --docs documents as a file of their own: mining's index holds those alone
        a.corpus = a.out / f"corpus-{a.docs}.jsonl"
        with open(a.input or harness.data_dir() / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
            a.corpus.write_text("".join(line for _, line in zip(range(a.docs), f)), encoding="utf-8")
    if "generate" in workloads and not (a.out / "brainstormed" / "brainstorm" / "stats.json").is_file():
        shutil.rmtree(a.out / "brainstormed", ignore_errors=True)
        negsynth(["run", "-d", str(a.out / "brainstormed"), "--stages", "brainstorm"])
    results = {}
    for w in workloads:
        results[w] = harness.interleaved(names, a.repeats, lambda n, rep, w=w: run_workload(a, w, sets[n], a.out / w / f"{n}-rep{rep + 1}"))
        report(w, results[w], a)
    print(f"\n{start['cpus']} CPUs; {a.repeats} repetitions, order rotated; medians; started {start['at']}, load {start['load']}")
    harness.write_record(a.out / "results.json", a, start, results=results)


if __name__ == "__main__":
    main()
