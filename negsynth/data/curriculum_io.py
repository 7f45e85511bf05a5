"""The curriculum on disk: the ordered rows saved as a ``datasets`` folder with its card
(``card.json`` / ``card.md``: counts per phase, level, task type and source), written atomically,
and read back in training order, and the error every curriculum step raises.
:mod:`negsynth.data.curriculum` builds the rows (and is where callers import these from)."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from negsynth.errors import NegsynthError

#: the saved columns (``negative_1..K`` in place of ``negative`` for n-tuple rows; ``label`` where a teacher scored them)
COLUMNS = ("anchor", "positive", "negative", "level", "phase", "batch", "task_type", "example_id", "source")


class CurriculumError(NegsynthError, ValueError):
    """Bad input or options for the curriculum builder (message names the field and the fix)."""


def composition(rows: list[dict], stats: dict | None = None) -> dict[str, Any]:
    """Counts per phase, level, task_type, source and (phase, level) — the dataset card."""
    stats = dict(stats or getattr(rows, "stats", {}) or {})
    card = {
        "rows": len(rows),
        "batches": len({r["batch"] for r in rows if r["batch"] >= 0}),  # -1: rows not built as batches ("stock")
        "per_phase": dict(sorted(Counter(r["phase"] for r in rows).items())),
        "per_level": dict(sorted(Counter(r["level"] for r in rows).items())),
        "per_phase_level": {f"{p}/{lv}": n for (p, lv), n in sorted(Counter((r["phase"], r["level"]) for r in rows).items())},
        "per_task_type": dict(sorted(Counter(r["task_type"] for r in rows).items())),
        "per_source": dict(sorted(Counter(r["source"] for r in rows).items())),
        "build": stats,
    }
    return {k: ({str(a): b for a, b in v.items()} if isinstance(v, dict) and k != "build" else v) for k, v in card.items()}


def _card_md(card: dict) -> str:
    b = card["build"]
    lines = [
        "# Curriculum training set",
        "",
        f"Schedule `{b.get('schedule')}` (levels by phase {b.get('levels')}), batch size {b.get('batch_size')}, "
        f"seed {b.get('seed')}, homogeneous batches {b.get('homogeneous_batches')}, mined negatives {b.get('use_mined')}.",
        (
            f"{card['rows']} rows in input order, once: the trainer's shuffled sampler batches and cycles them."
            if b.get("batches_planned") is False
            else f"{card['rows']} rows = {card['batches']} batches, in training order (do not shuffle)."
        ),
        "",
    ]
    for key, title in (
        ("per_phase", "phase"),
        ("per_level", "level"),
        ("per_phase_level", "phase/level"),
        ("per_task_type", "task_type"),
        ("per_source", "source"),
    ):
        lines += [f"| {title} | rows |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in card[key].items()] + [""]
    lines += ["| build statistic | value |", "|---|---|"]
    lines += [f"| {k} | {str(v).replace(chr(10), chr(92) + 'n')} |" for k, v in b.items()] + [""]
    return "\n".join(lines)


def row_columns(row: dict) -> list[str]:
    """The saved columns: :data:`COLUMNS`, with ``negative_1..negative_K`` in place of ``negative``
    for n-tuple rows (``tuple`` schedules), and ``label`` after the texts where rows carry one."""
    negs = sorted((c for c in row if re.fullmatch(r"negative_\d+", c)), key=lambda c: int(c.rsplit("_", 1)[1]))
    label = ["label"] if "label" in row else []
    if not negs:
        return [*COLUMNS[:3], *label, *COLUMNS[3:]]
    return ["anchor", "positive", *negs, *label, *COLUMNS[3:]]  # COLUMNS[2] is "negative"


def save_curriculum(rows: list[dict], out_dir: str | Path, *, stats: dict | None = None) -> Path:
    """Write ``out_dir/{dataset/ (HF save_to_disk), train.parquet, card.json, card.md}``.

    Atomic: everything is written to a temp dir beside ``out_dir`` and renamed into place, so
    a crash leaves either the old folder or the new one. Row order is preserved.
    """
    import datasets

    out_dir = Path(out_dir)
    if not rows:
        raise CurriculumError(f"curriculum: no rows to save to {out_dir}; build_curriculum produced none")
    columns = row_columns(rows[0])
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise CurriculumError(f"curriculum: rows lack column(s) {missing}; pass the output of build_curriculum")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        ds = datasets.Dataset.from_list([{c: r[c] for c in columns} for r in rows])
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # the stage prints its own summary (and a notebook cell no bars)
        try:
            ds.save_to_disk(str(tmp / "dataset"))
            ds.to_parquet(str(tmp / "train.parquet"))
        finally:
            if bars:
                datasets.enable_progress_bars()
        card = composition(rows, stats)
        import json

        (tmp / "card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
        (tmp / "card.md").write_text(_card_md(card), encoding="utf-8")
        old = None
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
            out_dir.rename(old)
        tmp.rename(out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def load_curriculum(out_dir: str | Path):
    """The saved rows as a ``datasets.Dataset`` (training order); a saved 0-row dataset loads as
    an empty one (``datasets.load_from_disk`` fails on it with an IndexError)."""
    import json

    import datasets

    path = Path(out_dir) / "dataset"
    if not path.is_dir():
        raise CurriculumError(f"curriculum: {path} does not exist; run save_curriculum first")
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        if not state.get("_data_files"):  # saved with no rows: no arrow file to load
            try:
                feats = datasets.Features.from_dict(json.loads((path / "dataset_info.json").read_text(encoding="utf-8"))["features"])
                return datasets.Dataset.from_dict({k: [] for k in feats}, features=feats)
            except (OSError, ValueError, KeyError, TypeError):
                return datasets.Dataset.from_dict({})
        return datasets.load_from_disk(str(path))
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise CurriculumError(
            f"{path}: cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}); rebuild it with `negsynth curriculum --overwrite`"
        ) from None
