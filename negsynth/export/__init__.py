"""Export a run as folders the Hugging Face ecosystem expects (``negsynth export``): ``OUT/dataset/``
(a dataset repo folder, a parquet file per configuration and a card) and ``OUT/model/``
(``RUN_DIR/train/final`` with a model card). The layouts: docs/train.md, "Share data and models".
"""

from __future__ import annotations

from negsynth.export.dataset import export_dataset
from negsynth.export.model import export_model
from negsynth.export.run import export_run, push

__all__ = ["export_dataset", "export_model", "export_run", "push"]
