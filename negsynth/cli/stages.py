"""The stage commands (one per stage of the method, in its order) and ``run``, the whole pipeline.

Each is a declaration: its own options, the shared ones (added by :func:`stage_command`) and one
call to :func:`_run` / :func:`_execute`, which run the stage here or on Ray and report its stats
with their exit code (:func:`_emit_llm`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.markup import escape

from negsynth.cli.guard import EXIT_BUDGET, EXIT_PENDING
from negsynth.cli.options import (
    BackendOpt,
    DocumentsOpt,
    EngineOpt,
    FormatOpt,
    GlobOpt,
    NoCacheOpt,
    Options,
    app,
    column_options,
    emit,
    stage_command,
)
from negsynth.cli.overrides import config_sets, embedder_overrides, filter_arg
from negsynth.errors import UserError
from negsynth.schemas.records import first_problem


def _emit_llm(stats: dict, json_mode: bool) -> None:
    """Print the stats; a stage stopped by a budget exits with EXIT_BUDGET and says how to go on;
    a failed stage exits 2 and an outage or pending items EXIT_PENDING, each with one line."""
    emit(stats, json_mode)
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


def _run(name: str, opts: Options, extra_sets: list[str] | None = None) -> None:
    """Run stage ``name`` under the command's options and report its stats (exit code included)."""
    _emit_llm(_execute(name, opts, opts.context(extra_sets)), opts.json_out)


def _execute(name: str, opts: Options, ctx) -> dict:
    """The stage on the executor ``--executor`` chose (:mod:`negsynth.pipeline.executor`): in this
    process, or on Ray (ranks; score, mined regenerate and corpus with its index: here with their
    embedding on Ray workers)."""
    from negsynth.pipeline.executor import executor_for, run_stage
    from negsynth.stages import METHOD, get

    stage = get(name)
    executor = executor_for(opts.executor, workers=opts.workers, address=opts.ray_address, method=METHOD)
    executor.check(stage, ctx.cfg)
    return run_stage(stage, ctx, executor=executor)


# ============================================================================ the method's stages


@stage_command(llm=True)
def brainstorm(opts: Options) -> None:
    """Stage 1: the LLM invents embedding tasks per task type -> RUN_DIR/brainstorm/."""
    _run("brainstorm", opts)


@stage_command(llm=True)
def generate(opts: Options) -> None:
    """Stage 2: per task, one example with 4 negatives ordered hardest -> easiest -> RUN_DIR/generate/."""
    _run("generate", opts)


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
                    filter=filter_arg(filter_),
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
    inputs: DocumentsOpt = None,
    fmt: Annotated[
        str, typer.Option("--format", help="auto | folder | text | html | pdf | jsonl | parquet | csv | tsv | beir | hf")
    ] = "auto",
    max_docs: Annotated[int | None, typer.Option("--max-docs", min=1, help="a seeded sample of at most N documents")] = None,
    queries_per_doc: Annotated[
        int | None, typer.Option("--queries-per-doc", min=1, help="queries the LLM writes per document (one request)")
    ] = None,
    glob: GlobOpt = None,
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
            "--chunk-tokens", min=0, help="split documents longer than N tokens into overlapping passages (e.g. 224; default 0: never)"
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
    except ValidationError as e:
        raise UserError(f"corpus: {': '.join(first_problem(e, 'corpus'))}; see negsynth corpus --help") from None
    _emit_llm(_execute("corpus", opts, ctx), opts.json_out)


@stage_command(ray=True)
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
    """Stage 3: measure cos(query, positive/negatives) with a local embedder, flag false negatives -> RUN_DIR/score/."""
    _run("score", opts, embedder_overrides(embedder) + config_sets("score", policy=policy or None))


@stage_command()
def curriculum(
    opts: Options,
    schedule: Annotated[str | None, typer.Option("--schedule", help="auto | curriculum | tuple | tuple:K | stock")] = None,
) -> None:
    """Build the training rows in training order (easiest level first; n-tuple rows when all negatives were mined) -> RUN_DIR/curriculum/."""
    _run("curriculum", opts, config_sets("curriculum", schedule=schedule or None))


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
    stats = _execute("evaluate", opts, ctx)
    if stats.get("skipped"):  # no evaluation data: the line says where to get some
        raise UserError(stats["reason"])
    _emit_llm(stats, opts.json_out)


def _generic(name: str):
    """The command of a stage with none of its own: the stage, with the shared options only."""

    def command(opts: Options) -> None:
        _run(name, opts)

    return command


#: the commands :func:`method_commands` made, by stage name
_GENERIC: dict[str, object] = {}


def method_commands(commands: list) -> list:
    """``commands`` with one per stage of ``METHOD`` (read now) that has none of its own: ``negsynth
    NAME`` runs the stage with the shared options (an LLM stage's workers, mode and budgets; a stage
    that splits, the executor's), as the method's own commands do; a command made for a stage no
    longer in ``METHOD`` goes. A stage that needs options of its own declares its command here."""
    from negsynth.pipeline import LLMStage
    from negsynth.stages import METHOD

    names = {s.name for s in METHOD}
    for n in [n for n in _GENERIC if n not in names]:
        commands.remove(_GENERIC.pop(n))  # in place: a command registered below is appended to this very list
    have = {c.name or c.callback.__name__.replace("_", "-") for c in commands}
    for stage in METHOD:
        if stage.name in have:
            continue
        command = _generic(stage.name)
        command.__name__ = stage.name
        command.__doc__ = f"Stage {stage.name}: {stage.summary} -> RUN_DIR/{stage.name}/."
        stage_command(stage.name, llm=isinstance(stage, LLMStage), ray=stage.split == "ranks")(command)
        _GENERIC[stage.name] = commands[-1]
    return commands


app.command_hooks.append(method_commands)


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
    regenerate) runs as --workers ranks, their stats summed here, and the embedding of score, of
    regenerate's mining with mined negatives and of corpus's index on --workers Ray workers (the
    stage itself here); the other stages run in this process. One embedded LLM server and one
    budget serve the whole run, and finished stages are reused without starting workers."""
    from negsynth.pipeline.executor import executor_for
    from negsynth.pipeline.stage import unfinished
    from negsynth.stages import run_pipeline

    executor = executor_for(opts.executor, workers=opts.workers, address=opts.ray_address)
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
        executor=executor,
    )
    stopped = next((s for s in out.values() if unfinished(s)), None)
    if stopped is not None:
        _emit_llm({**stopped, "stages": out}, opts.json_out)
    ctx.reporter.info(f"[bold green]done[/]: outputs in {escape(str(opts.run_dir))}/", styled=True)
    verdict = (out.get("evaluate") or {}).get("verdict")
    if verdict:  # did it help? the run's last line (its held-out documents)
        ctx.reporter.info(verdict["line"].replace("[", "\\["))
    emit(out, opts.json_out)
