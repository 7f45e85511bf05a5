"""Data-parallel training: ``negsynth train`` under ``torchrun`` / ``accelerate launch``.

The sentence-transformers trainer already runs under DDP when a launcher starts it; negsynth makes a
run on W devices train on the batches of a run on one: ``train.batch_size`` stays the **global**
batch (each rank gets ``b / W`` rows, :func:`per_device_batch_size`), the
:class:`~negsynth.train.sampler.CurriculumBatchSampler` hands each rank its slice of every global
batch, and the loss gathers every rank's embeddings (``train.gather_across_devices``).

``torchrun --nproc_per_node N -m negsynth train -d RUN`` starts the CLI N times. Rank 0 runs the
train stage as one process would (lock, reuse or resume, manifest, stats, progress) and, just
before training, tells the other ranks the exact ``TrainConfig`` it trains with, or that there is
nothing to train (:func:`announce`); they train with it silently, or exit (:func:`follow`).
Commands for one node and several: docs/scale.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from negsynth.train.sampler import data_parallel_world


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


_announced = False


def init_launched_group() -> None:
    """Join the launcher's process group now, with the backend the trainer would pick (nccl on
    GPUs, gloo on CPU); the trainer then uses this group. A no-op when already joined."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        # without a GPU, accelerate takes torchrun's LOCAL_RANK for a GPU launch and falls back to no
        # distribution (every rank alone on all the data); this makes its PartialState pick MULTI_CPU
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
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
