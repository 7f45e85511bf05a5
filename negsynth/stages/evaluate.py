"""Stage — evaluate: the trained model (and its base, as baseline) on the offline mini-MTEB.

In:  ``RUN_DIR/train/final`` (or ``evaluate.model``; with no trained model and ``embedder.kind =
     "decoder"``, the zero-shot decoder embedder that ``[embedder]`` describes), benchmark files in ``evaluate.data_dir``
     (default ``../shared/data``). When no data is reachable it says so in one line and returns.
Out: ``RUN_DIR/evaluate/report.json`` (and ``baseline.json``), ``summary.json`` = ``stats.json``; prints one table per category
     with the delta against the baseline.
"""

from __future__ import annotations

from pathlib import Path

from negsynth.data.shards import atomic_write_json
from negsynth.embed import embedder_for
from negsynth.errors import UserError
from negsynth.pipeline.context import StageContext

STAGE = "evaluate"


def run(ctx: StageContext, model: str | None = None, baseline: str | None = None, *, require_data: bool = False) -> dict:
    """Evaluate the trained model and its baseline. With no evaluation data the runner prints one
    line saying how to get it; ``require_data`` (the ``evaluate`` command) then fails with exit 2,
    while ``negsynth run`` ends its pipeline with that line."""
    from negsynth.evaluate import EvalDataError, UnknownTask, evaluate, load_report, print_report, write_report
    from negsynth.evaluate.mteb_engine import MtebUnavailable

    ec = ctx.cfg.evaluate
    out = ctx.stage_dir(STAGE)
    out.mkdir(parents=True, exist_ok=True)
    trained = ctx.stage_dir("train") / "final"
    emb_cfg = ctx.cfg.embedder
    zero_shot = emb_cfg.kind == "decoder" and not trained.is_dir()  # asked for a zero-shot decoder embedder
    default = ("smollm2" if emb_cfg.model == "default" else emb_cfg.model) if zero_shot else ctx.cfg.train.model
    model = model or ec.model or (str(trained) if trained.is_dir() else default)
    baseline = baseline if baseline is not None else ec.baseline
    if baseline == "base":
        baseline = ctx.cfg.train.model if Path(model).resolve() != Path(ctx.cfg.train.model).resolve() else None
    quiet = ctx.reporter.quiet

    def one(m: str, dest: Path) -> dict:
        if Path(m).suffix == ".json" and Path(m).is_file():
            return load_report(m)  # a saved report as baseline
        try:
            emb = embedder_for(m, batch_size=ec.batch_size, instruct_queries=ec.instruct_queries, embedder=emb_cfg, what="evaluate --model (or --baseline)",
                               backend=ec.backend)  # fmt: skip
        except ValueError as e:  # the embedder refused its settings (method, pooling, ...)
            raise UserError(f"evaluate: model {m!r}: {e}; fix [embedder] or pass --model (or --baseline) another model") from None
        try:
            rep = evaluate(emb, suite=ec.suite, data_dir=ec.data_dir, tasks=ec.tasks, progress=not quiet, out=dest, seed=ec.seed, announce=not require_data, engine=ec.engine)
        except (EvalDataError, UnknownTask, MtebUnavailable) as e:
            raise UserError(str(e)) from None
        rep["model"] = m
        write_report(rep, dest)
        return rep

    def nothing(rep: dict) -> dict:
        reason = "; ".join(rep.get("notes", [])) or "no evaluation data"
        if require_data:
            raise UserError(reason)
        return {"stage": STAGE, "skipped": True, "reason": reason}

    base_rep = one(baseline, out / "baseline.json") if baseline else None
    if base_rep is not None and not base_rep.get("tasks") and not base_rep.get("skipped"):
        return nothing(base_rep)
    rep = one(model, out / "report.json")
    if not rep.get("tasks"):
        return nothing(rep)
    if not quiet:
        print_report(rep, baseline=base_rep, console=ctx.reporter.console)
    summary = {
        "stage": STAGE,
        "model": model,
        "baseline": baseline,
        "average": rep.get("average"),
        "categories": rep.get("categories"),
        "baseline_average": base_rep.get("average") if base_rep else None,
        "report": str(out / "report.json"),
    }
    atomic_write_json(out / "summary.json", summary)
    return summary
