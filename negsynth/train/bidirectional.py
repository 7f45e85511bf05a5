"""Bidirectional attention for decoder LLMs: all layers (LLM2Vec) or only the last K (BeLLM).

``mode``: ``"none"`` | ``"all"`` | ``"last:K"``. transformers builds one causal mask for every
layer (or none, leaving SDPA to each module's ``is_causal``), so a per-layer switch needs two hooks,
no patching: the chosen layers get ``self_attn.is_causal = False``, and a pre-hook on each replaces
its ``attention_mask`` with ``masking_utils.create_bidirectional_mask`` of the call's padding mask
(remembered by a pre-hook on the backbone). The padding mask is kept (SEED_SPEC §5): pad keys stay
hidden. In a SentenceTransformer use :class:`BidirectionalAttention`, an identity module after the
Transformer that saves the mode and re-applies it on reload; :func:`make_bidirectional` does it on a
bare model (``handle.remove()`` restores causal attention).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from sentence_transformers.base.modules import Module
from torch import nn

log = logging.getLogger(__name__)


def parse_mode(mode: str, num_layers: int) -> list[int]:
    """Layer indices made bidirectional. ``"none"`` -> [], ``"all"`` -> all, ``"last:K"`` -> last K."""
    mode = (mode or "none").strip().lower()
    if mode == "none":
        return []
    if mode == "all":
        return list(range(num_layers))
    m = re.fullmatch(r"last:(\d+)", mode)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"bidirectional={mode!r}: use 'none', 'all' or 'last:K' with K >= 1 (e.g. 'last:1' for BeLLM)")
    k = int(m.group(1))
    if k > num_layers:
        raise ValueError(f"bidirectional={mode!r}: the model has only {num_layers} layers; use K <= {num_layers} or 'all'")
    return list(range(num_layers - k, num_layers))


def find_decoder(model: nn.Module) -> tuple[nn.Module, nn.ModuleList]:
    """(backbone, its decoder layers) for a Llama-family model, also inside ForCausalLM / PEFT wrappers."""
    for mod in model.modules():
        layers = getattr(mod, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) and hasattr(layers[0], "self_attn") and hasattr(mod, "config"):
            return mod, layers
    raise TypeError(
        f"{type(model).__name__}: no decoder layers with .self_attn found; bidirectional attention supports Llama-family decoders"
    )


class BidirectionalHandle:
    """Returned by :func:`make_bidirectional`; ``remove()`` restores causal attention."""

    def __init__(self, backbone: nn.Module, layers: nn.ModuleList, indices: list[int]):
        from transformers.masking_utils import create_bidirectional_mask

        self.indices = indices
        self._builder = create_bidirectional_mask
        self._backbone = backbone
        self._pad_mask: torch.Tensor | None = None
        self._cache: tuple[Any, torch.Tensor | None] | None = None
        self._handles = [backbone.register_forward_pre_hook(self._remember_mask, with_kwargs=True)]
        self._layers = [layers[i] for i in indices]
        for layer in self._layers:
            layer.self_attn.is_causal = False
            self._handles.append(layer.register_forward_pre_hook(self._swap_mask, with_kwargs=True))

    def _remember_mask(self, module, args, kwargs):
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        self._pad_mask = mask if (mask is None or mask.dim() == 2) else None
        if mask is not None and mask.dim() != 2:
            log.warning("bidirectional: got a %d-D attention_mask; only 2-D padding masks are supported, padding is ignored", mask.dim())
        self._cache = None

    def _swap_mask(self, module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        key = (hidden.shape, hidden.dtype, id(self._pad_mask))
        if self._cache is None or self._cache[0] != key:
            mask = self._builder(config=self._backbone.config, inputs_embeds=hidden, attention_mask=self._pad_mask)
            self._cache = (key, mask)
        kwargs["attention_mask"] = self._cache[1]
        return args, kwargs

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        for layer in self._layers:
            layer.self_attn.is_causal = True
        self._handles, self._layers = [], []


def make_bidirectional(model: nn.Module, mode: str = "all") -> BidirectionalHandle | None:
    """Make the chosen decoder layers of ``model`` attend in both directions (see module docstring)."""
    backbone, layers = find_decoder(model)
    idx = parse_mode(mode, len(layers))
    if not idx:
        return None
    impl = getattr(backbone.config, "_attn_implementation", None)
    if impl not in (None, "eager", "sdpa"):
        log.warning("bidirectional: attention implementation %r is untested; eager or sdpa is recommended", impl)
    log.info("bidirectional attention in layers %s of %d", idx if len(idx) < 6 else f"{idx[0]}..{idx[-1]}", len(layers))
    return BidirectionalHandle(backbone, layers, idx)


class BidirectionalAttention(Module):
    """Identity SentenceTransformer module that makes the preceding decoder bidirectional.

    Place it right after the ``Transformer`` module. ``on_model_ready`` (run on construction and on
    ``SentenceTransformer(path)`` reload) applies :func:`make_bidirectional` to the backbone, and its
    ``config.json`` stores ``mode``, so a saved model keeps its attention pattern.
    """

    config_keys = ["mode"]

    def __init__(self, mode: str = "all"):
        super().__init__()
        self.mode = mode
        self._handle: BidirectionalHandle | None = None

    def on_model_ready(self, model) -> None:
        self.bind(getattr(model[0], "auto_model", None) or model[0].model)

    def bind(self, backbone: nn.Module) -> None:
        if self._handle is not None:
            self._handle.remove()
        self._handle = make_bidirectional(backbone, self.mode)

    def forward(self, features: dict[str, Any], **kwargs) -> dict[str, Any]:
        return features

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.save_config(output_path)
