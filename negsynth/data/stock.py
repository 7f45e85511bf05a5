"""Hand negsynth's training data to the stock sentence-transformers trainer.

Two layouts:

* **the curriculum** (``RUN_DIR/curriculum/dataset``: one row per (example, level), in training
  order, with metadata columns). :func:`for_stock_trainer` turns it into what
  ``SentenceTransformerTrainer`` wants: the three text columns only (ST embeds every column it is
  given) and a batch sampler that keeps the order and never mixes phases::

      from negsynth.data.stock import for_stock_trainer
      train_ds, sampler = for_stock_trainer("runs/demo")       # or the Dataset itself
      args = SentenceTransformerTrainingArguments(..., batch_sampler=sampler)
      SentenceTransformerTrainer(model, args, train_dataset=train_ds, loss=MultipleNegativesRankingLoss(model)).train()

* **n-tuples** (:func:`ntuple_rows`): one row per example, ``anchor, positive, negative_1 ..
  negative_n`` (hardest first), for training with several hard negatives per row and no
  curriculum. :func:`for_stock_trainer` accepts that layout too (no phases: plain order).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from negsynth.data.curriculum import DEFAULT_TEMPLATE, CurriculumError, CurriculumRows, _to_example, normalise

NTUPLE_META = ("task_type", "example_id", "source")


def text_columns(column_names: Sequence[str]) -> list[str]:
    """``anchor, positive`` + ``negative`` or ``negative_1..n`` (in column order): what the loss embeds."""
    negs = [c for c in column_names if c == "negative" or re.fullmatch(r"negative_\d+", c)]
    return ["anchor", "positive", *negs]


def _as_dataset(data):
    """A ``datasets.Dataset`` from a Dataset, a run dir, a curriculum dir, a saved dataset dir or a parquet file."""
    import datasets

    if isinstance(data, datasets.Dataset):
        return data
    if isinstance(data, dict):
        return datasets.Dataset.from_dict(data)
    p = Path(data)
    if p.is_file() and p.suffix == ".parquet":
        return datasets.Dataset.from_parquet(str(p))
    for cand in (p / "curriculum" / "dataset", p / "dataset", p):
        if (cand / "dataset_info.json").is_file():
            return datasets.load_from_disk(str(cand))
    raise CurriculumError(f"{p}: no saved curriculum (looked for {p / 'curriculum' / 'dataset'}, {p / 'dataset'}); run `negsynth curriculum` first or pass a Dataset")


def for_stock_trainer(data) -> tuple[Any, Any]:
    """``(train_dataset, batch_sampler)`` for ``SentenceTransformerTrainer``.

    ``data``: the curriculum as a ``datasets.Dataset`` (or a run dir / curriculum dir / saved
    dataset dir / parquet file), or n-tuple rows. ``train_dataset`` keeps only the text columns
    (``anchor, positive, negative`` or ``negative_1..n``); ``batch_sampler`` is
    :func:`negsynth.train.sampler.curriculum_batch_sampler` bound to the ``phase`` column (None
    when there is none): pass it as ``SentenceTransformerTrainingArguments(batch_sampler=...)``.
    """
    from negsynth.train.sampler import curriculum_batch_sampler

    ds = _as_dataset(data)
    missing = [c for c in ("anchor", "positive") if c not in ds.column_names]
    if missing:
        raise CurriculumError(f"dataset lacks column(s) {missing}; pass the curriculum (RUN_DIR/curriculum/dataset) or ntuple_rows output")
    phases = ds["phase"] if "phase" in ds.column_names else None
    return ds.select_columns(text_columns(ds.column_names)), curriculum_batch_sampler(phases)


def ntuple_rows(
    examples: Iterable,
    n: int = 4,
    *,
    instruction_template: str | None = DEFAULT_TEMPLATE,
    use_mined: bool = False,
    drop_false_negatives: bool = False,
) -> CurriculumRows:
    """One row per example: ``anchor, positive, negative_1..negative_n`` (hardest first) + ``task_type,
    example_id, source``, in input order.

    ``examples``: :class:`~negsynth.schemas.records.Example` records or their dicts (e.g.
    ``read_stage(RUN_DIR / "score")``). The n hardest negatives are used (``negatives[:n]``, or
    ``mined_negatives`` with ``use_mined``); with ``drop_false_negatives`` negatives that
    ``score`` flagged as false negatives are removed first. Examples left with fewer than n
    negatives are skipped and counted (``stats["skipped_few_negatives"]``), as are examples
    whose texts repeat within the row (``stats["skipped_self_duplicate"]``: the loss would treat
    a copy of the positive as a negative). Every row has exactly n negatives.
    """
    if n < 1:
        raise CurriculumError(f"ntuple: n must be >= 1, got {n}")
    if instruction_template is not None and "{query}" not in instruction_template:
        raise CurriculumError("ntuple: instruction_template must contain {query} (and usually {instruction})")
    rows: list[dict] = []
    stats: Counter = Counter()
    for i, obj in enumerate(examples):
        ex = _to_example(obj, i)
        stats["examples"] += 1
        negs = list(ex.mined_negatives if use_mined else ex.negatives)
        if drop_false_negatives and not use_mined and ex.score is not None and len(ex.score.false_negative) == len(negs):
            kept = [t for t, fn in zip(negs, ex.score.false_negative) if not fn]
            stats["false_negatives_dropped"] += len(negs) - len(kept)
            negs = kept
        if len(negs) < n:
            stats["skipped_few_negatives"] += 1
            continue
        negs = negs[:n]
        anchor = instruction_template.format(instruction=ex.task.strip(), query=ex.query) if instruction_template and ex.task.strip() else ex.query
        keys = [normalise(t) for t in (anchor, ex.positive, *negs)]
        if len(set(keys)) < len(keys):
            stats["skipped_self_duplicate"] += 1
            continue
        row = {"anchor": anchor, "positive": ex.positive}
        row.update({f"negative_{k + 1}": t for k, t in enumerate(negs)})
        row.update({"task_type": ex.task_type, "example_id": ex.id, "source": ex.source})
        rows.append(row)
    out = dict(stats)
    for k in ("examples", "skipped_few_negatives", "skipped_self_duplicate"):
        out.setdefault(k, 0)
    out.update({"rows": len(rows), "n": n, "use_mined": use_mined, "drop_false_negatives": drop_false_negatives, "instruction_template": instruction_template})
    return CurriculumRows(rows, out)
