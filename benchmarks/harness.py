"""What the benchmarks share, one definition each: an argument parser from a script's docstring;
arms x repetitions interleaved, with medians and the machine's load; a process measured from
outside and the peak memory of a block; a results file that parallel processes add to; arms x
seeds with a per-query paired test against a reference arm, printed as a Markdown table; BEIR
files, run-dir shards and the stages run from a run file; sentence-transformers' stock recipe.

The benchmarks use negsynth as a user does: its commands, ``negsynth.run`` / ``load_config`` /
``evaluate_model`` / ``model_path``, ``negsynth.evaluate`` and ``negsynth.train``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------ arguments


def parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose description is ``doc``'s first paragraph and whose epilog is the rest."""
    head, _, rest = doc.strip().partition("\n\n")
    return argparse.ArgumentParser(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)


def int_list(text: str) -> list[int]:
    """``--seeds 0,1,2`` (an argparse ``type``: a bad value is argparse's one-line usage error)."""
    try:
        out = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not out:
        raise argparse.ArgumentTypeError("no value given; e.g. 0")
    return out


def names(text: str, known: Sequence[str], what: str = "arm") -> list[str]:
    """Comma-separated names of ``known`` (or ``all``); anything else stops the run in one line."""
    got = list(known) if text.strip() == "all" else [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in got if a not in known]
    if bad or not got:
        sys.exit(f"{Path(sys.argv[0]).name}: unknown {what}(s) {bad or repr(text)}; choose from {','.join(known)} or 'all'")
    return got


def data_dir(given: str | Path | None = None) -> Path:
    """The shared evaluation data: ``given``, else ``$NEGSYNTH_DATA_DIR``, else ``../shared/data``
    beside the checkout or the working directory (negsynth's own rule); none there: one line."""
    named = given or os.environ.get("NEGSYNTH_DATA_DIR")
    for cand in [named] if named else [ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]:
        if Path(cand).is_dir():
            return Path(cand)
    sys.exit(f"no evaluation data{f' in {named}' if named else ''}: pass --data-dir or set NEGSYNTH_DATA_DIR to the shared data folder")


# ------------------------------------------------------------------------------ timing, load, memory


def machine() -> dict:
    """The machine now: date, usable CPUs, load average over 1, 5 and 15 minutes."""
    return {
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": len(os.sched_getaffinity(0)),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def interleaved(arms: Sequence[str], repeats: int, run: Callable[[str, int], dict]) -> dict[str, list[dict]]:
    """``run(arm, rep)`` for every arm, ``repeats`` times, each repetition in a rotated order (no arm
    always first or last, so a load spike hits them alike); each result gets ``load``, the 1-minute
    load average before it. Returns the results by arm."""
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    for rep in range(repeats):
        for arm in [*arms[rep % len(arms) :], *arms[: rep % len(arms)]]:
            load = os.getloadavg()[0]
            r = run(arm, rep)
            r["load"] = round(load, 2)
            runs[arm].append(r)
            print(f"rep {rep + 1} {arm}: " + ", ".join(f"{k} {v:.4g}" for k, v in r.items() if isinstance(v, float)), flush=True)
    return runs


def median(runs: Iterable[dict], key: str) -> float | None:
    """The median of ``key`` over the runs that recorded it."""
    v = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(v) if v else None


def measured_run(cmd: Sequence[str], cwd: Path = ROOT, env: dict | None = None) -> dict:
    """Run ``cmd`` under ``/usr/bin/time``: ``{"wall_s", "cpu_s", "peak_rss_mb", "stdout"}``, or exit
    with its stderr's tail."""
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %M %U %S", *cmd], capture_output=True, text=True, cwd=cwd, env=env)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))}: exit {out.returncode}\n{out.stderr[-3000:]}")
    _, kb, user, system = next(x for x in reversed(out.stderr.splitlines()) if x.startswith("TIME ")).split()
    return {"wall_s": wall, "cpu_s": float(user) + float(system), "peak_rss_mb": int(kb) / 1024, "stdout": out.stdout}


def negsynth_cli(*args: str) -> list[str]:
    """The command line of ``negsynth ARGS`` with this interpreter."""
    return [sys.executable, "-m", "negsynth", *args]


class PeakRSS:
    """``with PeakRSS() as m: ...; m.peak_mib, m.seconds``: the peak resident memory of this process
    and its children, sampled every ``interval`` s (so a lower bound), and where torch has started
    CUDA, ``gpu_peak_mib``, torch's own peak of allocated GPU memory (exact); None otherwise."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak, self.seconds, self.gpu_peak = interval, 0, 0.0, None
        self._stop = threading.Event()

    @staticmethod
    def _rss() -> int:
        import psutil

        p = psutil.Process()
        total = p.memory_info().rss
        for c in p.children(recursive=True):
            try:
                total += c.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._rss())

    @staticmethod
    def _cuda():
        torch = sys.modules.get("torch")  # never imports torch itself
        return torch.cuda if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def __enter__(self) -> PeakRSS:
        if (cuda := self._cuda()) is not None:
            cuda.reset_peak_memory_stats()
        self._t0, self.peak = time.monotonic(), self._rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak, self.seconds = max(self.peak, self._rss()), time.monotonic() - self._t0
        if (cuda := self._cuda()) is not None:
            self.gpu_peak = cuda.max_memory_allocated()

    @property
    def peak_mib(self) -> int:
        return round(self.peak / 2**20)

    @property
    def gpu_peak_mib(self) -> int | None:
        return None if self.gpu_peak is None else round(self.gpu_peak / 2**20)


# ------------------------------------------------------------------------------ records and tables


def write_record(path: Path | None, args, start: dict, **figures) -> None:
    """``--json PATH``: the arguments, the figures and the machine at the start and the end."""
    if path is not None:
        rec = {"args": {k: str(v) for k, v in vars(args).items()}, **figures, "machine": {"start": start, "end": machine()}}
        Path(path).write_text(json.dumps(rec, indent=1))


def load_results(path: Path) -> list[dict]:
    """The results in ``path`` (``{"args", "results"}``; a bare list from before is read too)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else data["results"]


def save_result(path: Path, r: dict, key: Sequence[str], args=None) -> list[dict]:
    """Add ``r`` to ``path`` (the result with the same ``key`` fields replaced) and return them all.
    The file is read again under a lock right before the write, so the results other processes
    add to the same file meanwhile are kept."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = [x for x in load_results(path) if any(x.get(k) != r.get(k) for k in key)] + [r]
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args or argparse.Namespace()).items()}, "results": results}, indent=1)
        )
        tmp.replace(path)
    return results


def table(head: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A Markdown table, the first column left-aligned and the others right."""
    lines = ["| " + " | ".join(map(str, head)) + " |", "|---|" + "---:|" * (len(head) - 1)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def mean_sd(v: Sequence[float]) -> str:
    """``mean``, with ``± sd`` when there are two or more."""
    return f"{statistics.mean(v):.2f}" + (f" ± {statistics.stdev(v):.2f}" if len(v) > 1 else "")


def seed_scores(runs: Iterable[dict], task: str) -> list[float]:
    """``task``'s score x100 in each run (one per seed) that has it."""
    return [100 * r["scores"][task] for r in runs if task in r.get("scores", {})]


def jobs(arms: Sequence[str], seeds: Sequence[int], more: Callable[[str], bool]) -> list[tuple[str, int]]:
    """Every arm at the first seed, then the further seeds of the arms ``more`` picks: an
    interrupted run has the whole table before any second seed."""
    return [(a, seeds[0]) for a in arms] + [(a, s) for s in seeds[1:] for a in arms if more(a)]


def paired(results: list[dict], arm: str, ref: str, task: str, n_resamples: int = 10000) -> dict | None:
    """``arm`` against ``ref`` on ``task``, query by query (each query's nDCG@10 averaged over an
    arm's seeds): mean difference, 95 % bootstrap CI over queries and seeds, two-sided sign-flip p
    (:func:`negsynth.evaluate.paired_test`); None where either has no per-query scores there."""
    from negsynth.evaluate import paired_test

    def maps(a: str) -> list[dict]:
        return [r["per_query"][task] for r in sorted(results, key=lambda r: r["seed"]) if r["arm"] == a and task in r.get("per_query", {})]

    mine, theirs = maps(arm), maps(ref)
    if not mine or not theirs or arm == ref:
        return None
    qids, b = align(theirs)
    _, a = align(mine, qids)
    return paired_test(a, b, n_resamples=n_resamples, seed=0)


def align(per_query: Sequence[dict[str, float]], qids: Sequence[str] | None = None) -> tuple[list[str], Any]:
    """``[seeds, queries]`` from per-seed ``{query id: score}`` maps, in ``qids`` order (default: the
    sorted ids of the first map). A query missing from any seed is an error: the test is paired."""
    import numpy as np

    if not per_query:
        raise ValueError("no per-query scores")
    ids = list(qids) if qids is not None else sorted(per_query[0])
    missing = [(i, q) for i, m in enumerate(per_query) for q in ids if q not in m]
    if missing:
        i, q = missing[0]
        raise ValueError(f"seed #{i} has no score for query {q!r} ({len(missing)} missing): the arms must be scored on the same queries")
    return ids, np.array([[m[q] for q in ids] for m in per_query], dtype=np.float64)


def paired_cell(t: dict | None) -> str:
    return "-" if t is None else f"{100 * t['mean_diff']:+.2f} [{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}], p {t['p_value']:.3f}"


# ------------------------------------------------------------------------------ data, run dirs, stages


def read_beir(corpus: Path, queries: Path, qrels: Path, *, title: bool = True) -> tuple[dict, dict, list]:
    """``(queries {id: text}, corpus {id: text}, qrels [(query id, doc id, gain)])`` as negsynth reads
    a BEIR folder: a document is ``title + " " + text`` (``title``), texts stripped."""

    def texts(path: Path, with_title: bool) -> dict[str, str]:
        out = {}
        for d in read_jsonl(path):
            t = (d.get("title") or "").strip() if with_title else ""
            out[str(d["_id"])] = f"{t} {d.get('text') or ''}".strip() if t else (d.get("text") or "").strip()
        return out

    lines = qrels.read_text(encoding="utf-8").splitlines()
    cols = lines[0].split("\t")
    q, c, s = (cols.index(k) for k in ("query-id", "corpus-id", "score"))
    rows = [(f[q], f[c], float(f[s])) for f in (line.split("\t") for line in lines[1:] if line.strip())]
    return texts(queries, False), texts(corpus, title), rows


def documents(path: Path) -> dict[str, str]:
    """A corpus JSONL's documents as negsynth's ``corpus`` stage reads them, by id: ``title + " " +
    text``, or the text alone where it opens with its title (Cranfield); empty ones and repeated ids
    left out."""
    out: dict[str, str] = {}
    for d in read_jsonl(path):
        body, title, i = str(d.get("text") or "").strip(), str(d.get("title") or "").strip(), str(d.get("_id", d.get("id")))
        if (body or title) and i not in out:
            out[i] = f"{title} {body}".strip() if title and not body.lower().startswith(title.lower()) else body
    return out


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def records(stage_dir: Path, rejects: bool = False) -> list[dict]:
    """A stage's records (its ``shard-*.jsonl``), or its rejects (``rejects/shard-*.jsonl``)."""
    d = stage_dir / "rejects" if rejects else stage_dir
    return [r for f in sorted(d.glob("shard-*.jsonl")) for r in read_jsonl(f)]


def text_columns(columns: Sequence[str]) -> list[str]:
    """What a training loss embeds: ``anchor, positive`` and ``negative`` or ``negative_1..n``."""
    return ["anchor", "positive", *(c for c in columns if c == "negative" or (c.startswith("negative_") and c[9:].isdigit()))]


def layered(*layers: dict) -> dict:
    """Run-file tables merged key by key, a later layer's key winning (as ``negsynth -c`` layers files)."""

    def merge(a: dict, b: dict) -> dict:
        return {**a, **{k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v for k, v in b.items()}}

    out: dict = {}
    for layer in layers:
        out = merge(out, layer)
    return out


def run_stages(cfg: dict, run_dir: Path, stages: Sequence[str]) -> dict:
    """``stages`` of the run file ``cfg`` (written beside ``run_dir`` as ``pipeline.toml``) in
    ``run_dir``, as ``negsynth run`` runs them (finished stages reused); each stage's stats."""
    import tomli_w

    import negsynth

    path = run_dir.parent / "pipeline.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(cfg))
    return negsynth.run(negsynth.load_config(path), run_dir, stages=list(stages))


def add_llm_args(ap: argparse.ArgumentParser) -> None:
    """The LLM of the arms that ask one (default: the embedded SmolLM2-135M)."""
    ap.add_argument("--llm-base-url", default="embedded")
    ap.add_argument("--llm-model", default="smollm2-135m-instruct")
    ap.add_argument("--llm-key-env", default=None, help="environment variable holding the API key")
    ap.add_argument("--concurrency", type=int, default=2, help="llm.max_concurrency")
    ap.add_argument("--llm-threads", type=int, default=None, help="serve.n_threads of the embedded server (default: the cores free)")
    ap.add_argument("--llm-servers", type=int, default=None, help="serve.servers: embedded servers side by side (default: auto)")


def llm_tables(args, max_tokens: int) -> dict:
    """The ``[llm]`` (and ``[serve]``) tables of :func:`add_llm_args`'s options."""
    llm = {"base_url": args.llm_base_url, "model": args.llm_model, "max_concurrency": args.concurrency, "temperature": 0.7, "seed": 0}
    llm |= {"max_tokens": max_tokens, "max_attempts": 3, "timeout": 300} | ({"api_key_env": args.llm_key_env} if args.llm_key_env else {})
    serve = {k: v for k, v in (("n_threads", args.llm_threads), ("servers", args.llm_servers)) if v}
    return {"llm": llm, **({"serve": serve} if serve else {})}


# ------------------------------------------------------------------------------ models


def evaluate(model: str | None, tasks: list, args, suite: str = "full") -> tuple[dict, dict]:
    """``(main score by task, per-query nDCG@10 by retrieval task)`` of ``model`` (None: the base
    all-MiniLM-L6-v2) on ``args.device`` (``auto``: a GPU when there is one), as ``negsynth evaluate``."""
    import negsynth

    rep = negsynth.evaluate_model(
        model or "default",
        tasks,
        suite=suite,
        overrides=[f"embedder.device={getattr(args, 'device', 'cpu')}"],
        data_dir=args.data_dir,
        per_query=True,
    )
    return (
        {name: float(t["main_score"]) for name, t in rep["tasks"].items()},
        {name: t["per_query"] for name, t in rep["tasks"].items() if "per_query" in t},
    )


def base_model(device: str = "cpu", max_length: int | None = None):
    """all-MiniLM-L6-v2 as sentence-transformers loads it (from the package negsynth bundles)."""
    from sentence_transformers import SentenceTransformer

    import negsynth

    model = SentenceTransformer(negsynth.model_path("default"), device=None if device == "auto" else device)
    if max_length:
        model.max_seq_length = max_length
    return model


def mine_stock(ds, model, corpus: list[str], k: int, cache_folder: Path | None = None):
    """sentence-transformers' ``mine_hard_negatives`` as the stock recipe calls it: ``k`` negatives
    within a relative margin of 0.05 of the positive, the hardest (``top``), its own candidate window."""
    from sentence_transformers.util import mine_hard_negatives

    return mine_hard_negatives(
        ds,
        model,
        corpus=corpus,
        num_negatives=k,
        relative_margin=0.05,
        sampling_strategy="top",
        output_format="triplet" if k == 1 else "n-tuple",
        batch_size=64,
        verbose=False,
        cache_folder=str(cache_folder) if cache_folder else None,
    )


def train_stock_recipe(model, ds, dest: Path, *, batch_size: int, lr: float, seed: int, max_length: int, steps: int | None = None):
    """sentence-transformers' stock recipe: its trainer with ``MultipleNegativesRankingLoss`` (scale
    20), the ``NO_DUPLICATES`` sampler, linear warmup over 10 % of the steps, ``steps`` (None: one
    pass) over ``ds`` (anchor, positive[, negative_1..n]) at ``max_length`` tokens; the model saved to
    ``dest`` at the base model's length, as negsynth saves its own. Returns the trainer
    (``trainer.batch_rows``: the rows of each batch trained: ``NO_DUPLICATES`` leaves a batch short
    where rows share a text)."""
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import set_seed

    set_seed(seed)
    base_len = model.max_seq_length
    model.max_seq_length = max_length
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(dest / "_ckpt"),
        per_device_train_batch_size=batch_size,
        learning_rate=lr,
        **({"num_train_epochs": 1} if steps is None else {"max_steps": steps}),
        warmup_ratio=0.1,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        seed=seed,
        data_seed=seed,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
    )
    loss = MultipleNegativesRankingLoss(model)
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=ds, loss=loss)
    trainer.batch_rows = []
    hook = loss.register_forward_pre_hook(lambda _m, a: trainer.batch_rows.append(int(a[0][0]["input_ids"].shape[0])))
    trainer.train()
    hook.remove()
    model.max_seq_length = base_len  # evaluated like the base model (documents up to 256 tokens)
    model.save(str(dest))
    return trainer
