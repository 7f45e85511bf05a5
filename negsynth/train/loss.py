"""InfoNCE with in-batch and hard negatives (SEED_SPEC §1.6), as sentence-transformers' MNRL.

For a batch of B triplets ``(q_i, d_i+, d_i-)`` and cosine similarity s::

    L = -(1/B) Σ_i log  exp(s(q_i,d_i+)/τ) / ( Σ_j exp(s(q_i,d_j+)/τ) + Σ_j exp(s(q_i,d_j-)/τ) )

This is exactly ``MultipleNegativesRankingLoss(model, scale=1/τ)`` with its default
``directions=("query_to_doc",)`` fed ``(anchor, positive, negative)`` columns: the score matrix is
``cos(q, [D+; D-]) * scale`` and the label of row i is i (tests/test_train.py checks it). τ per
model family: ``train.temperature`` (:func:`negsynth.train.trainer.resolve_temperature`).
"""

from __future__ import annotations

import torch


def make_loss(model, temperature: float, *, gather_across_devices: bool = False, mini_batch_size: int | None = None):
    """``MultipleNegativesRankingLoss`` with ``scale = 1/temperature`` (cosine similarity).

    ``mini_batch_size``: ``CachedMultipleNegativesRankingLoss`` (GradCache) instead, embedding
    the batch in chunks of that many rows: the same loss value and gradients, with the activation
    memory of one chunk instead of the whole batch (docs/benchmarks.md, training memory).

    ``gather_across_devices``: under DDP, every rank scores its queries against all ranks' documents
    (a no-op in a single process).
    """
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss

    if mini_batch_size:
        return CachedMultipleNegativesRankingLoss(
            model, scale=1.0 / temperature, mini_batch_size=mini_batch_size, gather_across_devices=gather_across_devices
        )
    return MultipleNegativesRankingLoss(model, scale=1.0 / temperature, gather_across_devices=gather_across_devices)


def make_angle_infonce_loss(
    model,
    temperature: float,
    *,
    infonce_weight: float = 1.0,
    angle_weight: float = 0.0,
    angle_scale: float = 20.0,
    gather_across_devices: bool = False,
):
    """``infonce_weight x MNRL + angle_weight x AnglELoss`` — AnglE's trainer on (text, positive,
    negative) rows as BeLLM trains (SEED_SPEC §5: ``ibn_w = 20``, ``angle_w = 1``, both at scale 20).

    The AnglE term ranks every (anchor, positive) pair (label 1) above every (anchor, negative)
    pair (label 0) of the batch, on angle differences (sentence-transformers' ``AnglELoss``, a
    CoSENT variant); each row's hard negatives (``negative`` or ``negative_1..n``) each make one
    label-0 pair. Both terms read the same embeddings: one forward pass per batch.
    """
    import torch
    from sentence_transformers.sentence_transformer.losses import AnglELoss

    mnrl = make_loss(model, temperature, gather_across_devices=gather_across_devices)

    class AnglEInfoNCELoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.infonce = mnrl
            self.angle = AnglELoss(model, scale=angle_scale)
            self.infonce_weight, self.angle_weight = infonce_weight, angle_weight

        def forward(self, sentence_features, labels):
            embeddings = [self.model(f)["sentence_embedding"] for f in sentence_features]
            loss = self.infonce_weight * self.infonce.compute_loss_from_embeddings(embeddings, labels)
            if self.angle_weight > 0 and len(embeddings) > 2:
                q, pos, negs = embeddings[0], embeddings[1], embeddings[2:]
                a = torch.cat([q] * (1 + len(negs)))
                b = torch.cat([pos, *negs])
                y = torch.cat([torch.ones(len(q), device=q.device), torch.zeros(len(q) * len(negs), device=q.device)])
                loss = loss + self.angle_weight * self.angle.compute_loss_from_embeddings([a, b], y)
            return loss

        def get_config_dict(self):
            return {"infonce_weight": infonce_weight, "angle_weight": angle_weight, "scale": 1.0 / temperature, "angle_scale": angle_scale}

    return AnglEInfoNCELoss()


#: ``train.loss`` values that learn from a teacher's scores (the dataset's ``label`` column)
DISTILL_LOSSES = ("margin-mse", "distill-kl", "mnrl+distill-kl")


class WeightedSumLoss(torch.nn.Module):
    """``sum_i weight_i x loss_i`` of sentence-transformers losses over one set of embeddings: the
    batch's columns are embedded once (``embed_columns``, as the library's losses do) and each
    part's ``compute_loss_from_embeddings`` reads them with the same labels."""

    def __init__(self, model, parts: dict[str, tuple[float, torch.nn.Module]]):
        super().__init__()
        self.model = model
        self.weights = {name: float(w) for name, (w, _) in parts.items()}
        self.parts = torch.nn.ModuleDict({name: loss for name, (_, loss) in parts.items()})

    def forward(self, sentence_features, labels):
        from sentence_transformers.base.losses.merged_forward import embed_columns

        embeddings = embed_columns(self.model, sentence_features)
        return sum(w * self.parts[name].compute_loss_from_embeddings(embeddings, labels) for name, w in self.weights.items())

    def get_config_dict(self):
        return {"weights": dict(self.weights), **{name: type(loss).__name__ for name, loss in self.parts.items()}}


def make_distill_loss(
    model,
    kind: str,
    *,
    temperature: float,
    distill_weight: float = 1.0,
    distill_temperature: float | None = None,
    distill_teacher_temperature: float | None = None,
    gather_across_devices: bool = False,
):
    """The loss of ``train.loss`` = ``kind`` (one of :data:`DISTILL_LOSSES`, docs/train.md) from
    sentence-transformers' ``MarginMSELoss`` / ``DistillKLDivLoss`` (+ InfoNCE through
    :class:`WeightedSumLoss` for ``mnrl+distill-kl``), fed ``(anchor, positive, negative_1..K)``
    and a ``label`` of the teacher's scores ``[positive, negative_1..K]`` per row. The student's
    score is the cosine (the library's default is the dot product); the teacher's scores come as
    written (a cross-encoder's logits)."""
    from sentence_transformers.sentence_transformer.losses import DistillKLDivLoss, MarginMSELoss
    from sentence_transformers.util import pairwise_cos_sim

    if kind not in DISTILL_LOSSES:
        raise ValueError(f"train.loss = {kind!r}: a distillation loss is one of {', '.join(DISTILL_LOSSES)}")
    if kind == "margin-mse":
        return MarginMSELoss(model, similarity_fct=pairwise_cos_sim)
    kl_kw = {"temperature": distill_temperature} if distill_temperature is not None else {}
    if distill_teacher_temperature is not None:
        kl_kw["teacher_temperature"] = distill_teacher_temperature
    kl = DistillKLDivLoss(model, similarity_fct=pairwise_cos_sim, **kl_kw)
    if kind == "distill-kl":
        return kl
    mnrl = make_loss(model, temperature, gather_across_devices=gather_across_devices)
    return WeightedSumLoss(model, {"mnrl": (1.0, mnrl), "distill_kl": (distill_weight, kl)})
