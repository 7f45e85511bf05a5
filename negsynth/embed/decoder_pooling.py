"""Pooling a decoder's hidden states into one vector: ReBA's fused backward attention and the
token weights it gives (SEED_SPEC §4), and mean / last-token pooling over a weight mask. Pure
tensor functions, unit-tested on their own; :class:`~negsynth.embed.decoder.DecoderEmbedder`
applies them to each batch."""

from __future__ import annotations

from collections.abc import Sequence


def fuse_attentions(attentions: Sequence, attention_mask) -> torch.Tensor:  # noqa: F821
    """ReBA Algorithm 1: ``A_new = max over layers and heads of (A + Aᵀ) / 2``, ``[B, L, L]`` float32.

    ``attentions``: one ``[B, H, L, L]`` probability tensor per layer (row = query); pad rows and
    columns are zeroed before the max, so the result on the real tokens is an unpadded run's (the
    seed's ``(A+B)/2 + |A-B|/2`` from 0 is the same max, the entries being non-negative)."""
    import torch

    if not attentions or any(a is None for a in attentions):
        raise RuntimeError("the model returned no attention probabilities; ReBA needs attn_implementation='eager'")
    m = attention_mask.to(dtype=torch.float32, device=attentions[0].device)
    valid = (m[:, :, None] * m[:, None, :])[:, None].bool()  # [B, 1, L, L]
    fused = None
    for a in attentions:
        a = torch.where(valid, a.float(), 0.0)  # where, not *: a fully masked pad row may hold NaN
        s = ((a + a.transpose(-1, -2)) / 2).amax(dim=1)  # symmetrise, max over heads
        fused = s if fused is None else torch.maximum(fused, s)
    return fused


def reba_weights(fused, first_mask, attention_mask, pooling: str):
    """Token weights ``w[b, k]`` so that the ReBA sentence embedding is ``Σ_k w_k v_k / Σ_k w_k``.

    In: ``fused`` ``[B, L, L]`` from :func:`fuse_attentions`; ``first_mask`` ``[B, L]`` marks the
    tokens of the *first* copy of the text (the rows, i.e. the words being embedded);
    ``attention_mask`` ``[B, L]``. ``v_k`` are the last-layer hidden states.

    - ``mean`` (paper eq. 5; the code's ``LLM_ours_mean_pool`` is the same up to scale):
      ``w_k = Σ_{i in first copy, i <= k} A_new[i, k]`` (column sums of the upper triangle over
      the first-copy rows), so each word i gathers the *backward* attention from itself and every
      later token, and the words are averaged.
    - ``last`` (eq. 4 for the last word of the first copy, e_n): ``w_k = A_new[n, k]`` for
      ``k >= n``, where n = last token of the first copy.
    Out: ``[B, L]`` float, zero on pads.
    """
    import torch

    am = attention_mask.to(fused.dtype)
    first = first_mask.to(fused.dtype)
    L = fused.shape[-1]
    pos = torch.arange(L, device=fused.device)
    if pooling == "mean":
        upper = torch.triu(fused)  # keep k >= i
        w = torch.einsum("bi,bik->bk", first, upper)
    elif pooling == "last":
        n = _last_index(first_mask)
        w = fused[torch.arange(fused.shape[0]), n] * (pos[None, :] >= n[:, None]).to(fused.dtype)
    else:
        raise ValueError(f"unknown pooling {pooling!r} (mean, last)")
    return w * am


def _last_index(mask):
    """Index of the last 1 in each row of a ``[B, L]`` 0/1 mask (works for left or right padding)."""
    import torch

    L = mask.shape[-1]
    pos = torch.arange(L, device=mask.device)[None, :].expand_as(mask)
    return torch.where(mask.bool(), pos, torch.full_like(pos, -1)).amax(dim=-1)


def pool(hidden, weights, pooling: str):
    """Pool ``hidden`` ``[B, L, d]`` with non-negative ``weights`` ``[B, L]`` -> ``[B, d]``.

    ``mean``: ``Σ_k w_k h_k / Σ_k w_k`` (with a 0/1 mask this is the plain mean over the masked
    positions). ``last``: ``h`` at the last position whose weight is non-zero.
    """
    import torch

    if pooling == "mean":
        w = weights.to(hidden.dtype)
        return torch.einsum("bl,bld->bd", w, hidden) / w.sum(dim=1, keepdim=True).clamp_min(1e-30)
    if pooling == "last":
        idx = _last_index(weights > 0)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]
    raise ValueError(f"unknown pooling {pooling!r} (mean, last)")
