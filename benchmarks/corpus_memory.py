"""Peak memory of the corpus stage's reading path on a large generated corpus: counting the
documents and planning the sample (``corpus.max_docs``), what every ``negsynth corpus`` run does
before its first request.

What runs is ``negsynth estimate -i FILE --set corpus.max_docs=N --rps 1 --json`` (it reads and
samples the corpus as the stage does and sends nothing), measured from outside (``/usr/bin/time``:
peak RSS, wall, CPU), ``--repeats`` times. The corpus is generated: ``--docs`` JSONL documents of
``--repeat`` sentences each (3: about 175 bytes a line). ``--code PATH`` runs another checkout's
``negsynth`` on the same file (e.g. ``git archive <commit> negsynth | tar -x -C /tmp/before``), for a
before / after; ``imports_mb`` is the same command's peak on a 20-document corpus, so
``peak_rss_mb - imports_mb`` is what the reading path itself holds::

    python benchmarks/corpus_memory.py --docs 300000 --out /tmp/cm
    python benchmarks/corpus_memory.py --docs 300000 --out /tmp/cm --code /tmp/before
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import harness


def write_corpus(path: Path, n: int, repeat: int) -> None:
    words = "river copper violin orbit wheat glacier enzyme harbor falcon basalt lantern quartz".split()
    with open(path, "w") as f:
        for i in range(n):
            text = f"Document {i} about {words[(i * 7) % 12]} and topic {i % 97}. " * repeat
            f.write(json.dumps({"_id": f"d{i}", "title": f"{words[i % 12]} {i}", "text": text}) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--docs", type=int, default=300_000)
    ap.add_argument("--max-docs", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3, help="sentences per document")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "corpus_memory")
    ap.add_argument("--code", type=Path, default=harness.ROOT, help="the checkout whose negsynth runs (default: this one)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(a.code.resolve())}
    runs = {}
    for name, n in (("imports", 20), ("corpus", a.docs)):
        corpus = a.out / f"corpus-{n}-{a.repeat}.jsonl"
        if not corpus.is_file():
            write_corpus(corpus, n, a.repeat)
        cmd = harness.negsynth_cli(
            "estimate", "-i", str(corpus), "-d", str(a.out / "run"), "--set", f"corpus.max_docs={a.max_docs}", "--rps", "1", "--json"
        )
        runs[name] = [
            harness.measured_run(cmd, cwd=a.out, env=env) for _ in range(a.repeats if n > 1 else 1)
        ]  # not the checkout: -m puts the cwd first
    med = {k: harness.median(runs["corpus"], k) for k in ("peak_rss_mb", "wall_s", "cpu_s")}
    out = {
        "code": str(a.code),
        "file_mb": corpus.stat().st_size >> 20,
        "docs": a.docs,
        "max_docs": a.max_docs,
        **{k: round(v, 1) for k, v in med.items()},
    }
    out["imports_mb"] = round(runs["imports"][0]["peak_rss_mb"])
    out["estimate"] = json.loads(runs["corpus"][0]["stdout"])
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
