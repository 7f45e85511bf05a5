"""Client CPU per request of the chat hot path's aiohttp session: ``trust_env=True`` (what the
client used to do: a netrc lookup in an executor and a proxy lookup per request) vs the proxy
resolved once per session (what it does now). Same process, same local server, interleaved.

    python benchmarks/client_trust_env.py --requests 2000 --concurrency 64 --repeats 5

The server is a bare aiohttp app in its own process (answers at once); the client CPU is
``resource.getrusage`` user+sys of this process around the requests only. Prints the median ms of
client CPU per request for each variant and their ratio (the machine's load average is printed:
only the ratio within one run counts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}).encode()
ANSWER = json.dumps({"choices": [{"message": {"content": "{}"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()


def serve(port: int) -> None:
    from aiohttp import web

    async def chat(request):
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def run(url: str, n: int, c: int, trust_env: bool) -> float:
    import aiohttp

    from negsynth.llm.wire import proxy_for

    proxy = None if trust_env else proxy_for(url)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=c + 8, limit_per_host=0), trust_env=trust_env, headers={"Content-Type": "application/json"}
    ) as s:
        sem = asyncio.Semaphore(c)

        async def one():
            async with sem:
                kw = {} if trust_env else {"proxy": proxy}
                async with s.post(url, data=BODY, **kw) as r:
                    await r.read()

        await asyncio.gather(*(one() for _ in range(50)))  # warm the pool
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.gather(*(one() for _ in range(n)))
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    return 1000 * ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--_serve", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._serve:
        serve(a._serve)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([sys.executable, __file__, "--_serve", str(port)])
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        res: dict[str, list[float]] = {"trust_env=True (before)": [], "proxy resolved once (now)": []}
        for _ in range(a.repeats):  # interleaved
            res["trust_env=True (before)"].append(asyncio.run(run(url, a.requests, a.concurrency, True)))
            res["proxy resolved once (now)"].append(asyncio.run(run(url, a.requests, a.concurrency, False)))
        print(f"load average {os.getloadavg()[0]:.2f}; {a.requests} requests x {a.repeats} repeats, C={a.concurrency}")
        med = {k: statistics.median(v) for k, v in res.items()}
        for k, v in res.items():
            print(f"{k:28s} median {med[k]:.3f} ms CPU/request  (runs: {', '.join(f'{x:.3f}' for x in v)})")
        before, now = med["trust_env=True (before)"], med["proxy resolved once (now)"]
        print(f"saved {before - now:.3f} ms per request; now / before = {now / before:.2f}")
    finally:
        srv.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
