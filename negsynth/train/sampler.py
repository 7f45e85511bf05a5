"""The batch sampler that keeps a curriculum's order and never puts a text twice in a batch
(a text twice is a false in-batch negative for MNRL; sentence-transformers' ``NoDuplicatesBatchSampler``
avoids it but shuffles). Rows are taken in order, each into the earliest open batch that holds none
of its texts (:func:`negsynth.data.text.text_key`); batches never mix segments
(:func:`batch_segments`), and a row repeating its own text is skipped. On a built curriculum the
batches are exactly ``[0..B), [B..2B), ...``. Under data parallelism (world size W) it plans the
global batches of ``batch_size * W`` rows and yields each one's W consecutive slices, one per rank
(docs/scale.md).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sentence_transformers.base.sampler import DefaultBatchSampler

from negsynth.data.curriculum import CurriculumError, place
from negsynth.data.stock import text_columns as loss_columns
from negsynth.data.text import text_key

LABEL_COLUMNS = ("label", "labels", "score", "scores")


def text_columns(column_names: Sequence[str]) -> list[str]:
    """The columns the loss embeds: everything but label columns and ``dataset_name``."""
    return [c for c in column_names if c not in LABEL_COLUMNS and c != "dataset_name"]


def plan_batches(
    rows: Sequence[Sequence[str]],
    batch_size: int,
    *,
    phases: Sequence[Any] | None = None,
    drop_last: bool = False,
) -> tuple[list[list[int]], dict[str, int]]:
    """Order-preserving, duplicate-free, phase-pure batches of row indices (see module docstring).

    ``rows[i]``: the texts of row i. Returns (batches, counts) with counts ``moved`` (rows placed
    in a later batch than the earliest open one), ``skipped_self_duplicate`` and
    ``dropped_incomplete`` (only with ``drop_last``).
    """
    n = len(rows)
    batches: list[list[int]] = []
    counts = {"moved": 0, "skipped_self_duplicate": 0, "dropped_incomplete": 0}
    start = 0
    while start < n:
        end = start + 1
        if phases is not None:
            while end < n and phases[end] == phases[start]:
                end += 1
        else:
            end = n
        open_batches: list[tuple[list[int], set[str]]] = []
        for i in range(start, end):
            keys = [text_key(t) for t in rows[i] if t is not None]
            kset = set(keys)
            if len(kset) < len(keys):
                counts["skipped_self_duplicate"] += 1
                continue
            full, moved = place(open_batches, i, kset, batch_size)
            counts["moved"] += moved
            if full is not None:
                batches.append(full)
        for members, _ in open_batches:  # the phase's leftovers, in order of their first row
            if drop_last:
                counts["dropped_incomplete"] += len(members)
            else:
                batches.append(members)
        start = end
    return batches, counts


def data_parallel_world() -> tuple[int, int]:
    """(world size, rank) of a data-parallel run: ``torch.distributed`` once initialised, else the
    ``WORLD_SIZE``/``RANK`` variables that torchrun and accelerate launch set, else (1, 0)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
    except ImportError:  # pragma: no cover - torch is a dependency of the trainer
        pass
    return int(os.environ.get("WORLD_SIZE", "1") or 1), int(os.environ.get("RANK", "0") or 0)


def split_global_batches(batches: list[list[int]], num_replicas: int) -> tuple[list[list[int]], int]:
    """Each global batch cut into ``num_replicas`` equal consecutive slices, slices of one batch
    adjacent (``[b0/r0, b0/r1, ..., b1/r0, ...]``). A batch of ``n`` rows loses its last
    ``n % num_replicas`` rows; a batch left with none is dropped. Returns (slices, rows dropped)."""
    if num_replicas == 1:
        return [list(b) for b in batches], 0
    out: list[list[int]] = []
    dropped = 0
    for b in batches:
        per = len(b) // num_replicas
        dropped += len(b) - per * num_replicas
        if per:
            out.extend(list(b[r * per : (r + 1) * per]) for r in range(num_replicas))
    return out, dropped


class CurriculumBatchSampler(DefaultBatchSampler):
    """Order-preserving, duplicate-free, phase-pure batches (module docstring). Never shuffles:
    ``generator`` and ``seed`` are accepted for the trainer's call and ignored on purpose.

    ``batch_size`` is the per-device batch. ``num_replicas`` (default: the data-parallel world
    size, see :func:`data_parallel_world`) > 1 plans global batches of ``batch_size·num_replicas``
    rows and yields their per-rank slices (module docstring); ``global_batches`` holds the plan.
    """

    def __init__(
        self,
        dataset,
        batch_size: int,
        drop_last: bool = False,
        valid_label_columns=None,
        generator=None,
        seed: int = 0,
        phases: Sequence[Any] | None = None,
        num_replicas: int | None = None,
    ):
        super().__init__(
            range(len(dataset)),
            batch_size=batch_size,
            drop_last=drop_last,
            valid_label_columns=valid_label_columns,
            generator=generator,
            seed=seed,
        )
        cols = text_columns(dataset.column_names)
        data = [dataset[c] for c in cols]
        if phases is not None and len(phases) != len(dataset):
            raise ValueError(f"phases has {len(phases)} values for {len(dataset)} rows")
        self.num_replicas = num_replicas if num_replicas is not None else data_parallel_world()[0]
        self.global_batch_size = batch_size * self.num_replicas
        rows = list(zip(*data)) if data else [()] * len(dataset)
        self.global_batches, self.counts = plan_batches(rows, self.global_batch_size, phases=phases, drop_last=drop_last)
        self.batches, self.counts["dropped_uneven"] = split_global_batches(self.global_batches, self.num_replicas)
        if self.num_replicas > 1:
            # accelerate's BatchSamplerShard yields a group of W slices only if its last slice has
            # ``batch_size`` rows, unless batch_size is None (variable-size batches)
            self.batch_size = None

    def __iter__(self):
        yield from (list(b) for b in self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def batch_segments(columns: dict[str, Sequence[Any]] | Any) -> list | None:
    """What the sampler must not mix in a batch, from a curriculum's columns (a dict or a
    ``datasets.Dataset``): its ``batch`` column when it has one (each curriculum batch, a short one
    included, is then trained as one batch, exactly as the curriculum planned it), else its
    ``phase`` column, else None (one segment)."""
    names = columns.column_names if hasattr(columns, "column_names") else list(columns)
    for name in ("batch", "phase"):
        if name in names:
            values = list(columns[name])
            if name == "batch" and any(v is None or v < 0 for v in values):
                continue  # an unnumbered row (-1): the rows were not built as batches
            return values
    return None


def curriculum_batch_sampler(phases: Sequence[Any] | None = None):
    """The ``batch_sampler`` argument for ``SentenceTransformerTrainingArguments``, with ``phases``
    (one per row, or None) bound: works with the stock ``SentenceTransformerTrainer`` too."""
    return functools.partial(CurriculumBatchSampler, phases=list(phases) if phases is not None else None)


def load_rows(data):
    """The training rows as a ``datasets.Dataset``, from a Dataset, a dict of columns, a run dir,
    a curriculum dir, a saved dataset dir or a parquet file; refused in one line without the
    ``anchor`` and ``positive`` columns every loss reads."""
    import datasets

    if isinstance(data, datasets.Dataset):
        ds = data
    elif isinstance(data, dict):
        ds = datasets.Dataset.from_dict(data)
    else:
        p = Path(data)
        found = [c for c in (p / "curriculum" / "dataset", p / "dataset", p) if (c / "dataset_info.json").is_file()]
        if p.is_file() and p.suffix == ".parquet":
            ds = datasets.Dataset.from_parquet(str(p))
        elif found:
            ds = datasets.load_from_disk(str(found[0]))
        else:
            raise CurriculumError(
                f"{p}: no saved curriculum (looked for {p / 'curriculum' / 'dataset'}, {p / 'dataset'}); "
                "run `negsynth curriculum` first or pass a Dataset"
            )
    missing = [c for c in ("anchor", "positive") if c not in ds.column_names]
    if missing:
        raise CurriculumError(
            f"dataset lacks column(s) {missing}; pass the curriculum (RUN_DIR/curriculum/dataset) or rows with "
            "anchor, positive (+ negative or negative_1..K)"
        )
    return ds


def for_stock_trainer(data) -> tuple[Any, Any]:
    """``(train_dataset, batch_sampler)`` for ``SentenceTransformerTrainer``.

    ``data``: the curriculum, as :func:`load_rows` reads it. ``train_dataset`` keeps only the text
    columns (``anchor, positive, negative`` or ``negative_1..n``) and ``label`` where the rows carry a
    teacher's scores (for ``MarginMSELoss`` / ``DistillKLDivLoss``; MNRL ignores it); ``batch_sampler`` is
    :func:`curriculum_batch_sampler` bound to the ``batch`` column (else ``phase``; see
    :func:`batch_segments`): pass it as ``SentenceTransformerTrainingArguments(batch_sampler=...)``.
    """
    ds = load_rows(data)
    keep = loss_columns(ds.column_names) + (["label"] if "label" in ds.column_names else [])
    return ds.select_columns(keep), curriculum_batch_sampler(batch_segments(ds))
