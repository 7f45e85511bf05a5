"""Stage — evaluate: the trained model (and its base, as baseline) on the offline mini-MTEB, and
the verdict on the team's own documents.

In:  ``RUN_DIR/train/final`` (or ``evaluate.model``; with no trained model and ``embedder.kind =
     "decoder"``, the zero-shot decoder embedder that ``[embedder]`` describes), benchmark files in ``evaluate.data_dir``
     (default ``../shared/data``); ``RUN_DIR/heldout`` (the held-out queries) when that stage ran.
Out: ``RUN_DIR/evaluate/report.json`` (and ``baseline.json``), ``verdict.json`` (every figure of
     the verdict, per query too), ``summary.json`` = ``stats.json``; its summary (:func:`report`)
     is the table of tasks and categories with the delta against the baseline, and the verdict's line.

The verdict (:mod:`negsynth.evaluate.own_corpus`, docs/evaluate.md): each held-out query
searches the whole corpus its set was drawn from, with the model and its baseline. With no
evaluation data and no held-out queries the stage is skipped, its stats' ``reason`` saying where
to get some; with held-out queries alone, the verdict alone.
"""

from __future__ import annotations

from pathlib import Path

from negsynth.data.shards import atomic_write_json
from negsynth.embed import embedder_for
from negsynth.errors import UserError
from negsynth.pipeline import Stage, StageContext, Summary, read_json
from negsynth.schemas.config import EvaluateConfig
from negsynth.stages.common import path_fingerprint
from negsynth.stages.corpus_queries import STYLES

NAME = "evaluate"


def run(ctx: StageContext) -> dict:
    """Evaluate the trained model and its baseline; with no evaluation data, skipped stats whose
    ``reason`` says how to get some."""
    from negsynth.evaluate import EvalDataError, UnknownTask, compare, evaluate, load_report, write_report
    from negsynth.evaluate.cache import default_folder
    from negsynth.evaluate.mteb_engine import MtebUnavailable
    from negsynth.evaluate.own_corpus import general_sets, verdict

    ec = ctx.cfg.evaluate
    out = ctx.run_dir / NAME
    out.mkdir(parents=True, exist_ok=True)
    trained = ctx.run_dir / "train" / "final"
    emb_cfg = ctx.cfg.embedder
    zero_shot = emb_cfg.kind == "decoder" and not trained.is_dir()  # asked for a zero-shot decoder embedder
    default = ("smollm2" if emb_cfg.model == "default" else emb_cfg.model) if zero_shot else ctx.cfg.train.model
    model = ec.model or (str(trained) if trained.is_dir() else default)
    baseline = ec.baseline
    if baseline == "base":
        baseline = ctx.cfg.train.model if Path(model).resolve() != Path(ctx.cfg.train.model).resolve() else None
    quiet = ctx.reporter.quiet

    def one(m: str, dest: Path) -> dict:
        if Path(m).suffix == ".json" and Path(m).is_file():
            return load_report(m)  # a saved report as baseline
        emb = load_embedder(ctx, m)
        try:
            rep = evaluate(
                emb,
                suite=ec.suite,
                data_dir=ec.data_dir,
                tasks=ec.tasks,
                progress=False if quiet else ctx.reporter.progress,  # a bar over the tasks, a line per task
                out=dest,
                seed=ec.seed,
                announce=False,
                engine=ec.engine,
                results_cache=default_folder() if ec.cache else None,
            )
        except (EvalDataError, UnknownTask, MtebUnavailable) as e:
            raise UserError(str(e)) from None
        rep["model"] = m
        write_report(rep, dest)
        return rep

    own, no_verdict = held_out_ranks(ctx, model, baseline)
    base_rep = one(baseline, out / "baseline.json") if baseline else None
    rep = None
    if base_rep is not None and not base_rep.get("tasks") and not base_rep.get("skipped"):
        missing = _no_data(base_rep)
    else:
        rep = one(model, out / "report.json")
        missing = None if rep.get("tasks") else _no_data(rep)
    summary: dict = {"stage": NAME, "model": model, "baseline": baseline}
    if missing is None:
        summary.update(
            average=rep.get("average"),
            categories=rep.get("categories"),
            baseline_average=base_rep.get("average") if base_rep else None,
            report=str(out / "report.json"),
        )
    if own is None and no_verdict is None:  # no held-out stage ran: the benchmark report alone
        if missing is not None:
            return {"stage": NAME, "skipped": True, "reason": missing}
    else:
        compared = compare(rep, base_rep) if missing is None and base_rep and base_rep.get("tasks") else None
        why = missing or ("no baseline to compare with" if base_rep is None else None)
        v = verdict(own, general_sets(compared, why), no_verdict)
        atomic_write_json(out / "verdict.json", v)
        summary["verdict"] = v
    atomic_write_json(out / "summary.json", summary)
    return summary


def load_embedder(ctx: StageContext, m: str):
    """Model ``m`` as the evaluation encodes with it (``[evaluate]``'s backend, precision, batch size)."""
    ec = ctx.cfg.evaluate
    try:
        return embedder_for(
            m,
            batch_size=ec.batch_size,
            instruct_queries=ec.instruct_queries,
            embedder=ctx.cfg.embedder,
            what="evaluate --model (or --baseline)",
            backend=ec.backend,
            dtype=ec.dtype,
        )
    except ValueError as e:  # the embedder refused its settings (method, pooling, ...)
        raise UserError(f"evaluate: model {m!r}: {e}; fix [embedder] or pass --model (or --baseline) another model") from None


def _no_data(rep: dict) -> str:
    """Why a report has no tasks: the sets a data folder lacks, or the notes (no data folder)."""
    skipped = rep.get("skipped") or {}
    if skipped:
        name, why = next(iter(skipped.items()))
        return f"no evaluation set could be read ({len(skipped)} skipped; {name}: {why})"
    return "; ".join(rep.get("notes", [])) or "no evaluation data"


def held_out_ranks(ctx: StageContext, model: str, baseline: str | None) -> tuple[dict | None, str | None]:
    """The held-out queries' comparison of ``model`` with ``baseline``
    (:func:`~negsynth.evaluate.own_corpus.own_corpus`), or why there is none; ``(None, None)``
    where no held-out stage ran."""
    import numpy as np

    from negsynth.data.shards import read_stage
    from negsynth.evaluate.cache import default_folder
    from negsynth.evaluate.own_corpus import corpus_vectors, own_corpus, ranks_of

    folder = ctx.run_dir / "heldout"
    stats = read_json(folder / "stats.json")
    if stats is None:
        return None, None
    if stats.get("skipped"):
        return None, stats.get("reason") or "no held-out set"
    queries = list(read_stage(folder))
    if not queries:
        return None, f"{folder}: no held-out query passed its checks (see {folder / 'rejects'})"
    if baseline is None:
        return (
            None,
            f"nothing to compare with: {model} is the base model (no trained model in RUN_DIR/train/final), or evaluate.baseline is empty",
        )
    if Path(baseline).suffix == ".json":
        return None, f"the baseline is a saved report ({baseline}); the verdict needs the base model itself (evaluate.baseline)"
    leaked = trained_on(ctx.run_dir, {(q["corpus"], q["doc_id"]) for q in queries})
    if leaked:
        return None, (
            f"{leaked} of {len(queries)} held-out documents are positives of training examples in {ctx.run_dir / 'corpus'} "
            "(made before held-out sets existed, or with other heldout settings); rerun corpus and the stages after it with --overwrite"
        )
    corpora, relevant = held_out_corpus(stats["heldout"], queries)
    if isinstance(corpora, str):
        return None, corpora
    ec = ctx.cfg.evaluate
    texts = [q["query"] for q in queries]
    instructions = [STYLES[q["style"]][3] for q in queries]
    count = sum(c.count for c in corpora)
    key = {"inputs": stats["heldout"]["inputs"], "chunks": stats["heldout"]["chunks"], "files": [path_fingerprint(c.path) for c in corpora]}

    def batches():
        return ([d.text for d in docs] for c in corpora for _, docs in c.batches())

    def ranks(m: str, cache: Path | None):
        emb = load_embedder(ctx, m)
        ctx.reporter.info(f"evaluate: {len(texts)} held-out queries over {count} documents with {m} ...")
        docs = corpus_vectors(emb, batches, count, key, cache)
        return ranks_of(emb.encode_queries(texts, instructions), np.asarray(docs), relevant)

    base = ranks(baseline, default_folder() / "corpus-vectors" if ec.cache else None)  # the same on every run of this corpus
    tuned = ranks(model, None)
    return own_corpus(base, tuned, [q["id"] for q in queries], seed=ec.seed), None


def trained_on(run_dir: Path, docs: set[tuple[str, str]]) -> int:
    """How many of ``docs`` (corpus, document id) are the positive of a corpus example of the run."""
    from negsynth.data.shards import read_stage

    seen = set()
    for r in read_stage(run_dir / "corpus"):
        key = ((r.get("meta") or {}).get("corpus"), (r.get("meta") or {}).get("doc_id"))
        if key in docs:
            seen.add(key)
    return len(seen)


def held_out_corpus(held: dict, queries: list[dict]) -> tuple[list | str, list[int]]:
    """The corpus the held-out set was drawn from, read as the corpus stage read it, and each
    query's document's place in it (every input's documents in a row); or why it cannot be read."""
    from negsynth.data.corpus import read_corpus
    from negsynth.schemas.config import CorpusSpec

    try:
        corpora = [read_corpus(CorpusSpec(**s), *held["chunks"]) for s in held["inputs"]]
    except UserError as e:
        return f"the held-out set's corpus cannot be read now ({e})", []
    wanted = {(q["corpus"], q["doc_id"]) for q in queries}
    where: dict[tuple[str, str], int] = {}
    start = 0
    for c in corpora:
        for i, docs in c.batches():
            for j, d in enumerate(docs):
                if (c.name, d.id) in wanted:
                    where.setdefault((c.name, d.id), start + i + j)
        start += c.count
    gone = [k for k in wanted if k not in where]
    if gone:
        return f"{len(gone)} held-out documents are no longer in the corpus (first: {gone[0][1]!r}); rerun heldout with --overwrite", []
    return corpora, [where[(q["corpus"], q["doc_id"])] for q in queries]


def report(stats: dict) -> list[Summary]:
    """The table of tasks, category means and average (with the baseline and the deltas), read
    back from the reports the stage wrote; skipped tasks and notes below it."""
    from negsynth.evaluate import load_report
    from negsynth.evaluate.runner import report_notes, table_rows

    out = []
    if stats.get("report"):
        rep = load_report(stats["report"])
        base = None
        if stats.get("baseline"):
            saved = Path(stats["baseline"])
            base = load_report(saved if saved.suffix == ".json" and saved.is_file() else Path(stats["report"]).with_name("baseline.json"))
        title, header, rows = table_rows(rep, base)
        out.append(Summary(title, [tuple(r) for r in rows], header))
        notes = report_notes(rep, base)
        if notes:
            out.append(Summary("notes", [(n,) for n in notes], ("",)))
    if stats.get("verdict"):
        line = stats["verdict"]["line"].replace("[", "\\[")  # printed as it is ("negsynth[eval]" is no markup)
        out.append(Summary("did it help? (your own documents, held out)", [(line,)], ("",)))
    return out


class Evaluate(Stage):
    """The benchmark report: see the module's docstring."""

    name = NAME
    summary = "the benchmark report"
    config = EvaluateConfig
    relaunch = "always"

    run = staticmethod(run)
    report = staticmethod(report)


STAGE = Evaluate()
