"""Export a run as folders the Hugging Face ecosystem expects (``negsynth export``).

``OUT/dataset/``: a dataset repo folder — parquet files + ``README.md`` (dataset card with YAML
front matter: configs, licence, composition, what made the data, schedule, score filters).
Configurations, each in a layout ``SentenceTransformerTrainer`` takes with no column
selection: ``triplet`` (anchor, positive, negative), ``ntuple`` (anchor, positive,
negative_1..n: the curriculum's n-tuple rows, or with ``ntuple=n`` one row per scored example)
and ``pair`` (anchor, positive); where the run had a teacher (``corpus.teacher``) ``triplet`` and
``ntuple`` add ``label``, its scores of the positive and each negative (the layout of
``MarginMSELoss`` / ``DistillKLDivLoss``; MNRL ignores it). The default one is the curriculum's
own layout, in training order. ``metadata`` holds the rest of the curriculum's columns row for row; with ``with_shards``
the stage records (``generate``, ``regenerate``, ``score``) too.
``datasets.load_dataset("OUT/dataset", "triplet", split="train")`` reads it offline (a repo
layout: ``load_from_disk`` does not); ``push_to_hub`` / :func:`push` upload it as it is.

``OUT/model/``: a copy of ``RUN_DIR/train/final`` with a model card (base model, data, schedule,
pooling, training settings, and the evaluation table from ``RUN_DIR/evaluate/report.json`` and
``baseline.json`` when present). ``SentenceTransformer(OUT/model)`` loads it; anchors trained
with an instruction prefix give it ``query`` / ``document`` prompts.

The package's modules: :mod:`~negsynth.export.dataset` and :mod:`~negsynth.export.model` write
one folder each, :mod:`~negsynth.export.provenance` says what made the examples (for both cards),
:mod:`~negsynth.export.run` is the command (both folders, ``--push``) and
:mod:`~negsynth.export.common` holds what they share.
"""

from __future__ import annotations

from negsynth.export.common import PARQUET
from negsynth.export.dataset import CONFIG_COLUMNS, TEXT_CONFIGS, export_dataset
from negsynth.export.model import export_model, query_prompts
from negsynth.export.provenance import describe_provenance, provenance
from negsynth.export.run import check_out, export_run, push

__all__ = [
    "CONFIG_COLUMNS",
    "PARQUET",
    "TEXT_CONFIGS",
    "check_out",
    "describe_provenance",
    "export_dataset",
    "export_model",
    "export_run",
    "provenance",
    "push",
    "query_prompts",
]
