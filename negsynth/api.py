"""negsynth from Python: the names ``import negsynth`` offers (each has this one import path):
:func:`load_config`, :func:`run`, :func:`training_data`, :func:`sample_corpus`,
:func:`evaluate_model` and :func:`model_path`.

This module sits above the stages (it runs them); ``negsynth/__init__.py`` resolves the names
here on first use, so ``import negsynth`` itself stays cheap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from negsynth.errors import UserError
from negsynth.resources import sample_corpus

if TYPE_CHECKING:
    import datasets

    from negsynth.schemas.config import RunConfig

__all__ = ["evaluate_model", "load_config", "model_path", "run", "sample_corpus", "training_data"]

#: the stages :func:`training_data` runs: documents -> queries + mined negatives -> checked -> rows
DATA_STAGES = ["corpus", "score", "curriculum"]


def load_config(config: RunConfig | str | Path | None = None, overrides: Sequence[str] | None = None) -> RunConfig:
    """The run config: the built-in defaults, ``config``'s keys over them (a TOML path; a
    :class:`RunConfig` is returned as it is), then ``overrides``; every stage's section known."""
    from negsynth.schemas.config import RunConfig

    if isinstance(config, RunConfig):
        if not overrides:
            return config
        from negsynth.schemas.config_io import apply_override

        data = config.model_dump(mode="json")
        for o in overrides:
            apply_override(data, o)
        return type(config).model_validate(data)  # the class it was: with any stage sections it had
    from negsynth.schemas.config_io import load_config as read
    from negsynth.stages import sections

    return read(config, list(overrides or []), sections())


def run(
    config: RunConfig | str | Path | None = None,
    run_dir: str | Path = "runs/default",
    *,
    stages: Sequence[str] | None = None,
    overrides: Sequence[str] | None = None,
    overwrite: bool = False,
    quiet: bool = False,
) -> dict[str, dict]:
    """Run ``stages`` (default ``pipeline.stages``) of ``config`` into ``run_dir``, as ``negsynth run``
    (the embedded LLM started and stopped when a stage needs it; finished stages reused). Returns
    each stage's stats. Inside a running event loop (a notebook cell) it blocks until done; ``await
    negsynth.stages.arun_pipeline(...)`` keeps the loop free instead."""
    from negsynth.pipeline.progress import Reporter
    from negsynth.stages import run_pipeline

    cfg = load_config(config, overrides)
    return run_pipeline(cfg, run_dir, stages=list(stages) if stages else None, reporter=Reporter(quiet=quiet), overwrite=overwrite)


def _write_documents(documents: Iterable[str | dict], path: Path) -> int:
    """``documents`` as the JSONL the corpus stage reads (``id``, ``title``, ``text``), written atomically."""
    from negsynth.data.shards import atomic_write_text

    lines = []
    for i, d in enumerate(documents):
        if isinstance(d, str):
            d = {"text": d}
        if not isinstance(d, dict) or not isinstance(d.get("text"), str) or not d["text"].strip():
            raise UserError(f"documents[{i}]: expected a non-empty string or a dict with a 'text' string; got {str(d)[:60]!r}")
        rec = {"id": str(d.get("id", f"doc{i}")), "title": str(d.get("title") or ""), "text": d["text"]}
        lines.append(json.dumps(rec, ensure_ascii=False))
    if not lines:
        raise UserError("documents: empty; pass at least a few dozen documents (or a path to a corpus file)")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")
    return len(lines)


def training_data(
    documents: str | Path | Iterable[str | dict],
    run_dir: str | Path,
    *,
    config: RunConfig | str | Path | None = None,
    overrides: Sequence[str] | None = None,
    max_docs: int | None = None,
    overwrite: bool = False,
    quiet: bool = False,
) -> datasets.Dataset:
    """Training rows for ``documents``: the LLM writes a query per document, hard negatives are
    mined from the same documents (``corpus``), an embedder drops false negatives (``score``) and
    the rows are built in training order (``curriculum``), all in ``run_dir`` (rerun: finished
    stages are reused). ``documents``: a corpus path (JSONL / parquet / CSV / BEIR folder / saved
    HF dataset) or texts / ``{"text", "title", "id"}`` dicts (written to ``RUN_DIR/documents.jsonl``).

    Returns a ``datasets.Dataset`` with the text columns only — ``anchor, positive,
    negative_1..4`` (mined negatives) or ``anchor, positive, negative`` (a graded curriculum) —
    that ``SentenceTransformerTrainer(model, args, train_dataset=ds,
    loss=MultipleNegativesRankingLoss(model))`` takes as it is. By default these are the stock
    recipe's rows (the corpus stage's queries mined again with ``mine_hard_negatives``): train them
    as it does, ``batch_sampler=BatchSamplers.NO_DUPLICATES``; a planned curriculum
    (``curriculum.schedule = "tuple"`` or ``"curriculum"``) is in training order (do not shuffle).
    The rows' metadata (phase, level, source) stays in ``RUN_DIR/curriculum``."""
    from negsynth.data.curriculum import CurriculumError, load_curriculum
    from negsynth.data.stock import text_columns

    run_dir = Path(run_dir)
    if isinstance(documents, (str, Path)):
        path = Path(documents)
        if not path.exists():
            raise UserError(f"{path}: no such corpus file or folder; pass a path, or a list of texts")
    else:
        path = run_dir / "documents.jsonl"
        _write_documents(documents, path)
    sets = [f"corpus.inputs=[{{path={json.dumps(str(path))}}}]"]
    if max_docs is not None:
        sets.append(f"corpus.max_docs={int(max_docs)}")
    cfg = load_config(config, [*(overrides or []), *sets])
    stats = run(cfg, run_dir, stages=DATA_STAGES, overwrite=overwrite, quiet=quiet)
    from negsynth.pipeline.stage import finished_stats

    stopped = [s for s in DATA_STAGES if s not in stats or not finished_stats(stats[s])]
    if stopped:
        raise UserError(f"{run_dir}: the {stopped[0]} stage did not finish; see {run_dir / stopped[0] / 'stats.json'} and rerun")
    try:
        ds: Any = load_curriculum(run_dir / "curriculum")
    except CurriculumError as e:
        raise UserError(str(e)) from None
    return ds.select_columns(text_columns(ds.column_names))


def evaluate_model(
    model: str | Path = "default",
    tasks: Sequence[Any] | None = None,
    *,
    suite: str | None = None,
    config: RunConfig | str | Path | None = None,
    overrides: Sequence[str] | None = None,
    data_dir: str | Path | None = None,
    per_query: bool = False,
) -> dict[str, Any]:
    """The evaluation report of ``model`` (a folder, an alias or a hub name) as ``negsynth evaluate
    --model MODEL --no-cache`` scores it, returned instead of written: the ``[embedder]`` and
    ``[evaluate]`` settings (backend, dtype, batch size, engine, suite, tasks, data dir) come from
    ``config`` and ``overrides``; ``suite``, ``tasks`` and ``data_dir`` given here win. ``tasks``:
    task or category names, or :func:`negsynth.evaluate.retrieval_task` specs (a BEIR folder of your
    own). ``per_query``: each retrieval task also carries ``per_query`` (query id -> nDCG@10), what
    :func:`negsynth.evaluate.paired_test` compares two models on. No data reachable: one line on
    stderr and a report with no tasks."""
    from negsynth.embed import embedder_for
    from negsynth.evaluate import evaluate

    cfg = load_config(config, overrides)
    ec = cfg.evaluate
    emb = embedder_for(
        str(model),
        batch_size=ec.batch_size,
        instruct_queries=ec.instruct_queries,
        device=cfg.embedder.device,
        embedder=cfg.embedder,
        what="evaluate_model: model",
        backend=ec.backend,
        dtype=ec.dtype,
    )
    return evaluate(
        emb,
        suite=suite or ec.suite,
        data_dir=data_dir or ec.data_dir,
        tasks=list(tasks) if tasks is not None else ec.tasks,
        progress=False,
        seed=ec.seed,
        engine=ec.engine,
        per_query=per_query,
    )


def model_path(name: str = "default") -> str:
    """The folder ``name`` resolves to where ``train.model`` or ``embedder.model`` names it: an alias
    (``default`` / ``minilm``: the bundled all-MiniLM-L6-v2; ``smollm2``: the bundled SmolLM2-135M-Instruct)
    to its installed folder, a folder or a hub name as it is. A missing bundled model is one
    :class:`~negsynth.errors.UserError` naming the package to install."""
    from negsynth.embed.models import resolve_model

    return resolve_model(name, what="model_path: name").path
