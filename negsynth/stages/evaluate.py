"""Stage — evaluate: the trained model (and its base, as baseline) on the offline mini-MTEB.

In:  ``RUN_DIR/train/final`` (or ``evaluate.model``; with no trained model and ``embedder.kind =
     "decoder"``, the zero-shot decoder embedder that ``[embedder]`` describes), benchmark files in ``evaluate.data_dir``
     (default ``../shared/data``). When no data is reachable it says so in one line and returns.
Out: ``RUN_DIR/evaluate/report.json`` (and ``baseline.json``), ``summary.json`` = ``stats.json``; its
     summary (:func:`report`) is the table of tasks and categories with the delta against the baseline.

``evaluate.model`` and ``evaluate.baseline`` choose the models (the ``evaluate`` command's
``--model`` and ``--baseline`` set them). With no evaluation data the stage is skipped, its stats
saying where to get some (``negsynth run`` ends its pipeline with that line; the ``evaluate``
command fails with it).
"""

from __future__ import annotations

from pathlib import Path

from negsynth.data.shards import atomic_write_json
from negsynth.embed import embedder_for
from negsynth.errors import UserError
from negsynth.pipeline import Stage, StageContext, Summary
from negsynth.schemas.config import EvaluateConfig

NAME = "evaluate"


def run(ctx: StageContext) -> dict:
    """Evaluate the trained model and its baseline; with no evaluation data, skipped stats whose
    ``reason`` says how to get some."""
    from negsynth.evaluate import EvalDataError, UnknownTask, evaluate, load_report, write_report
    from negsynth.evaluate.cache import default_folder
    from negsynth.evaluate.mteb_engine import MtebUnavailable

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
        try:
            emb = embedder_for(
                m,
                batch_size=ec.batch_size,
                instruct_queries=ec.instruct_queries,
                embedder=emb_cfg,
                what="evaluate --model (or --baseline)",
                backend=ec.backend,
                dtype=ec.dtype,
            )
        except ValueError as e:  # the embedder refused its settings (method, pooling, ...)
            raise UserError(f"evaluate: model {m!r}: {e}; fix [embedder] or pass --model (or --baseline) another model") from None
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

    def nothing(rep: dict) -> dict:
        reason = "; ".join(rep.get("notes", [])) or "no evaluation data"
        return {"stage": NAME, "skipped": True, "reason": reason}

    base_rep = one(baseline, out / "baseline.json") if baseline else None
    if base_rep is not None and not base_rep.get("tasks") and not base_rep.get("skipped"):
        return nothing(base_rep)
    rep = one(model, out / "report.json")
    if not rep.get("tasks"):
        return nothing(rep)
    summary = {
        "stage": NAME,
        "model": model,
        "baseline": baseline,
        "average": rep.get("average"),
        "categories": rep.get("categories"),
        "baseline_average": base_rep.get("average") if base_rep else None,
        "report": str(out / "report.json"),
    }
    atomic_write_json(out / "summary.json", summary)
    return summary


def report(stats: dict) -> list[Summary]:
    """The table of tasks, category means and average (with the baseline and the deltas), read
    back from the reports the stage wrote; skipped tasks and notes below it."""
    from negsynth.evaluate import load_report
    from negsynth.evaluate.runner import report_notes, table_rows

    rep = load_report(stats["report"])
    base = None
    if stats.get("baseline"):
        saved = Path(stats["baseline"])
        base = load_report(saved if saved.suffix == ".json" and saved.is_file() else Path(stats["report"]).with_name("baseline.json"))
    title, header, rows = table_rows(rep, base)
    out = [Summary(title, [tuple(r) for r in rows], header)]
    notes = report_notes(rep, base)
    if notes:
        out.append(Summary("notes", [(n,) for n in notes], ("",)))
    return out


class Evaluate(Stage):
    """The benchmark report: see the module's docstring."""

    name = NAME
    summary = "the benchmark report"
    config = EvaluateConfig
    relaunch = "always"

    def run(self, ctx: StageContext) -> dict:
        return run(ctx)

    def report(self, stats: dict) -> list[Summary]:
        return report(stats)


STAGE = Evaluate()
