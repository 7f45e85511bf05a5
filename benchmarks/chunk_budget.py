"""Do the corpus stage's passages fit the prompt? ``corpus.chunk_tokens`` counts a cheap proxy
(``\\w+`` runs and other non-space characters); the prompt cuts a document at ``corpus.doc_tokens``
(320) tokens of the embedder's tokenizer. Per corpus and ``chunk_tokens`` this reads the corpus
with the stage's own reader (:func:`negsynth.data.corpus.read_corpus`, overlap 32 or
chunk_tokens // 8), counts each passage in the default embedder's tokens and reports how many
passages the prompt would still cut, and the tokenizer-to-proxy ratio. No timing.

    python benchmarks/chunk_budget.py                       # scifact and cranfield of ../shared/data
    python benchmarks/chunk_budget.py --corpus my_docs/ --sizes 128,256
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", action="append", help="a corpus input (any the stage reads); default: scifact and cranfield")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--sizes", default="192,224,256,288")
    ap.add_argument("--doc-tokens", type=int, default=320)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from negsynth.data.corpus import read_corpus
    from negsynth.data.documents import count_tokens
    from negsynth.embed.models import resolve_model
    from negsynth.schemas.config import CorpusSpec, EmbedderConfig

    model = EmbedderConfig().model
    tok = AutoTokenizer.from_pretrained(resolve_model(model).path)
    inputs = args.corpus or [str(Path(args.data) / n) for n in ("scifact", "cranfield")]
    rows = []
    for path in inputs:
        for size in [int(x) for x in args.sizes.split(",")]:
            overlap = min(32, size // 8)
            c = read_corpus(CorpusSpec(path=path), size, overlap)
            over, ratios, n = 0, [], 0
            for d in c.documents():
                wp = len(tok(d.text, add_special_tokens=False, truncation=False, verbose=False)["input_ids"])
                ratios.append(wp / max(1, count_tokens(d.text)))
                over += wp > args.doc_tokens
                n += 1
            ratios.sort()
            rows.append(
                {
                    "corpus": Path(path).name,
                    "chunk_tokens": size,
                    "overlap": overlap,
                    "documents": c.rows - c.empty_skipped,
                    "split": c.chunked,
                    "passages": n,
                    f"passages_over_{args.doc_tokens}_model_tokens": over,
                    "share_over": round(over / n, 4),
                    "ratio_median": round(statistics.median(ratios), 3),
                    "ratio_p99": round(ratios[int(0.99 * (len(ratios) - 1))], 3),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print(f"tokenizer: {model}")


if __name__ == "__main__":
    main()
