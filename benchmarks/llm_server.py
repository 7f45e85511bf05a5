"""The embedded LLM engines side by side on the demo's own `generate` requests.

The requests are the exact JSON bodies the generate stage sends for the demo config
(``negsynth/defaults/default.toml``: SmolLM2-135M-Instruct, temperature 0.7, seed 0 + item k,
max_tokens 700, ``response_format = {"type": "json_object", "schema": ...}``), built with the
stage's own functions (``plan_items``, ``build_messages``, ``output_schema``,
``LLMClient.payload``) from a fixed set of brainstorm-like tasks; ``--requests`` of them, spread
over the task types. Arms:

``python-server``  (a) ``python -m llama_cpp.server`` as negsynth starts it with
                   ``serve.engine = "llama-cpp-python"`` (today's default settings);
``llama-server``   (b) llama.cpp's llama-server as negsynth starts it (``serve.engine =
                   "llama-server"``, slots = the concurrency, threads = the cores free);
``in-process``     (c) ``llama_cpp.Llama`` in a child process on the same GGUF, n_ctx 4096,
                   the same threads as (b) (``--ref-threads``), one request after another,
                   sampling as the servers do (top_k 40, min_p 0.05, repeat penalty 1.1).

Each repetition runs every arm in turn (interleaved), a fresh server per arm; the request set
is sent at ``--concurrency`` (default 2, the demo's ``llm.max_concurrency``). Reported, medians
over ``--repeats``: wall time of the request set, prompt tokens/s and generated tokens/s
(server-side timings per request: llama-server's ``timings``, the Python server's
``llama_perf_context_print`` log lines, the reference's ``llama_perf_context``; prompt tokens
are all the request's tokens, cached prefix included, so prompt caching counts as speed), and
completion tokens per second of wall time. Also: for each arm, how many requests gave the
same text in every repetition (determinism), and the load average before and after.

    python benchmarks/llm_server.py                          # 16 requests, C = 2, 3 repeats
    python benchmarks/llm_server.py --busy 1                 # with one CPU-burning process
    python benchmarks/llm_server.py --determinism            # seed / slot / batching checks only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# brainstorm-like tasks (the demo's come from SmolLM2's own brainstorm; these keep the requests fixed)
TASKS = {
    "short-long": [
        "Given a question about personal finance, retrieve a blog post that answers it.",
        "Given a product name, retrieve customer reviews that discuss its durability.",
        "Given a short medical question, retrieve a patient leaflet that answers it.",
    ],
    "long-short": [
        "Given a movie plot summary, identify the genre of the movie.",
        "Classify an email by whether it asks for a refund, a repair or information.",
        "Given a paragraph from a travel guide, name the city it describes.",
    ],
    "long-long": [
        "Given a bug report, retrieve an earlier bug report describing the same problem.",
        "Given a job posting, retrieve a resume summary that fits it.",
        "Given a news article, retrieve an article reporting the same event from another source.",
    ],
    "short-short": [
        "Given a chemical element, retrieve its symbol.",
        "Given a book title, retrieve the name of its author.",
        "Given a search query, retrieve a query with the same intent.",
    ],
}


def demo_requests(n: int) -> list[dict]:
    """``n`` request bodies of the demo's generate stage, spread evenly over its items."""
    from negsynth.llm.client import LLMClient, response_format_for
    from negsynth.schemas.config_io import load_config
    from negsynth.schemas.outputs import output_schema
    from negsynth.schemas.records import STS_TASK, Task
    from negsynth.stages.generate import build_messages, plan_items

    cfg = load_config()
    gen = cfg.generate
    tasks = {tt: [Task(id=f"t-{tt}-{i}", task_type=tt, task=t) for i, t in enumerate(ts)] for tt, ts in TASKS.items()}
    tasks["sts"] = [Task(id="task-sts-fixed", task_type="sts", task=STS_TASK, model="fixed")]  # as brainstorm adds it
    ctx = SimpleNamespace(cfg=cfg, reporter=SimpleNamespace(warn=print, info=print))
    items = plan_items(ctx, tasks)
    step = len(items) / n
    out = []
    for j in range(n):
        p = items[int(j * step)].payload
        tt = p["task_type"]
        msgs = build_messages(tt, p["task"], p["attributes"], few_shot=gen.few_shot, shot=p.get("shot", 0))
        rf = response_format_for(
            cfg.llm.structured_output, output_schema(tt, max_query=gen.max_query_chars, max_doc=gen.max_doc_chars), "example"
        )
        out.append(LLMClient.payload(SimpleNamespace(cfg=cfg.llm), msgs, response_format=rf, temperature=None, sample_index=p["k"]))
    return out


# -- the servers ----------------------------------------------------------------------------
# llama-cpp-python's defaults: n_threads = cpu_count // 2 (generation), n_threads_batch = cpu_count (prompt)
PY_SERVER_THREADS = f"{max((os.cpu_count() or 2) // 2, 1)} gen / {os.cpu_count() or 1} prompt"
PERF = re.compile(r"llama_perf_context_print:\s+(prompt eval|eval) time =\s+([\d.]+) ms /\s+(\d+)")


def post_all(base_url: str, bodies: list[dict], concurrency: int) -> tuple[float, list[dict]]:
    import httpx

    def one(body: dict) -> dict:
        with httpx.Client(timeout=600) as c:
            t0 = time.perf_counter()
            r = c.post(base_url + "/chat/completions", json=body)
            r.raise_for_status()
            o = r.json()
            o["_latency"] = time.perf_counter() - t0
            return o

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        res = list(ex.map(one, bodies))
    return time.perf_counter() - t0, res


def run_server(
    engine: str,
    bodies: list[dict],
    concurrency: int,
    log: Path,
    slots: int | None = None,
    threads: int | None = None,
    extra: list[str] = (),
) -> dict:
    from negsynth.llm.server import EmbeddedServer, _free_port
    from negsynth.schemas.config import ServeConfig

    log.unlink(missing_ok=True)
    cfg = ServeConfig(
        engine=engine, port=_free_port("127.0.0.1"), n_ctx=4096, startup_timeout=300, n_threads=threads, extra_args=list(extra)
    )
    srv = EmbeddedServer(cfg, "smollm2-135m-instruct", log_path=log, slots=slots or concurrency)
    with srv:
        # warm-up (page the model in), not counted; a prompt of its own, so that no measured request
        # is an exact repeat of one the server holds (llama-server would evaluate only its last token)
        warm = {**bodies[0], "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
        warm.pop("response_format", None)
        post_all(srv.base_url, [warm], 1)
        log_mark = log.stat().st_size
        wall, res = post_all(srv.base_url, bodies, concurrency)
    texts = [r["choices"][0]["message"]["content"] for r in res]
    pt = sum(r["usage"]["prompt_tokens"] for r in res)
    ct = sum(r["usage"]["completion_tokens"] for r in res)
    if engine == "llama-server":
        p_ms = sum(r["timings"]["prompt_ms"] for r in res)
        g_ms = sum(r["timings"]["predicted_ms"] for r in res)
        p_eval = sum(r["timings"]["prompt_n"] for r in res)
    else:  # the Python server logs llama.cpp's perf counters after every request
        text = log.read_bytes()[log_mark:].decode("utf-8", "replace")
        m = PERF.findall(text)
        p_ms = sum(float(ms) for k, ms, _ in m if k == "prompt eval")
        g_ms = sum(float(ms) for k, ms, _ in m if k == "eval")
        p_eval = sum(int(n) for k, _, n in m if k == "prompt eval")
    return {
        "wall": wall,
        "prompt_tokens": pt,
        "completion_tokens": ct,
        "prompt_ms": p_ms,
        "gen_ms": g_ms,
        "prompt_evaluated": p_eval,
        "texts": texts,
        "threads": srv.threads or PY_SERVER_THREADS,
        "slots": srv.slots,
    }


# -- the in-process reference (a child process) ---------------------------------------------
def reference_child(bodies_path: str, threads: int) -> None:
    import llama_cpp

    from negsynth.resources import smollm2_gguf_path

    bodies = json.loads(Path(bodies_path).read_text())
    llm = llama_cpp.Llama(str(smollm2_gguf_path()), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    keys = ("temperature", "top_p", "max_tokens", "seed", "response_format")
    # sample as both servers do: llama-cpp-python's server defaults (llama-server gets them from negsynth)
    sampling = {"top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1}
    llm.create_chat_completion(messages=bodies[0]["messages"], **sampling, **{k: bodies[0][k] for k in keys if k in bodies[0]})  # warm-up
    out, p_ms, g_ms, p_eval = [], 0.0, 0.0, 0
    t0 = time.perf_counter()
    for b in bodies:
        llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
        r = llm.create_chat_completion(messages=b["messages"], **sampling, **{k: b[k] for k in keys if k in b})
        perf = llama_cpp.llama_perf_context(llm._ctx.ctx)
        p_ms += perf.t_p_eval_ms
        g_ms += perf.t_eval_ms
        p_eval += perf.n_p_eval
        out.append(r)
    wall = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "wall": wall,
                "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in out),
                "completion_tokens": sum(r["usage"]["completion_tokens"] for r in out),
                "prompt_ms": p_ms,
                "gen_ms": g_ms,
                "prompt_evaluated": p_eval,
                "texts": [r["choices"][0]["message"]["content"] for r in out],
                "threads": threads,
                "slots": 1,
            }
        )
    )


def run_reference(bodies_path: Path, threads: int) -> dict:
    r = subprocess.run(
        [sys.executable, __file__, "--_reference", str(bodies_path), "--ref-threads", str(threads)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- determinism ------------------------------------------------------------------------------
def determinism(bodies: list[dict], tmp: Path) -> None:
    """Is one request's answer the same (a) twice in a row (the second from a cached prompt),
    (b) on a fresh server, (c) with another request decoding beside it in the other slot, (d)
    under another seed (it must differ)? For llama-server with 2 slots and the Python server."""
    from negsynth.llm.server import EmbeddedServer, _free_port
    from negsynth.schemas.config import ServeConfig

    probe, others = bodies[0], bodies[1:4]
    for engine in ("llama-server", "llama-cpp-python"):
        answers: dict[str, str] = {}
        for fresh in range(2):
            cfg = ServeConfig(engine=engine, port=_free_port("127.0.0.1"), startup_timeout=300)
            with EmbeddedServer(cfg, "smollm2-135m-instruct", log_path=tmp / f"det-{engine}.log", slots=2) as srv:
                for i in range(2):
                    answers[f"server {fresh + 1}, alone, try {i + 1}"] = post_all(srv.base_url, [probe], 1)[1][0]["choices"][0]["message"][
                        "content"
                    ]
                if fresh == 0:
                    for j, o in enumerate(others):
                        _, res = post_all(srv.base_url, [probe, o], 2)
                        answers[f"server 1, beside request {j + 1}"] = res[0]["choices"][0]["message"]["content"]
                    answers["server 1, seed + 1000 (must differ)"] = post_all(srv.base_url, [{**probe, "seed": probe["seed"] + 1000}], 1)[
                        1
                    ][0]["choices"][0]["message"]["content"]
        ref = answers["server 1, alone, try 1"]
        print(f"\n{engine}: the same request (seed {probe['seed']}) -> same answer as the first?")
        for k, v in answers.items():
            same = v == ref
            where = (
                ""
                if same
                else f" (first difference at character {next((i for i, (a, b) in enumerate(zip(v, ref)) if a != b), min(len(v), len(ref)))} of {len(ref)})"
            )
            print(f"  {k:42s} {'same' if same else 'DIFFERENT'}{where}")


# -- driver --------------------------------------------------------------------------------------
def burner() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=16, help="how many of the demo's generate requests (default 16)")
    ap.add_argument("--concurrency", type=int, default=2, help="requests in flight for the server arms (default 2, the demo's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--arms",
        default="python-server,llama-server,in-process",
        help="comma-separated; ENGINE@C runs a server arm at concurrency C (llama-server: C slots), e.g. llama-server@4; "
        "ENGINE@S/C: S slots, C requests in flight (llama-server@1/2: one slot, requests queued in arrival order); "
        "a suffix :tN fixes the threads (serve.n_threads = N) instead of choosing them from the load, e.g. llama-server@1/2:t2; "
        "+FLAG+VALUE... appends server flags (serve.extra_args), e.g. llama-server@1/1:t1+--spec-type+ngram-simple",
    )
    ap.add_argument("--ref-threads", type=int, default=None, help="threads of the in-process reference (default: what llama-server chose)")
    ap.add_argument("--busy", type=int, default=0, help="CPU-burning processes running throughout (started --busy-warmup s before)")
    ap.add_argument(
        "--busy-warmup",
        type=float,
        default=60.0,
        help="seconds between starting the burners and the first arm (the load average needs ~1 min)",
    )
    ap.add_argument("--determinism", action="store_true", help="only the determinism checks")
    ap.add_argument("--json", type=Path, default=None, help="also write every measurement here")
    ap.add_argument("--_reference", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._reference:
        return reference_child(a._reference, a.ref_threads)

    from negsynth.llm.server import choose_threads, find_llama_server

    bodies = demo_requests(a.requests)
    arms = [s.strip() for s in a.arms.split(",") if s.strip()]
    if any(arm.startswith("llama-server") for arm in arms) and find_llama_server() is None:
        sys.exit("no llama-server binary: bash scripts/build_llama_server.sh (or drop it from --arms)")
    burners = [burner() for _ in range(a.busy)]
    try:
        if burners:
            print(f"{a.busy} busy process(es) started; waiting {a.busy_warmup:.0f} s for the load average", flush=True)
            time.sleep(a.busy_warmup)
        with tempfile.TemporaryDirectory() as td:
            tmp = Path(td)
            if a.determinism:
                return determinism(bodies, tmp)
            bodies_path = tmp / "bodies.json"
            bodies_path.write_text(json.dumps(bodies))
            load0 = os.getloadavg()
            started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            runs: dict[str, list[dict]] = {arm: [] for arm in arms}
            for rep in range(a.repeats):
                for arm in arms:
                    la = os.getloadavg()[0]
                    base, *extra = arm.split("+")
                    name, _, tn = base.partition(":t")
                    threads = int(tn) if tn else None
                    if name == "in-process":
                        r = run_reference(bodies_path, threads or a.ref_threads or choose_threads())
                    else:  # "ENGINE@C": this arm at concurrency (and slots) C; "ENGINE@S/C": S slots, C in flight
                        engine, _, spec = name.partition("@")
                        slots, _, conc = spec.partition("/")
                        r = run_server(
                            "llama-cpp-python" if engine == "python-server" else "llama-server",
                            bodies,
                            int(conc or slots) if spec else a.concurrency,
                            tmp / f"{arm.replace('/', 'x')}.log",
                            slots=int(slots) if spec else None,
                            threads=threads,
                            extra=extra,
                        )
                    r["load"] = la
                    runs[arm].append(r)
                    print(
                        f"rep {rep + 1} {arm:14s} wall {r['wall']:6.1f} s  {r['prompt_tokens']} + {r['completion_tokens']} tokens  threads {r['threads']}  load {la:.2f}",
                        flush=True,
                    )
            load1 = os.getloadavg()
    finally:
        for b in burners:
            b.send_signal(signal.SIGKILL)
            b.wait()

    med = statistics.median
    base = med(r["wall"] for r in runs[arms[0]])
    print(
        f"\n{started}, {a.requests} demo generate requests, concurrency {a.concurrency} (in-process: 1), {a.repeats} repeats, medians;"
        f" {len(os.sched_getaffinity(0))} CPUs, {a.busy} busy process(es), load average {load0[0]:.2f} before / {load1[0]:.2f} after\n"
    )
    print(
        f"| engine | threads | slots | wall s | vs {arms[0]} | prompt tok/s | gen tok/s | completion tok/s (wall) | prompt + completion tokens | same text every repeat | same text as {arms[0]} |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ref_texts = runs[arms[0]][0]["texts"]
    for arm in arms:
        rs = runs[arm]
        wall = med(r["wall"] for r in rs)
        ptps = med(r["prompt_tokens"] / (r["prompt_ms"] / 1e3) if r["prompt_ms"] else float("nan") for r in rs)
        gtps = med(r["completion_tokens"] / (r["gen_ms"] / 1e3) if r["gen_ms"] else float("nan") for r in rs)
        ctps = med(r["completion_tokens"] / r["wall"] for r in rs)
        same = sum(len({r["texts"][i] for r in rs}) == 1 for i in range(len(rs[0]["texts"])))
        as_ref = sum(all(r["texts"][i] == ref_texts[i] for r in rs) for i in range(len(ref_texts)))
        threads = "/".join(sorted({str(r["threads"]) for r in rs}))
        print(
            f"| {arm} | {threads} | {rs[0]['slots']} | {wall:.1f} | {base / wall:.2f}x | {ptps:.0f} | {gtps:.1f} | {ctps:.1f} | {med(r['prompt_tokens'] for r in rs):.0f} + {med(r['completion_tokens'] for r in rs):.0f} | {same}/{len(rs[0]['texts'])} | {as_ref}/{len(ref_texts)} |"
        )
    if a.json:
        a.json.write_text(
            json.dumps(
                {"started": started, "args": {k: str(v) for k, v in vars(a).items()}, "load": [load0, load1], "runs": runs}, indent=1
            )
        )


if __name__ == "__main__":
    main()
