"""Decoder embedders trained on the same data, one setting changed per arm (SmolLM2-135M + LoRA).

Two studies of the seed methods, each arm a :class:`~negsynth.train.TrainConfig` away from the next:

**BeLLM** (seed 001) reports, on LLaMA-2-7B trained on NLI: last layer bidirectional 86.26 (STS
avg), all layers causal 85.24, all layers bidirectional 75.55. These arms use
``train.recipe = "bellm"`` (its prompt ``The representative word for sentence {text} is:"``,
last-prompt-token pooling, 20 x contrastive + 1 x AnglE at scale 20, LoRA r 32 / alpha 32 /
dropout 0.1, lr 2e-4) and change only the attention:

==============  ==============================================================================
arm             what it is
==============  ==============================================================================
zero-shot       the untrained decoder with BeLLM's prompt and pooling, all layers causal
causal          the BeLLM recipe with ``bidirectional = "none"`` (the paper's "no bidirectional layer")
bellm           the BeLLM recipe (``bidirectional = "last:1"``)
all-bidir       the BeLLM recipe with ``bidirectional = "all"``
==============  ==============================================================================

**Pooling** (MGH's ATA, seed 002): the MGH recipe on a decoder (all layers bidirectional as
LLM2Vec, LoRA r 16 / alpha 32, InfoNCE at the decoder tau 0.02, lr 1e-4), every text in E5's STS
format ``Instruct: Retrieve semantically similar text.\nQuery: {text}`` (training and
evaluation), and only the pooling changed: ``pool-mean``, ``pool-last``, ``pool-ata`` (ATA,
instruction tokens left out of the pooled set: ``embed_mask``), ``pool-ata-all`` (ATA pooling
every token), ``pool-latent`` (NV-Embed's latent attention, 512 latents).

Training data: the (premise, entailment, contradiction) triples of SNLI 1.0 test in
``../shared/data/snli/triples_test.tsv`` (3,247 rows; BeLLM trains on MNLI + SNLI train, which
are not in the shared data), less every row with a text that also occurs in an evaluation set
(normalised-equal), first ``--rows`` in file order. Evaluation: ``negsynth.evaluate`` on the
full STS-B test (1,379 pairs) and SICK-R test (4,927 pairs), Spearman x 100 (``--eval-suite
quick``: 500 pairs of each, seed 0 — SmolLM2 embeds ~5-15 texts/s on a loaded 2-core CPU); the trained folder
is loaded by negsynth's loader, which applies the saved prompt (``negsynth_text.json``).

Writes ``OUT/results.json`` after every arm (a rerun skips the arms in it; ``--fresh`` redoes
them) and prints a Markdown table::

    python benchmarks/decoder_sts.py --out runs/decoder --rows 1024 --seeds 0
    python benchmarks/decoder_sts.py --out runs/decoder --arms pool-mean,pool-last,pool-ata,pool-ata-all,pool-latent

On a GPU with a larger decoder nothing changes but the arguments (device and precision are
picked automatically; ``--device cpu`` forces the CPU)::

    python benchmarks/decoder_sts.py --model /models/Qwen2.5-1.5B --rows 3000 --batch-size 64 --steps 500 \
        --arms pool-mean,pool-last,pool-ata,pool-ata-all,pool-latent --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BELLM = {"recipe": "bellm"}
E5_STS = "Instruct: Retrieve semantically similar text.\nQuery: {text}"
POOL = {"recipe": "mgh", "bidirectional": "all", "lora": {"enabled": True}, "lr": 1e-4, "text_template": E5_STS}
#: arm -> TrainConfig overrides (None: the untrained zero-shot model)
ARMS = {
    "zero-shot": None,
    "causal": {**BELLM, "bidirectional": "none"},
    "bellm": BELLM,
    "all-bidir": {**BELLM, "bidirectional": "all"},
    "pool-mean": {**POOL, "pooling": "mean"},
    "pool-last": {**POOL, "pooling": "last"},
    "pool-ata": {**POOL, "pooling": "ata"},
    "pool-ata-all": {**POOL, "pooling": "ata", "ata_pool": "all"},
    "pool-latent": {**POOL, "pooling": "latent"},
}
DEFAULT_ARMS = "zero-shot,causal,bellm,all-bidir"
PAPER = {"causal": 85.24, "bellm": 86.26, "all-bidir": 75.55}  # BeLLM Table/ablation, STS avg (LLaMA-2-7B)


def training_rows(data_dir: Path, n: int, eval_tasks: list[str]) -> list[dict]:
    from negsynth.data.text import text_key
    from negsynth.evaluate.runner import select_tasks

    path = data_dir / "snli" / "triples_test.tsv"
    if not path.is_file():
        sys.exit(f"decoder_sts: {path} not found; point --data-dir (or NEGSYNTH_DATA_DIR) at the shared evaluation data")
    seen = set()
    for spec in select_tasks("full", eval_tasks):
        for name in spec.files:
            for line in (data_dir / name).read_text(encoding="utf-8").splitlines()[1:]:
                a, b = line.split("\t")[:2]
                seen.update((text_key(a), text_key(b)))
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        a, p, ng = line.split("\t")
        if seen.isdisjoint((text_key(a), text_key(p), text_key(ng))):
            rows.append({"anchor": a, "positive": p, "negative": ng})
    return rows[:n]


def run_arm(arm: str, seed: int, rows: list[dict], args) -> dict:
    from datasets import Dataset

    from negsynth.embed.st import SentenceTransformerEmbedder
    from negsynth.evaluate import evaluate
    from negsynth.train import TrainConfig
    from negsynth.train.trainer import build_model, make_trainer, save_model

    t0 = time.time()
    dest = args.out / arm / f"seed{seed}"
    steps = args.steps if args.steps > 0 else max(1, len(rows) // args.batch_size)
    common = dict(
        model=args.model,
        batch_size=args.batch_size,
        grad_accum=1,
        epochs=1,
        max_steps=args.steps,
        max_length=args.max_length,
        seed=seed,
        output_dir=str(dest / "_ckpt"),
        save_steps=10**6,
        save_total_limit=1,
        logging_steps=max(1, steps // 8),
    )
    info: dict = {}
    if arm == "zero-shot":
        cfg = TrainConfig(**{**common, **BELLM, "bidirectional": "none", "lora": {"enabled": False}})
        model = build_model(cfg, device=None if args.device == "auto" else args.device)
    else:
        cfg = TrainConfig(**{**common, **ARMS[arm]})
        trainer, model = make_trainer(Dataset.from_list(rows), cfg)
        trainer.train()
        info = {"steps": trainer.state.global_step, "loss": [round(e["loss"], 4) for e in trainer.state.log_history if "loss" in e]}
    save_model(model, str(dest))
    t_train = time.time() - t0
    emb = SentenceTransformerEmbedder.load(str(dest), device=args.device, batch_size=args.eval_batch_size)
    rep = evaluate(emb, suite=args.eval_suite, tasks=args.eval_tasks, progress=False, data_dir=args.data_dir, seed=0)
    scores = {name: round(100 * float(t["main_score"]), 2) for name, t in rep["tasks"].items()}
    return {
        "arm": arm,
        "seed": seed,
        "scores": scores,
        "avg": round(statistics.mean(scores.values()), 2),
        "rows": len(rows),
        "train_s": round(t_train, 1),
        "seconds": round(time.time() - t0, 1),
        **info,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bellm"))
    ap.add_argument("--data-dir", type=Path, default=None, help="shared evaluation data (default: NEGSYNTH_DATA_DIR or ../shared/data)")
    ap.add_argument("--arms", default=DEFAULT_ARMS, help=f"from {','.join(ARMS)}")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--model", default="smollm2", help="decoder to train: 'smollm2' (bundled SmolLM2-135M) or a local model folder")
    ap.add_argument("--rows", type=int, default=1024, help="training triples (first N after decontamination)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=-1, help="optimizer steps (default: one pass over --rows; more steps cycle the rows)")
    ap.add_argument("--device", default="auto", help="auto = CUDA when present (bf16/fp16 picked by the trainer), else CPU")
    ap.add_argument("--eval-batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=64, help="BeLLM's README trains at maxlen 60")
    ap.add_argument("--eval-tasks", default="STSBenchmark,SICK-R")
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
    from negsynth.resources import default_data_dir

    args.data_dir = args.data_dir or default_data_dir()
    if args.data_dir is None or not Path(args.data_dir).is_dir():
        sys.exit("decoder_sts: no evaluation data; set NEGSYNTH_DATA_DIR or --data-dir to the shared data folder")
    args.data_dir = Path(args.data_dir)
    args.eval_tasks = [t for t in args.eval_tasks.split(",") if t]
    arms = [a for a in args.arms.split(",") if a]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        sys.exit(f"decoder_sts: unknown arm(s) {bad}; choose from {','.join(ARMS)}")
    rows = training_rows(args.data_dir, args.rows, args.eval_tasks)
    print(f"SNLI triples for training: {len(rows)} (after dropping rows that share a text with {', '.join(args.eval_tasks)})", flush=True)
    results = saved.get("results", [])
    done = {(r["arm"], r["seed"]) for r in results}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for arm in arms:
            if (arm, seed) in done or (arm == "zero-shot" and any(r["arm"] == arm for r in results)):
                continue
            r = run_arm(arm, seed, rows, args)
            results.append(r)
            args.out.mkdir(parents=True, exist_ok=True)
            tmp = res_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1))
            tmp.replace(res_path)
            print(f"{arm} seed {seed}: {r['scores']} avg {r['avg']} ({r['seconds']:.0f} s)", flush=True)
    print(
        f"\n| arm | {' | '.join(args.eval_tasks)} | avg | BeLLM paper (LLaMA-2-7B, 7 STS sets) |\n|---|{'---:|' * (len(args.eval_tasks) + 2)}"
    )
    for arm in ARMS:
        rs = [r for r in results if r["arm"] == arm]
        if not rs:
            continue
        cell = [f"{statistics.mean(r['scores'][t] for r in rs):.2f}" for t in args.eval_tasks]
        avg = statistics.mean(r["avg"] for r in rs)
        sd = f" ± {statistics.stdev(r['avg'] for r in rs):.2f}" if len(rs) > 1 else ""
        print(f"| {arm} ({len(rs)} seed{'s' if len(rs) > 1 else ''}) | {' | '.join(cell)} | {avg:.2f}{sd} | {PAPER.get(arm, '—')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
