"""Local embedders: sentence-transformers models and zero-shot decoder-LLM methods.

Never imports :mod:`negsynth.stages`, so a user can use an embedder on its own.
"""

from negsynth.embed.base import Embedder, resolve_device, resolve_dtype

__all__ = ["Embedder", "load_embedder", "resolve_device", "resolve_dtype"]


def load_embedder(cfg=None) -> Embedder:
    """Build the embedder described by an :class:`negsynth.schemas.config.EmbedderConfig`."""
    from negsynth.schemas.config import EmbedderConfig

    cfg = cfg or EmbedderConfig()
    if cfg.kind == "sentence-transformers":
        from negsynth.embed.st import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder.from_config(cfg)
    from negsynth.embed.decoder import DecoderEmbedder

    return DecoderEmbedder.from_config(cfg)
