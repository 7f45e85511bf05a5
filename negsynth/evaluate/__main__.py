"""``python -m negsynth.evaluate``: run the suite from the shell (benchmarks, quick checks).

The package CLI (``negsynth evaluate``) is the main entry point; this one exists so the
evaluator can be measured on its own. The model is a local sentence-transformers folder
(default: the bundled all-MiniLM-L6-v2); nothing is fetched from a hub.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from negsynth.embed.base import Embedder


class LocalSTEmbedder(Embedder):
    """A minimal :class:`Embedder` over a local ``SentenceTransformer`` folder (fallback while
    :mod:`negsynth.embed.st` is not importable)."""

    def __init__(self, path: str | Path, *, batch_size: int = 64, instruct_queries: bool = False):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
        self.name = f"st:{Path(path).name if Path(path).name != 'model' else Path(path).parent.name}"
        self.batch_size = batch_size
        self.instruct_queries = instruct_queries

    @property
    def dim(self) -> int:
        return int(self.model.get_sentence_embedding_dimension())

    def _encode(self, texts, *, batch_size, show_progress) -> np.ndarray:
        return self.model.encode(texts, batch_size=batch_size or self.batch_size, show_progress_bar=show_progress,
                                 convert_to_numpy=True, normalize_embeddings=True)


def build_embedder(model: str | None, instruct: bool) -> Embedder:
    from negsynth.resources import minilm_path

    path = Path(model) if model else minilm_path()
    try:
        from negsynth.embed import load_embedder
        from negsynth.schemas.config import EmbedderConfig

        return load_embedder(EmbedderConfig(model=str(path) if model else "default", device="cpu", instruct_queries=instruct))
    except ImportError:
        return LocalSTEmbedder(path, instruct_queries=instruct)


def main(argv: list[str] | None = None) -> int:
    from negsynth.evaluate import EvalDataError, UnknownTask, evaluate, load_report, print_report

    p = argparse.ArgumentParser(prog="python -m negsynth.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=("quick", "full"), default="quick")
    p.add_argument("--tasks", default=None, help="comma-separated task or category names (default: the suite)")
    p.add_argument("--data-dir", default=None, help="benchmark folder (default: $NEGSYNTH_DATA_DIR or ../shared/data)")
    p.add_argument("--model", default=None, help="local sentence-transformers folder (default: bundled MiniLM)")
    p.add_argument("--instruct", action="store_true", help="prepend E5 instructions to queries")
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.add_argument("--baseline", default=None, help="a previous report JSON to compare against")
    a = p.parse_args(argv)
    try:
        baseline = load_report(a.baseline) if a.baseline else None
        t0 = time.perf_counter()
        emb = build_embedder(a.model, a.instruct)
        load_s = time.perf_counter() - t0
        rep = evaluate(emb, suite=a.suite, data_dir=a.data_dir, tasks=a.tasks, out=a.out)
    except (EvalDataError, UnknownTask) as e:
        print(str(e), file=sys.stderr)
        return 2
    print_report(rep, baseline)
    print(f"model load {load_s:.1f}s, evaluation {rep['seconds']:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
