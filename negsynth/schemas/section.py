"""The base of every run-file table (:class:`Section`): unknown keys refused, assignments
validated, the fields added after run dirs existed kept out of config hashes while they hold
their defaults (:data:`ADDED_FIELDS`), and the fields removed since kept in them at the defaults
they had (:data:`REMOVED_FIELDS`), so an older run dir still resumes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A table of the run file: unknown keys refused, assignments validated. A field that holds a
    table of its own defaults to that table's defaults (``price: PriceConfig = PriceConfig()``:
    pydantic copies a default per config, so no two configs share a table); every section has
    defaults, so an empty file is a valid config."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def __repr_args__(self):
        # a field added after run dirs were made (``added_field``) is left out while it holds its
        # default, a removed one put back at its old default in its old place: config hashes (over
        # the sections' dumps and reprs) stay what older run dirs recorded
        removed = REMOVED_FIELDS.get(type(self).__name__, {})
        for name, value in super().__repr_args__():
            if name not in ADDED_FIELDS.get(type(self).__name__, ()) or value != type(self).model_fields[name].get_default(
                call_default_factory=True
            ):
                yield name, value
            yield from ((gone, old) for gone, (after, old) in removed.items() if after == name)

    def hash_dump(self) -> dict:
        """``model_dump(mode="json")`` less the added fields at their defaults, with the removed ones
        at their old defaults (see ``__repr_args__``)."""
        out = added_at_default(self, self.model_dump(mode="json"))
        for name, value in self:
            if isinstance(value, Section):
                out[name] = value.hash_dump()
            elif isinstance(value, BaseModel) and type(value).__name__ in ADDED_FIELDS:  # train: a plain model
                out[name] = added_at_default(value, value.model_dump(mode="json"))
        return out


#: section class -> fields added after run dirs existed: at their defaults they stay out of config
#: hashes, so an older run dir resumes; set, they change the hash as every setting does
ADDED_FIELDS: dict[str, tuple[str, ...]] = {
    "CorpusConfig": ("teacher", "teacher_k", "queries", "candidates", "teacher_model"),
    "RegenerateConfig": ("teacher", "teacher_model"),
    # not a Section: the train stage's fingerprint drops these itself (added_at_default)
    "TrainConfig": ("loss", "distill_weight", "distill_temperature", "distill_teacher_temperature"),
}


#: section class -> fields removed after run dirs existed: ``{field: (the field it followed, its
#: old default)}``. Every run dir made before held them at those defaults (any other value is
#: refused now: ``config_io.REMOVED``), so config hashes read them there as they always did
REMOVED_FIELDS: dict[str, dict[str, tuple[str, Any]]] = {
    "CorpusConfig": {"negatives": ("styles", "mined"), "max_doc_chars": ("max_query_chars", 1500)},
    "CurriculumConfig": {"incomplete_batches": ("instructions", "train")},
    "ScoreConfig": {"easy_margin": ("min_negatives", None), "dedup_labelled": ("dedup_threshold", "exact")},
    "LLMConfig": {"transport": ("tpm", "http1")},
    "GenerateConfig": {"worked_examples": ("few_shot", "rotate")},
    "EmbedderConfig": {"devices": ("device", None), "reba_variant": ("repeat", "paper"), "padding_side": ("repeat", None)},
    "ServeConfig": {"engine": ("startup_timeout", "auto")},
    "MiningConfig": {
        "strategy": ("sampling", "top"),
        "bands": ("sampling", [(1, 3), (4, 10), (11, 30), (31, 100)]),
        "seed": ("sampling", 0),
    },
    # not a Section: added_at_default and TrainConfig.__repr_args__ put these back
    "TrainConfig": {
        "latent_num": ("pooling", 512),
        "latent_heads": ("pooling", 8),
        "ata_detach": ("pooling", False),
        "ata_pool": ("pooling", "embed_mask"),
        "hardness_mode": ("max_grad_norm", None),
        "hardness_strength": ("max_grad_norm", 0.0),
        "check_batches": ("resume", True),
        "no_duplicates": ("resume", True),
    },
}


def added_at_default(model, dump: dict) -> dict:
    """``dump`` (of ``model``) less the fields of ``ADDED_FIELDS`` that ``model`` holds at their
    default, with those of ``REMOVED_FIELDS`` at their old defaults."""
    for name in ADDED_FIELDS.get(type(model).__name__, ()):
        if getattr(model, name) == type(model).model_fields[name].get_default(call_default_factory=True):
            dump.pop(name, None)
    dump.update({gone: old for gone, (_, old) in REMOVED_FIELDS.get(type(model).__name__, {}).items()})
    return dump
