"""What the LLM false-negative judge (``score.judge_model = "llm"``) can tell apart, on real pairs.

SciFact **train** claims with the abstract they cite (human-labelled), each written as an example
whose four negatives are, in a seeded random order:

* ``planted``  the cited abstract itself: a judge that reads at all must say it answers;
* ``hard-1``, ``hard-2``  the two abstracts all-MiniLM-L6-v2 ranks highest for the claim among those
  not cited, in a pool of ``--pool`` abstracts (every cited one, then random others): where false
  negatives hide (SciFact's labels are not exhaustive, so a few may truly answer);
* ``random``  an abstract drawn at random: never an answer, the judge's noise floor.

The examples are scored as a user scores them, ``negsynth score`` with the judge on
(``score.policy = "annotate"``: the order kept; decontamination and near-duplicate removal off), and
each negative's verdict read from the scored records. A useful judge says "answers" for planted far
more often than for random; a judge at chance says it equally often for every kind (and then its
verdicts follow the slot, which is reported too). Abstracts are cut to ``--words`` words::

    python benchmarks/llm_judge.py --claims 100 --out runs/llm-judge         # the embedded SmolLM2-135M
    python benchmarks/llm_judge.py --set llm.base_url=http://localhost:8000/v1 --set llm.model=...   # any server

Prints a table and writes ``OUT/results.json``; the LLM's answers are cached in the run dir (a rerun is free).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import harness

KINDS = ("planted", "hard-1", "hard-2", "random")


def examples(data: Path, n: int, words: int, pool: int, seed: int) -> list[dict]:
    """``n`` claims, each with its cited abstract as positive and the four kinds of candidate as negatives."""
    import numpy as np

    root = data / "scifact"
    claims, docs, rows = harness.read_beir(root / "corpus.jsonl", root / "train" / "queries.jsonl", root / "train" / "qrels.tsv")
    docs = {d: " ".join(t.split()[:words]) for d, t in docs.items()}
    cited: dict[str, list[str]] = {}
    for q, d, g in rows:
        if g > 0 and q in claims and d in docs:
            cited.setdefault(q, []).append(d)
    rng = random.Random(seed)
    qids = sorted(cited, key=int)
    rng.shuffle(qids)
    qids = qids[:n]
    in_pool = sorted({d for ds in cited.values() for d in ds})
    others = sorted(set(docs) - set(in_pool))
    rng.shuffle(others)
    doc_ids = sorted(in_pool + others[: max(0, pool - len(in_pool))])
    model = harness.base_model("cpu")
    sims = (
        model.encode([claims[q] for q in qids], normalize_embeddings=True)
        @ model.encode([docs[d] for d in doc_ids], normalize_embeddings=True).T
    )
    out = []
    for r, q in enumerate(qids):
        ranked = [doc_ids[i] for i in np.argsort(-sims[r])[:50] if doc_ids[i] not in cited[q]]
        rand = rng.choice([d for d in doc_ids if d not in cited[q] and d not in ranked[:2]])
        cands = [("planted", cited[q][0]), ("hard-1", ranked[0]), ("hard-2", ranked[1]), ("random", rand)]
        rng.shuffle(cands)
        ex = {
            "id": f"claim-{q}",
            "task": "Given a scientific claim, retrieve abstracts that support or refute it",
            "task_type": "short-long",
        }
        out.append(
            ex
            | {"query": claims[q], "positive": docs[cited[q][0]], "negatives": [docs[d] for _, d in cands], "kinds": [k for k, _ in cands]}
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--out", type=Path, default=Path("runs/llm-judge"))
    ap.add_argument("--data-dir", type=Path, default=None, help="the shared data (default: $NEGSYNTH_DATA_DIR or ../shared/data)")
    ap.add_argument("--claims", type=int, default=100)
    ap.add_argument("--words", type=int, default=120)
    ap.add_argument("--pool", type=int, default=1500, help="abstracts searched for the hard candidates (every cited one, then random)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="a config override, e.g. llm.model=... (repeatable)")
    a = ap.parse_args(argv)
    exs = examples(harness.data_dir(a.data_dir), a.claims, a.words, a.pool, a.seed)
    kinds = {e["id"]: e.pop("kinds") for e in exs}
    harness.write_jsonl(a.out / "generate" / "shard-00000.jsonl", exs)
    sets = ["score.judge_model=llm", "score.policy=annotate", "score.dedup=false", "score.decontam_sets=[]", *a.overrides]
    r = harness.measured_run(
        harness.negsynth_cli("score", "-d", str(a.out), "--overwrite", "--json", *(x for s in sets for x in ("--set", s)))
    )
    stats = json.loads(r["stdout"])
    says, seen, by_slot, slot_seen = Counter(), Counter(), Counter(), Counter()
    for rec in harness.records(a.out / "score"):
        verdicts = rec["score"].get("judge_neg")
        for slot, (kind, v) in enumerate(zip(kinds[rec["id"]], verdicts or [])):
            if v is not None:
                seen[kind], says[kind] = seen[kind] + 1, says[kind] + (v == 1.0)
                slot_seen[slot], by_slot[slot] = slot_seen[slot] + 1, by_slot[slot] + (v == 1.0)
    rate = {k: round(says[k] / seen[k], 4) if seen[k] else None for k in KINDS}
    slot_rate = {s + 1: round(by_slot[s] / slot_seen[s], 4) if slot_seen[s] else None for s in range(4)}
    judge = stats.get("judge") or {}
    llm = next((s.split("=", 1)[1] for s in a.overrides if s.startswith("llm.model=")), "smollm2-135m-instruct (embedded)")
    print(f"\nLLM judge {llm} on {len(exs)} SciFact train claims (seed {a.seed}, pool {a.pool}); {judge}; {r['wall_s']:.0f} s\n")
    print(
        harness.table(
            ["candidate", "says it answers the claim"],
            [[k, "-" if rate[k] is None else f"{100 * rate[k]:.1f} % ({says[k]} of {seen[k]})"] for k in KINDS],
        )
    )
    print("by slot (position in the list): " + ", ".join(f"{s}: {'-' if v is None else f'{100 * v:.0f} %'}" for s, v in slot_rate.items()))
    res = {"args": {k: str(v) for k, v in vars(a).items()}, "model": llm, "claims": len(exs), "judge": judge, "says_answers": rate}
    res |= {"counts": {k: [says[k], seen[k]] for k in KINDS}, "by_slot": slot_rate, "wall_s": round(r["wall_s"], 1)}
    (a.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out / 'results.json'}")


if __name__ == "__main__":
    main()
