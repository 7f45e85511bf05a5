"""Throughput of the embedded LLM against the cores: K single-threaded servers vs one T-threaded one.

The same recorded chat requests (the bodies ``negsynth corpus`` sends, one JSON object per line:
``--bodies``) are replayed on each arm, with as many requests in flight as the arm has slots:

``fleet:K``    ``serve.servers = K``, ``serve.n_threads = 1`` (negsynth's default shape on K free cores):
               :class:`negsynth.llm.fleet.EmbeddedFleet` starts the K servers, one worker per server
               takes the next request as soon as its server is free (what the client's most-free-capacity
               router does with one slot per server);
``single:T``   one server with T threads and one slot (the shape before the fleet).

Each arm gets ``--per-slot`` requests per server (so every arm runs about as long; a ``single`` arm
gets ``--per-slot`` × ``--single-requests-factor``), arms interleaved and rotated over
``--repeats`` repetitions, servers started before the clock. Reported per arm, medians: wall
seconds, requests/s, completion tokens/s, the ratio to ``fleet:1`` (one core) and to the best
``single`` arm, the load average before the run; and the answers: every request's content compared
across repetitions and across arms (all ``fleet`` arms compute with one thread and one slot, so
they must agree byte for byte; a ``single:T`` arm's thread count may change them), and against
``--reference`` (the same requests answered on another machine, e.g. a 2-core laptop).

    python benchmarks/llm_cores.py --bodies bodies.jsonl --arms fleet:1,fleet:2,single:2 --per-slot 4 --out /tmp/cores
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import aiohttp

from negsynth.llm.fleet import EmbeddedFleet
from negsynth.schemas.config import ServeConfig


def parse_arm(arm: str) -> tuple[str, int]:
    kind, _, n = arm.partition(":")
    if kind not in ("fleet", "single") or not n.isdigit() or int(n) < 1:
        raise SystemExit(f"--arms: {arm!r} is not fleet:K or single:T (K, T >= 1)")
    return kind, int(n)


def serve_config(kind: str, n: int, args) -> ServeConfig:
    servers, threads = (n, 1) if kind == "fleet" else (1, n)
    return ServeConfig(servers=servers, n_threads=threads, model_path=args.model, server_path=args.server, prompt_cache=False)


async def replay(urls: list[str], bodies: list[dict], timeout: float) -> tuple[float, list[dict]]:
    """Send ``bodies`` over ``urls`` (one request in flight per URL); the wall time and the answers in order."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(bodies)):
        queue.put_nowait(i)
    answers: list[dict] = [{} for _ in bodies]

    async def worker(session: aiohttp.ClientSession, url: str) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            async with session.post(url + "/chat/completions", json=bodies[i]) as r:
                data = await r.json()
            if r.status != 200:
                raise RuntimeError(f"{url}: HTTP {r.status}: {str(data)[:300]}")
            answers[i] = {"content": data["choices"][0]["message"]["content"], "usage": data.get("usage", {})}

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        await asyncio.gather(*(worker(session, u) for u in urls))
    return time.perf_counter() - t0, answers


def run_arm(arm: str, bodies: list[dict], args) -> dict:
    kind, n = parse_arm(arm)
    servers = n if kind == "fleet" else 1
    count = args.per_slot * (servers if kind == "fleet" else args.single_requests_factor)
    work = bodies[:count]
    load = os.getloadavg()[0]
    with EmbeddedFleet(serve_config(kind, n, args), "smollm2-135m-instruct") as fleet:
        wall, answers = asyncio.run(replay(fleet.urls, work, args.timeout))
        rss = [m for m in fleet.rss_mib() if m is not None]
    ctoks = sum(a["usage"].get("completion_tokens", 0) for a in answers)
    ptoks = sum(a["usage"].get("prompt_tokens", 0) for a in answers)
    return {
        "arm": arm,
        "requests": len(work),
        "wall_s": wall,
        "requests_per_s": len(work) / wall,
        "completion_tokens_per_s": ctoks / wall,
        "prompt_tokens": ptoks,
        "completion_tokens": ctoks,
        "load_before": load,
        "server_rss_mib_max": max(rss) if rss else None,
        "answers": [hashlib.sha256(a["content"].encode()).hexdigest()[:16] for a in answers],
        "contents": [a["content"] for a in answers],
    }


def agreement(runs: list[dict], reference: list[str] | None) -> dict:
    """Per arm: do its repetitions agree, and do the fleet arms agree with each other and with the reference."""
    by_arm: dict[str, list[list[str]]] = {}
    for r in runs:
        by_arm.setdefault(r["arm"], []).append(r["answers"])
    out: dict = {"repeat_to_repeat": {a: all(x == v[0] for x in v) for a, v in by_arm.items()}}
    base = next((v[0] for a, v in by_arm.items() if a.startswith("fleet")), None)
    if base is not None:
        out["vs_first_fleet_arm"] = {a: sum(x == y for x, y in zip(v[0], base)) for a, v in by_arm.items()}
        out["compared_per_arm"] = {a: min(len(v[0]), len(base)) for a, v in by_arm.items()}
    if reference is not None:
        ref = [hashlib.sha256(c.encode()).hexdigest()[:16] for c in reference]
        out["vs_reference"] = {a: f"{sum(x == y for x, y in zip(v[0], ref))}/{min(len(v[0]), len(ref))}" for a, v in by_arm.items()}
    return out


def summary(runs: list[dict]) -> list[dict]:
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    med = {a: statistics.median(r["requests_per_s"] for r in runs if r["arm"] == a) for a in arms}
    one = med.get("fleet:1")
    best_single = max((v for a, v in med.items() if a.startswith("single")), default=None)
    rows = []
    for a in arms:
        mine = [r for r in runs if r["arm"] == a]
        rows.append(
            {
                "arm": a,
                "repeats": len(mine),
                "requests": mine[0]["requests"],
                "wall_s_median": statistics.median(r["wall_s"] for r in mine),
                "requests_per_s_median": med[a],
                "completion_tokens_per_s_median": statistics.median(r["completion_tokens_per_s"] for r in mine),
                "x_fleet1": med[a] / one if one else None,
                "x_best_single": med[a] / best_single if best_single else None,
                "load_before": [round(r["load_before"], 2) for r in mine],
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bodies", required=True, help="JSONL of chat request bodies (as recorded from negsynth corpus)")
    ap.add_argument("--arms", default="fleet:1,fleet:2,single:2")
    ap.add_argument("--per-slot", type=int, default=4, help="requests per server of a fleet arm")
    ap.add_argument("--single-requests-factor", type=int, default=8, help="a single arm's requests = per-slot x this")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--server", default=None, help="llama-server binary (default: as negsynth finds it)")
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2)")
    ap.add_argument("--reference", default=None, help="a results.json from another machine: its first fleet arm's answers")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    bodies = [json.loads(line) for line in Path(args.bodies).read_text().splitlines() if line.strip()]
    arms = args.arms.split(",")
    for a in arms:
        parse_arm(a)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    for rep in range(args.repeats):
        order = arms[rep % len(arms) :] + arms[: rep % len(arms)]  # rotated: no arm always first or last
        for arm in order:
            r = run_arm(arm, bodies, args)
            r["repeat"] = rep
            runs.append(r)
            print(
                f"rep {rep} {arm:10s} {r['requests']:4d} req  {r['wall_s']:7.1f} s  {r['requests_per_s']:.3f} req/s  load {r['load_before']:.2f}",
                flush=True,
            )
    reference = None
    if args.reference:
        ref_runs = json.loads(Path(args.reference).read_text())["runs"]
        reference = next(r["contents"] for r in ref_runs if r["arm"].startswith("fleet"))
    result = {
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "summary": summary(runs),
        "answers": agreement(runs, reference),
        "runs": runs,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    for row in result["summary"]:
        print(json.dumps(row))
    print(json.dumps(result["answers"]))


if __name__ == "__main__":
    main()
