"""Re-export: the trainer's config lives in :mod:`negsynth.schemas.train` so that the run file's
``[train]`` section (``RunConfig.train``) can use it without importing the trainer."""

from negsynth.schemas.train import (
    BERT_LORA_TARGETS,
    DECODER_ALIASES,
    ENCODER_ALIASES,
    LLAMA_LORA_TARGETS,
    TEXT_COLUMNS,
    LoraSettings,
    TrainConfig,
)

__all__ = ["BERT_LORA_TARGETS", "DECODER_ALIASES", "ENCODER_ALIASES", "LLAMA_LORA_TARGETS", "TEXT_COLUMNS", "LoraSettings", "TrainConfig"]
