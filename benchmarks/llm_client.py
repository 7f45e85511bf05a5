"""The LLM client's CPU per request at 64 requests in flight, against a local fake server.

The server is another process (a small asyncio HTTP/1.1 server answering every chat request after
``--latency`` seconds with a ~2 KB completion), pinned to the last CPU; each client run is a fresh
process pinned to the first, so only the client's own work is counted (``getrusage`` of the client
process around the requests, after a warm-up). Arms:

``client``      negsynth's client as a stage opens it (:func:`negsynth.llm.session.open_client`: request
                cache on disk, rate limiter, transport retries) asking ``structured`` with a
                schema and a validator: cache key, SQLite write, SDK call, JSON extraction;
``sdk``         the openai SDK alone on the same HTTP client (its aiohttp one), ``post`` of the
                same bodies: the floor the client stands on;
``sdk-httpx``   the SDK on its default (httpx) HTTP client, for comparison.

Runs are interleaved (repetition r runs every arm before r+1), ``--repeats`` times (default 3);
the table gives medians of CPU ms per request and requests/s, and the load average before and
after (a shared machine moves every figure; compare arms within one run).

    python benchmarks/llm_client.py                        # 2,000 requests, 64 in flight, 3 repeats
    python benchmarks/llm_client.py --arms client --profile   # where the client's CPU goes
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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("client", "sdk", "sdk-httpx")


# -- the server ----------------------------------------------------------------------------------
def serve(port: int, latency: float) -> None:
    """Answer ``/v1/models`` at once and every ``/v1/chat/completions`` after ``latency`` seconds."""
    content = json.dumps({"tasks": [f"a retrieval task number {i} about a topic long enough to be realistic" for i in range(20)]})
    chat = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 500, "completion_tokens": 120, "total_tokens": 620},
        }
    ).encode()
    models = b'{"object":"list","data":[{"id":"fake","object":"model"}]}'

    class Conn(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buf = transport, b""

        def data_received(self, data):
            self.buf += data
            while (end := self.buf.find(b"\r\n\r\n")) >= 0:
                head = self.buf[:end].decode("latin-1").split("\r\n")
                length = next((int(h.split(":", 1)[1]) for h in head[1:] if h.lower().startswith("content-length:")), 0)
                if len(self.buf) < end + 4 + length:
                    return
                self.buf = self.buf[end + 4 + length :]
                is_chat = head[0].split(" ")[1].endswith("/chat/completions")
                body = chat if is_chat else models
                out = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                asyncio.get_running_loop().call_later(latency if is_chat else 0, self.write, out)

        def write(self, out):
            if not self.transport.is_closing():
                self.transport.write(out)

    async def main():
        server = await asyncio.get_running_loop().create_server(Conn, "127.0.0.1", port, backlog=4096)
        await server.serve_forever()

    asyncio.run(main())


# -- one client run (in its own process) ---------------------------------------------------------
def messages(i: int) -> list[dict]:
    """A generate-sized request (~3 KB), different for each ``i`` (no cache hit)."""
    return [
        {"role": "system", "content": "You write hard negatives for retrieval training. " * 12},
        {"role": "user", "content": f"Task {i}: " + "write a query, a positive document and four hard negatives. " * 40},
    ]


async def run_arm(arm: str, url: str, n: int, concurrency: int, warm: int, cache_dir: Path, profile: bool = False) -> float:
    """Send ``warm`` then ``n`` requests, ``concurrency`` at once; the CPU seconds of the ``n``
    (``profile``: their cProfile, top 25 by own time, to stderr)."""
    sem = asyncio.Semaphore(concurrency)

    async def measured(one) -> float:
        await asyncio.gather(*(one(-1 - i) for i in range(warm)))
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.gather(*(one(i) for i in range(n)))
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        if profile:
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
        return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)

    if arm == "client":
        from negsynth.llm.session import open_client
        from negsynth.schemas.config import LLMConfig

        cfg = LLMConfig(base_url=url, model="fake", max_concurrency=concurrency, timeout=60, max_tokens=600)
        schema = {"type": "object", "properties": {"tasks": {"type": "array", "items": {"type": "string"}}}, "required": ["tasks"]}

        def validate(obj):
            if not isinstance(obj.get("tasks"), list):
                raise ValueError("no tasks")
            return obj["tasks"]

        async with open_client(cfg, base_url=url, cache_path=cache_dir / "llm.sqlite", stage="bench") as client:

            async def one(i):
                res = await client.structured(messages(i), validate=validate, schema=schema)
                assert res.value is not None, res.reason

            return await measured(one)

    import openai

    http = openai.DefaultAioHttpClient() if arm == "sdk" else openai.DefaultAsyncHttpxClient()
    sdk = openai.AsyncOpenAI(base_url=url, api_key="sk-none", max_retries=0, http_client=http)
    try:

        async def one(i):
            async with sem:
                body = json.dumps({"model": "fake", "messages": messages(i), "max_tokens": 600}).encode()
                raw = await sdk.post("/chat/completions", cast_to=bytes, content=body)
                json.loads(raw)["choices"][0]["message"]["content"]

        return await measured(one)
    finally:
        await sdk.close()


def child(arm: str, url: str, n: int, concurrency: int, warm: int, profile: bool) -> None:
    _pin(0)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        cpu = asyncio.run(run_arm(arm, url, n, concurrency, warm, Path(d), profile))
        wall = time.perf_counter() - t0
    print(json.dumps({"arm": arm, "cpu_ms": 1000 * cpu / n, "rps": (n + warm) / wall}))


def _pin(which: int) -> None:
    """Run on the first (0) or last (-1) CPU this process may use, where the OS allows it."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 1:
            os.sched_setaffinity(0, {cpus[which]})
    except (AttributeError, OSError):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.05, help="seconds the fake server takes per chat request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--profile", action="store_true", help="cProfile one run of the first arm (to stderr) instead")
    ap.add_argument("--out", type=Path, help="also write the results as JSON here")
    ap.add_argument("--child", nargs=2, metavar=("ARM", "URL"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    warm = max(a.concurrency, a.requests // 10)
    if a.child:
        return child(a.child[0], a.child[1], a.requests, a.concurrency, warm, a.profile)
    port = _free_port()
    here = str(Path(__file__).resolve().parent)
    srv = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {here!r}); from llm_client import serve, _pin; _pin(-1); serve({port}, {a.latency})",
        ]
    )
    url = f"http://127.0.0.1:{port}/v1"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        load = [os.getloadavg()[0]]
        runs: dict[str, list[dict]] = {arm: [] for arm in a.arms}
        for _ in range(1 if a.profile else a.repeats):
            for arm in a.arms[:1] if a.profile else a.arms:
                cmd = [sys.executable, __file__, "--child", arm, url, "--requests", str(a.requests), "--concurrency", str(a.concurrency)]
                out = subprocess.run([*cmd, *(["--profile"] if a.profile else [])], capture_output=True, text=True, env=env, check=False)
                if out.returncode != 0:
                    sys.exit(f"{arm}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
                if a.profile:
                    print(out.stderr)
                runs[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
        load.append(os.getloadavg()[0])
    finally:
        srv.terminate()
        srv.wait()
    rows = {arm: {k: statistics.median(r[k] for r in rs) for k in ("cpu_ms", "rps")} for arm, rs in runs.items() if rs}
    print(f"{a.requests} requests, {a.concurrency} in flight, {a.latency * 1000:.0f} ms server latency, {a.repeats} repeats (medians);")
    print(f"load average {load[0]:.2f} before, {load[-1]:.2f} after, {os.cpu_count()} CPUs\n")
    print("| arm | client CPU ms / request | requests / s | requests / s per client core |")
    print("|---|---:|---:|---:|")
    for arm, r in rows.items():
        print(f"| {arm} | {r['cpu_ms']:.2f} | {r['rps']:.0f} | {1000 / r['cpu_ms']:.0f} |")
    if a.out:
        a.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "load": load, "runs": runs, "medians": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
