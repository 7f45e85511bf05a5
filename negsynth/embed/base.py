"""The embedder contract shared by `score`, `regenerate --mine` and `evaluate`.

An embedder turns texts into L2-normalised float32 vectors. Queries may carry an instruction
(E5 style); documents never do. Implementations: :mod:`negsynth.embed.st`
(sentence-transformers) and :mod:`negsynth.embed.decoder` (zero-shot decoder LLMs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np


class Embedder(ABC):
    """Base class: subclasses implement :meth:`_encode` on plain strings."""

    #: a description recorded next to every cosine it produced, e.g. "st:all-MiniLM-L6-v2"
    name: str = "embedder"
    query_template: str = "Instruct: {instruction}\nQuery: {text}"
    instruct_queries: bool = False

    def format_query(self, text: str, instruction: str | None) -> str:
        if instruction and self.instruct_queries:
            return self.query_template.format(instruction=instruction.strip(), text=text)
        return text

    def identity(self) -> dict | None:
        """What its vectors depend on, for caching results scored with it (the model's files by
        content, how it encodes); None: never cached (the default, e.g. an in-memory model)."""
        return None

    def encode_queries(self, texts: Sequence[str], instruction: str | Sequence[str] | None = None, **kw) -> np.ndarray:
        if instruction is None or isinstance(instruction, str):
            formatted = [self.format_query(t, instruction) for t in texts]
        else:
            formatted = [self.format_query(t, i) for t, i in zip(texts, instruction, strict=True)]
        return self.encode(formatted, **kw)

    def encode_documents(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode(list(texts), **kw)

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None, show_progress: bool = False) -> np.ndarray:
        """Embed ``texts`` (already formatted) -> ``[len(texts), dim]`` float32, rows L2-normalised."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = np.asarray(self._encode(list(texts), batch_size=batch_size, show_progress=show_progress), dtype=np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.clip(norms, 1e-12, None)

    @property
    @abstractmethod
    def dim(self) -> int: ...

    @abstractmethod
    def _encode(self, texts: list[str], *, batch_size: int | None, show_progress: bool) -> np.ndarray: ...


#: one call to an embedder: ``("encode", texts, None)`` (already formatted), ``("queries", texts,
#: instructions)`` or ``("documents", texts, None)``
Part = tuple[str, list[str], list[str | None] | None]


def shares_query_pool(embedder) -> bool:
    """True when queries are just ``format_query`` + ``encode`` (so queries and documents can share
    one pool of texts). An embedder standing in for another (the Ray workers' proxy) answers for
    the one it stands for with a ``shares_query_pool`` attribute."""
    own = getattr(embedder, "shares_query_pool", None)
    if own is not None:
        return bool(own)
    t = type(embedder)
    return t.encode_queries is Embedder.encode_queries and t.encode_documents is Embedder.encode_documents


def encode_part(embedder, part: Part, *, batch_size: int) -> np.ndarray:
    """The vectors of one :data:`Part`."""
    how, texts, instructions = part
    if how == "queries":
        return embedder.encode_queries(texts, instructions, batch_size=batch_size)
    if how == "documents":
        return embedder.encode_documents(texts, batch_size=batch_size)
    return embedder.encode(texts, batch_size=batch_size)


def encode_parts(embedder, parts: Sequence[Part], *, batch_size: int) -> Iterator[np.ndarray]:
    """The vectors of each part, in order, one part at a time (the caller stores each as it comes,
    so no more than one part's vectors are held twice).

    In this process, one call after another. An embedder with its own ``encode_parts`` (the Ray
    workers' proxy, :mod:`negsynth.pipeline.ray_executor`) spreads the parts over its workers,
    each part whole (so every batch holds the texts it holds in one process)."""
    fan_out = getattr(embedder, "encode_parts", None)
    if fan_out is not None:
        yield from fan_out(parts, batch_size=batch_size)
        return
    for part in parts:
        yield encode_part(embedder, part, batch_size=batch_size)


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' and the hub's progress bars off while negsynth loads a model (a decorator too).

    transformers reads ``HF_HUB_DISABLE_PROGRESS_BARS`` once, when it is imported: imported
    before the CLI sets it (by a test, a notebook, a library user), its "Loading weights" bar
    reached stderr, where a stage promises one line. The previous setting is restored after."""
    try:
        from huggingface_hub import utils as hub
        from transformers.utils import logging as tl
    except ImportError:
        yield
        return
    was, hub_was = tl.is_progress_bar_enabled(), not hub.are_progress_bars_disabled()
    tl.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            tl.enable_progress_bar()
            if not hub_was:
                hub.disable_progress_bars()
        elif hub_was:
            hub.enable_progress_bars()


def resolve_device(device: str = "auto") -> str:
    """``auto`` -> ``cuda`` when available, else ``mps``, else ``cpu``."""
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_dtype(dtype: str, device: str):
    """``auto`` -> bf16 on CUDA with bf16 support, fp16 on other GPUs, fp32 on CPU."""
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "mps":
        return torch.float16
    return torch.float32
