"""Order-preserving batch sampler for the curriculum, plus a cheap batch check.

The curriculum dataset is already in training order; sentence-transformers' default sampler is
``BatchSampler(RandomSampler(...))``, which would erase it. :class:`OrderedBatchSampler` is a
``DefaultBatchSampler`` subclass, so it can be passed as a class in
``SentenceTransformerTrainingArguments(batch_sampler=OrderedBatchSampler)``.
"""

from __future__ import annotations

from typing import Any

from sentence_transformers.base.sampler import DefaultBatchSampler

from negsynth.train.config import TEXT_COLUMNS


class OrderedBatchSampler(DefaultBatchSampler):
    """Consecutive batches ``[0..B), [B..2B), ...`` in dataset order — never shuffles.

    Accepts the keyword arguments ``BaseTrainer.get_batch_sampler`` passes (``generator`` and ``seed``
    are ignored on purpose: the curriculum order IS the order). ``set_epoch`` is inherited and a no-op
    for ordering, so epoch 2 replays the same curriculum.
    """

    def __init__(self, dataset, batch_size: int, drop_last: bool = False, valid_label_columns=None, generator=None, seed: int = 0):
        self.dataset_len = len(dataset)
        super().__init__(range(self.dataset_len), batch_size=batch_size, drop_last=drop_last, valid_label_columns=valid_label_columns, generator=generator, seed=seed)

    def __iter__(self):
        n, b = self.dataset_len, self.batch_size
        stop = n - n % b if self.drop_last else n
        for start in range(0, stop, b):
            yield list(range(start, min(start + b, n)))

    def __len__(self) -> int:
        n, b = self.dataset_len, self.batch_size
        return n // b if self.drop_last else -(-n // b)


def check_batches(columns: dict[str, list[Any]], batch_size: int, max_report: int = 5) -> list[str]:
    """Problems in consecutive batches: mixed ``phase`` values, the same text twice (false negatives).

    One pass over the python lists, O(rows). Returns human-readable problem strings (empty = fine).
    """
    problems: list[str] = []
    n = len(next(iter(columns.values())))
    phases = columns.get("phase")
    texts = [columns[c] for c in TEXT_COLUMNS if c in columns]
    for bi, start in enumerate(range(0, n, batch_size)):
        end = min(start + batch_size, n)
        if phases is not None and len(set(phases[start:end])) > 1:
            problems.append(f"batch {bi} (rows {start}-{end - 1}) mixes phases {sorted(set(phases[start:end]))}")
        seen: set[str] = set()
        dup = 0
        for col in texts:
            for t in col[start:end]:
                dup += t in seen
                seen.add(t)
        if dup:
            problems.append(f"batch {bi} (rows {start}-{end - 1}) holds {dup} duplicate text(s): false in-batch negatives")
        if len(problems) >= max_report:
            problems.append("... (more not checked)")
            break
    return problems
