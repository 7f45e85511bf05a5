"""ATA pooling for embedding training (mean, cls and last are sentence-transformers' own ``Pooling``).

**ATA** (anchor-token-aware pooling, SEED_SPEC §2.2-2.3; docs/train.md): token j's weight is the
final-layer attention it receives from every real position, averaged over heads, normalised over
the pooled set (``ata_pool``: ``"embed_mask"`` leaves an E5 prefix ``Instruct: …\nQuery: `` out,
``"all"`` pools every real token). SDPA and flash kernels never materialise the attention, so a
forward pre-hook keeps the final self-attention's input and the pooling recomputes its
probabilities (:func:`recompute_attention_probs`); ``tests/test_train.py`` checks it against eager
``output_attentions``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

import torch
from sentence_transformers.base.modules import Module
from torch import nn

log = logging.getLogger(__name__)

ATA_POOL_SETS = ("embed_mask", "all")
#: the E5 query format whose prefix ``embed_mask`` leaves out of ATA's pooled set (SEED_SPEC §1.9, §2.3)
INSTRUCTION_PROBE = ("Instruct: ", "x", "\nQuery: ", "y")


# ----------------------------------------------------------------------------- pure functions


def mean_pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the real (non-pad) token vectors: ``[B,n,d], [B,n] -> [B,d]``."""
    m = attention_mask.to(token_embeddings.dtype).unsqueeze(-1)
    return (token_embeddings * m).sum(1) / m.sum(1).clamp_min(1e-9)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each row, for left *or* right padding.

    ``[[1,1,0]] -> [1]`` (right padding), ``[[0,1,1]] -> [2]`` (left padding). The index of the last
    1 is ``n - 1 - argmax(flip(mask))``, which works for both layouts (and for an all-ones row).
    """
    n = attention_mask.shape[1]
    return n - 1 - attention_mask.flip(1).to(torch.int64).argmax(1)


def last_pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    idx = last_token_index(attention_mask)
    return token_embeddings[torch.arange(token_embeddings.shape[0], device=idx.device), idx]


def ata_weights(attn_probs: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Anchor-token weights from final-layer attention probabilities (SEED_SPEC §2.2 eq. 3–4).

    Args:
        attn_probs: ``[B, H, n, n]`` softmax probabilities, row i = query, column j = key.
        attention_mask: ``[B, n]`` 1 = real token. Pad query rows are dropped from the column sum.
        pool_mask: ``[B, n]`` the pooled set P (default: all real tokens).

    Returns:
        ``[B, n]`` float32 weights, zero outside P, summing to 1 over P:
        ``s_j = mean_h Σ_{i real} A[h,i,j]``, ``w_j = s_j / Σ_{k∈P} s_k``.
        The spec's ``×n`` and ``1/H`` factors cancel in the ratio.
    """
    valid = attention_mask.to(torch.float32)
    pool = valid if pool_mask is None else pool_mask.to(torch.float32) * valid
    s = (attn_probs.to(torch.float32) * valid[:, None, :, None]).sum(dim=2).mean(dim=1)  # [B, n]
    s = s * pool
    return s / s.sum(-1, keepdim=True).clamp_min(1e-12)


@dataclass(frozen=True)
class InstructionMarkers:
    """Token ids of an E5 instruction prefix: ``instruct`` (``Instruct:``), ``query`` (``Query:``)
    and the tokenizer's special ids."""

    instruct: tuple[int, ...]
    query: tuple[int, ...]
    special: frozenset[int]


def instruction_markers(tokenizer) -> InstructionMarkers:
    """Read the ids of ``Instruct:`` and ``Query:`` from how ``tokenizer`` splits the probe
    ``"Instruct: x\\nQuery: y"`` (character offsets; the tokens overlapping each marker's
    characters), so BPE, SentencePiece and WordPiece tokenizers all work."""
    pre, ins, mid, text = INSTRUCTION_PROBE
    probe = pre + ins + mid + text
    enc = tokenizer(probe, add_special_tokens=False, return_offsets_mapping=True)
    ids, offs = enc["input_ids"], enc["offset_mapping"]

    def covering(lo: int, hi: int) -> tuple[int, ...]:
        return tuple(i for i, (a, b) in zip(ids, offs) if b > a and a < hi and b > lo)

    q0 = probe.index("Query:")
    instruct = covering(0, len("Instruct:"))
    query = covering(q0, q0 + len("Query:"))
    if not instruct or not query:
        raise ValueError(f"could not find the instruction markers in {type(tokenizer).__name__}'s tokens")
    return InstructionMarkers(instruct, query, frozenset(getattr(tokenizer, "all_special_ids", []) or []))


def instruction_pool_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor, markers: InstructionMarkers) -> torch.Tensor:
    """``[B, n]`` 0/1 pooled set P: every real token, except in rows that hold ``Instruct:``
    followed later by ``Query:``, where everything from the start of the row (BOS/CLS, a chat
    wrapper's opening) up to and including that ``Query:`` is left out. The first ``Instruct:``
    counts (normally the row's first text tokens). A row whose text after the marker is empty
    keeps all its real tokens (P is never empty). Left or right padding."""
    pool = attention_mask.clone().to(torch.long)
    ids_rows, mask_rows = input_ids.tolist(), attention_mask.tolist()
    I, Q = list(markers.instruct), list(markers.query)  # noqa: E741 - the marker names of the spec

    def find(seq: list[int], sub: list[int], start: int) -> int | None:
        return next((k for k in range(start, len(seq) - len(sub) + 1) if seq[k : k + len(sub)] == sub), None)

    for b, (ids, m) in enumerate(zip(ids_rows, mask_rows)):
        real = [j for j, v in enumerate(m) if v]
        seq = [ids[j] for j in real]
        s0 = find(seq, I, 0)
        start = None if s0 is None else find(seq, Q, s0 + len(I))
        if start is None:
            continue
        cut = start + len(Q)  # first pooled position in seq
        if cut >= len(seq):
            continue
        pool[b, real[:cut]] = 0
    return pool


def _projections(attn: nn.Module) -> tuple[nn.Module, nn.Module]:
    for q, k in (("q_proj", "k_proj"), ("query", "key")):
        if hasattr(attn, q) and hasattr(attn, k):
            return getattr(attn, q), getattr(attn, k)
    raise TypeError(f"{type(attn).__name__} has neither q_proj/k_proj nor query/key projections; ATA cannot recompute attention")


def recompute_attention_probs(
    attn: nn.Module,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Attention probabilities ``[B, H, n, n]`` (float32) of one self-attention module.

    Recomputes ``softmax(q k^T * scaling + mask)`` from the module's *input* hidden states with the
    module's own projections, RoPE (when ``position_embeddings`` is given) and GQA head repetition.
    The mask hides pad keys, plus future keys when ``attn.is_causal`` is true.
    """
    q_proj, k_proj = _projections(attn)
    B, n, _ = hidden_states.shape
    head_dim = getattr(attn, "head_dim", None) or attn.attention_head_size
    q = q_proj(hidden_states).view(B, n, -1, head_dim)
    k = k_proj(hidden_states).view(B, n, -1, head_dim)
    if hasattr(attn, "q_norm"):  # Qwen3 / OLMo2-style per-head q/k norms
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    if position_embeddings is not None:
        mod = sys.modules[type(attn).__module__]
        cos, sin = position_embeddings
        q, k = mod.apply_rotary_pos_emb(q, k, cos, sin)
    if k.shape[1] != q.shape[1]:  # grouped-query attention
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scaling = getattr(attn, "scaling", head_dim**-0.5)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scaling
    allowed = attention_mask.bool()[:, None, None, :].expand(B, 1, n, n)
    if getattr(attn, "is_causal", False):
        allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
    # a fully masked row (a pad query under a causal mask with left padding) would give NaN;
    # let it see itself — such rows are dropped from the ATA sum anyway
    allowed = allowed | torch.eye(n, dtype=torch.bool, device=scores.device)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1)


def find_last_self_attention(backbone: nn.Module) -> nn.Module:
    """The final self-attention module of a transformers backbone (Llama-family or BERT-family)."""
    last = None
    for name, mod in backbone.named_modules():
        if "crossattention" in name.lower():
            continue
        try:
            _projections(mod)
        except TypeError:
            continue
        last = mod
    if last is None:
        raise TypeError(f"could not find a self-attention module with q/k projections in {type(backbone).__name__}")
    return last


class _AttentionInputCapture:
    """Forward pre-hook storing the final attention layer's inputs for ATA (see module docstring)."""

    def __init__(self, attn: nn.Module):
        self.attn = attn
        self.hidden_states: torch.Tensor | None = None
        self.position_embeddings = None
        self.handle = attn.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        self.hidden_states = args[0] if args else kwargs["hidden_states"]
        self.position_embeddings = kwargs.get("position_embeddings")

    def pop(self):
        h, pe = self.hidden_states, self.position_embeddings
        self.hidden_states = self.position_embeddings = None
        return h, pe


def _backbone_of(model) -> nn.Module:
    first = model[0]
    return getattr(first, "auto_model", None) or first.model


# ----------------------------------------------------------------------------- modules


class EmbeddingPooling(Module):
    """Parameter-free pooling of ``token_embeddings`` (left or right padding): ``mode`` ``mean``,
    ``last`` (the last real token) or ``ata``. For ``ata``, ``on_model_ready`` (construction and
    reload) hooks the backbone; call :meth:`bind` when appending it to an already-built model.
    """

    config_file_name = "config.json"
    config_keys = ["embedding_dimension", "mode", "ata_pool"]

    def __init__(self, embedding_dimension: int, mode: str = "mean", ata_pool: str = "embed_mask"):
        super().__init__()
        if mode not in ("mean", "last", "ata"):
            raise ValueError(f"EmbeddingPooling mode={mode!r}: use 'mean', 'last' or 'ata'")
        if ata_pool not in ATA_POOL_SETS:
            raise ValueError(f"EmbeddingPooling ata_pool={ata_pool!r}: use one of {ATA_POOL_SETS}")
        self.embedding_dimension = int(embedding_dimension)
        self.mode = mode
        self.ata_pool = ata_pool
        self._capture: _AttentionInputCapture | None = None
        self._markers: InstructionMarkers | None = None
        self._warned = False

    def get_embedding_dimension(self) -> int:
        return self.embedding_dimension

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.save_config(output_path)

    @classmethod
    def load_config(cls, *args, **kwargs) -> dict[str, Any]:
        """Like the base ``load_config`` (which the base ``load`` reads); a config saved before
        ``ata_pool`` existed reads as ``"all"`` (what that model was trained with), and the
        training-only ``ata_detach`` of older configs is dropped (it changed no embedding)."""
        config = super().load_config(*args, **kwargs)
        config.setdefault("ata_pool", "all")
        config.pop("ata_detach", None)
        return config

    def on_model_ready(self, model) -> None:
        if self.mode == "ata":
            self.bind(_backbone_of(model), getattr(model[0], "tokenizer", None))

    def bind(self, backbone: nn.Module, tokenizer=None) -> None:
        """Hook the backbone's final self-attention (idempotent); ``tokenizer`` gives the
        instruction-prefix ids for ``ata_pool="embed_mask"``."""
        if self._capture is not None:
            self._capture.handle.remove()
        self._capture = _AttentionInputCapture(find_last_self_attention(backbone))
        if tokenizer is not None:
            self._markers = instruction_markers(tokenizer)

    def pool_mask(self, features: dict[str, Any]) -> torch.Tensor | None:
        """The pooled set P for this batch (``None`` = all real tokens); see the module docstring."""
        if self.ata_pool == "all":
            return None
        if self._markers is None or "input_ids" not in features:
            if not self._warned:
                log.warning("ATA ata_pool='embed_mask' has no tokenizer markers (bind(backbone, tokenizer)); pooling all tokens")
                self._warned = True
            return None
        return instruction_pool_mask(features["input_ids"], features["attention_mask"], self._markers)

    def forward(self, features: dict[str, Any], **kwargs) -> dict[str, Any]:
        tok, mask = features["token_embeddings"], features["attention_mask"]
        if self.mode == "mean":
            emb = mean_pool(tok, mask)
        elif self.mode == "last":
            emb = last_pool(tok, mask)
        else:
            if self._capture is None:
                raise RuntimeError("ATA pooling is not bound to a backbone: build it inside a SentenceTransformer or call .bind(backbone)")
            h, pe = self._capture.pop()
            if h is None or h.shape[:2] != mask.shape:
                raise RuntimeError("ATA pooling found no captured final-layer input for this batch (was the backbone run first?)")
            probs = recompute_attention_probs(self._capture.attn, h, mask, pe)
            w = ata_weights(probs, mask, self.pool_mask(features))
            features["ata_weights"] = w
            emb = torch.einsum("bn,bnd->bd", w.to(tok.dtype), tok)
        features["sentence_embedding"] = emb
        return features
