"""``python -m negsynth.evaluate``: run the suite from the shell (benchmarks, quick checks).

The package CLI (``negsynth evaluate``) is the main entry point; this one exists so the
evaluator can be measured on its own. The model is a local sentence-transformers folder
(default: the bundled all-MiniLM-L6-v2); nothing is fetched from a hub.
"""

from __future__ import annotations

import argparse
import sys
import time

from negsynth.embed.base import Embedder


def build_embedder(model: str | None, instruct: bool) -> Embedder:
    from negsynth.embed.models import embedder_for

    return embedder_for(model or "default", instruct_queries=instruct, device="cpu")


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
