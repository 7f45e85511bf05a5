"""EmbedFilter's projection (SEED_SPEC §6): the middle band of right singular vectors of a decoder's
unembedding matrix ``W_U = U Σ Vᵀ``, onto which :class:`~negsynth.embed.decoder.DecoderEmbedder`
projects its pooled vectors. The SVD of ``W_U`` is computed once per model and weight, and kept
on disk and in memory."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

import numpy as np

log = logging.getLogger("negsynth.embed.decoder")  # the decoder embedder's: its log lines say what it does

#: EmbedFilter's Mistral-7B-Instruct-v0.3 runs keep V[128 : 128 + k] instead of the centred window
#: (seed 004 App. A: "offset the whole indices until l_τ = 128"; code ``start_idx = 128``; SEED_SPEC §6)
MISTRAL_FILTER_START = 128


def filter_window(d: int, tau: int, start: int | None = None) -> tuple[int, int]:
    """EmbedFilter's window ``[l, r)`` of right singular vectors to keep.

    ``k = d // tau`` rows of ``Vᵀ`` (sorted by descending singular value) are kept. Centred by
    default (Qwen/Llama): ``l = (d - k) // 2``, ``r = l + k``; with ``start`` (Mistral: 128,
    :data:`MISTRAL_FILTER_START`) ``l = start``, ``r = start + k``. ``tau = 1`` without ``start``
    keeps everything (``(0, d)``), i.e. no filter.
    Example: ``d = 576, tau = 4 -> k = 144, (216, 360)``; ``d = 4096, tau = 2, start = 128 -> (128, 2176)``.
    """
    if tau < 1 or d // tau < 1:
        raise ValueError(f"filter ratio tau={tau} is invalid for d={d}")
    k = d // tau
    lo = (d - k) // 2 if start is None else int(start)
    if lo < 0 or lo + k > d:
        raise ValueError(f"filter window [{lo}, {lo + k}) does not fit d={d} (tau={tau}, start={start})")
    return lo, lo + k


def unembedding_matrix(model):
    """``W_U`` ``[|V|, d]``: ``lm_head.weight`` of a causal LM, or the input embeddings of a bare
    backbone whose config ties them to the LM head. Raises if neither is available."""
    get_out = getattr(model, "get_output_embeddings", None)
    out = get_out() if get_out is not None else None
    if out is not None and getattr(out, "weight", None) is not None:
        return out.weight
    if getattr(model.config, "tie_word_embeddings", False):
        return model.get_input_embeddings().weight
    raise ValueError("EmbedFilter needs the unembedding matrix: load the model with causal_lm=True (lm_head)")


_BASIS_MEMO: dict[str, np.ndarray] = {}


def svd_basis(weight, model_key: str, cache: Path | str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right singular vectors of ``W_U``: ``(Vh [d, d], S [d])`` float32, descending ``S``.

    Computed once per (``model_key``, sha256 of the weight bytes) with
    ``torch.linalg.svd(W.float(), full_matrices=False)`` and kept as ``.npz`` under
    ``cache`` (default: ``negsynth.embed.hf.cache_dir() / "embedfilter"``) and in memory.
    The signs of singular vectors are arbitrary; projections and cosines do not depend on them.
    """
    import torch

    w = weight.detach().to("cpu", torch.float32).contiguous()
    digest = hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model_key).strip("_")[-80:] or "model"
    key = f"{slug}-{digest}"
    if key in _BASIS_MEMO:
        return _BASIS_MEMO[key]
    if cache is None:
        from negsynth.embed.hf import cache_dir

        cache = cache_dir() / "embedfilter"
    path = Path(cache) / f"{key}.npz"
    if path.exists():
        try:
            z = np.load(path)
            _BASIS_MEMO[key] = (z["vh"], z["s"])
            return _BASIS_MEMO[key]
        except Exception as exc:  # a torn file from a killed run: recompute
            log.warning("ignoring unreadable SVD cache %s (%s)", path, exc)
    log.info("EmbedFilter: SVD of the %dx%d unembedding matrix (cached at %s)", *w.shape, path)
    _, s, vh = torch.linalg.svd(w, full_matrices=False)
    vh_np, s_np = vh.numpy().astype(np.float32), s.numpy().astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + f".tmp{id(w)}.npz")
    np.savez(tmp, vh=vh_np, s=s_np)
    tmp.replace(path)
    _BASIS_MEMO[key] = (vh_np, s_np)
    return _BASIS_MEMO[key]


def filter_basis(
    model, model_key: str, filter_ratio: int, filter_start: int | str | None, model_type: str | None
) -> tuple[np.ndarray, tuple[int, int]]:
    """EmbedFilter's projection for ``model``: ``V[l:r]ᵀ`` ``[d, k]`` (float64) and its window ``(l, r)``.

    ``filter_start``: ``"auto"`` = :data:`MISTRAL_FILTER_START` for ``model_type == "mistral"``,
    centred for any other backbone; ``"centred"``; or the first row as an int (see
    :func:`filter_window`). ``model_key`` names the SVD in its cache (:func:`svd_basis`)."""
    vh, _ = svd_basis(unembedding_matrix(model), model_key)
    if filter_start == "auto":  # the seed's Mistral exception; centred for every other backbone
        filter_start = MISTRAL_FILTER_START if model_type == "mistral" else None
    elif filter_start in ("centred", "centered"):
        filter_start = None
    lo, hi = filter_window(vh.shape[0], filter_ratio, filter_start)
    return vh[lo:hi].T.astype(np.float64), (lo, hi)
