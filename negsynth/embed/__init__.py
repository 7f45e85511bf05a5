"""Local embedders: sentence-transformers models and zero-shot decoder-LLM methods.

Never imports :mod:`negsynth.stages`, so a user can use an embedder on its own.
"""

from negsynth.embed.base import Embedder, resolve_device, resolve_dtype

__all__ = ["Embedder", "embedder_for", "load_embedder", "resolve_device", "resolve_dtype"]


def load_embedder(cfg=None) -> Embedder:
    """Build the embedder described by an :class:`negsynth.schemas.config.EmbedderConfig`."""
    from negsynth.schemas.config import EmbedderConfig

    cfg = cfg or EmbedderConfig()
    if cfg.kind == "sentence-transformers":
        from negsynth.embed.st import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder.from_config(cfg)
    from negsynth.embed.decoder import DecoderEmbedder

    return DecoderEmbedder.from_config(cfg)


def embedder_for(
    model: str,
    *,
    batch_size: int = 64,
    instruct_queries: bool = False,
    device: str = "auto",
    embedder=None,
    what: str = "model",
    backend: str = "torch",
    dtype: str = "auto",
):
    """An :class:`~negsynth.embed.base.Embedder` for an alias, a negsynth-trained folder or any
    sentence-transformers folder or hub name.

    A decoder (``smollm2`` or a ``*ForCausalLM`` folder) becomes a zero-shot
    :class:`~negsynth.embed.decoder.DecoderEmbedder` built from the whole ``[embedder]`` section
    (``embedder``: an :class:`EmbedderConfig`; method, pooling, repeat, filter ratio, dtype, …), with
    ``model`` and ``batch_size`` taken from the arguments. ``backend``: the encoder's inference
    backend (:mod:`negsynth.embed.backends`; decoders always run on torch). ``dtype``: the torch
    weights' precision ("auto": bf16/fp16 on a GPU, float32 on CPU; for a decoder, "auto" keeps
    ``embedder.dtype``).
    """
    from negsynth.embed.models import resolve_model
    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.schemas.config import EmbedderConfig
    from negsynth.schemas.train import DECODER_ALIASES, ENCODER_ALIASES

    ref = resolve_model(model, what=what)
    if ref.is_decoder:
        from negsynth.embed.decoder import DecoderEmbedder

        base = embedder if embedder is not None else EmbedderConfig()
        update = {
            "kind": "decoder",
            "model": "default" if model in DECODER_ALIASES else ref.path,
            "batch_size": batch_size,
            "instruct_queries": instruct_queries or base.instruct_queries,
        }
        if device != "auto":
            update["device"] = device
        if dtype != "auto":
            update["dtype"] = dtype
        return DecoderEmbedder.from_config(base.model_copy(update=update))
    return SentenceTransformerEmbedder.load(
        "default" if model in ENCODER_ALIASES else ref.path,
        device=device,
        batch_size=batch_size,
        instruct_queries=instruct_queries,
        backend=backend,
        dtype=dtype,
    )
