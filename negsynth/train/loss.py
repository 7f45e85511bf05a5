"""InfoNCE with in-batch and hard negatives (SEED_SPEC §1.6), as sentence-transformers' MNRL.

For a batch of B triplets ``(q_i, d_i+, d_i-)`` and cosine similarity s::

    L = -(1/B) Σ_i log  exp(s(q_i,d_i+)/τ) / ( Σ_j exp(s(q_i,d_j+)/τ) + Σ_j exp(s(q_i,d_j-)/τ) )

This is exactly ``MultipleNegativesRankingLoss(model, scale=1/τ)`` with its default
``directions=("query_to_doc",)`` fed ``(anchor, positive, negative)`` columns: the score matrix is
``cos(q, [D+; D-]) * scale`` and the label of row i is i. We reuse MNRL directly (:func:`make_loss`)
and keep a tensor version (:func:`info_nce`) so the equivalence is tested, not assumed.

Temperature default τ = 0.02 (scale 50): the seed text literally says "set to 1", but with cosine
logits in [-1, 1] τ = 1 gives almost no gradient signal; LLM2Vec (``loss_scale=50``), which MGH says it
follows, and E5 use τ = 0.02. Pass ``temperature=1.0`` for the literal-seed ablation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_TEMPERATURE = 0.02


def info_nce(q: torch.Tensor, d_pos: torch.Tensor, d_neg: torch.Tensor | None = None, temperature: float = DEFAULT_TEMPERATURE) -> torch.Tensor:
    """Reference InfoNCE on embeddings ``[B, d]`` (no query–query negatives)."""
    docs = d_pos if d_neg is None else torch.cat([d_pos, d_neg], 0)
    scores = F.normalize(q, dim=-1) @ F.normalize(docs, dim=-1).T / temperature
    return F.cross_entropy(scores, torch.arange(q.shape[0], device=q.device))


def make_loss(model, temperature: float = DEFAULT_TEMPERATURE, *, hardness_mode: str | None = None, hardness_strength: float = 0.0, gather_across_devices: bool = False):
    """``MultipleNegativesRankingLoss`` with ``scale = 1/temperature`` (cosine similarity).

    ``hardness_mode`` / ``hardness_strength``: the library's hardness weighting of negative logits.
    ``gather_across_devices``: under DDP, every rank scores its queries against all ranks' documents
    (a no-op in a single process).
    """
    if not temperature > 0:
        raise ValueError(f"temperature={temperature}: must be > 0 (0.05 = sentence-transformers encoders, 0.02 = LLM2Vec/E5 decoders, 1.0 = literal seed)")
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    kw = {"hardness_mode": hardness_mode, "hardness_strength": hardness_strength} if hardness_mode else {}
    return MultipleNegativesRankingLoss(model, scale=1.0 / temperature, gather_across_devices=gather_across_devices, **kw)
