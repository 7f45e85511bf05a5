"""Embedding trainer for the MGH curriculum: pooling (mean/last/ATA/latent), bidirectional decoders,
LoRA, InfoNCE with hard negatives, and an order-preserving sentence-transformers trainer.

Imports are lazy: ``import negsynth.train`` does not import torch or transformers; the first access
to a name below does. Install the extra with ``pip install negsynth[train]``.

    from negsynth.train import TrainConfig, train
    out_dir = train(curriculum_dataset, TrainConfig(pooling="ata"))
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TrainConfig": "negsynth.schemas.train",
    "LoraSettings": "negsynth.schemas.train",
    "train": "negsynth.train.trainer",
    "make_trainer": "negsynth.train.trainer",
    "build_model": "negsynth.train.trainer",
    "load_model": "negsynth.train.trainer",
    "for_stock_trainer": "negsynth.train.sampler",
    "EmbeddingPooling": "negsynth.train.pooling",
    "LatentAttentionPooling": "negsynth.train.pooling",
    "ata_weights": "negsynth.train.pooling",
    "recompute_attention_probs": "negsynth.train.pooling",
    "make_bidirectional": "negsynth.train.bidirectional",
    "BidirectionalAttention": "negsynth.train.bidirectional",
    "add_lora": "negsynth.train.lora",
    "make_loss": "negsynth.train.loss",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'negsynth.train' has no attribute {name!r}")
    try:
        module = importlib.import_module(mod)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"negsynth.train.{name} needs the training extra: pip install 'negsynth[train]' ({e})") from e
    return getattr(module, name)
