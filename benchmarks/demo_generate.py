"""The demo's whole `generate` stage on each embedded engine, side by side.

What README command 1 waits for most: the default config's 72 generate items (with their re-asks)
against the embedded SmolLM2-135M. `brainstorm` runs once (``serve.engine = "auto"``); each
repetition copies that run dir (its request cache holds brainstorm's answers only; the server record
``embedded-server.json`` left out, so each run chooses its threads from the cores free as a new run
dir does, unless ``--threads`` fixes them) and runs ``negsynth run --stages generate`` once per
engine, the order rotated, a fresh server each time.
Reported, medians over the repetitions: the stage's own ``wall_time_s``, the whole command's wall
time (server start included), requests sent (first asks + re-asks), valid examples and tokens; the
load average before each run, and how many examples equal those of the first engine's first run.

    python benchmarks/demo_generate.py --engines llama-cpp-python,llama-server --repeats 3 --out /tmp/demo-gen
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def negsynth(run_dir: Path, *args: str) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "negsynth", "run", "-d", str(run_dir), *args, "--quiet", "--json"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"demo_generate: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    return time.perf_counter() - t0


def examples(run_dir: Path) -> list[str]:
    return [line for f in sorted((run_dir / "generate").glob("shard-*.jsonl")) for line in f.read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="llama-cpp-python,llama-server", help="serve.engine values, the first the reference")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True, help="run dirs and results.json go here")
    ap.add_argument("--threads", type=int, default=None, help="serve.n_threads for every run (default: each chooses)")
    a = ap.parse_args()
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    base = a.out / "brainstormed"
    if not (base / "brainstorm" / "stats.json").is_file():
        shutil.rmtree(base, ignore_errors=True)
        negsynth(base, "--stages", "brainstorm")
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for rep in range(a.repeats):
        for e in engines[rep % len(engines) :] + engines[: rep % len(engines)]:
            d = a.out / f"{e}-rep{rep + 1}"
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(base, d)
            (d / "embedded-server.json").unlink(missing_ok=True)  # brainstorm's thread choice is not this run's
            load = os.getloadavg()[0]
            fixed = ["--set", f"serve.n_threads={a.threads}"] if a.threads else []
            wall = negsynth(d, "--stages", "generate", "--set", f"serve.engine={e}", *fixed)
            st = json.loads((d / "generate" / "stats.json").read_text())
            srv = json.loads((d / "embedded-server.json").read_text()) if (d / "embedded-server.json").is_file() else {}
            r = {
                "stage_s": st["wall_time_s"],
                "command_s": round(wall, 1),
                "requests": st["attempts"],
                "valid": st["valid"],
                "tokens": st.get("tokens"),
                "load": round(load, 2),
                "threads": srv.get("threads") or a.threads or "its default",
                "examples": examples(d),
            }
            runs[e].append(r)
            print(
                f"rep {rep + 1} {e:18s} stage {r['stage_s']:6.1f} s  command {r['command_s']:6.1f} s  requests {r['requests']}  valid {r['valid']}  "
                f"threads {r['threads']}  load {load:.2f}",
                flush=True,
            )
    med = statistics.median
    ref = med(r["stage_s"] for r in runs[engines[0]])
    first = runs[engines[0]][0]["examples"]
    print(f"\n{len(os.sched_getaffinity(0))} CPUs; {a.repeats} repetitions, order rotated; medians\n")
    print(
        f"| engine | threads | generate s | vs {engines[0]} | command s | requests | valid | completion tokens | same examples as {engines[0]} rep 1 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for e in engines:
        rs = runs[e]
        stage = med(r["stage_s"] for r in rs)
        comp = med((r["tokens"] or {}).get("completion", 0) for r in rs)
        same = min(sum(x == y for x, y in zip(r["examples"], first)) for r in rs)
        threads = "/".join(sorted({str(r["threads"]) for r in rs}))
        print(
            f"| {e} | {threads} | {stage:.1f} | {ref / stage:.2f}x | {med(r['command_s'] for r in rs):.1f} | {med(r['requests'] for r in rs):.0f} | "
            f"{med(r['valid'] for r in rs):.0f} | {comp:.0f} | {same}/{len(first)} |"
        )
    loads = [r["load"] for rs in runs.values() for r in rs]
    print(f"\nload average before each run: {min(loads):.2f}-{max(loads):.2f}")
    (a.out / "results.json").write_text(
        json.dumps({e: [{k: v for k, v in r.items() if k != "examples"} for r in rs] for e, rs in runs.items()}, indent=1)
    )


if __name__ == "__main__":
    main()
