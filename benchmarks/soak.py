"""A soak of the `corpus` stage: thousands of documents against a faulty fake server, killed and
resumed, through a full outage, checking that nothing is lost, duplicated or paid twice.

What runs is ``python -m negsynth corpus`` as a user runs it, a child process, against the tests'
real-socket fake OpenAI server (``tests/fake_openai.py``) in this process. The server answers
each request about the document in its prompt (valid JSON: queries built from the document's
words) except for ``--fault-rate`` of the requests (default 25 %), drawn with the seed, in this
mix: HTTP 500 (6/25), 429 with ``Retry-After: 1`` (5/25), a hang past ``llm.timeout`` then a
dropped connection (3/25), a 200 whose content is truncated JSON (a paid answer the validator
re-asks, 6/25), a connection reset with no answer (5/25). Every answered request waits
``--latency`` first. The process is SIGKILLed when ``--kill-at`` fractions of the documents are
done (one kill per fraction, each in a fresh process, the command rerun as is to resume), and
the server goes away for ``--outage-s`` seconds (connections refused) when ``--outage-at`` of
them are done; the last process must finish with exit 0.

Documents: the first ``--docs`` of ``/work/shared/data/scifact/corpus.jsonl`` (``--scifact``)
where it exists, topped up with seeded synthetic abstracts where it holds fewer (``--source
synthetic``: all synthetic). They are written to ``--out`` (never the repository). Passages are
not split (``corpus.chunk_tokens = 0``), so the stage's items are the documents.

Checks (each a verdict in ``results.json``; the script exits 1 when one fails):

* ``accounted``: every document has exactly one valid record (an example) or one reject with
  a reason in the final shards, no id twice, none missing, no ``.partial`` left, ``stats.json``
  complete with ``items`` = documents and nothing pending;
* ``resent_within_in_flight``: per kill, the bodies the next processes sent again that
  the server had already answered (a 200 delivered before the kill) is at most the requests in
  flight at the kill: the documents a request had been sent for and that the killed process had
  not recorded (in a partial or finished shard), or, where documents were re-asked, the distinct
  answered bodies of those documents (``paid_unrecorded_requests``: a re-asked document had two).
  A body counts once however often it is retried (``resent_requests`` counts every send: a
  re-sent body that meets an injected fault is sent again); ``repaid``, the re-sends answered
  again, is held to the same bound. ``open_at_server`` (received, not yet answered) and
  ``answered_unrecorded`` (answered, item not yet written) break the bound down;
* ``no_repaid_within_a_run``: no answered body is sent again by the same process (an outage's
  requeued items come from the cache);
* ``rss_flat``: the resident memory of the negsynth process (``/proc/PID/status`` VmRSS, sampled
  every ``--sample-s``) in steady state (samples after the process wrote its first record, so
  start-up and the corpus embedding are not counted): no process grew or shrank by more than
  ``--rss-tolerance`` (10 %) from its first to its last tenth of samples, and the medians while
  the first ``W`` and the last ``W`` documents were done (``W`` = 1,000, or a tenth of the
  documents when fewer than 10,000) did not grow by more than it. A drop over the run is
  reported (``within_plus_minus``), not failed: the first process embedded the corpus and keeps
  that heap, a resumed one loads the cached vectors;
* ``outage_ridden_out``: the process the outage hit did not exit 4 (nor anything but 0 or our
  SIGKILL) and made progress after the server came back; its ``waiting:`` / ``resumed:`` lines;
* ``kills``: every planned kill happened; ``last_exit_0``: the last process finished with exit 0;
  ``verify``: ``negsynth corpus ... --verify`` on the finished run dir exits 0 and sends no
  request; ``requests_matched_documents``: the server found every request's document.

The stage runs with its defaults: the real embedder (MiniLM, offline) mines each query's
negatives. Machine load (``os.getloadavg``) is recorded at the start and the end, with the date;
``ledger.jsonl`` (every request) and ``rss.jsonl`` (every sample) go beside ``results.json``::

    nice -n 19 python3 benchmarks/soak.py --docs 2000 --out /tmp/soak-2k
    python3 benchmarks/soak.py --docs 300 --outage-s 5 --out /tmp/soak-300          # while developing
    python3 benchmarks/soak.py --docs 60 --kill-at 0.3 --outage-at 0.6 --outage-s 3 --out /tmp/soak-tiny
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import harness

ROOT = harness.ROOT
SCIFACT = Path(os.environ.get("NEGSYNTH_DATA_DIR") or ROOT.parent / "shared" / "data") / "scifact" / "corpus.jsonl"

#: the fault mix, as shares of ``--fault-rate`` (sum 1)
FAULTS = {"http500": 6, "http429": 5, "hang": 3, "malformed_json": 6, "reset": 5}


# -- documents ------------------------------------------------------------------------------
TOPICS = "insulin receptor;tumour suppressor;gut microbiota;T cell exhaustion;amyloid plaques;vitamin D;statin therapy;HIV latency;malaria vaccine;CRISPR screening;sleep deprivation;air pollution;opioid receptor;bone density;hepatitis C;influenza antigen;mitochondrial fission;stem cell niche;blood pressure;kidney fibrosis".split(
    ";"
)
SUBJECTS = "mice;adult patients;children;a cohort of 2,400 women;zebrafish larvae;cultured neurons;elderly adults;healthy volunteers;rats;human organoids".split(
    ";"
)
VERBS = "increased;reduced;did not change;reversed;predicted;was associated with;doubled;abolished;delayed;enhanced".split(";")
OUTCOMES = "mortality;insulin sensitivity;tumour growth;cognitive decline;viral load;inflammation markers;fracture risk;weight gain;relapse rates;cardiac output".split(
    ";"
)


def synthetic_docs(n: int, seed: int, start: int = 0) -> list[dict]:
    """``n`` seeded abstract-like documents (a title and 4-8 sentences), ids ``syn-<i>``."""
    rng = random.Random(f"{seed}:docs")
    docs = []
    for i in range(start, start + n):
        a, b = rng.sample(TOPICS, 2)
        title = f"{a.capitalize()} and {b} in {rng.choice(SUBJECTS)}: study {i}"
        sents = []
        for _ in range(rng.randint(4, 8)):
            sents.append(
                f"In {rng.choice(SUBJECTS)}, {rng.choice(TOPICS)} {rng.choice(VERBS)} {rng.choice(OUTCOMES)} "
                f"over {rng.randint(2, 52)} weeks (n = {rng.randint(12, 4000)}, p = 0.0{rng.randint(1, 9)})."
            )
        docs.append({"_id": f"syn-{i}", "title": title, "text": " ".join(sents)})
    return docs


def load_docs(n: int, source: str, scifact: Path, seed: int) -> tuple[list[dict], dict]:
    """``n`` documents: SciFact's first ones where it exists (topped up with synthetic ones), or synthetic."""
    docs: list[dict] = []
    if source in ("auto", "scifact") and scifact.is_file():
        seen: set[str] = set()
        with open(scifact) as f:
            for line in f:
                if len(docs) >= n:
                    break
                d = json.loads(line)
                key = _norm(f"{d.get('title', '')} {d['text']}")[:200]
                if not d["text"].strip() or key in seen:  # an empty or repeated text: the prompt could not tell them apart
                    continue
                seen.add(key)
                docs.append({"_id": str(d["_id"]), "title": d.get("title", ""), "text": d["text"]})
    elif source == "scifact":
        raise SystemExit(f"{scifact}: not found (use --source synthetic)")
    from_scifact = len(docs)
    docs += synthetic_docs(n - len(docs), seed, start=len(docs))
    return docs, {"scifact": from_scifact, "synthetic": len(docs) - from_scifact}


def _norm(text: str) -> str:
    return " ".join(text.split())


# -- the fake server ------------------------------------------------------------------------
def _document_of(req: dict) -> str | None:
    """The document in a corpus request's prompt (cut to doc_tokens, maybe ending " ...")."""
    for m in reversed(req.get("messages") or []):
        if m.get("role") == "user" and m.get("content", "").startswith("Document: "):
            found = re.match(r"Document: (.*?)\n\nWrite", m["content"], re.S)
            return found.group(1) if found else None
    return None


def _n_queries(req: dict) -> int:
    try:
        return int(req["response_format"]["schema"]["properties"]["queries"]["minItems"])
    except (KeyError, TypeError, ValueError):
        return 1


def valid_content(req: dict, doc: str) -> str:
    """A valid answer about ``doc``: queries built from its words."""
    words = [w.lower() for w in re.findall(r"[A-Za-z]{4,}", doc)] or ["topic", "study", "finding"]
    h = int(hashlib.blake2b(doc.encode(), digest_size=8).hexdigest(), 16)
    qs = []
    for j in range(_n_queries(req)):
        a, b = words[(h + j) % len(words)], words[(h // 7 + 3 * j + 1) % len(words)]
        qs.append(f"what is known about {a} and {b} in question {j + 1}?")
    return json.dumps({"queries": qs})


class SoakServer:
    """The tests' fake server with a seeded fault mix, and a ledger of every chat request: which
    process sent it, for which document, with which body, and whether an answer was delivered."""

    def __init__(self, docs: list[tuple[str, str]], *, fault_rate: float, seed: int, latency: float, hang_s: float):
        sys.path.insert(0, str(ROOT / "tests"))
        from fake_openai import FakeOpenAI, Reply

        self.Reply = Reply
        self.rng = random.Random(f"{seed}:faults")
        self.fault_rate, self.latency, self.hang_s = fault_rate, latency, hang_s
        self.lock = threading.Lock()
        self.run = 0  # the negsynth process now running (0, 1, ...)
        self.killed: set[int] = set()  # processes SIGKILLed: what the server finishes for them is never delivered
        self.open = 0  # requests received and not yet answered
        #: one row per chat request: [process, body digest, document id, outcome]; outcome is
        #: "paid" (a 200 completion delivered), a fault kind, "down" or "after_kill"
        self.ledger: list[list] = []
        self.faults: Counter = Counter()
        self.by_prefix: dict[str, list[tuple[str, str]]] = {}
        for doc_id, text in docs:
            text = _norm(text)
            self.by_prefix.setdefault(text[:80], []).append((doc_id, text))
        self.unknown_docs = 0
        self.t0 = time.monotonic()
        self.fake = FakeOpenAI(self.respond)

    def doc_id(self, req: dict) -> str:
        doc = _document_of(req)
        if doc is None:
            return "?"
        doc = _norm(doc)
        cands = self.by_prefix.get(doc[:80], [])
        cut = doc[:-4] if doc.endswith(" ...") else doc
        for i, text in cands:
            if text.startswith(cut):
                return i
        return "?"

    def respond(self, req: dict, n: int):
        Reply = self.Reply
        digest = hashlib.blake2b(json.dumps(req, sort_keys=True).encode(), digest_size=16).digest()
        doc_id = self.doc_id(req)
        with self.lock:
            run = self.run
            row = [run, digest, doc_id, None, round(time.monotonic() - self.t0, 3)]
            self.ledger.append(row)
            self.open += 1
            if doc_id == "?":
                self.unknown_docs += 1
            u = self.rng.random()
        with self.fake._lock:  # the fake keeps every body; the ledger has what the soak needs
            self.fake.requests.clear()
            self.fake.headers.clear()
        try:
            kind = None
            if u < self.fault_rate:
                x, total = u / self.fault_rate * sum(FAULTS.values()), 0
                for kind, share in FAULTS.items():  # noqa: B007 - the kind drawn is the one the loop stops at
                    total += share
                    if x < total:
                        break
            if kind == "http500":
                reply = Reply(status=500)
            elif kind == "http429":
                reply = Reply(status=429, headers={"Retry-After": "1"})
            elif kind == "hang":
                time.sleep(self.hang_s)
                reply = Reply(reset=True)
            elif kind == "reset":
                reply = Reply(reset=True)
            else:
                time.sleep(self.latency)
                content = valid_content(req, _document_of(req) or "")
                if kind == "malformed_json":
                    content = content[: len(content) // 2]
                reply = Reply(content=content, prompt_tokens=400, completion_tokens=60)
            with self.lock:
                if self.fake.down:
                    row[3] = "down"
                    reply = Reply(reset=True)
                elif run in self.killed:
                    row[3] = "after_kill"
                else:
                    row[3] = "paid" if reply.status == 200 and not reply.reset else kind
                if kind:  # drawn (a truncated answer is a paid 200: its outcome says "paid")
                    self.faults[kind] += 1
            return reply
        finally:
            with self.lock:
                self.open -= 1


# -- the run dir ----------------------------------------------------------------------------
def recorded(stage_dir: Path) -> tuple[Counter, int]:
    """Documents recorded in the stage's shards and partials (a partial's pending transport
    failures, which a rerun redoes, are not), and how many rows that is."""
    got: Counter = Counter()
    rows = 0
    for p in sorted(stage_dir.glob("shard-*.jsonl")) + sorted((stage_dir / "rejects").glob("shard-*.jsonl")):
        for line in p.read_text().splitlines():
            if line.strip():
                got[_doc_of_row(json.loads(line))] += 1
                rows += 1
    for p in sorted(stage_dir.glob("shard-*.jsonl.partial")):
        finished = (stage_dir / p.name[: -len(".partial")]).exists()
        for line in p.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # the truncated tail of a kill mid-write
                continue
            if finished or (row["k"] == "rej" and str(row["r"].get("reason", "")).startswith(("transport_", "bad_request"))):
                continue
            got[_doc_of_row(row["r"])] += 1
            rows += 1
    return got, rows


def _doc_of_row(r: dict) -> str:
    if "source_id" in r:  # a record: "<corpus>:<doc id>:<query index>"
        return r["source_id"].split(":", 1)[1].rsplit(":", 1)[0]
    return str((r.get("input") or {}).get("doc_id"))


def lines_done(stage_dir: Path, cache: dict) -> int:
    """Rows written so far (finished shards counted once, partials read each time): progress."""
    n = 0
    for p in stage_dir.glob("shard-*.jsonl*"):
        if p.name.endswith(".tmp"):
            continue
        try:
            if p.name.endswith(".partial"):
                n += p.read_bytes().count(b"\n")
            else:
                if p.name not in cache:
                    cache[p.name] = p.read_bytes().count(b"\n")
                n += cache[p.name]
        except FileNotFoundError:  # a partial renamed away as we looked
            continue
    return n


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# -- the checks (pure: the test feeds them broken inputs) -----------------------------------
def check_accounting(doc_ids: list[str], got: Counter, rows: list[tuple[str, dict]], stats: dict, partials: int) -> dict:
    """Every document once, as a valid record or a reject with a reason."""
    want = Counter(doc_ids)
    missing = [d for d in want if got[d] == 0]
    dup = {d: c for d, c in got.items() if c > 1}
    extra = [d for d in got if d not in want]
    invalid = 0
    no_reason = 0
    for kind, r in rows:
        if kind == "ok":  # an example: an id, a query, its document, its mined negatives
            texts = [r.get("query"), r.get("positive"), *(r.get("negatives") or [None])]
            invalid += not (isinstance(r.get("id"), str) and all(isinstance(t, str) and t.strip() for t in texts))
        elif not r.get("reason"):
            no_reason += 1
    stats_ok = bool(stats.get("complete")) and stats.get("items") == len(doc_ids) and not stats.get("pending")
    ok = not missing and not dup and not extra and not invalid and not no_reason and partials == 0 and stats_ok
    return {
        "ok": ok,
        "documents": len(doc_ids),
        "records": sum(k == "ok" for k, _ in rows),
        "rejects": sum(k == "rej" for k, _ in rows),
        "lost": len(missing),
        "duplicated": sum(c - 1 for c in dup.values()),
        "unknown": len(extra),
        "invalid_records": invalid,
        "rejects_without_reason": no_reason,
        "partials_left": partials,
        "stats_complete": stats_ok,
        "examples_lost": missing[:5],
        "examples_duplicated": list(dup)[:5],
    }


def count_resends(ledger: list[list], kills: list[dict]) -> tuple[list[dict], int]:
    """Per kill, the bodies later processes sent again whose answer had been delivered (paid)
    before it; and the paid bodies a process sent again itself. ``kills[k]["process"]`` is the
    process killed. A body is counted once however many times it is sent: a re-sent body that met
    an injected fault (a reset, a 500) is retried, and each retry costs nothing until one is
    answered; ``resent_requests`` counts them all, ``repaid`` the answered ones."""
    paid_in: dict[bytes, int] = {}  # body -> the process its last delivered answer went to
    bodies: dict[int, set] = {k["process"]: set() for k in kills}
    requests = {k["process"]: 0 for k in kills}
    repaid = {k["process"]: 0 for k in kills}  # of those, the ones answered (paid) again
    within = 0
    for run, digest, _doc, outcome, *_ in ledger:
        before = paid_in.get(digest)
        if before is not None:
            if before < run:  # paid by an earlier (killed) process: charged to the kill just before this process
                charged = max((p for p in bodies if p < run), default=None)
                if charged is not None:
                    bodies[charged].add(digest)
                    requests[charged] += 1
                    repaid[charged] += outcome == "paid"
            else:
                within += 1
        if outcome == "paid":
            paid_in[digest] = run
    out = []
    for k in kills:
        p = k["process"]
        bound = max(k["in_flight"], k.get("paid_unrecorded_requests", 0))
        out.append(
            {
                **k,
                "resent": len(bodies[p]),
                "resent_requests": requests[p],
                "repaid": repaid[p],
                "ok": len(bodies[p]) <= bound and repaid[p] <= bound,
            }
        )
    return out, within


def check_rss(samples: list[tuple[float, int, int, int, int]], docs: int, tolerance: float) -> dict:
    """``samples``: (t, process, rss_kb, done, done_at_process_start). Medians while the first and
    the last ``W`` documents were done, in steady state (the process had written a record; a
    window with no sample takes the nearest one). Flat: no process grew or shrank by more than
    ``tolerance`` from its first to its last tenth, and the run did not grow by more than it
    from the first ``W`` to the last ``W`` (a drop is reported, not a failure: the first process
    embedded the corpus and keeps that heap, a resumed one loads the cached vectors)."""
    w = min(1000, max(1, docs // 10))
    steady = [s for s in samples if s[3] > s[4]]
    if not steady:
        return {"ok": False, "why": "no sample after a process wrote its first record: lower --sample-s", "window_docs": w}
    first = [s[2] for s in steady if s[3] <= w] or [steady[0][2]]
    last = [s[2] for s in steady if s[3] >= docs - w] or [steady[-1][2]]
    per_process = {}
    for proc in sorted({s[1] for s in steady}):
        mine = [s[2] for s in steady if s[1] == proc]
        k = max(1, len(mine) // 10)
        a, b = statistics.median(mine[:k]), statistics.median(mine[-k:])
        per_process[proc] = {
            "samples": len(mine),
            "first_mb": round(a / 1024, 1),
            "last_mb": round(b / 1024, 1),
            "growth": round(b / a - 1, 4),
        }
    a, b = statistics.median(first), statistics.median(last)
    growth = b / a - 1
    worst = max((abs(v["growth"]) for v in per_process.values()), default=0.0)
    return {
        "ok": growth <= tolerance and worst <= tolerance,
        "window_docs": w,
        "first_mb": round(a / 1024, 1),
        "last_mb": round(b / 1024, 1),
        "growth": round(growth, 4),
        "within_plus_minus": abs(growth) <= tolerance,
        "worst_process_growth": worst,
        "tolerance": tolerance,
        "samples_first": len(first),
        "samples_last": len(last),
        "peak_mb": round(max(s[2] for s in samples) / 1024, 1),
        "per_process": per_process,
    }


# -- the soak -------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--source", choices=["auto", "scifact", "synthetic"], default="auto")
    ap.add_argument("--scifact", type=Path, default=SCIFACT)
    ap.add_argument("--fault-rate", type=float, default=0.25)
    ap.add_argument("--kill-at", type=float, nargs="*", default=[0.15, 0.35, 0.55], help="fractions of the documents done")
    ap.add_argument("--outage-at", type=float, default=0.75, help="fraction done when the server goes away (negative: no outage)")
    ap.add_argument("--outage-s", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=16, help="llm.max_concurrency")
    ap.add_argument("--timeout", type=float, default=5.0, help="llm.timeout (a hang lasts this + 1 s)")
    ap.add_argument("--latency", type=float, default=0.05, help="seconds before each answer")
    ap.add_argument("--shard-size", type=int, default=0, help="pipeline.shard_size (0: a twentieth of the documents, 10..1000)")
    ap.add_argument("--sample-s", type=float, default=0.5, help="seconds between RSS / progress samples")
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-timeout", type=float, default=7200.0, help="seconds one negsynth process may take")
    ap.add_argument("--out", type=Path, default=Path("/tmp/soak"))
    a = ap.parse_args(argv)

    import shutil

    import tomli_w

    a.out.mkdir(parents=True, exist_ok=True)
    rd = a.out / "run"
    if rd.exists():
        shutil.rmtree(rd)
    load_start, t_start = os.getloadavg(), time.monotonic()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    docs, sources = load_docs(a.docs, a.source, a.scifact, a.seed)
    corpus = a.out / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    doc_ids = [d["_id"] for d in docs]
    shard_size = a.shard_size or min(1000, max(10, a.docs // 20))

    # the documents as the stage reads them (its title rule, its whitespace): what a prompt shows
    texts = list(harness.documents(corpus).items())
    srv = SoakServer(texts, fault_rate=a.fault_rate, seed=a.seed, latency=a.latency, hang_s=a.timeout + 1)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    kill_at = sorted(a.kill_at)
    samples: list[tuple[float, int, int, int, int]] = []
    kills: list[dict] = []
    runs: list[dict] = []
    outage: dict = {"planned": a.outage_at >= 0, "at_docs": None}
    progress_cache: dict = {}
    stage_dir = rd / "corpus"

    with srv.fake:
        cfg = a.out / "run.toml"
        llm = {"base_url": srv.fake.base_url, "model": "fake", "timeout": a.timeout, "connect_timeout": 2, "max_concurrency": a.concurrency}
        llm |= {"backoff_initial": 0.5, "backoff_max": 10.0}
        corpus_cfg = {"inputs": [{"path": str(corpus)}], "chunk_tokens": 0}
        cfg.write_text(tomli_w.dumps({"llm": llm, "pipeline": {"shard_size": shard_size}, "corpus": corpus_cfg}))
        cmd = [sys.executable, "-m", "negsynth", "corpus", "-c", str(cfg), "-d", str(rd), "-q", "--json"]
        proc_i = 0
        while True:
            with srv.lock:
                srv.run = proc_i
            err_path = a.out / f"stderr-{proc_i}.txt"
            t0 = time.monotonic()
            with open(err_path, "w") as err, open(a.out / f"stdout-{proc_i}.txt", "w") as out:
                p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=ROOT)
                done0 = lines_done(stage_dir, progress_cache)
                this: dict = {"process": proc_i, "done_at_start": done0}
                my_kill = kill_at[len(kills)] if len(kills) < len(kill_at) else None
                while p.poll() is None:
                    if time.monotonic() - t0 > a.run_timeout:
                        break
                    done = lines_done(stage_dir, progress_cache)
                    r = rss_kb(p.pid)
                    if r is not None:
                        samples.append((round(time.monotonic() - t_start, 2), proc_i, r, done, done0))
                    if outage["planned"] and outage["at_docs"] is None and done >= a.outage_at * a.docs:
                        srv.fake.go_down()
                        outage.update(at_docs=done, process=proc_i, start_s=round(time.monotonic() - t_start, 1))
                        threading.Timer(a.outage_s, srv.fake.come_back).start()
                    down_now = srv.fake.down
                    if my_kill is not None and done >= my_kill * a.docs and not down_now:
                        with srv.lock:
                            open_now = srv.open
                            p.send_signal(signal.SIGKILL)
                            srv.killed.add(proc_i)
                        p.wait()
                        kills.append(
                            {"process": proc_i, "at_docs": done, "open_at_server": open_now, "t_s": round(time.monotonic() - t_start, 1)}
                        )
                        break
                    time.sleep(a.sample_s)
                if p.poll() is None:
                    p.kill()
                    p.wait()
                rc = p.wait()
            this.update(exit=rc, wall_s=round(time.monotonic() - t0, 1), done_at_end=lines_done(stage_dir, progress_cache))
            if outage.get("process") == proc_i:
                after = [s for s in samples if s[1] == proc_i and s[0] > outage["start_s"] + a.outage_s]
                outage["progress_after"] = (max(s[3] for s in after) - outage["at_docs"]) if after else 0
                outage["exit"] = rc
                errs = err_path.read_text()
                outage["waiting_lines"] = errs.count("waiting: ")
                outage["resumed_lines"] = errs.count("resumed: ")
            runs.append(this)
            if rc == -signal.SIGKILL and kills and kills[-1]["process"] == proc_i:
                # what the killed process had in flight: documents it sent a request for and had not recorded
                got, _ = recorded(stage_dir)
                with srv.lock:
                    asked = {row[2] for row in srv.ledger}
                    answered = {row[2] for row in srv.ledger if row[3] == "paid" and row[0] == proc_i}
                kills[-1]["in_flight"] = len({d for d in asked if got[d] == 0})
                kills[-1]["answered_unrecorded"] = len({d for d in answered if got[d] == 0})
                # the bound in requests: a document re-asked (an invalid first answer) had two
                # answered bodies in flight, and a resumed run sends both again
                with srv.lock:
                    kills[-1]["paid_unrecorded_requests"] = len(
                        {row[1] for row in srv.ledger if row[0] == proc_i and row[3] == "paid" and got[row[2]] == 0}
                    )
                kills[-1]["recorded_after"] = sum(got.values())
                proc_i += 1
                continue
            break
        while srv.fake.down:  # an outage still on: let it end before the verify run
            time.sleep(0.2)

        final_rc = runs[-1]["exit"]
        # the finished outputs check themselves: sizes and hashes against the manifest, nothing sent
        n_before = len(srv.ledger)
        v = subprocess.run([*cmd, "--verify"], env=env, capture_output=True, text=True, cwd=ROOT, timeout=a.run_timeout)
        verify = {"exit": v.returncode, "requests": len(srv.ledger) - n_before, "stderr_tail": v.stderr[-500:]}
        verify["ok"] = v.returncode == 0 and verify["requests"] == 0

    stats = json.loads((stage_dir / "stats.json").read_text()) if (stage_dir / "stats.json").exists() else {}
    got, _ = recorded(stage_dir)
    rows: list[tuple[str, dict]] = []
    for p in sorted(stage_dir.glob("shard-*.jsonl")):
        rows += [("ok", json.loads(x)) for x in p.read_text().splitlines() if x.strip()]
    for p in sorted((stage_dir / "rejects").glob("shard-*.jsonl")):
        rows += [("rej", json.loads(x)) for x in p.read_text().splitlines() if x.strip()]
    accounting = check_accounting(doc_ids, got, rows, stats, len(list(stage_dir.glob("*.partial"))))
    per_kill, within = count_resends(srv.ledger, kills)
    rss = check_rss(samples, a.docs, a.rss_tolerance)
    outcome = Counter(row[3] for row in srv.ledger)
    if outage["planned"]:
        o = outage
        o["ok"] = o.get("at_docs") is not None and o.get("exit") in (0, -signal.SIGKILL) and o.get("progress_after", 0) > 0
    checks = {
        "accounted": accounting["ok"],
        "resent_within_in_flight": all(k["ok"] for k in per_kill),
        "no_repaid_within_a_run": within == 0,
        "rss_flat": rss["ok"],
        "kills": len(kills) == len(kill_at),
        "last_exit_0": final_rc == 0,
        "verify": verify["ok"],
        "requests_matched_documents": srv.unknown_docs == 0,
    }
    if outage["planned"]:
        checks["outage_ridden_out"] = outage["ok"]
    result = {
        "started": started,
        "args": {k: str(v) for k, v in vars(a).items()},
        "command": " ".join(cmd),
        "documents": a.docs,
        "sources": sources,
        "shard_size": shard_size,
        "wall_s": round(time.monotonic() - t_start, 1),
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "runs": runs,
        "requests": {
            "total": len(srv.ledger),
            "by_outcome": dict(outcome),
            "faults_drawn": dict(srv.faults),
            "fault_share": round(sum(srv.faults.values()) / max(1, len(srv.ledger)), 4),
        },
        "kills": per_kill,
        "repaid_within_a_run": within,
        "outage": outage,
        "accounting": accounting,
        "rss": rss,
        "verify": verify,
        "stats": {k: stats.get(k) for k in ("items", "valid", "rejected", "pending", "complete", "reasons")},
        "this_run": {
            k: (stats.get("this_run") or {}).get(k) for k in ("outage_waits", "outage_wait_s", "requeued", "transport_retries", "reasks")
        },
        "checks": checks,
        "passed": all(checks.values()),
    }
    (a.out / "results.json").write_text(json.dumps(result, indent=1))
    (a.out / "ledger.jsonl").write_text("".join(json.dumps([r[0], r[1].hex(), *r[2:]]) + "\n" for r in srv.ledger))
    (a.out / "rss.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    print(json.dumps({k: result[k] for k in ("documents", "wall_s", "requests", "kills", "accounting", "checks", "passed")}, indent=1))
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}", file=sys.stderr)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
