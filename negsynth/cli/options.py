"""The ``negsynth`` app and what its commands share: the options declared once (:class:`Options`),
the decorators that declare a command (:func:`stage_command`, :func:`report_command`,
:func:`column_options`), logging and printing stats as JSON."""

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

from negsynth.cli.guard import guarded
from negsynth.errors import UserError

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


class MethodApp(typer.Typer):
    """The app. Click reads its commands through ``registered_commands`` each time it is run (the
    console entry point, and tests' ``CliRunner``); every function in ``command_hooks`` brings the
    list up to date first, e.g. a command per stage of the method (``negsynth.cli.stages``), so a
    stage added as a module and a ``METHOD`` line is ``negsynth NAME`` with no other edit."""

    def __init__(self, **kw: Any) -> None:
        self.command_hooks: list[Callable[[list], list]] = []
        self._syncing = False
        super().__init__(**kw)

    @property
    def registered_commands(self) -> list:
        if not self._syncing and self.command_hooks:
            self._syncing = True  # a hook registers commands through this list: no second pass
            try:
                for hook in self.command_hooks:
                    self._commands = hook(self._commands)
            finally:
                self._syncing = False
        return self._commands

    @registered_commands.setter
    def registered_commands(self, value: list) -> None:
        self._commands = value


app = MethodApp(
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
        help="with --executor ray: ranks of a stage that splits (the global LLM limits are split among them), or embedding workers (one embedder each)",
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
VerboseOpt = Annotated[int, typer.Option("--verbose", "-v", count=True, help="more logging (-vv for debug)")]
#: --format of a command that reads an --input (regenerate, corpus)
FormatOpt = Annotated[str, typer.Option("--format", help="auto | hf | jsonl | parquet | csv | tsv | beir")]
#: the corpus stage's documents (corpus, estimate)
DocumentsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input",
        "-i",
        help="a folder of documents (.txt/.md/.html/.pdf/.jsonl(.gz)/.csv(.gz)/.parquet, recursive), one such file, a BEIR folder (its corpus.jsonl) or a saved HF dataset; repeatable",
    ),
]
GlobOpt = Annotated[
    str | None, typer.Option("--glob", help="a folder --input's files to read, e.g. '**/*.md' (default: every corpus file)")
]


def one_of(command: str, what: str, given: Path | None, flag: str, flagged: Path | None) -> Path | None:
    """The one of a positional argument and its option that was given; both (and different): one line."""
    if given is not None and flagged is not None and given != flagged:
        raise UserError(f"{command}: two {what} ({given} and {flag} {flagged}); pass one")
    return given if given is not None else flagged


def setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def emit(stats: Any, json_mode: bool) -> None:
    if json_mode:
        typer.echo(json.dumps(stats, indent=2, ensure_ascii=False, default=str))


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
        from negsynth.stages import sections

        cfg = load_config(self.config, list(extra_sets or []) + list(self.set_ or []), sections())
        _check_run_dir(self.run_dir)
        return StageContext(
            cfg=cfg,
            run_dir=self.run_dir,
            overwrite=self.overwrite,
            verify=self.verify,
            budget=Budget(self.max_requests, self.max_tokens, self.max_cost),
            reporter=Reporter(quiet=self.quiet, json_mode=self.json_out),
            mode=self.mode,
        )


#: the shared options of the commands that call the LLM: workers, mode, budgets
_RAY = ("executor", "workers", "ray_address")
_SHARDS = ("mode", *_RAY)
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
            setup_logging(opts.verbose)
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
            setup_logging(verbose)
            result = fn(**kw)
            if json_out:
                emit(result, True)
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
