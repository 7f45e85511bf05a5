"""Decoder embedders on STS (SmolLM2-135M): zero-shot methods, and LoRA training with one setting changed per arm.

**Zero-shot arms** (``zs-*``): the untrained decoder through ``[embedder]``'s methods, scored by
``negsynth.evaluate_model`` as ``negsynth evaluate --model smollm2`` scores it (128 tokens per copy of a text):

=========================  ========================================================================
arm                        embedder settings
=========================  ========================================================================
zs-mean, zs-last           ``method = "mean"`` / ``"last"``: classical pooling
zs-prompteol               PromptEOL (``This sentence : "{text}" means in one word:"``, last token)
zs-prompteol-summarize     PromptEOL with EmbedFilter's "summarize" template, head+tail truncation
zs-embedfilter2-prompteol  EmbedFilter (tau 2; ``-embedfilter4-``: tau 4) on the summarize PromptEOL
zs-echo-mean, zs-echo-last echo embeddings (the text twice, the second copy pooled)
zs-embedfilter2-echo       EmbedFilter (tau 2; ``-embedfilter4-``: tau 4) on echo-mean
zs-reba2-mean, -last       ReBA-2 (the text repeated, attention re-weighted); ``zs-reba2-last-code``:
                           the final row instead of the paper's e_n
zs-bellm                   BeLLM's prompt (``The representative word for sentence {text} is:"``), last token
=========================  ========================================================================

**Trained arms**: ``negsynth.train.train`` on SNLI triples, then evaluated. **BeLLM** (seed 001:
LLaMA-2-7B on NLI, last layer bidirectional 86.26 STS avg, all causal 85.24, all bidirectional
75.55) with ``train.recipe = "bellm"`` (its prompt, last-token pooling, 20 x contrastive + 1 x AnglE,
LoRA r 32, lr 2e-4), only the attention changed: ``causal`` (``bidirectional = "none"``), ``bellm``
(``"last:1"``), ``all-bidir`` (``"all"``). **Pooling** (MGH's ATA, seed 002): the MGH recipe on a
decoder (all layers bidirectional, LoRA r 16, InfoNCE at tau 0.02, lr 1e-4), E5's STS instruction on
every text, only the pooling changed: ``pool-mean``, ``pool-last``, ``pool-ata`` (instruction tokens
left out: ``embed_mask``), ``pool-latent`` (NV-Embed's latent attention).

Training data: the (premise, entailment, contradiction) triples of SNLI 1.0 test (3,247 rows), less
every row sharing a text with an evaluation set, first ``--rows``. Evaluation (``--eval-tasks``, default
STS-B and SICK-R test; ``STS`` for the seven STS sets), Spearman x 100, ``--eval-suite quick``: 500 pairs
of each. ``OUT/results.json`` is written after every arm (a rerun skips what it holds, and refuses a
file made with other settings; ``--fresh`` redoes)::

    python benchmarks/decoder_sts.py --out runs/decoder --arms zs-bellm,causal,bellm,all-bidir --rows 1024
    python benchmarks/decoder_sts.py --out runs/zs --arms zs-mean,zs-last,zs-prompteol,zs-echo-mean,zs-reba2-mean --eval-tasks STS
    python benchmarks/decoder_sts.py --out runs/pool --arms pool-mean,pool-last,pool-ata,pool-latent
    python benchmarks/decoder_sts.py --model /models/Qwen2.5-1.5B --rows 3000 --batch-size 64 --steps 500 --arms pool-mean,pool-ata --seeds 0,1,2
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import harness

BELLM = {"recipe": "bellm"}
E5_STS = "Instruct: Retrieve semantically similar text.\nQuery: {text}"
POOL = {"recipe": "mgh", "bidirectional": "all", "lora": {"enabled": True}, "lr": 1e-4, "text_template": E5_STS}
SUMMARIZE = {"method": "prompteol", "prompteol_template": "summarize", "truncation": "head_tail"}
ZERO_SHOT = {  # arm -> [embedder] settings
    "zs-mean": {"method": "mean"},
    "zs-last": {"method": "last"},
    "zs-prompteol": {"method": "prompteol"},
    "zs-prompteol-summarize": SUMMARIZE,
    "zs-embedfilter2-prompteol": {"method": "embedfilter", "base": "prompteol", "filter_ratio": 2},
    "zs-embedfilter4-prompteol": {"method": "embedfilter", "base": "prompteol", "filter_ratio": 4},
    "zs-echo-mean": {"method": "echo", "pooling": "mean"},
    "zs-echo-last": {"method": "echo", "pooling": "last"},
    "zs-embedfilter2-echo": {"method": "embedfilter", "base": "echo", "filter_ratio": 2},
    "zs-embedfilter4-echo": {"method": "embedfilter", "base": "echo", "filter_ratio": 4},
    "zs-reba2-mean": {"method": "reba", "repeat": 2, "pooling": "mean"},
    "zs-reba2-last": {"method": "reba", "repeat": 2, "pooling": "last"},
    "zs-reba2-last-code": {"method": "reba", "repeat": 2, "pooling": "last", "reba_variant": "code"},
    "zs-bellm": {"method": "prompteol", "prompteol_template": 'The representative word for sentence {text} is:"'},
}
TRAINED = {  # arm -> TrainConfig keys
    "causal": {**BELLM, "bidirectional": "none"},
    "bellm": BELLM,
    "all-bidir": {**BELLM, "bidirectional": "all"},
    "pool-mean": {**POOL, "pooling": "mean"},
    "pool-last": {**POOL, "pooling": "last"},
    "pool-ata": {**POOL, "pooling": "ata"},
    "pool-latent": {**POOL, "pooling": "latent"},
}
ARMS = [*ZERO_SHOT, *TRAINED]
PAPER = {"causal": 85.24, "bellm": 86.26, "all-bidir": 75.55}  # BeLLM, STS avg (LLaMA-2-7B)


def text_key(text: str) -> str:
    """Two texts are one when equal after NFKC, casefolding, collapsed whitespace and outer punctuation stripped."""
    import unicodedata

    t = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    i, j = 0, len(t)
    while i < j and not t[i].isalnum():
        i += 1
    while j > i and not t[j - 1].isalnum():
        j -= 1
    return t[i:j]


def training_rows(data_dir: Path, n: int, eval_tasks: list[str]) -> list[dict]:
    """The first ``n`` SNLI triples that share no text with the evaluation sets."""
    from negsynth.evaluate import select_tasks

    path = data_dir / "snli" / "triples_test.tsv"
    if not path.is_file():
        sys.exit(f"decoder_sts: {path} not found; point --data-dir (or NEGSYNTH_DATA_DIR) at the shared evaluation data")
    seen = set()
    for spec in select_tasks("full", eval_tasks):
        for name in spec.files:
            for line in (data_dir / name).read_text(encoding="utf-8").splitlines()[1:]:
                seen.update(text_key(t) for t in line.split("\t")[:2])
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        a, p, ng = line.split("\t")
        if seen.isdisjoint((text_key(a), text_key(p), text_key(ng))):
            rows.append({"anchor": a, "positive": p, "negative": ng})
    return rows[:n]


def run_arm(arm: str, seed: int, rows: list[dict], args) -> dict:
    import negsynth

    t0 = time.time()
    info: dict = {}
    evaluated = [f"evaluate.batch_size={args.eval_batch_size}", f"embedder.device={args.device}"]
    if arm in ZERO_SHOT:
        model, sets = (
            args.model,
            ["embedder.kind=decoder", "embedder.max_length=128", *(f"embedder.{k}={v}" for k, v in ZERO_SHOT[arm].items())],
        )
    else:
        from negsynth.train import TrainConfig, train

        steps = args.steps if args.steps > 0 else max(1, len(rows) // args.batch_size)
        cfg = TrainConfig(
            **{
                "model": args.model,
                "batch_size": args.batch_size,
                "grad_accum": 1,
                "epochs": 1,
                "max_steps": args.steps,
                "max_length": args.max_length,
                "seed": seed,
                "output_dir": str(args.out / arm / f"seed{seed}"),
                "save_steps": 10**6,
                "save_total_limit": 1,
                "logging_steps": max(1, steps // 8),
                **TRAINED[arm],
            }
        )
        model, sets = train({k: [r[k] for r in rows] for k in rows[0]}, cfg), []
        log = json.loads((Path(model) / "train_log.json").read_text())["log_history"]
        info = {"steps": max((e.get("step", 0) for e in log), default=0), "loss": [round(e["loss"], 4) for e in log if "loss" in e]}
    t_train = time.time() - t0
    rep = negsynth.evaluate_model(model, args.eval_tasks, suite=args.eval_suite, overrides=[*evaluated, *sets], data_dir=args.data_dir)
    scores = {name: round(100 * float(t["main_score"]), 2) for name, t in rep["tasks"].items()}
    if not scores:
        sys.exit(f"decoder_sts: nothing evaluated ({'; '.join(rep.get('notes', []))})")
    return {"arm": arm, "seed": seed, "scores": scores, "avg": round(statistics.mean(scores.values()), 2), "rows": len(rows)} | {
        "train_s": round(t_train, 1),
        "seconds": round(time.time() - t0, 1),
        **info,
    }


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--out", type=Path, default=Path("runs/decoder"))
    ap.add_argument("--data-dir", type=Path, default=None, help="shared evaluation data (default: NEGSYNTH_DATA_DIR or ../shared/data)")
    ap.add_argument("--arms", default="zs-bellm,causal,bellm,all-bidir", help=f"comma-separated, or 'all': {','.join(ARMS)}")
    ap.add_argument("--seeds", type=harness.int_list, default="0", help="seeds of the trained arms (a zero-shot arm runs once)")
    ap.add_argument("--model", default="smollm2", help="the decoder: 'smollm2' (bundled SmolLM2-135M) or a local model folder")
    ap.add_argument("--rows", type=int, default=1024, help="training triples (first N after decontamination)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=-1, help="optimizer steps (default: one pass over --rows)")
    ap.add_argument("--device", default="auto", help="auto = CUDA when present (bf16/fp16 picked by the trainer), else CPU")
    ap.add_argument("--eval-batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=64, help="training tokens (BeLLM's README trains at maxlen 60)")
    ap.add_argument("--eval-tasks", type=lambda v: [t for t in v.split(",") if t], default="STSBenchmark,SICK-R")
    ap.add_argument("--eval-suite", choices=["full", "quick"], default="full", help="quick: 500 pairs per set (seed 0)")
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the trainer picks CUDA whenever it sees one
    res_path = args.out / "results.json"
    saved = {} if args.fresh or not res_path.exists() else json.loads(res_path.read_text())
    for key in ("model", "rows", "batch_size", "steps", "max_length", "eval_suite"):
        was = saved.get("args", {}).get(key, {"model": "smollm2", "steps": "-1"}.get(key))
        if saved and was != str(getattr(args, key)):
            sys.exit(
                f"decoder_sts: {res_path} holds arms run with --{key.replace('_', '-')} {was}; use another --out, the same setting, or --fresh"
            )
    args.data_dir = harness.data_dir(args.data_dir)
    arms = harness.names(args.arms, ARMS)
    rows = training_rows(args.data_dir, args.rows, args.eval_tasks) if set(arms) & set(TRAINED) else []
    results = saved.get("results", [])
    done = {(r["arm"], r["seed"]) for r in results}
    for arm, seed in harness.jobs(arms, args.seeds, lambda a: a in TRAINED):
        if (arm, seed) in done or (arm in ZERO_SHOT and any(r["arm"] == arm for r in results)):
            continue
        r = run_arm(arm, seed, rows, args)
        results = harness.save_result(res_path, r, ("arm", "seed"), args)
        print(f"{arm} seed {seed}: {r['scores']} avg {r['avg']} ({r['seconds']:.0f} s)", flush=True)
    table = []
    for arm in ARMS:
        if rs := [r for r in results if r["arm"] == arm]:
            cells = [f"{statistics.mean(r['scores'][t] for r in rs if t in r['scores']):.2f}" for t in rs[0]["scores"]]
            table.append(
                [
                    f"{arm} ({len(rs)} seed{'s' if len(rs) > 1 else ''})",
                    *cells,
                    harness.mean_sd([r["avg"] for r in rs]),
                    PAPER.get(arm, "-"),
                ]
            )
    if table:
        head = list(next(r for r in results if r["arm"] in arms)["scores"])
        print("\n" + harness.table(["arm", *head, "avg", "BeLLM paper (LLaMA-2-7B)"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
