"""One place that turns a model name into a model: an alias (``default``/``minilm`` = the bundled
all-MiniLM-L6-v2, ``smollm2`` = the bundled SmolLM2-135M decoder; :data:`MODEL_ALIASES`), a local
folder (sentence-transformers or transformers), or, online, a hub name. Score, mining, train and
evaluate resolve names with :func:`resolve_model`; :func:`negsynth.embed.embedder_for` makes the
embedder.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from negsynth.embed.base import quiet_loading
from negsynth.errors import UserError
from negsynth.schemas.train import DECODER_ALIASES, ENCODER_ALIASES, MODEL_ALIASES

Kind = Literal["sentence-transformers", "decoder", "encoder"]


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: ``path`` (a local folder, or the hub name when not local) and ``kind``:
    ``sentence-transformers`` (a folder with ``modules.json``), ``decoder`` (a causal LM) or
    ``encoder`` (any other transformers model, or a hub name)."""

    name: str
    path: str
    kind: Kind
    local: bool

    @property
    def is_decoder(self) -> bool:
        return self.kind == "decoder"


def is_decoder_folder(path: str | Path) -> bool:
    """A transformers folder whose config names a ``*ForCausalLM`` architecture (or ``is_decoder``)."""
    cfg = Path(path) / "config.json"
    if not cfg.exists():
        return False
    c = json.loads(cfg.read_text())
    return any(a.endswith("ForCausalLM") for a in c.get("architectures") or []) or bool(c.get("is_decoder"))


def looks_like_path(name: str) -> bool:
    """A local path rather than a hub name (``org/name``): absolute, ``./``, ``../``, ``~`` or
    more than one ``/``."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or "\\" in name


def resolve_model(name: str, *, allow_hub: bool = True, what: str = "model") -> ModelRef:
    """``name`` -> :class:`ModelRef`. Aliases resolve to the bundled models (a one-line error
    says which package to install when they are missing); ``allow_hub=False`` refuses names that
    are neither an alias nor an existing folder. ``what`` names the setting in error messages."""
    from negsynth.resources import MissingResource

    if name in ENCODER_ALIASES:
        from negsynth.resources import minilm_path

        try:
            return ModelRef(name, str(minilm_path()), "sentence-transformers", True)
        except MissingResource as e:
            raise UserError(str(e)) from None
    if name in DECODER_ALIASES:
        from negsynth.embed.hf import resolve_decoder_path

        try:
            return ModelRef(name, resolve_decoder_path("default"), "decoder", True)
        except MissingResource as e:
            raise UserError(str(e)) from None
    p = Path(name).expanduser()
    if not p.exists() and looks_like_path(name):
        raise UserError(f"{what} {name!r}: no such folder; pass a model folder, an alias (default, minilm, smollm2) or a hub name")
    if p.exists():
        if not p.is_dir():
            raise UserError(f"{what} {name!r}: is a file; pass a model folder, an alias (default, minilm, smollm2) or a hub name")
        if (p / "modules.json").exists():
            return ModelRef(name, str(p), "sentence-transformers", True)
        return ModelRef(name, str(p), "decoder" if is_decoder_folder(p) else "encoder", True)
    if not allow_hub:
        raise UserError(
            f"{what} {name!r}: not 'default', 'minilm', 'smollm2' or an existing local folder (hub downloads are disabled here)"
        )
    return ModelRef(name, name, "encoder", False)


def hub_id(name: str) -> str | None:
    """The Hugging Face hub id of the bundled model ``name`` names (an alias, or MiniLM's own folder
    name ``all-MiniLM-L6-v2``; any case), else None: what a model card names as the base model."""
    key = name.lower()
    if key in MODEL_ALIASES:
        return MODEL_ALIASES[key][1]
    minilm = MODEL_ALIASES["minilm"][1]
    return minilm if key == minilm.split("/")[1].lower() else None


@quiet_loading()
def load_sentence_transformer(name: str = "default", *, device: str = "auto", max_length: int | None = None):
    """A raw ``SentenceTransformer`` for ``name`` (mining, benchmarks): no negsynth wrapper."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise UserError("this needs sentence-transformers and torch; run: pip install 'negsynth[embed]'") from None
    from negsynth.embed.base import resolve_device

    ref = resolve_model(name, what="embedder.model")
    if ref.is_decoder:
        raise UserError(
            f'embedder.model {name!r} is a decoder LLM; this step needs a sentence-transformers encoder (decoder embedders: embedder.kind = "decoder")'
        )
    model = SentenceTransformer(ref.path, device=resolve_device(device), local_files_only=ref.local)
    if max_length:
        model.max_seq_length = max_length
    return model


@cache
def _folder_digest(path: str, state: tuple) -> str:
    h = hashlib.sha256()
    root = Path(path)
    for rel, _size, _mtime in state:
        h.update(rel.encode())
        with open(root / rel, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def model_digest(path: str | os.PathLike) -> str:
    """The content hash of a model folder (every file, by relative path): ~0.2 s for MiniLM's 90 MB,
    once per process and folder state."""
    root = Path(path)
    stats = ((p, p.stat()) for p in sorted(root.rglob("*")) if p.is_file())
    state = tuple((str(p.relative_to(root)), st.st_size, st.st_mtime_ns) for p, st in stats)
    return _folder_digest(str(root.resolve()), state)
