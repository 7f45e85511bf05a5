"""Zero-shot STS with SmolLM2-135M: classical pooling vs PromptEOL, echo, ReBA and EmbedFilter.

Every pair of the seven STS test sets (STS12–16, STSBenchmark, SICK-R; MTEB's tasks, read from the
local files in the data folder), scored by the same path as ``negsynth evaluate --suite full
--tasks STS``: negsynth's evaluator, or mteb's (``--engine mteb``). The score is Spearman (x100)
of the cosine of the two embeddings against the gold score, per set and averaged.

Rows that share a forward pass (mean+last; echo-mean, echo-last and EmbedFilter on echo;
PromptEOL and EmbedFilter on PromptEOL; ReBA mean/last) are served from one pass
(:class:`negsynth.embed.decoder.SharedPass`): each distinct text is embedded once per pass, and
the vectors are kept in ``--cache DIR`` so a killed run resumes where it stopped (a pass is
written after every set). Throughput is texts/s of the forward passes this process ran.

    python benchmarks/zeroshot_sts.py --out-md /tmp/zs.md                  # full sets, every pass
    python benchmarks/zeroshot_sts.py --suite quick --groups plain,prompteol   # a subsample, two passes
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

SETS = ["STSBenchmark", "STS12", "STS13", "STS14", "STS15", "STS16", "SICK-R"]


def main(argv: list[str] | None = None) -> dict:
    from negsynth.resources import default_data_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data-dir", type=Path, default=None, help="folder with stsb/, sts12/ ... (default: negsynth.resources.default_data_dir())"
    )
    ap.add_argument("--model", default="default", help="decoder model folder (default: bundled SmolLM2-135M-Instruct)")
    ap.add_argument("--suite", choices=["full", "quick"], default="full", help="full = every pair; quick = evaluate's fixed subsample")
    ap.add_argument(
        "--engine",
        choices=["negsynth", "mteb"],
        default="negsynth",
        help="which evaluator scores the sets (as `negsynth evaluate --engine`)",
    )
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=128, help="tokens per copy of a text")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = leave)")
    ap.add_argument("--groups", default="plain,prompteol,embedfilter-prompteol,echo,reba", help="which forward passes to run")
    ap.add_argument("--cache", type=Path, default=Path("zeroshot-cache"), help="folder for the passes' vectors (resume)")
    ap.add_argument("--out-md", type=Path, default=None)
    ap.add_argument("--out-json", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import torch

    from negsynth.embed.decoder import DecoderEmbedder, SharedPass
    from negsynth.embed.hf import load_decoder
    from negsynth.evaluate import evaluate

    if args.threads:
        torch.set_num_threads(args.threads)
    data_dir = args.data_dir or default_data_dir()
    if data_dir is None:
        raise SystemExit(
            "zeroshot_sts: no data folder; pass --data-dir or set NEGSYNTH_DATA_DIR to a folder with stsb/, sts12/ … (see docs/evaluate.md)"
        )
    sets = [s for s in args.sets.split(",") if s]

    t_start = time.perf_counter()
    model, tok = load_decoder(args.model, causal_lm=True, attn_implementation="eager")
    common = dict(max_length=args.max_length, batch_size=args.batch_size, model_name=args.model)

    def emb(method, **kw):
        return DecoderEmbedder(model, tok, method=method, **common, **kw)

    # group -> (embedder running the pass, [(row label, pooling, EmbedFilter projector or None)])
    groups = {
        "plain": (emb("mean"), [("mean", "mean", None), ("last", "last", None)]),
        "prompteol": (emb("prompteol"), [("prompteol (last)", "last", None)]),
        "embedfilter-prompteol": (
            emb("prompteol", prompteol_template="summarize", truncation="head_tail"),
            [("prompteol[summarize] (last)", "last", None)]
            + [
                (f"embedfilter τ={t} on prompteol[summarize]", "last", emb("embedfilter", base="prompteol", filter_ratio=t)) for t in (2, 4)
            ],
        ),
        "echo": (
            emb("echo"),
            [("echo-mean", "mean", None), ("echo-last", "last", None)]
            + [(f"embedfilter τ={t} on echo-mean", "mean", emb("embedfilter", base="echo", filter_ratio=t)) for t in (2, 4)],
        ),
        "echo-rewrite": (
            emb("echo", echo_template="rewrite"),
            [("echo-mean [rewrite]", "mean", None), ("echo-last [rewrite]", "last", None)],
        ),
        "reba": (
            emb("reba", repeat=2),
            [
                ("reba2-mean", "mean", None),
                ("reba2-last (paper e_n)", "last:paper", None),
                ("reba2-last (code: final row)", "last:code", None),
            ],
        ),
    }
    results, passes = [], {}
    for g in args.groups.split(","):
        e, rows = groups[g]
        model.set_attn_implementation("eager" if e.method == "reba" else "sdpa")  # only ReBA reads attention probabilities
        poolings = tuple(dict.fromkeys(p for _, p, _ in rows))
        tag = hashlib.sha256(f"{e.name}|{args.model}|{args.max_length}|{poolings}".encode()).hexdigest()[:12]
        shared = SharedPass(e, poolings, cache=args.cache / f"{g}-{tag}.npz")
        for label, p, proj in rows:
            view = shared.view(p, projector=proj, name=label)
            rep = evaluate(view, suite=args.suite, data_dir=data_dir, tasks=sets, progress=False, engine=args.engine)
            missing = [s for s in sets if s not in rep["tasks"]]
            if missing:
                raise SystemExit(f"zeroshot_sts: {', '.join(missing)} not evaluated ({rep.get('skipped') or rep.get('notes')})")
            per = {s: 100 * rep["tasks"][s]["main_score"] for s in sets}
            results.append({"method": label, "pass": g, "dim": view.dim, "per_set": per, "avg": float(np.mean(list(per.values())))})
            log.info("%s: avg %.2f", label, results[-1]["avg"])
        n_tok = float(np.mean([len(e.tokenize(t).ids) for t in list(shared.index)[:2000]]))
        passes[g] = {
            "texts": len(shared.index),
            "embedded_now": shared.encoded,
            "seconds": round(shared.seconds, 1),
            "texts_per_s": shared.encoded / shared.seconds if shared.seconds else None,
            "tokens_per_text": n_tok,
        }
        log.info("%s pass: %s", g, passes[g])

    head = "| method | dim | " + " | ".join(sets) + " | avg |"
    lines = [head, "|" + "---|" * (len(sets) + 3)]
    for r in results:
        cells = " | ".join(f"{r['per_set'][s]:.2f}" for s in sets)
        lines.append(f"| {r['method']} | {r['dim']} | {cells} | **{r['avg']:.2f}** |")
    lines += ["", "| pass | distinct texts | embedded in this run | seconds | texts/s | tokens/text |", "|---|---|---|---|---|---|"]
    for g, v in passes.items():
        tps = f"{v['texts_per_s']:.1f}" if v["texts_per_s"] else "(from cache)"
        lines.append(f"| {g} | {v['texts']} | {v['embedded_now']} | {v['seconds']} | {tps} | {v['tokens_per_text']:.0f} |")
    table = "\n".join(lines)
    wall = time.perf_counter() - t_start
    meta = (
        f"SmolLM2-135M-Instruct ({args.model}), Spearman x100 of cosine vs gold, suite {args.suite} "
        f"({'every pair' if args.suite == 'full' else 'evaluate quick subsample'}), engine {args.engine}, max {args.max_length} tokens "
        f"per copy, batch {args.batch_size}, torch threads {torch.get_num_threads()}, wall {wall / 60:.1f} min."
    )
    print(meta)
    print(table)
    if args.out_md:
        args.out_md.write_text(meta + "\n\n" + table + "\n")
    if args.out_json:
        args.out_json.write_text(
            json.dumps({"meta": meta, "args": {k: str(v) for k, v in vars(args).items()}, "results": results, "passes": passes}, indent=1)
        )
    return {"meta": meta, "results": results, "passes": passes}


if __name__ == "__main__":
    main()
