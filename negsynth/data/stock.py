"""Training rows in the layouts the stock sentence-transformers trainer reads.

* **the ``stock`` curriculum** (:func:`stock_curriculum`): the n-tuples below in input order, once,
  not built as batches: the trainer's shuffled sampler batches and cycles them, as the stock recipe
  trains ``mine_hard_negatives``' output (the default for labelled pairs with mined negatives);

* **the curriculum** (``RUN_DIR/curriculum/dataset``, built by :mod:`negsynth.data.curriculum`):
  one row per (example, level), in training order, with metadata columns;
* **n-tuples** (:func:`ntuple_rows`): one row per example, ``anchor, positive, negative_1 ..
  negative_n`` (hardest first), for training with several hard negatives per row and no
  curriculum.

:func:`negsynth.train.for_stock_trainer` hands either to ``SentenceTransformerTrainer`` (the
text columns only, and a batch sampler that keeps the order and never mixes phases).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

from negsynth.data.curriculum import DEFAULT_TEMPLATE, CurriculumError, CurriculumRows, anchor_of, teacher_label, to_example
from negsynth.data.text import text_key


def text_columns(column_names: Sequence[str]) -> list[str]:
    """``anchor, positive`` + ``negative`` or ``negative_1..n`` (in column order): what the loss embeds."""
    negs = [c for c in column_names if c == "negative" or re.fullmatch(r"negative_\d+", c)]
    return ["anchor", "positive", *negs]


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
    a copy of the positive as a negative). Every row has exactly n negatives. When every row's
    example carries teacher scores (:func:`negsynth.data.curriculum.teacher_label`), rows add
    ``label``: ``[positive, negative_1..negative_n]`` (sentence-transformers' distillation layout).
    """
    if n < 1:
        raise CurriculumError(f"ntuple: n must be >= 1, got {n}")
    if instruction_template is not None and "{query}" not in instruction_template:
        raise CurriculumError("ntuple: instruction_template must contain {query} (and usually {instruction})")
    rows: list[dict] = []
    stats: Counter = Counter()
    for i, obj in enumerate(examples):
        ex = to_example(obj, i)
        stats["examples"] += 1
        negs = list(ex.mined_negatives if use_mined else ex.negatives)
        label = teacher_label(ex, use_mined)
        if drop_false_negatives and not use_mined and ex.score is not None and len(ex.score.false_negative) == len(negs):
            kept = [t for t, fn in zip(negs, ex.score.false_negative) if not fn]
            if label is not None:
                label = [label[0], *(x for x, fn in zip(label[1:], ex.score.false_negative) if not fn)]
            stats["false_negatives_dropped"] += len(negs) - len(kept)
            negs = kept
        if len(negs) < n:
            stats["skipped_few_negatives"] += 1
            continue
        negs = negs[:n]
        anchor = anchor_of(ex, instruction_template)
        keys = [text_key(t) for t in (anchor, ex.positive, *negs)]
        if len(set(keys)) < len(keys):
            stats["skipped_self_duplicate"] += 1
            continue
        row = {"anchor": anchor, "positive": ex.positive}
        row.update({f"negative_{k + 1}": t for k, t in enumerate(negs)})
        row["label"] = label[: n + 1] if label is not None else None
        row.update({"task_type": ex.task_type, "example_id": ex.id, "source": ex.source})
        rows.append(row)
    if rows and any(r["label"] is None for r in rows):  # all or none: a column has no gaps
        for r in rows:
            del r["label"]
    out = dict(stats)
    for k in ("examples", "skipped_few_negatives", "skipped_self_duplicate"):
        out.setdefault(k, 0)
    out.update(
        {
            "rows": len(rows),
            "n": n,
            "use_mined": use_mined,
            "drop_false_negatives": drop_false_negatives,
            "instruction_template": instruction_template,
        }
    )
    return CurriculumRows(rows, out)


def stock_curriculum(
    examples: Iterable,
    *,
    batch_size: int = 64,
    total_steps: int | None = None,
    epochs: float | None = None,
    seed: int = 0,
    use_mined: bool = False,
    instruction_template: str | None = DEFAULT_TEMPLATE,
    schedule: str = "stock",
    homogeneous_batches: bool = True,
) -> CurriculumRows:
    """The ``stock`` schedule: :func:`ntuple_rows` (one row per example, its 4 hardest negatives,
    input order) with ``level`` 0, ``phase`` 1 and ``batch`` -1 (not built as batches), once. The
    trainer shuffles and batches them (``NO_DUPLICATES``) and cycles them for ``total_steps`` steps,
    as sentence-transformers' stock recipe trains ``mine_hard_negatives``' rows, so no pass is drawn
    or packed here. Takes :func:`~negsynth.data.curriculum.build_curriculum`'s options; the batch
    planning one (``homogeneous_batches``) has nothing to plan."""
    del homogeneous_batches  # no batch is planned here
    if schedule != "stock":
        raise CurriculumError(f"curriculum: stock_curriculum builds schedule 'stock', not {schedule!r}; use build_curriculum")
    if total_steps is not None and epochs is not None:
        raise CurriculumError("curriculum: give total_steps or epochs, not both")
    if epochs is not None and epochs != 1:
        raise CurriculumError(
            f"curriculum: schedule 'stock' writes the rows once and the trainer cycles them; set train.max_steps "
            f"or curriculum.total_steps instead of epochs = {epochs}"
        )
    built = ntuple_rows(examples, 4, instruction_template=instruction_template, use_mined=use_mined)
    if not built:
        raise CurriculumError(
            f"curriculum: no usable example (need >= 4 {'mined_negatives' if use_mined else 'negatives'} each); "
            "check the input stage or use schedule tuple:K"
        )
    # ``batch`` -1: not built as batches (the trainer's shuffled sampler makes them)
    rows = CurriculumRows({**r, "level": 0, "phase": 1, "batch": -1} for r in built)
    stats = dict(built.stats)
    stats.update(
        {
            "schedule": "stock",
            "levels": [0],
            "batch_size": batch_size,
            "seed": seed,
            "epochs": epochs if total_steps is not None or epochs is not None else 1,
            # the trainer's optimizer steps (it cycles the rows); None: one pass, ceil(rows / batch)
            "total_steps": total_steps,
            "steps": total_steps or -(-len(rows) // batch_size),
            "rows": len(rows),
            "use_mined": use_mined,
            "instruction_template": instruction_template,
            "label": "label" in rows[0],
            "examples_in": stats.get("examples", 0),
            "examples_used": len(rows),
            "examples_unused": stats.get("examples", 0) - len(rows),
            "batches_planned": False,  # the trainer's shuffled sampler makes them
        }
    )
    # the builder's counters, under its names: ntuple_rows skips a row whose texts repeat; nothing is packed
    stats.update(
        dropped_self_duplicate=stats.pop("skipped_self_duplicate", 0), dropped_incomplete=0, moved_to_later_batch=0, short_batches=0
    )
    rows.stats = stats
    return rows
