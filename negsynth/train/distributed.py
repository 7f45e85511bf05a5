"""Data-parallel training on several devices or nodes with ``torchrun`` / ``accelerate launch``.

The sentence-transformers trainer (a transformers ``Trainer``) already runs under DDP when it is
started by a launcher; negsynth adds three things so that a run on W devices trains on the same
batches as a run on one:

* ``train.batch_size`` stays the **global** batch b. Each rank gets ``b / W`` rows per step
  (:func:`per_device_batch_size`; b must be a multiple of W).
* :class:`~negsynth.train.sampler.CurriculumBatchSampler` plans the global batches as in one process
  and yields their per-rank slices (see its module docstring): same phase on every rank at every
  step, no text twice in a global batch, global order = single-process order.
* the loss gathers every rank's embeddings (``train.gather_across_devices = true``, the default),
  so each query still sees all b positives and b hard negatives of the global batch.

Only rank 0 writes the final model and ``RUN_DIR/train/stats.json``.

Entry point (one process per device; see docs/scale.md for the multi-node commands)::

    torchrun --nproc_per_node 8 -m negsynth.train.distributed --run-dir RUN [--config run.toml] [--set train.batch_size=512]
    accelerate launch --multi_gpu --num_processes 8 -m negsynth.train.distributed --run-dir RUN

It reads ``RUN/curriculum/dataset`` (or ``--data`` = a parquet file / saved dataset folder) and
writes ``RUN/train/final`` like ``negsynth train``; the run manifest is not touched.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from negsynth.train.sampler import data_parallel_world

log = logging.getLogger(__name__)


def per_device_batch_size(global_batch_size: int, world_size: int | None = None) -> int:
    """``global_batch_size / world_size`` (default: the launcher's world size); raises if uneven."""
    w = world_size if world_size is not None else data_parallel_world()[0]
    if global_batch_size % w:
        raise ValueError(
            f"batch_size={global_batch_size} is the global batch and must be a multiple of the {w} processes (data-parallel world size)"
        )
    return global_batch_size // w


def is_main_process() -> bool:
    return data_parallel_world()[1] == 0


def _cpu_ddp_if_no_gpu() -> None:
    """On a machine without a GPU, accelerate treats torchrun's LOCAL_RANK as a GPU launch and falls
    back to *no* distribution (every rank would train alone on all the data); ACCELERATE_USE_CPU
    makes the trainer's PartialState pick MULTI_CPU with the gloo backend."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")


# ----------------------------------------------------------------------------- `negsynth train` under a launcher
#
# ``torchrun --nproc_per_node N -m negsynth train --run-dir RUN`` starts the CLI N times. Rank 0
# runs the train stage as one process would (run-dir lock, reuse / resume decision, manifest,
# stats, progress, summary table) and, just before training, tells the other ranks the exact
# TrainConfig it trains with (its resume checkpoint included), or that there is nothing to train
# (the stage was up to date, or failed before training): they then train with it, silently, or
# exit. Without that word a rank could start training that rank 0 skipped, and wait forever.

_announced = False


def init_launched_group() -> None:
    """Join the launcher's process group now, with the backend the trainer would pick (nccl on
    GPUs, gloo on CPU); the trainer then uses this group. A no-op when already joined."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    _cpu_ddp_if_no_gpu()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")


def announce(config) -> None:
    """Rank 0 of a launched run: send the other ranks the ``TrainConfig`` to train with (``None``:
    nothing to train, they exit). Once per process; a no-op outside a launcher and on other ranks."""
    global _announced
    import torch.distributed as dist

    if _announced or not dist.is_initialized() or dist.get_world_size() == 1 or dist.get_rank() != 0:
        return
    _announced = True
    dist.broadcast_object_list([config], src=0)


def follow(run_dir: Path) -> bool:
    """A rank other than 0: wait for rank 0's word (:func:`announce`), then train on
    ``run_dir/curriculum`` with its config, printing nothing. Returns whether it trained."""
    import contextlib

    import torch.distributed as dist

    from negsynth.data.curriculum import load_curriculum
    from negsynth.train import train

    box = [None]
    dist.broadcast_object_list(box, src=0)
    config = box[0]
    if config is None:
        return False
    ds = load_curriculum(run_dir / "curriculum")
    # no bar and no log dicts; anything else printed goes to stderr: stdout is rank 0's (--json)
    with contextlib.redirect_stdout(sys.stderr):
        train(ds, config, progress=lambda *a, **kw: contextlib.nullcontext())
    return True


def leave_launched_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _load_data(path: str | Path):
    import datasets

    p = Path(path)
    if p.is_dir():
        return datasets.load_from_disk(str(p))
    if p.suffix == ".parquet":
        return datasets.Dataset.from_parquet(str(p))
    raise ValueError(f"--data {p}: expected a saved dataset folder or a .parquet file")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m negsynth.train.distributed",
        description="negsynth train under torchrun / accelerate launch (one process per device)",
    )
    ap.add_argument("--run-dir", required=True, type=Path, help="run directory: reads RUN/curriculum/dataset, writes RUN/train")
    ap.add_argument("--config", type=Path, default=None, help="run file (TOML); default: the built-in config")
    ap.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key, e.g. train.batch_size=512 (repeatable)",
    )
    ap.add_argument("--data", default=None, help="training rows instead of RUN/curriculum/dataset (saved dataset folder or .parquet)")
    args = ap.parse_args(argv)

    from negsynth.errors import UserError
    from negsynth.schemas.config_io import load_config

    world, rank = data_parallel_world()
    if world > 1:
        _cpu_ddp_if_no_gpu()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, args.sets)
        out = args.run_dir / "train"
        tc = cfg.train.model_copy(update={"output_dir": str(out)})
        per_device_batch_size(tc.batch_size, world)
        ds = _load_data(args.data or args.run_dir / "curriculum" / "dataset")
    except (UserError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if len(ds) == 0:
        print("error: the training data has 0 rows", file=sys.stderr)
        return 2
    from negsynth.train import train

    t0 = time.monotonic()
    log.info("train: %d rows, %d process(es), global batch %d = %d per device", len(ds), world, tc.batch_size, tc.batch_size // world)
    path = train(ds, tc)
    if rank == 0:
        hist = json.loads((Path(path) / "train_log.json").read_text(encoding="utf-8")).get("log_history", [])
        losses = [e["loss"] for e in hist if "loss" in e]
        stats = {
            "stage": "train",
            "model": path,
            "rows": len(ds),
            "world_size": world,
            "steps": len(losses),
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "phases_seen": sorted({e.get("phase") for e in hist if e.get("phase") is not None}),
            "wall_time_s": round(time.monotonic() - t0, 3),
        }
        from negsynth.data.shards import atomic_write_json

        atomic_write_json(out / "stats.json", stats)
        log.info("saved %s (%d steps, loss %s -> %s)", path, stats["steps"], stats["loss_first"], stats["loss_last"])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
