"""Subcommands of the later stages (score, inspect, curriculum/train/evaluate, regenerate).

Imported by :func:`negsynth.cli.main`; each block registers its commands on the shared
``app``. Heavy imports (torch, polars, matplotlib) stay inside the command functions, so
``import negsynth.cli`` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from negsynth.cli import (
    ConfigOpt,
    JsonOpt,
    OverwriteOpt,
    QuietOpt,
    RunDirOpt,
    SetOpt,
    VerboseOpt,
    _emit,
    _setup_logging,
    app,
    guarded,
    make_context,
)
from negsynth.errors import UserError

# ============================================================================ score (issue 4)


def embedder_overrides(spec: str | None) -> list[str]:
    """``--embedder`` shortcut -> ``--set`` overrides.

    ``decoder`` / ``decoder:MODEL`` -> a zero-shot decoder embedder (method via
    ``--set embedder.method=echo``); ``st`` / ``st:MODEL`` / ``sentence-transformers`` -> a
    sentence-transformers model; anything else is a sentence-transformers folder or hub name.
    """
    if not spec:
        return []
    kind, _, model = spec.partition(":") if spec.split(":", 1)[0] in ("decoder", "st", "sentence-transformers") else ("st", "", spec)
    if kind == "decoder":
        out = ["embedder.kind=decoder"]
    else:
        out = ["embedder.kind=sentence-transformers"]
    if model:
        out.append(f"embedder.model='{model}'" if "'" not in model else f"embedder.model={model}")  # TOML literal: no escapes
    elif kind == "decoder" or spec in ("st", "sentence-transformers"):
        out.append("embedder.model='default'")
    return out


@app.command()
@guarded
def score(
    config: ConfigOpt = None,
    run_dir: RunDirOpt = Path("runs/default"),
    set_: SetOpt = None,
    embedder: Annotated[
        str | None,
        typer.Option("--embedder", "-e", help="st (MiniLM), st:PATH_OR_NAME, decoder, decoder:PATH, or a sentence-transformers folder / hub name"),
    ] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="measured | annotate | reorder | filter (default score.policy)")] = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    overwrite: OverwriteOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Stage 3: measure cos(query, positive/negatives) with a local embedder, flag false negatives -> RUN_DIR/score/."""
    from negsynth.pipeline.registry import get_stage

    _setup_logging(verbose)
    sets = embedder_overrides(embedder) + ([f"score.policy={policy}"] if policy else []) + list(set_ or [])
    ctx = make_context(config, run_dir, sets, quiet=quiet, json_mode=json_out, overwrite=overwrite)
    _emit(get_stage("score")(ctx), json_out)


# ============================================================================ end score


# ============================================================================ regenerate (issue 6)

from negsynth.cli import MaxCostOpt, MaxReqOpt, MaxTokOpt, ModeOpt, NumShardsOpt, ShardIdxOpt, _emit_llm  # noqa: E402


def _filter_arg(items: list[str] | None) -> dict[str, str | list[str]]:
    """``--filter label=entailment`` / ``--filter label=a,b`` -> the source spec's ``filter``."""
    out: dict[str, str | list[str]] = {}
    for it in items or []:
        col, sep, val = it.partition("=")
        if not sep or not col.strip():
            raise UserError(f"--filter {it!r}: expected COLUMN=VALUE (or COLUMN=V1,V2), e.g. --filter label=entailment")
        vals = [v.strip() for v in val.split(",")]
        out[col.strip()] = vals if len(vals) > 1 else vals[0]
    return out


@app.command()
@guarded
def regenerate(
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", "-i", help="a BEIR folder, a saved HF dataset (or hub name), or a .jsonl/.parquet/.csv/.tsv file; repeatable"),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="auto | hf | jsonl | parquet | csv | tsv | beir")] = "auto",
    query_col: Annotated[str | None, typer.Option("--query-col", help="column holding the query (default: query, anchor, question, premise, text1, ...)")] = None,
    positive_col: Annotated[str | None, typer.Option("--positive-col", help="column holding the positive (default: positive, document, answer, hypothesis, text2, ...)")] = None,
    instruction_col: Annotated[str | None, typer.Option("--instruction-col", help="column with a per-row instruction")] = None,
    negatives_col: Annotated[str | None, typer.Option("--negatives-col", help="column with the source's own negatives (kept in meta, never used)")] = None,
    source_name: Annotated[str | None, typer.Option("--source-name", help="source name: instruction-table key and source_id prefix (default: from the path)")] = None,
    split: Annotated[str | None, typer.Option("--split", help="BEIR qrels split (train/dev/test) or a DatasetDict split")] = None,
    filter_: Annotated[list[str] | None, typer.Option("--filter", help="keep rows with COLUMN=VALUE[,VALUE...], e.g. --filter label=entailment")] = None,
    instruction: Annotated[str | None, typer.Option("--instruction", help="instruction for every pair (overrides the per-source table)")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="at most N pairs per input (a seeded random sample)")] = None,
    mine: Annotated[int | None, typer.Option("--mine", min=0, help="also mine K negatives per pair from the source's corpus with the embedder")] = None,
    config: ConfigOpt = None,
    run_dir: RunDirOpt = Path("runs/default"),
    set_: SetOpt = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    overwrite: OverwriteOpt = False,
    shard_index: ShardIdxOpt = 0,
    num_shards: NumShardsOpt = 1,
    max_requests: MaxReqOpt = None,
    max_tokens: MaxTokOpt = None,
    max_cost: MaxCostOpt = None,
    mode: ModeOpt = "online",
    verbose: VerboseOpt = 0,
) -> None:
    """LLM-graded negatives for existing (query, positive) pairs (MGH §1.5) -> RUN_DIR/regenerate/.

    With --input the command line describes the input(s); without it, the inputs listed under
    regenerate.inputs in the run file are used (--limit and --mine still apply to them).
    """
    from negsynth.cli import _llm_stage
    from negsynth.schemas.config import SourceSpec

    _setup_logging(verbose)
    ctx = make_context(
        config, run_dir, set_, quiet=quiet, json_mode=json_out, overwrite=overwrite, shard_index=shard_index,
        num_shards=num_shards, max_requests=max_requests, max_tokens=max_tokens, max_cost=max_cost, mode=mode,
    )  # fmt: skip
    rcfg = ctx.cfg.regenerate
    cols = {k: v for k, v in (("query", query_col), ("positive", positive_col), ("instruction", instruction_col), ("negatives", negatives_col)) if v}
    if inputs:
        if source_name and len(inputs) > 1:
            raise UserError("--source-name applies to one --input; describe several named inputs with [[regenerate.inputs]] in a --config file")
        try:
            rcfg.inputs = [
                SourceSpec(
                    path=p, format=fmt, name=source_name, split=split, columns=cols, filter=_filter_arg(filter_),
                    instruction=instruction, limit=limit,
                )  # fmt: skip
                for p in inputs
            ]
        except ValueError as e:
            raise UserError(f"--input: {str(e).splitlines()[-1].strip()}") from None
    else:
        if cols or fmt != "auto" or source_name or split or filter_ or instruction:
            raise UserError("--format/--*-col/--source-name/--split/--filter/--instruction describe an --input; pass --input PATH too (or edit [[regenerate.inputs]])")
        if limit is not None:
            rcfg.inputs = [s.model_copy(update={"limit": limit}) for s in rcfg.inputs]
    if mine is not None:
        rcfg.mine = mine
    _emit_llm(_llm_stage("regenerate", ctx), json_out)


# ============================================================================ end regenerate


# ============================================================================ inspect (issue 4)


@app.command("inspect")
@guarded
def inspect_cmd(
    path: Annotated[Path, typer.Argument(help="a run dir, a stage folder (e.g. runs/default/score) or one shard-XXXXX.jsonl")],
    sample: Annotated[int, typer.Option("--sample", "-n", min=0, help="pretty-print N examples (with cosines and flags when scored)")] = 0,
    task_type: Annotated[str | None, typer.Option("--task-type", help="only examples of this task type")] = None,
    flag: Annotated[str | None, typer.Option("--flag", help="only examples with this flag: false_negative | too_easy | non_monotonic")] = None,
    level: Annotated[int | None, typer.Option("--level", help="LLM level 1-4: where --flag must hold; alone, the only level tabulated")] = None,
    seed: Annotated[int, typer.Option("--seed", help="which examples --sample picks")] = 0,
    plots: Annotated[Path | None, typer.Option("--plots", help="also write PNG figures to this directory")] = None,
    html_out: Annotated[Path | None, typer.Option("--html", help="also write one self-contained HTML page (tables, plots, a filterable sample browser)")] = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Summarise a run: counts per stage, task-type mix, rejects, tokens/cost, score statistics per level."""
    from negsynth.inspect import inspect_path, render, write_plots

    _setup_logging(verbose)
    report = inspect_path(path, sample=sample, task_type=task_type, flag=flag, level=level, seed=seed)
    if plots is not None:
        report["plots"] = [str(p) for p in write_plots(path, plots, task_type=task_type)]
    if html_out is not None:
        from negsynth.report_html import write_html

        report["html"] = str(write_html(path, html_out, seed=seed))
    if json_out:
        _emit(report, True)
        return
    from rich.console import Console

    console = Console(highlight=False)
    render(report, console)
    for p in report.get("plots", []) + ([report["html"]] if "html" in report else []):
        console.print(f"wrote {p}")


# ============================================================================ end inspect


# ============================================================================ curriculum / train / evaluate (issue 5)


@app.command()
@guarded
def curriculum(
    config: ConfigOpt = None,
    run_dir: RunDirOpt = Path("runs/default"),
    set_: SetOpt = None,
    schedule: Annotated[str | None, typer.Option("--schedule", help="curriculum | reverse | random | fixed:K")] = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    overwrite: OverwriteOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Build the training rows in training order (easiest level first) -> RUN_DIR/curriculum/."""
    from negsynth.stages.curriculum import run as run_stage

    _setup_logging(verbose)
    sets = list(set_ or []) + ([f"curriculum.schedule='{schedule}'"] if schedule else [])
    ctx = make_context(config, run_dir, sets, quiet=quiet, json_mode=json_out, overwrite=overwrite)
    _emit(run_stage(ctx), json_out)


@app.command()
@guarded
def train(
    config: ConfigOpt = None,
    run_dir: RunDirOpt = Path("runs/default"),
    set_: SetOpt = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    overwrite: OverwriteOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Fine-tune on the curriculum in order (InfoNCE, in-batch + hard negatives) -> RUN_DIR/train/final."""
    from negsynth.stages.train import run as run_stage

    _setup_logging(verbose)
    ctx = make_context(config, run_dir, set_, quiet=quiet, json_mode=json_out, overwrite=overwrite)
    _emit(run_stage(ctx), json_out)


@app.command()
@guarded
def evaluate(
    config: ConfigOpt = None,
    run_dir: RunDirOpt = Path("runs/default"),
    set_: SetOpt = None,
    model: Annotated[str | None, typer.Option("--model", help="model folder or alias (default: RUN_DIR/train/final)")] = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="model or report.json to compare with ('' for none)")] = None,
    suite: Annotated[str | None, typer.Option("--suite", help="quick | full")] = None,
    tasks: Annotated[str | None, typer.Option("--tasks", help="comma-separated task or category names")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="benchmark folder (default ../shared/data)")] = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Evaluate a model on the offline mini-MTEB (STS, Retr, Pair, Class, Clust) with a delta table."""
    from negsynth.stages.evaluate import run as run_stage

    _setup_logging(verbose)
    sets = list(set_ or [])
    if suite:
        sets.append(f"evaluate.suite='{suite}'")
    if data_dir:
        sets.append(f"evaluate.data_dir='{data_dir}'")
    if tasks:
        sets.append("evaluate.tasks=[" + ",".join(f"'{t.strip()}'" for t in tasks.split(",")) + "]")
    ctx = make_context(config, run_dir, sets, quiet=quiet, json_mode=json_out)
    _emit(run_stage(ctx, model=model, baseline=baseline, require_data=True), json_out)


# ============================================================================ end curriculum / train / evaluate


# ============================================================================ export


@app.command()
@guarded
def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder: OUT/dataset (HF dataset repo) and OUT/model (sentence-transformers model + card)")],
    run_dir: RunDirOpt = Path("runs/default"),
    only: Annotated[str | None, typer.Option("--only", help="dataset | model (default: both)")] = None,
    with_shards: Annotated[bool, typer.Option("--with-shards", help="also export the generate/regenerate/score records as dataset configurations")] = False,
    ntuple: Annotated[int | None, typer.Option("--ntuple", min=1, help="also write the 'ntuple' configuration: anchor, positive, negative_1..N per scored example")] = None,
    license_: Annotated[str, typer.Option("--license", help="licence id for both cards (e.g. cc-by-4.0, apache-2.0)")] = "unknown",
    push: Annotated[str | None, typer.Option("--push", help="upload to the Hub as USER/NAME (dataset and model repo); needs HF_TOKEN")] = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Write the curriculum as a Hugging Face dataset folder and the trained model with a model card (optionally push)."""
    from negsynth.export import export_run

    _setup_logging(verbose)
    res = export_run(run_dir, out, only=only, with_shards=with_shards, ntuple=ntuple, license=license_, push_repo=push)
    if json_out:
        _emit(res, True)
        return
    for k in ("dataset", "model"):
        if k in res:
            typer.echo(f"wrote {res[k][k]}")
    for url in res.get("pushed", []):
        typer.echo(f"pushed {url}")


# ============================================================================ end export
