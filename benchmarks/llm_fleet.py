"""The embedded LLM as a fleet of single-threaded servers vs one multi-threaded server, side by side.

Each arm is a ``--set`` of ``[serve]`` for the same ``negsynth`` command, on a fresh run dir:

``single``   one llama-server with ``--single-threads`` threads (default: every usable CPU) and
             its prompt cache on, the embedded LLM as negsynth started it before the fleet on a
             quiet machine (``serve.servers = 1``, ``serve.n_threads = T``, ``serve.prompt_cache = true``);
``single-auto`` the same with the threads chosen as before the fleet: the cores free when it
             starts (``serve.n_threads = 0``; on a busy machine fewer than every CPU);
``fleet2``   two single-threaded, single-slot servers behind the endpoint router
             (``serve.servers = 2``, ``serve.n_threads = 1``), each request's shared prefix
             pinned (``serve.prompt_cache = "pinned"``): the default on a quiet 2-core machine;
``fleet1``   one such server (``serve.servers = 1``): the fleet's answers with one server, for
             the byte comparison;
``fleet2-whole`` / ``fleet1-whole`` the same with every prompt evaluated whole
             (``serve.prompt_cache = "off"``, the default before the pin);
``fleet2-pc`` ``fleet2`` with llama-server's plain prompt cache (``serve.prompt_cache = "on"``):
             its answers depend on each server's history.

Workloads (``--workloads``):

``corpus``    ``negsynth corpus`` on the first ``--docs`` documents of ``--input`` (default:
              SciFact's corpus.jsonl), written to ``OUT/corpus-N.jsonl`` as the stage's input
              (so mining's index holds those documents only and the figure is mostly the
              LLM's), with the default config: one query per document, mined negatives;
``generate``  the demo's ``generate`` stage (default config, ``--examples`` items) from one
              brainstormed run dir, copied per run (as benchmarks/demo_generate.py).

Every repetition runs every arm, the order rotated (interleaved), ``llm.max_concurrency`` as in
the default config unless ``--concurrency``. Reported, medians over ``--repeats``: the stage's own
``wall_time_s``, documents (or items) per minute, requests/s, prompt and completion tokens/s (the
stage's token counts over its wall time), the ratio to ``single``, the servers' peak resident
memory (``/proc``, sampled every 0.5 s, per server), the load average before each run; and the
stage's output shards compared byte for byte across repetitions and across arms (``fleet1`` and
``fleet2`` should agree, as should ``fleet1-whole`` and ``fleet2-whole``; a pinned prefix gives
other answers than a whole prompt, and ``single``'s other thread count others again).

    python benchmarks/llm_fleet.py --workloads corpus --docs 150 --repeats 3 --out /tmp/llm-fleet
    python benchmarks/llm_fleet.py --workloads corpus,generate --docs 40 --examples 24 --repeats 3 --out /tmp/llm-fleet
    python benchmarks/llm_fleet.py --determinism 16 --out /tmp/llm-fleet-det    # the answer check alone

**The physical limit** (``--ceiling``): after each repetition, llama.cpp's own
``llama-batched-bench`` on the same GGUF with every usable CPU's thread, B sequences decoded
together (``--ceiling-batches``), each sequence as long as the workload's mean request (its prompt
and completion tokens per request, measured in that repetition's reference arm). A request there
costs what one of ours costs in tokens, without HTTP, JSON, sampling constraints or the schema's
grammar; its best requests/s over B is the ceiling the table puts beside the arms. The tool is
built from the same llama.cpp source as the server (``ninja -C <build dir> bin/llama-batched-bench``;
``--batched-bench`` points at it, else it is looked for beside the built server).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCIFACT = Path("/work/shared/data/scifact/corpus.jsonl")


def arms(single_threads: int) -> dict[str, list[str]]:
    return {
        "single": ["serve.servers=1", f"serve.n_threads={single_threads}", "serve.prompt_cache=true"],
        "single-auto": ["serve.servers=1", "serve.n_threads=0", "serve.prompt_cache=true"],
        "fleet2": ["serve.servers=2", "serve.n_threads=1", "serve.prompt_cache=pinned"],
        "fleet1": ["serve.servers=1", "serve.n_threads=1", "serve.prompt_cache=pinned"],
        "fleet2-whole": ["serve.servers=2", "serve.n_threads=1", "serve.prompt_cache=off"],
        "fleet1-whole": ["serve.servers=1", "serve.n_threads=1", "serve.prompt_cache=off"],
        "fleet2-pc": ["serve.servers=2", "serve.n_threads=1", "serve.prompt_cache=on"],
    }


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(p.name))
    return out


def _rss_mib(pid: int) -> tuple[str, float] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    name = next((line.split()[1] for line in status.splitlines() if line.startswith("Name:")), "")
    rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return name, rss / 1024


class ServerRSS:
    """Peak resident memory per llama-server process among the children of ``pid`` (sampled)."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid, self.interval = pid, interval
        self.peak: dict[int, float] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for c in _children(self.pid):
                got = _rss_mib(c)
                if got and got[0].startswith("llama-server"):
                    self.peak[c] = max(self.peak.get(c, 0.0), got[1])

    def stop(self) -> list[float]:
        self._stop.set()
        self._t.join()
        return sorted(self.peak.values())


def negsynth(args: list[str]) -> tuple[float, list[float]]:
    """Run ``python -m negsynth ARGS``; its wall time and its servers' peak RSS (MiB)."""
    cmd = [sys.executable, "-m", "negsynth", *args, "--quiet", "--json"]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mem = ServerRSS(p.pid)
    out, err = p.communicate()
    rss = mem.stop()
    if p.returncode != 0:
        sys.exit(f"llm_fleet: {' '.join(cmd)} failed ({p.returncode}): {err.strip()[-600:]}")
    return time.perf_counter() - t0, rss


def shard_digest(stage_dir: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(stage_dir.glob("shard-*.jsonl")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def corpus_input(a) -> Path:
    """The first ``--docs`` lines of ``--input``, as a file of their own under ``--out``."""
    path = a.out / f"corpus-{a.docs}.jsonl"
    if not path.is_file():
        with open(a.input, encoding="utf-8") as f:
            lines = [line for _, line in zip(range(a.docs), f)]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(lines), encoding="utf-8")
        tmp.replace(path)
    return path


def run_corpus(a, arm_sets: list[str], d: Path) -> tuple[dict, float, list[float]]:
    sets = [*([f"llm.max_concurrency={a.concurrency}"] if a.concurrency else []), *arm_sets]
    args = ["corpus", "--input", str(corpus_input(a)), "-d", str(d)]
    for s in sets:
        args += ["--set", s]
    wall, rss = negsynth(args)
    return json.loads((d / "corpus" / "stats.json").read_text()), wall, rss


def run_generate(a, arm_sets: list[str], d: Path, base: Path) -> tuple[dict, float, list[float]]:
    shutil.copytree(base, d)
    (d / "embedded-server.json").unlink(missing_ok=True)  # brainstorm's servers are not this run's
    sets = [f"generate.examples={a.examples}", *([f"llm.max_concurrency={a.concurrency}"] if a.concurrency else []), *arm_sets]
    args = ["run", "-d", str(d), "--stages", "generate"]
    for s in sets:
        args += ["--set", s]
    wall, rss = negsynth(args)
    return json.loads((d / "generate" / "stats.json").read_text()), wall, rss


def determinism(n: int, log_dir: Path, server_path: str | None = None) -> None:
    """Does an answer depend on the server, its prompt cache or the order? ``n`` of the demo's
    generate requests (benchmarks/llm_server.py), each arm on fresh servers:

    ``fresh``      one single-threaded server, prompt cache off (every prompt evaluated whole,
                   as by a server that never saw another request), in order: the reference;
    ``cached``     the same with the prompt cache on (each request after others that share its
                   system prompt and worked example: prefix hits);
    ``fleet2-rev`` two single-threaded servers, prompt cache off, the requests in reverse order,
                   one in flight per server (which server gets which: whichever is free);
    ``single-2t``  one server with 2 threads, prompt cache off (the thread count's own effect).
    """
    import queue

    import httpx

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from llm_server import demo_requests

    from negsynth.llm.fleet import EmbeddedFleet
    from negsynth.llm.server import _free_port
    from negsynth.schemas.config import ServeConfig

    # those that share a worked example side by side, so the prompt cache has prefixes to reuse
    bodies = sorted(demo_requests(n), key=lambda b: json.dumps(b["messages"][:-1]))

    def run(servers: int, threads: int, order: list[int], cache: bool) -> tuple[dict[int, str], dict[int, int], float]:
        cfg = ServeConfig(
            server_path=server_path,
            port=_free_port("127.0.0.1"),
            servers=servers,
            n_threads=threads,
            startup_timeout=300,
            prompt_cache=cache,
        )
        todo: queue.Queue = queue.Queue()
        for i in order:
            todo.put(i)
        texts: dict[int, str] = {}
        cached: dict[int, int] = {}
        with EmbeddedFleet(cfg, "smollm2-135m-instruct", log_dir=log_dir / f"s{servers}t{threads}{'c' if cache else 'n'}") as fleet:

            def worker(url: str) -> None:
                with httpx.Client(timeout=600) as c:
                    while True:
                        try:
                            i = todo.get_nowait()
                        except queue.Empty:
                            return
                        body = bodies[i]
                        r = c.post(url + "/chat/completions", json=body)
                        r.raise_for_status()
                        o = r.json()
                        texts[i] = o["choices"][0]["message"]["content"]
                        cached[i] = o["usage"]["prompt_tokens"] - o["timings"]["prompt_n"]

            t0 = time.perf_counter()
            ts = [threading.Thread(target=worker, args=(u,)) for u in fleet.urls]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return texts, cached, time.perf_counter() - t0

    fwd, rev = list(range(n)), list(reversed(range(n)))
    ref, _, ref_s = run(1, 1, fwd, cache=False)
    print(f"{n} demo generate requests; load average {os.getloadavg()[0]:.2f}")
    print(f"fresh       (1 server, 1 thread, prompt cache off): {ref_s:6.1f} s")
    for name, servers, threads, order, cache in (
        ("cached", 1, 1, fwd, True),
        ("fleet2-rev", 2, 1, rev, False),
        ("single-2t", 1, 2, fwd, False),
    ):
        texts, cached, secs = run(servers, threads, order, cache=cache)
        same = sum(texts[i] == ref[i] for i in range(n))
        hits = sum(1 for i in range(n) if cached[i] > 0)
        print(
            f"{name:11s} ({servers} server(s), {threads} thread(s), prompt cache {'on' if cache else 'off'}): {secs:6.1f} s; same text as fresh {same}/{n}; "
            f"{hits} requests took a cached prefix (median {statistics.median(cached.values()):.0f} tokens)",
            flush=True,
        )
    print(f"load average at end {os.getloadavg()[0]:.2f}")


def find_batched_bench(given: str | None) -> Path | None:
    if given:
        return Path(given)
    hits = sorted((Path.home() / ".cache" / "negsynth").glob("llama-server-*/build-*/bin/llama-batched-bench"))
    return hits[-1] if hits else None


def batched_ceiling(binary: Path, n_prompt: int, n_gen: int, batches: list[int], threads: int, shared: bool = False) -> list[dict]:
    """``llama-batched-bench`` at each B: B sequences of ``n_prompt`` + ``n_gen`` tokens decoded
    together; requests/s = B / its total time. ``shared``: the B sequences share one prompt
    (``-pps``), computed once — the bound for servers that reuse a common prefix (a prompt cache).
    Its markdown table is parsed (columns PP, TG, B, N_KV, T_PP, S_PP, T_TG, S_TG, T, S)."""
    from negsynth.resources import smollm2_gguf_path

    ctx = max(batches) * (n_prompt + n_gen) + 64
    cmd = [str(binary), "-m", str(smollm2_gguf_path()), "-c", str(ctx), "-b", "2048", "-ub", "512", "-t", str(threads)]
    cmd += ["-npp", str(n_prompt), "-ntg", str(n_gen), "-npl", ",".join(map(str, batches))] + (["-pps"] if shared else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[0].isdigit():
            b, total = int(cells[2]), float(cells[8])
            rows.append({"batch": b, "total_s": total, "req_s": b / total, "pp_tok_s": float(cells[5]), "tg_tok_s": float(cells[7])})
    if not rows:
        raise SystemExit(f"llama-batched-bench printed no table: {' '.join(cmd)}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="corpus", help="corpus, generate or both (comma-separated)")
    ap.add_argument("--arms", default="single,fleet2,fleet1", help="the first is the reference")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--docs", type=int, default=150, help="corpus: the first N documents of --input")
    ap.add_argument("--input", type=Path, default=SCIFACT, help="corpus: a BEIR corpus.jsonl")
    ap.add_argument("--examples", type=int, default=72, help="generate: generate.examples (the demo's default config: 72 items)")
    ap.add_argument("--concurrency", type=int, default=None, help="llm.max_concurrency (default: the config's)")
    ap.add_argument("--single-threads", type=int, default=len(os.sched_getaffinity(0)), help="threads of the single server")
    ap.add_argument("--out", type=Path, required=True, help="run dirs and results.json go here")
    ap.add_argument("--server-path", default=None, help="serve.server_path for every arm (default: the built llama-server)")
    ap.add_argument("--determinism", type=int, default=0, metavar="N", help="only the answer check on N demo requests (see determinism())")
    ap.add_argument("--ceiling", action="store_true", help="also llama-batched-bench on the workload's mean request, each repetition")
    ap.add_argument("--ceiling-batches", default="1,2,4,8,16", help="the B values of --ceiling")
    ap.add_argument("--batched-bench", default=None, help="the llama-batched-bench binary (default: beside the built llama-server)")
    a = ap.parse_args()
    bench_bin = find_batched_bench(a.batched_bench) if a.ceiling else None
    if a.ceiling and (bench_bin is None or not bench_bin.is_file()):
        ap.error(
            "--ceiling: no llama-batched-bench; build it with `ninja -C ~/.cache/negsynth/llama-server-<version>/build-native bin/llama-batched-bench` or pass --batched-bench"
        )
    if a.determinism:
        a.out.mkdir(parents=True, exist_ok=True)
        determinism(a.determinism, a.out, a.server_path)
        return
    names = [x.strip() for x in a.arms.split(",") if x.strip()]
    table = arms(a.single_threads)
    if a.server_path:
        table = {n: [*sets, f"serve.server_path={a.server_path}"] for n, sets in table.items()}
    workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    a.out.mkdir(parents=True, exist_ok=True)
    base = a.out / "brainstormed"
    if "generate" in workloads and not (base / "brainstorm" / "stats.json").is_file():
        shutil.rmtree(base, ignore_errors=True)
        negsynth(["run", "-d", str(base), "--stages", "brainstorm"])
    results: dict[str, dict[str, list[dict]]] = {w: {n: [] for n in names} for w in workloads}
    ceilings: dict[str, list[dict]] = {w: [] for w in workloads}
    t_start, load_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()[0]
    for rep in range(a.repeats):
        for w in workloads:
            for n in names[rep % len(names) :] + names[: rep % len(names)]:
                d = a.out / w / f"{n}-rep{rep + 1}"
                shutil.rmtree(d, ignore_errors=True)
                load = os.getloadavg()[0]
                st, wall, rss = run_corpus(a, table[n], d) if w == "corpus" else run_generate(a, table[n], d, base)
                tok = st.get("tokens") or {}
                s = st["wall_time_s"]
                units = a.docs if w == "corpus" else st.get("items", a.examples)
                r = {
                    "stage_s": s,
                    "command_s": round(wall, 1),
                    "per_min": units / s * 60,
                    "requests": st.get("attempts"),
                    "req_s": (st.get("attempts") or 0) / s,
                    "prompt_tok_s": tok.get("prompt", 0) / s,
                    "completion_tok_s": tok.get("completion", 0) / s,
                    "valid": st.get("valid"),
                    "load": round(load, 2),
                    "server_rss_mib": [round(x) for x in rss],
                    "digest": shard_digest(d / w),
                    "server": json.loads((d / "embedded-server.json").read_text()) if (d / "embedded-server.json").is_file() else {},
                }
                results[w][n].append(r)
                print(
                    f"rep {rep + 1} {w:8s} {n:7s} stage {s:6.1f} s  {r['per_min']:5.1f}/min  requests {r['requests']}  "
                    f"valid {r['valid']}  load {load:.2f}  servers {r['server']}  rss {r['server_rss_mib']}  shards {r['digest']}",
                    flush=True,
                )
            if bench_bin is not None:  # the same repetition's reference arm gives the request's mean length
                ref = results[w][names[0]][-1]
                per = max(1, ref["requests"] or 1)
                n_prompt = round(ref["prompt_tok_s"] * ref["stage_s"] / per)
                n_gen = max(1, round(ref["completion_tok_s"] * ref["stage_s"] / per))
                load = os.getloadavg()[0]
                bs, threads = [int(b) for b in a.ceiling_batches.split(",")], len(os.sched_getaffinity(0))
                rows = batched_ceiling(bench_bin, n_prompt, n_gen, bs, threads)
                shared = batched_ceiling(bench_bin, n_prompt, n_gen, bs, threads, shared=True)
                best, best_shared = max(rows, key=lambda r: r["req_s"]), max(shared, key=lambda r: r["req_s"])
                entry = {"n_prompt": n_prompt, "n_gen": n_gen, "load": round(load, 2), "rows": rows, "best": best}
                ceilings[w].append({**entry, "shared": shared, "best_shared": best_shared})
                print(
                    f"rep {rep + 1} {w:8s} ceiling  {n_prompt}+{n_gen} tokens/request: best B={best['batch']} {best['req_s']:.2f} requests/s "
                    f"(B=1: {rows[0]['req_s']:.2f}); one shared prompt: B={best_shared['batch']} {best_shared['req_s']:.2f}  load {load:.2f}",
                    flush=True,
                )
    med = statistics.median
    print(f"\n{len(os.sched_getaffinity(0))} CPUs; {a.repeats} repetitions, order rotated; medians; started {t_start}")
    for w, by_arm in results.items():
        unit = "docs" if w == "corpus" else "items"
        ref = med(r["per_min"] for r in by_arm[names[0]])
        print(f"\n{w} ({a.docs if w == 'corpus' else a.examples} {unit})\n")
        print(
            f"| arm | stage s | {unit}/min | vs {names[0]} | requests/s | prompt tok/s | completion tok/s | requests | server RSS MiB | same shards every rep |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for n in names:
            rs = by_arm[n]
            pm = med(r["per_min"] for r in rs)
            same = len({r["digest"] for r in rs}) == 1
            rss = sorted({x for r in rs for x in r["server_rss_mib"]})
            print(
                f"| {n} | {med(r['stage_s'] for r in rs):.1f} | {pm:.1f} | {pm / ref:.2f}x | {med(r['req_s'] for r in rs):.2f} | "
                f"{med(r['prompt_tok_s'] for r in rs):.0f} | {med(r['completion_tok_s'] for r in rs):.1f} | {med(r['requests'] for r in rs):.0f} | "
                f"{rss[0] if rss else '?'}-{rss[-1] if rss else '?'} | {'yes' if same else 'NO'} |"
            )
        if ceilings[w]:
            c = ceilings[w]
            best_rs = med(x["best"]["req_s"] for x in c)
            print(
                f"| llama-batched-bench (ceiling; {c[0]['n_prompt']}+{c[0]['n_gen']} tokens a request, best B "
                f"{sorted({x['best']['batch'] for x in c})}) | | | | {best_rs:.2f} | | | | | |"
            )
            shared_rs = med(x["best_shared"]["req_s"] for x in c)
            print(f"| llama-batched-bench, one prompt shared by the batch (-pps: a prefix-cache bound) | | | | {shared_rs:.2f} | | | | | |")
            for n in names:
                got = med(r["req_s"] for r in by_arm[n])
                print(f"{n}: {got / best_rs:.2f} of the ceiling's requests/s, {got / shared_rs:.2f} of the shared-prompt bound")
        digests = {n: {r["digest"] for r in by_arm[n]} for n in names}
        for x in names:
            for y in names:
                if x < y:
                    print(f"shards {x} vs {y}: {'identical' if digests[x] == digests[y] and len(digests[x]) == 1 else 'differ'}")
        loads = [r["load"] for rs in by_arm.values() for r in rs]
        print(f"load average before each run: {min(loads):.2f}-{max(loads):.2f}")
    print(f"load average at start {load_start:.2f}, at end {os.getloadavg()[0]:.2f}")
    (a.out / "results.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": results, "ceilings": ceilings}, indent=1)
    )


if __name__ == "__main__":
    main()
