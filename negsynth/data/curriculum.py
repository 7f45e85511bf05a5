"""Turn scored examples into the training rows, in TRAINING ORDER (SEED_SPEC §1.7; docs/curriculum.md).

Each :class:`~negsynth.schemas.records.Example` holds 4 negatives, hardest first (``negatives[0]``
= level 1). The ``curriculum`` schedule feeds them coarse to fine: level 4 for the first quarter
of the steps, then 3, 2, 1. How rows are drawn:

1. A seeded *stream* of example indices (one fresh permutation per pass) is cut into one segment
   per phase, so the phases get disjoint groups; a row is (query, positive, the negative of its
   phase's level).
2. A phase's rows are packed into batches in stream order; phases never mix, and with
   ``homogeneous_batches`` a batch holds one ``task_type`` (LLM2Vec / E5).
3. No text occurs twice in a batch (:func:`~negsynth.data.text.text_key`): a colliding row moves
   to a later batch of its phase; a row repeating its own text is dropped
   (``stats["dropped_self_duplicate"]``).
4. A phase's leftover rows are packed again, across task types, into short batches after its full
   ones (as ``NO_DUPLICATES`` keeps a last batch); never padded.

Length: ``total_steps`` gives each phase its share of steps (the last takes the remainder),
drawing further passes as needed; ``epochs`` (default 1) makes the stream ``round(epochs * N)``
long. Other schedules: ``tuple`` / ``tuple:K`` (one phase, each row the K hardest negatives as
``negative_1..K``, ``level = 0``), and ``stock`` (:func:`negsynth.data.stock.stock_curriculum`:
the ``tuple`` rows in input order, no batches planned, for the trainer's shuffled sampler).

Examples with fewer negatives than the schedule needs are skipped
(``stats["skipped_few_negatives"]``); ``use_mined`` takes ``mined_negatives`` instead. When every
usable example carries a teacher's scores (:func:`teacher_label`), rows add ``label``
(``[positive, negative_1..K]``, the layout of ``MarginMSELoss`` / ``DistillKLDivLoss``). The result
is a :class:`CurriculumRows` (a list of row dicts with ``stats``), to be trained in order.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from negsynth.data.curriculum_io import CurriculumError, load_curriculum, save_curriculum  # noqa: F401 - where callers import them
from negsynth.data.text import text_key

DEFAULT_TEMPLATE = "Instruct: {instruction}\nQuery: {query}"


class BatchFillError(CurriculumError):
    """A phase could not fill its batches with distinct texts (``total_steps`` asked for more)."""


class CurriculumRows(list):
    """A ``list`` of row dicts in training order, plus ``stats`` (counts, options)."""

    stats: dict[str, Any]

    def __init__(self, rows=(), stats: dict | None = None):
        super().__init__(rows)
        self.stats = stats or {}


def parse_schedule(schedule: str) -> tuple[str, list[int], int]:
    """``schedule`` -> (kind, level per phase (0 = every level up to K), negatives needed)."""
    s = schedule.strip().lower()
    if s == "curriculum":
        return "curriculum", [4, 3, 2, 1], 4
    if s == "stock":  # one row per example, input order: built by negsynth.data.stock.stock_curriculum
        return "stock", [0], 4
    m = re.fullmatch(r"tuple(?::([1-9][0-9]*))?", s)
    if m:  # level 0 = the row carries every level up to K
        k = int(m.group(1) or 4)
        return ("tuple" if k == 4 else f"tuple:{k}"), [0], k
    raise CurriculumError(f"curriculum: schedule {schedule!r} is not one of curriculum, tuple, tuple:K, stock")


def to_example(obj, i: int):
    from pydantic import ValidationError

    from negsynth.schemas.records import Example, first_problem

    if isinstance(obj, Example):
        return obj
    if not isinstance(obj, dict):
        raise CurriculumError(f"curriculum: example #{i} is a {type(obj).__name__}, not a dict or Example; pass Example records")
    try:
        return Example.model_validate(obj)
    except ValidationError as e:
        loc, msg = first_problem(e, "(record)")
        raise CurriculumError(f"curriculum: example #{i} (id={obj.get('id', '?')!r}) field {loc!r}: {msg}; fix that record") from None


def anchor_of(ex, instruction_template: str | None) -> str:
    """A row's anchor: the query in ``instruction_template`` with the example's task, or bare."""
    task = ex.task.strip()
    return instruction_template.format(instruction=task, query=ex.query) if instruction_template and task else ex.query


def teacher_label(ex, use_mined: bool = False) -> list[float] | None:
    """The teacher's scores of ``ex``'s positive and of each of its negatives as they stand now,
    ``[positive, negative_1, ...]``, or None when it has none that line up.

    ``meta["teacher_label"]`` holds them in the order the negatives were written (the
    cross-encoder teacher's scores); ``score`` may reorder or
    drop negatives and records which it kept in ``score.llm_order``, which is followed here. An
    older run dir (no ``teacher_label``: its ``teacher_scores`` are RRF ranks) and ``use_mined``
    (the scores belong to ``negatives``, not ``mined_negatives``) have none."""
    label = ex.meta.get("teacher_label") if isinstance(ex.meta, dict) else None
    if use_mined or not isinstance(label, list) or len(label) < 2:
        return None
    try:
        pos, scores = float(label[0]), [float(x) for x in label[1:]]
    except (TypeError, ValueError):
        return None
    order = ex.score.llm_order if ex.score is not None and ex.score.llm_order is not None else None
    if order is None:
        if len(scores) != len(ex.negatives):
            return None
        order = range(len(scores))
    if len(order) != len(ex.negatives) or any(not 0 <= i < len(scores) for i in order):
        return None
    return [pos, *(scores[i] for i in order)]


def _stream(n: int, rng: np.random.Generator) -> Iterator[int]:
    """Seeded permutations of range(n), one after another, forever."""
    while True:
        yield from rng.permutation(n).tolist()


class _Usable(NamedTuple):
    """An example a schedule can use, with what every row drawn from it needs precomputed: its
    negatives (LLM or mined), the formatted anchor, the text keys that decide batch duplicates
    (:func:`~negsynth.data.text.text_key`) and the teacher's scores (None when it has none)."""

    ex: Any
    negs: list[str]
    anchor: str
    q_key: str
    pos_key: str
    neg_keys: list[str]
    label: list[float] | None


#: one drawn row waiting in an open batch: (its draw number in the phase, the row, its text keys)
_Entry = tuple[int, dict, set[str]]


def _check_options(
    kind: str,
    n_phases: int,
    batch_size: int,
    total_steps: int | None,
    epochs: float | None,
    instruction_template: str | None,
) -> float | None:
    """Refuse options that contradict each other or cannot build anything, before any example is
    read; return ``epochs``, 1 when neither it nor ``total_steps`` is given."""
    if batch_size < 1:
        raise CurriculumError(f"curriculum: batch_size must be >= 1, got {batch_size}")
    if total_steps is not None and epochs is not None:
        raise CurriculumError("curriculum: give total_steps or epochs, not both")
    if total_steps is not None and total_steps < n_phases:
        raise CurriculumError(f"curriculum: total_steps={total_steps} is fewer than the {n_phases} phases of {kind!r}")
    if epochs is None and total_steps is None:
        epochs = 1
    if epochs is not None and epochs <= 0:
        raise CurriculumError(f"curriculum: epochs must be > 0, got {epochs}")
    if instruction_template is not None and "{query}" not in instruction_template:
        raise CurriculumError("curriculum: instruction_template must contain {query} (and usually {instruction})")
    return epochs


def _usable_examples(examples: Iterable, needed: int, use_mined: bool, instruction_template: str | None, stats: Counter) -> list[_Usable]:
    """The examples with at least ``needed`` negatives, in input order; the others are counted in
    ``stats["skipped_few_negatives"]`` (a schedule never pads a row with a missing level)."""
    pool: list[_Usable] = []
    for i, obj in enumerate(examples):
        ex = to_example(obj, i)
        negs = list(ex.mined_negatives if use_mined else ex.negatives)
        if len(negs) < needed:
            stats["skipped_few_negatives"] += 1
            continue
        keys = (text_key(ex.query), text_key(ex.positive), [text_key(n) for n in negs])
        pool.append(_Usable(ex, negs, anchor_of(ex, instruction_template), *keys, teacher_label(ex, use_mined)))
    return pool


def _phase_lengths(n_phases: int, pool_size: int, total_steps: int | None, epochs: float | None) -> tuple[list, list]:
    """Per phase, (batches to fill, examples to draw): with ``total_steps`` a step count each
    (``total_steps // n`` for all but the last phase, which takes the rest) and no draw limit;
    with ``epochs`` the ``round(epochs * N)``-long stream cut into ``n`` equal segments."""
    if total_steps is not None:
        first = total_steps // n_phases
        step_targets: list[int | None] = [first] * (n_phases - 1) + [total_steps - first * (n_phases - 1)]
        return step_targets, [None] * n_phases
    total_rows = max(int(round(epochs * pool_size)), 1)
    seg_sizes: list[int | None] = [len(a) for a in np.array_split(np.arange(total_rows), n_phases)]
    return [None] * n_phases, seg_sizes


def place(open_batches: list[tuple[list, set[str]]], item, keys: set[str], batch_size: int) -> tuple[list | None, bool]:
    """Put ``item`` into the earliest open batch that holds none of its text ``keys`` (opening a new
    one when none does) -> (that batch's items once it is full, and closed; else None), and whether
    it went into a later batch than the earliest open one. The builder and the trainer's sampler
    (:func:`negsynth.train.sampler.plan_batches`) fill their batches with it."""
    for k, (members, seen) in enumerate(open_batches):  # noqa: B007 - k is read after the loop
        if seen.isdisjoint(keys):
            break
    else:
        k, (members, seen) = len(open_batches), ([], set())
        open_batches.append((members, seen))
    members.append(item)
    seen.update(keys)
    if len(members) < batch_size:
        return None, k > 0
    del open_batches[k]
    return members, k > 0


@dataclass
class _Drawer:
    """What every phase draws from, in one place so the phases share it: the usable examples, the
    seeded stream over them, and the counts."""

    pool: list[_Usable]
    stream: Iterator[int]
    needed: int
    with_labels: bool
    batch_size: int
    homogeneous_batches: bool
    stats: Counter
    used: set[int] = field(default_factory=set)  # pool indices that gave at least one row

    def row(self, u: _Usable, level: int, phase: int) -> tuple[dict, set[str]] | None:
        """The row of ``u`` at ``level`` (0: the n-tuple of its ``needed`` hardest negatives) and
        its text keys; None when the row repeats one of its own texts (it could never be placed)."""
        if level == 0:  # n-tuple row: the K hardest negatives, hardest first
            keys = {u.q_key, u.pos_key, *u.neg_keys[: self.needed]}
            row_negs = {f"negative_{j + 1}": t for j, t in enumerate(u.negs[: self.needed])}
            row_label = u.label[: self.needed + 1] if self.with_labels else None
        else:
            keys = {u.q_key, u.pos_key, u.neg_keys[level - 1]}
            row_negs = {"negative": u.negs[level - 1]}
            row_label = [u.label[0], u.label[level]] if self.with_labels else None
        if len(keys) < 2 + len(row_negs):
            return None
        row = {
            "anchor": u.anchor,
            "positive": u.ex.positive,
            **row_negs,
            **({"label": row_label} if row_label is not None else {}),
            "level": level,
            "phase": phase,
            "batch": -1,
            "task_type": u.ex.task_type,
            "example_id": u.ex.id,
            "source": u.ex.source,
        }
        return row, keys

    def phase(self, p: int, lvl: int, target: int | None, seg: int | None) -> tuple[list[list[dict]], list[_Entry]]:
        """Draw phase ``p``'s rows (level ``lvl``) until it has ``target``
        full batches or has drawn its ``seg`` examples -> (full batches in the order they filled,
        the rows left in open batches, in draw order). Refuses a ``target`` the pool cannot fill."""
        open_batches: dict[str, list[tuple[list[_Entry], set[str]]]] = {}
        done: list[list[dict]] = []
        consumed = 0
        limit = None if target is None else 20 * target * self.batch_size + 10 * len(self.pool)
        while True:
            if (target is not None and len(done) >= target) or (seg is not None and consumed >= seg):
                break  # the phase has its batches (total_steps) or its share of the stream (epochs)
            if limit is not None and consumed >= limit:
                raise BatchFillError(
                    f"curriculum: phase {p} cannot fill {target} batches of {self.batch_size} rows with distinct texts "
                    f"from {len(self.pool)} examples; lower batch_size or total_steps, or set homogeneous_batches=False"
                )
            idx = next(self.stream)
            consumed += 1
            u = self.pool[idx]
            made = self.row(u, lvl, p)
            if made is None:
                self.stats["dropped_self_duplicate"] += 1
                continue
            row, keys = made
            group = u.ex.task_type if self.homogeneous_batches else ""
            full, moved = place(open_batches.setdefault(group, []), (consumed, row, keys), keys, self.batch_size)
            if moved:
                self.stats["moved_to_later_batch"] += 1
            self.used.add(idx)
            if full is not None:
                done.append([r for _, r, _ in full])
        left = sorted((e for slots in open_batches.values() for s in slots for e in s[0]), key=lambda e: e[0])
        return done, left


def _close_phase(
    p: int, done: list[list[dict]], left: list[_Entry], *, batch_size: int, train_short: bool, stats: Counter
) -> list[list[dict]]:
    """The phase's batches to emit: its full ones, then, when ``train_short``, its leftover rows
    packed into short batches (:func:`_pack`); otherwise the leftovers are dropped and counted."""
    if left and train_short:
        short = _pack(left, batch_size)
        stats["short_batches"] += sum(len(b) < batch_size for b in short)
        stats["rows_in_short_batches"] += sum(len(b) for b in short if len(b) < batch_size)
        stats[f"phase{p}_batches"] = len(done) + len(short)
        return done + short
    stats["dropped_incomplete"] += len(left)
    stats[f"phase{p}_batches"] = len(done)
    return done


def build_curriculum(
    examples: Iterable,
    *,
    schedule: str = "curriculum",
    batch_size: int = 64,
    total_steps: int | None = None,
    epochs: float | None = None,
    seed: int = 0,
    homogeneous_batches: bool = True,
    use_mined: bool = False,
    instruction_template: str | None = DEFAULT_TEMPLATE,
) -> CurriculumRows:
    """Build the training rows in training order (see the module docstring for the rules).

    ``examples``: :class:`Example` records or their dicts. ``total_steps`` and ``epochs`` are
    alternatives (default: ``epochs=1``). ``instruction_template`` formats the anchor with
    ``{instruction}`` (the example's ``task``) and ``{query}``; ``None`` or an example with an
    empty task gives the bare query.
    """
    kind, levels, needed = parse_schedule(schedule)
    if kind == "stock":
        raise CurriculumError("curriculum: schedule 'stock' plans no batches; build it with negsynth.data.stock.stock_curriculum")
    epochs = _check_options(kind, len(levels), batch_size, total_steps, epochs, instruction_template)
    stats: dict[str, Any] = Counter()
    pool = _usable_examples(examples, needed, use_mined, instruction_template, stats)
    stats["examples_in"] = len(pool) + stats["skipped_few_negatives"]
    stats["teacher_labels"] = sum(u.label is not None for u in pool)
    with_labels = bool(pool) and stats["teacher_labels"] == len(pool)  # all or none: a column has no gaps
    if not pool:
        raise CurriculumError(
            f"curriculum: no usable example (need >= {needed} {'mined_negatives' if use_mined else 'negatives'} each); "
            "check the input stage or use schedule tuple:K"
        )
    stream = _stream(len(pool), np.random.default_rng(seed))
    drawer = _Drawer(pool, stream, needed, with_labels, batch_size, homogeneous_batches, stats)
    rows: CurriculumRows = CurriculumRows()
    batch_no = 0
    for p, (lvl, target, seg) in enumerate(zip(levels, *_phase_lengths(len(levels), len(pool), total_steps, epochs)), start=1):
        done, left = drawer.phase(p, lvl, target, seg)
        # with total_steps a phase draws until its batches are full: there is nothing short to train
        for batch in _close_phase(p, done, left, batch_size=batch_size, train_short=target is None, stats=stats)[:target]:
            for r in batch:
                r["batch"] = batch_no
            rows.extend(batch)
            batch_no += 1
    stats = dict(stats)
    stats.update(
        {
            "schedule": kind,
            "levels": levels,
            "batch_size": batch_size,
            "seed": seed,
            "epochs": epochs,
            "total_steps": total_steps,
            "steps": batch_no,
            "rows": len(rows),
            "homogeneous_batches": homogeneous_batches,
            "use_mined": use_mined,
            "instruction_template": instruction_template,
            "label": with_labels,  # rows carry the teacher's scores (column ``label``)
            "examples_used": len(drawer.used),
            "examples_unused": len(pool) - len(drawer.used),
        }
    )
    # short batches are always trained now; the card still says so, as cards made when it was an
    # option did, so a card (and train's fingerprint over it) stays byte for byte what they recorded
    stats["incomplete_batches"] = "train"
    for k in ("skipped_few_negatives", "dropped_self_duplicate", "dropped_incomplete", "moved_to_later_batch", "short_batches"):
        stats.setdefault(k, 0)
    rows.stats = stats
    return rows


def _pack(entries: list[_Entry], batch_size: int) -> list[list[dict]]:
    """A phase's leftover rows (``(draw, row, text keys)`` in draw order) packed again, each into
    the earliest batch that holds none of its texts (:func:`place`); full batches close, the rest
    are emitted in the order they opened. Each keeps its ``batch`` number, which the trainer's
    sampler follows (:func:`negsynth.train.sampler.plan_batches` with the ``batch`` column as its
    segments), so it trains exactly these batches."""
    slots: list[tuple[list[_Entry], set[str]]] = []
    done: list[list[_Entry]] = []
    for e in entries:
        full, _ = place(slots, e, e[2], batch_size)
        if full is not None:
            done.append(full)
    return [[r for _, r, _ in members] for members in done + [m for m, _ in slots]]


def largest_fitting_batch(examples: list, batch_size: int, **options) -> tuple[int, CurriculumRows] | None:
    """The largest batch size below ``batch_size`` (down to 2) whose build gives at least one full
    batch, and its rows; ``None`` when not even pairs fit. For a small pool whose batches of
    ``batch_size`` cannot be filled with distinct texts (mined negatives are other examples'
    positives, so few examples share a batch); ``options`` as :func:`build_curriculum`'s."""
    for b in range(min(batch_size - 1, len(examples)), 1, -1):
        try:
            rows = build_curriculum(examples, batch_size=b, **options)
        except BatchFillError:
            continue
        if has_full_batch(rows):
            return b, rows
    return None


def has_full_batch(rows) -> bool:
    """Whether a build holds at least one batch of its full size (not only a phase's short ones)."""
    return bool(rows) and rows.stats.get("steps", 0) > rows.stats.get("short_batches", 0)
