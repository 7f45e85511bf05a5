"""What the LLM false-negative judge (``score.judge_model = "llm"``) can tell apart, on real pairs.

SciFact **train** claims with the abstract they cite (human-labelled). Each claim is shown to the
judge exactly as ``score`` shows an example: the claim, its cited abstract as the known answer,
and four candidates in a seeded random order:

* ``planted``  the cited abstract itself — a judge that reads at all must say it answers;
* ``hard-1``, ``hard-2``  the two abstracts the base embedder (all-MiniLM-L6-v2) ranks highest for
  the claim among those not cited, searched in a pool of ``--pool`` corpus abstracts (every
  abstract cited by a train claim, then random others; embedding all 5,183 takes ~15 min on this
  CPU): where false negatives hide, and mostly true negatives (SciFact's labels are not
  exhaustive, so a few may truly answer);
* ``random``  an abstract drawn at random: never an answer — the judge's noise floor.

A useful judge says "answers" for planted far more often than for random; a judge at chance says
it equally often for every kind (and its verdicts then depend on the slot, which the table shows
too). Abstracts are cut to ``--words`` words (generate's documents are about that long).

    python benchmarks/llm_judge.py --claims 100 --out runs/llm-judge         # embedded SmolLM2-135M
    python benchmarks/llm_judge.py --set llm.base_url=http://localhost:8000/v1 --set llm.model=...   # any server

Prints a table and writes ``OUT/results.json``; LLM answers are cached in ``OUT/cache`` (a rerun
is free).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KINDS = ("planted", "hard-1", "hard-2", "random")


def load_scifact(data_dir: Path, words: int):
    root = data_dir / "scifact"
    claims = {}
    for line in (root / "train" / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)
            claims[q["_id"]] = q["text"]
    cited: dict[str, list[str]] = defaultdict(list)
    for line in (root / "train" / "qrels.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        qid, did, score = line.split("\t")
        if int(score) > 0:
            cited[qid].append(did)
    docs = {}
    for line in (root / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            docs[d["_id"]] = " ".join(f"{d.get('title', '')}. {d['text']}".split()[:words])
    return claims, cited, docs


def build(claims, cited, docs, n: int, seed: int, emb, pool: int) -> list[dict]:
    import numpy as np

    rng = random.Random(seed)
    qids = sorted((q for q in cited if q in claims and all(d in docs for d in cited[q])), key=int)
    rng.shuffle(qids)
    qids = qids[:n]
    in_pool = sorted({d for q in cited for d in cited[q] if d in docs})
    others = sorted(set(docs) - set(in_pool))
    rng.shuffle(others)
    doc_ids = sorted(in_pool + others[: max(0, pool - len(in_pool))])
    dvec = emb.encode([docs[d] for d in doc_ids], show_progress=True)
    qvec = emb.encode([claims[q] for q in qids])
    sims = qvec @ dvec.T
    out = []
    for r, q in enumerate(qids):
        relevant = set(cited[q])
        ranked = [doc_ids[i] for i in np.argsort(-sims[r])[:50] if doc_ids[i] not in relevant]
        rand = rng.choice([d for d in doc_ids if d not in relevant and d not in ranked[:2]])
        cands = [("planted", cited[q][0]), ("hard-1", ranked[0]), ("hard-2", ranked[1]), ("random", rand)]
        rng.shuffle(cands)
        out.append(
            {
                "id": q,
                "query": claims[q],
                "positive": docs[cited[q][0]],
                "negatives": [docs[d] for _, d in cands],
                "kinds": [k for k, _ in cands],
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/llm-judge"))
    ap.add_argument("--data-dir", type=Path, default=None, help="the shared data folder (default: $NEGSYNTH_DATA_DIR or ../shared/data)")
    ap.add_argument("--claims", type=int, default=100)
    ap.add_argument("--words", type=int, default=120)
    ap.add_argument(
        "--pool", type=int, default=1500, help="corpus abstracts searched for the hard candidates (all cited ones, then random)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="a config override, e.g. llm.model=... (repeatable)")
    a = ap.parse_args()

    from negsynth.embed import load_embedder
    from negsynth.pipeline.context import StageContext
    from negsynth.pipeline.embedded import llm_endpoint
    from negsynth.pipeline.progress import Reporter
    from negsynth.resources import default_data_dir
    from negsynth.schemas.config_io import load_config
    from negsynth.stages.score.llm_judge import LLMJudge

    data_dir = a.data_dir or default_data_dir()
    if data_dir is None or not (data_dir / "scifact" / "train" / "qrels.tsv").is_file():
        raise SystemExit("SciFact train is not found: pass --data-dir (the shared data folder) or set NEGSYNTH_DATA_DIR")
    cfg = load_config(None, a.overrides)
    claims, cited, docs = load_scifact(data_dir, a.words)
    emb = load_embedder(cfg.embedder)
    examples = build(claims, cited, docs, a.claims, a.seed, emb, a.pool)
    del emb
    a.out.mkdir(parents=True, exist_ok=True)
    reporter = Reporter()
    t0 = time.perf_counter()
    with llm_endpoint(cfg, a.out, reporter) as url:
        ctx = StageContext(cfg=cfg, run_dir=a.out, reporter=reporter, base_url=url)
        judge = LLMJudge(ctx)
        _, verdicts = judge.score_examples(examples)
    wall = time.perf_counter() - t0

    says = Counter()
    seen = Counter()
    by_slot = Counter()
    slot_seen = Counter()
    for ex, v in zip(examples, verdicts, strict=True):
        if v is None:
            continue
        for slot, (kind, x) in enumerate(zip(ex["kinds"], v, strict=True)):
            seen[kind] += 1
            says[kind] += x == 1.0
            slot_seen[slot] += 1
            by_slot[slot] += x == 1.0
    judged = sum(v is not None for v in verdicts)
    rate = {k: round(says[k] / seen[k], 4) if seen[k] else None for k in KINDS}
    slot_rate = {s + 1: round(by_slot[s] / slot_seen[s], 4) if slot_seen[s] else None for s in range(4)}
    print(
        f"\nLLM judge {cfg.llm.model} on {len(examples)} SciFact train claims (seed {a.seed}, pool {a.pool}); judged {judged}, "
        f"not judged {len(examples) - judged} {dict(judge.failed)}; {judge.requests} requests, {judge.cache_hits} cache hits, {wall:.0f} s"
    )
    print("| candidate | says it answers the claim |\n|---|---:|")
    for k in KINDS:
        print(f"| {k} | {rate[k] if rate[k] is None else f'{100 * rate[k]:.1f} %'} ({says[k]} of {seen[k]}) |")
    print("by slot (position in the list): " + ", ".join(f"{s}: {'-' if r is None else f'{100 * r:.0f} %'}" for s, r in slot_rate.items()))
    res = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "model": cfg.llm.model,
        "claims": len(examples),
        "judged": judged,
        "not_judged": dict(judge.failed),
        "says_answers": rate,
        "counts": {k: [says[k], seen[k]] for k in KINDS},
        "by_slot": slot_rate,
        "requests": judge.requests,
        "cache_hits": judge.cache_hits,
        "wall_s": round(wall, 1),
    }
    (a.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out / 'results.json'}")


if __name__ == "__main__":
    main()
