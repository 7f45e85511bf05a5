"""The JSON record a scaling benchmark writes with ``--json``: its arguments, its figures, and the
machine's state while it ran (load at start and end, CPU affinity, torch threads)."""

from __future__ import annotations

import json
from pathlib import Path


def write_record(path: Path, args, figures: dict, *, load_start, load_end, affinity) -> None:
    import torch

    record = {
        "args": {k: str(v) for k, v in vars(args).items()},
        **figures,
        "load_start": load_start,
        "load_end": load_end,
        "affinity": affinity,
        "torch_threads": torch.get_num_threads(),
    }
    path.write_text(json.dumps(record, indent=1))
