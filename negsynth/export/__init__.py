"""Export a run as folders the Hugging Face ecosystem expects (``negsynth export``).

``OUT/dataset/``: a dataset repo folder, a parquet file per configuration and a dataset card.
Each configuration is a layout ``SentenceTransformerTrainer`` takes as it is: ``triplet``
(anchor, positive, negative), ``ntuple`` (anchor, positive, negative_1..n) and ``pair``, with
``label`` (a teacher's scores) where the run had a teacher; the default is the curriculum's own
layout, in training order; ``metadata`` holds the other columns row for row, and
``with_shards`` adds the stage records. ``datasets.load_dataset("OUT/dataset", "triplet")`` reads it.

``OUT/model/``: ``RUN_DIR/train/final`` with a model card (base model, data, schedule, pooling,
settings, evaluation table); ``SentenceTransformer(OUT/model)`` loads it, with ``query`` /
``document`` prompts where the anchors had an instruction prefix.
"""

from __future__ import annotations

from negsynth.export.dataset import export_dataset
from negsynth.export.model import export_model
from negsynth.export.run import export_run, push

__all__ = ["export_dataset", "export_model", "export_run", "push"]
