"""The trainer's checkpoints made safe to resume from: each ``checkpoint-N`` is sealed once whole.

The HF trainer writes a checkpoint file by file, and a run killed mid-save leaves a folder that
looks like a checkpoint but cannot be resumed. :func:`seal_callback` writes :data:`SEAL` (every
file with its size) after the trainer has saved everything; :func:`last_checkpoint` only ever
returns a sealed folder, and the rotation to ``save_total_limit`` happens only after the new one is
sealed (the trainer's own rotation would remove old checkpoints first).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: written into checkpoint-N once the trainer has saved everything in it: the files and their sizes
SEAL = "negsynth_checkpoint.json"


def checkpoint_step(path: Path) -> int | None:
    """N of a ``checkpoint-N`` folder; None for any other name."""
    m = re.fullmatch(r"checkpoint-(\d+)", path.name)
    return int(m.group(1)) if m else None


def _sealed(path: Path) -> bool:
    """Whether ``checkpoint-N`` is whole: its seal lists every file with the size it had when saved."""
    try:
        files = json.loads((path / SEAL).read_text(encoding="utf-8"))["files"]
        return bool(files) and all((path / f).is_file() and (path / f).stat().st_size == n for f, n in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def checkpoints(output_dir: str | Path) -> list[tuple[int, Path, bool]]:
    """``(step, folder, sealed)`` of every ``checkpoint-N`` in ``output_dir``, by step."""
    d = Path(output_dir)
    if not d.is_dir():
        return []
    out = [(s, p, _sealed(p)) for p in d.iterdir() if p.is_dir() and (s := checkpoint_step(p)) is not None]
    return sorted(out, key=lambda t: t[0])


def last_checkpoint(output_dir: str | Path) -> Path | None:
    """The latest whole checkpoint (sealed: a kill mid-save leaves an unsealed one, never used)."""
    sealed = [p for _, p, ok in checkpoints(output_dir) if ok]
    return sealed[-1] if sealed else None


def drop_checkpoint(path: Path) -> None:
    """Remove a checkpoint folder, its seal first."""
    import shutil

    (path / SEAL).unlink(missing_ok=True)  # unsealed first: a kill mid-removal leaves no half checkpoint that looks whole
    shutil.rmtree(path, ignore_errors=True)


def seal_callback(limit: int | None):
    """Seal each checkpoint once the trainer has written it, then keep the ``limit`` newest sealed
    ones (the trainer's own rotation is off: it removes old checkpoints before the new one is sealed)."""
    from transformers import TrainerCallback

    from negsynth.data.shards import atomic_write_text
    from negsynth.faults import crash_point

    class CheckpointSeal(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            if not state.is_world_process_zero:
                return
            ck = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if not ck.is_dir():
                return
            crash_point(f"checkpoint_saved:{state.global_step}")  # the resume test's kill mid-save
            files = {str(p.relative_to(ck)): p.stat().st_size for p in sorted(ck.rglob("*")) if p.is_file() and p.name != SEAL}
            atomic_write_text(ck / SEAL, json.dumps({"step": state.global_step, "files": files}, indent=1) + "\n")
            crash_point(f"checkpoint_sealed:{state.global_step}")
            if limit is not None:
                sealed = [p for _, p, ok in checkpoints(args.output_dir) if ok]
                for old in sealed[: max(0, len(sealed) - limit)]:
                    drop_checkpoint(old)

    return CheckpointSeal()
