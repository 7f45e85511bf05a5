"""Throughput of the real `generate` stage against a fake OpenAI server with 100 ms latency,
side by side with what a user would compare it to.

The server runs pinned to one core (``taskset -c 1``), every client to the other (``taskset -c
0``). Drivers, each in its own process, at concurrency 16, 64 and 128:

``raw``    a bare aiohttp client posting a fixed 3 KB body: the ceiling of this server right now;
``raw-h1`` the same body through negsynth's own HTTP/1.1 pool (``negsynth.llm.http1``), bare;
``sdk``    the openai SDK (``AsyncOpenAI`` on its aiohttp transport) sending the same body;
``stage``  the real generate stage in process — prompt building, request cache (SQLite), transport
           retries, rate limiter, JSON extraction, validation, partial/shard writes, stats — on the
           default transport (``llm.transport = "http1"``);
``stage-aiohttp`` the same stage with ``llm.transport = "aiohttp"`` (what it used before);
``cli``    ``negsynth generate --quiet`` as a user runs it: the whole process, start-up included.

Runs are interleaved (repetition r runs every concurrency and every driver before r+1), each
configuration ``--repeats`` times (default 3); the table shows medians: requests/s, the ratio to
the ceiling at the same concurrency (the faster of the bare clients run, ``raw`` / ``raw-h1``),
and client CPU ms per request (``getrusage`` of the client process: around the work for
raw/sdk/stage, the whole child process for cli). Only
ratios within one run mean anything on a shared machine: the load average is printed. The
package's bytecode is compiled first (``compileall``, as ``pip install`` does), so the CLI's
start-up is a user's steady state even where ``PYTHONDONTWRITEBYTECODE`` is set (containers, CI).

    python benchmarks/llm_throughput.py                    # 2,000 examples, C = 16, 64, 128, 3 repeats
    python benchmarks/llm_throughput.py --examples 500 --concurrency 64 --profile   # py-spy of the stage
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LATENCY = 0.1
ROOT = Path(__file__).resolve().parents[1]


# -- the server (aiohttp.web; run in its own process, pinned) -----------------------------------
def serve(port: int, latency: float) -> None:
    """A valid answer for every request, as the tests' fake server gives it (``tests/fake_openai.py``),
    after ``latency`` seconds; 20 tasks per brainstorm request, as the run file asks."""
    from aiohttp import web

    sys.path.insert(0, str(ROOT / "tests"))
    from fake_openai import completion_body, valid_answer

    counter = [0]

    async def models(_req):
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def chat(req):
        body = await req.json(loads=json.loads)
        counter[0] += 1
        await asyncio.sleep(latency)
        out = completion_body(valid_answer(body, counter[0], tasks=20), model=body.get("model", "fake"), pt=500, ct=120)
        return web.Response(body=json.dumps(out).encode(), content_type="application/json")

    app = web.Application(client_max_size=16 * 2**20)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, backlog=1024)


# -- the client side -----------------------------------------------------------------------------
def write_config(d: Path, port: int, examples: int, concurrency: int, transport: str | None = None) -> Path:
    cfg = d / f"bench-{transport or 'default'}.toml"
    cfg.write_text(
        f"""[llm]
base_url = "http://127.0.0.1:{port}/v1"
model = "fake"
{f'transport = "{transport}"' if transport else ""}
max_concurrency = {concurrency}
timeout = 30
max_tokens = 600
[pipeline]
shard_size = 500
[brainstorm]
tasks_per_type = 20
tasks_per_request = 20
[generate]
examples = {examples}
min_per_type = 10
"""
    )
    return cfg


def run_stage(stage: str, cfg: Path, run_dir: Path, quiet: bool) -> dict:
    """Run one stage in this process; returns wall time, CPU time and the stage's stats."""
    from negsynth.pipeline.context import StageContext
    from negsynth.pipeline.progress import Reporter
    from negsynth.schemas.config_io import load_config
    from negsynth.stages import get

    ctx = StageContext(cfg=load_config(cfg), run_dir=run_dir, reporter=Reporter(quiet=quiet))
    fn = get(stage).run
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    stats = fn(ctx)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "requests": stats["this_run"]["requests"], "valid": stats["valid"], "items": stats["items"]}


async def bare(port: int, n: int, concurrency: int) -> dict:
    """A bare aiohttp client (no openai SDK, no stage): the server's ceiling right now."""
    import aiohttp

    body = json.dumps({"model": "fake", "messages": [{"role": "user", "content": 'x "user_query" ' * 200}]}).encode()
    sem = asyncio.Semaphore(concurrency)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:

        async def one():
            async with sem:
                async with s.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
                ) as r:
                    await r.read()

        await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": wall, "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), "requests": n, "valid": n, "items": n}


async def bare_h1(port: int, n: int, concurrency: int) -> dict:
    """negsynth's HTTP/1.1 pool, bare: the same body and concurrency as :func:`bare`."""
    from negsynth.llm.http1 import H1Pool

    body = json.dumps({"model": "fake", "messages": [{"role": "user", "content": 'x "user_query" ' * 200}]}).encode()
    sem = asyncio.Semaphore(concurrency)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    pool = H1Pool(f"http://127.0.0.1:{port}/v1", headers={"Content-Type": "application/json"}, limit=concurrency)

    async def one():
        async with sem:
            await pool.request("POST", "/v1/chat/completions", body)

    await asyncio.gather(*(one() for _ in range(n)))
    await pool.close()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": wall, "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), "requests": n, "valid": n, "items": n}


async def sdk(port: int, n: int, concurrency: int) -> dict:
    """The openai SDK on its aiohttp transport, same body as :func:`bare`."""
    from openai import AsyncOpenAI, DefaultAioHttpClient

    messages = [{"role": "user", "content": 'x "user_query" ' * 200}]
    sem = asyncio.Semaphore(concurrency)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    async with AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="x", http_client=DefaultAioHttpClient(), max_retries=0
    ) as client:

        async def one():
            async with sem:
                await client.chat.completions.create(model="fake", messages=messages)

        await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": wall, "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), "requests": n, "valid": n, "items": n}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 20.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the fake server did not start")


def pinned(core: int, args: list[str]) -> list[str]:
    return (["taskset", "-c", str(core)] if shutil.which("taskset") and os.cpu_count() and os.cpu_count() > core else []) + args


def run_child(cmd: list[str], *, cli: bool = False, progress: bool = False, pythonpath: Path | None = None) -> dict:
    """Run one driver process; a driver prints its JSON line, the CLI its stats (--json) and is
    measured from outside: wall time and the child's whole CPU time."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath else None
    # `python -m` puts the working directory first on sys.path: a reference checkout runs from its own root
    out = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE, text=True, cwd=pythonpath or ROOT, env=env
    )
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr}")
    if cli:
        st = json.loads(out.stdout)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        return {"wall_s": wall, "cpu_s": cpu, "requests": st["this_run"]["requests"], "valid": st["valid"], "items": st["items"]}
    return json.loads(next(line for line in reversed(out.stdout.splitlines()) if line.startswith("{")))  # py-spy prints after it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--latency", type=float, default=LATENCY)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions of every (driver, concurrency); medians are reported")
    ap.add_argument(
        "--drivers",
        nargs="+",
        default=["raw", "raw-h1", "sdk", "stage", "stage-aiohttp", "cli"],
        choices=["raw", "raw-h1", "sdk", "stage", "stage-aiohttp", "cli", "cli-ref", "stage-ref"],
    )
    ap.add_argument(
        "--ref",
        type=Path,
        default=None,
        help="another checkout of negsynth (e.g. `git worktree add /tmp/ref HEAD~3`): "
        "the drivers cli-ref / stage-ref run it, for before/after in one interleaved run",
    )
    ap.add_argument("--json", dest="json_out", default=None, help="also write medians and every run to this JSON file")
    ap.add_argument("--progress", action="store_true", help="show the rich progress bar (default: --quiet, as in CI logs)")
    ap.add_argument(
        "--profile",
        nargs="?",
        const="svg",
        choices=["svg", "raw"],
        default=None,
        help="record a py-spy profile of the client: a flame graph (svg) or collapsed stacks (raw, text)",
    )
    # internal entry points
    ap.add_argument("--_serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_client", nargs=4, help=argparse.SUPPRESS)  # stage cfg run_dir quiet
    ap.add_argument("--_bare", nargs=3, type=int, help=argparse.SUPPRESS)  # port n concurrency
    ap.add_argument("--_bare_h1", nargs=3, type=int, help=argparse.SUPPRESS)  # port n concurrency
    ap.add_argument("--_sdk", nargs=3, type=int, help=argparse.SUPPRESS)  # port n concurrency
    a = ap.parse_args()

    if a._serve:
        return serve(a._serve, a.latency)
    if a._client:
        stage, cfg, rd, quiet = a._client
        print(json.dumps(run_stage(stage, Path(cfg), Path(rd), quiet == "1")))
        return
    if a._bare:
        print(json.dumps(asyncio.run(bare(*a._bare))))
        return
    if a._sdk:
        print(json.dumps(asyncio.run(sdk(*a._sdk))))
        return
    if a._bare_h1:
        print(json.dumps(asyncio.run(bare_h1(*a._bare_h1))))
        return

    port = free_port()
    me = [sys.executable, str(Path(__file__).resolve())]
    srv = subprocess.Popen(pinned(1, [*me, "--_serve", str(port), "--latency", str(a.latency)]))
    rows = []
    try:
        wait_port(port)
        for root in {ROOT, *([a.ref] if a.ref else [])}:
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "negsynth")], check=True, stdout=subprocess.DEVNULL)
        tmp = Path(tempfile.mkdtemp(prefix="negsynth-bench-"))
        base = tmp / "base"
        cfg = write_config(tmp, port, a.examples, 16)
        out = subprocess.run(
            pinned(0, [*me, "--_client", "brainstorm", str(cfg), str(base), "1"]), capture_output=True, text=True, cwd=ROOT
        )
        if out.returncode != 0:
            raise SystemExit(out.stderr)
        load = os.getloadavg()
        runs: dict[tuple[str, int], list[dict]] = {}
        for rep in range(a.repeats):
            for c in a.concurrency:
                for drv in a.drivers:
                    if drv in ("raw", "raw-h1", "sdk"):
                        flag = {"raw": "--_bare", "raw-h1": "--_bare_h1", "sdk": "--_sdk"}[drv]
                        r = run_child(pinned(0, [*me, flag, str(port), str(a.examples), str(c)]))
                    else:
                        rd = tmp / f"{drv}-c{c}-{rep}"
                        shutil.copytree(base, rd)
                        cfg = write_config(tmp, port, a.examples, c, "aiohttp" if drv == "stage-aiohttp" else None)
                        ref = a.ref if drv.endswith("-ref") else None
                        if ref is None and drv.endswith("-ref"):
                            raise SystemExit(f"--drivers {drv} needs --ref PATH")
                        if drv.startswith("stage"):
                            cmd = [*me, "--_client", "generate", str(cfg), str(rd), "0" if a.progress else "1"]
                            if a.profile:
                                fmt = "raw" if a.profile == "raw" else "flamegraph"
                                ext = "txt" if fmt == "raw" else "svg"
                                cmd = [
                                    "py-spy",
                                    "record",
                                    "-r",
                                    "200",
                                    "-f",
                                    fmt,
                                    "-o",
                                    str(ROOT / f"benchmarks/profile_c{c}.{ext}"),
                                    "--",
                                    *cmd,
                                ]
                            r = run_child(pinned(0, cmd), progress=a.progress, pythonpath=ref)
                        else:
                            cli_cmd = [
                                sys.executable,
                                "-m",
                                "negsynth.cli",
                                "generate",
                                "-c",
                                str(cfg),
                                "-d",
                                str(rd),
                                "--json",
                                *([] if a.progress else ["-q"]),
                            ]
                            r = run_child(pinned(0, cli_cmd), cli=True, pythonpath=ref)
                        assert r["items"] == a.examples, r
                        shutil.rmtree(rd, ignore_errors=True)
                    runs.setdefault((drv, c), []).append(r)
                    print(
                        f"  rep {rep} C={c} {drv:13s} {r['requests'] / r['wall_s']:7.1f} req/s  {1000 * r['cpu_s'] / r['requests']:5.2f} ms/req",
                        flush=True,
                    )
        end_load = os.getloadavg()

        def med(drv: str, c: int, key: str) -> float | None:
            rs = runs.get((drv, c))
            if not rs:
                return None
            return statistics.median(r["requests"] / r["wall_s"] if key == "rps" else 1000 * r["cpu_s"] / r["requests"] for r in rs)

        print(f"\nmedians of {a.repeats} interleaved runs; {a.examples} requests per run; latency {a.latency}s")
        print(f"{'driver':13s} " + " ".join(f"{'C=' + str(c) + ' req/s':>12s} {'/ceil':>5s} {'ms/req':>7s}" for c in a.concurrency))
        for drv in a.drivers:
            cells = []
            for c in a.concurrency:
                bares = [v for v in (med("raw", c, "rps"), med("raw-h1", c, "rps")) if v]
                rps, ms, ceil = med(drv, c, "rps"), med(drv, c, "ms"), max(bares, default=None)
                cells.append(f"{rps:12.1f} {rps / ceil if ceil else float('nan'):5.2f} {ms:7.2f}")
            print(f"{drv:13s} " + " ".join(cells))
            rows.append(
                {"driver": drv, **{f"C{c}": {"req_s": med(drv, c, "rps"), "ms_per_request": med(drv, c, "ms")} for c in a.concurrency}}
            )
        print(
            f"\nload average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end {end_load[0]:.2f} {end_load[1]:.2f} {end_load[2]:.2f}; {os.cpu_count()} CPUs"
        )
        if a.json_out:
            Path(a.json_out).write_text(
                json.dumps(
                    {
                        "args": vars(a) | {"json_out": str(a.json_out)},
                        "medians": rows,
                        "load_start": load,
                        "load_end": end_load,
                        "runs": {f"{d}@{c}": v for (d, c), v in runs.items()},
                    },
                    indent=1,
                    default=str,
                )
            )
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
