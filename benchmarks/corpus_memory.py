"""Peak memory of the corpus stage's reading path on a large generated corpus: the sample
(``corpus.max_docs``) and the mined-negative index, with a stub embedder.

What runs is the stage's own code (``load_corpora``, ``plan_items``, ``Work.index`` and one
``search``) in a child process, measured from outside (``/usr/bin/time``: peak RSS, CPU). The
embedder is a **stub**: a 32-dimension vector from a hash of each text, so that embedding
hundreds of thousands of documents on a CPU takes seconds and the figure is the memory of
reading, sampling and indexing, not of a model. ``--code PATH`` runs another checkout's
``negsynth`` (e.g. the commit before the streamed reader, unpacked with
``git archive <commit> negsynth | tar -x -C /tmp/before``) on the same file, for a before/after.
``plan_grown_mb`` / ``grown_mb``: how far the peak RSS grew past the imports (the reading path
alone); ``peak_rss_mb`` includes the interpreter and its libraries.

    python benchmarks/corpus_memory.py --docs 300000 --out /tmp/cm
    python benchmarks/corpus_memory.py --docs 300000 --out /tmp/cm --code /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _child import measured_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import hashlib, json, sys, time
import numpy as np
from negsynth.pipeline.context import StageContext
from negsynth.schemas.config import RunConfig
import negsynth.stages.corpus as stage

class Stub:
    # a deterministic cheap embedder: 32 floats from a hash of the text, normalised
    def encode(self, texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False, **kw):
        out = np.empty((len(texts), 32), dtype=np.float32)
        for i, t in enumerate(texts):
            v = np.frombuffer(hashlib.blake2b(t.encode(), digest_size=64).digest(), dtype=np.uint16).astype(np.float32) - 32768
            out[i] = v / np.linalg.norm(v)
        return out
    def get_embedding_dimension(self):
        return 32

import resource
path, run_dir, max_docs, index = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # after the imports
cfg = RunConfig.model_validate({"corpus": {"inputs": [{"path": path}], "max_docs": max_docs, "seed": 0}})
ctx = StageContext(cfg=cfg, run_dir=run_dir)
t0 = time.perf_counter()
corpora = stage.load_corpora(ctx)
items = stage.plan_items(ctx, corpora)
t_plan = time.perf_counter() - t0
res = {"items": len(items), "sampled": [it.payload["doc_id"] for it in items], "plan_s": round(t_plan, 2),
       "plan_grown_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) >> 10}
if index:
    work = stage.Work(ctx, corpora)
    work._model = Stub()
    p = items[0].payload
    found = work.index(0).search("a query about topic 7", work.positions[0][p["doc_id"]], 4)
    res["negatives"] = found["negatives"]
    res["index_s"] = round(time.perf_counter() - t0 - t_plan, 2)
    res["grown_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) >> 10
print(json.dumps(res))
"""


def write_corpus(path: Path, n: int, repeat: int = 3) -> None:
    words = "river copper violin orbit wheat glacier enzyme harbor falcon basalt lantern quartz".split()
    with open(path, "w") as f:
        for start in range(0, n, 10_000):
            f.write(
                "".join(
                    json.dumps(
                        {
                            "_id": f"d{i}",
                            "title": f"{words[i % 12]} {i}",
                            "text": f"Document {i} about {words[(i * 7) % 12]} and topic {i % 97}. " * repeat,
                        }
                    )
                    + "\n"
                    for i in range(start, min(n, start + 10_000))
                )
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=300_000)
    ap.add_argument("--max-docs", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3, help="sentences per document (3: about 175 bytes a line)")
    ap.add_argument("--no-index", action="store_true", help="measure the sample alone, not the mined-negative index")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "corpus_memory")
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose negsynth runs (default: this one)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    corpus = a.out / f"corpus-{a.docs}-{a.repeat}.jsonl"
    if not corpus.is_file():
        write_corpus(corpus, a.docs, a.repeat)
    env_path = str(a.code.resolve())
    rows = {}
    for index in (False,) if a.no_index else (False, True):
        run_dir = tempfile.mkdtemp(dir=a.out)
        cmd = [sys.executable, "-c", CHILD, str(corpus), run_dir, str(a.max_docs), "1" if index else "0"]
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = env_path
        try:
            r = measured_run(cmd, a.out)  # not ROOT: python -c puts its cwd first on sys.path
        finally:
            if old is None:
                os.environ.pop("PYTHONPATH")
            else:
                os.environ["PYTHONPATH"] = old
        res = json.loads(r["stdout"].strip().splitlines()[-1])
        rows["sample+index" if index else "sample"] = {
            "peak_rss_mb": round(r["peak_rss_mb"]),
            "wall_s": round(r["wall_s"], 1),
            "cpu_s": round(r["cpu_s"], 1),
            **res,
        }
    print(json.dumps({"code": env_path, "file_mb": corpus.stat().st_size >> 20, "docs": a.docs, "max_docs": a.max_docs, **rows}, indent=1))


if __name__ == "__main__":
    main()
