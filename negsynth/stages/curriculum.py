"""Stage — curriculum: scored examples -> training rows in training order.

In:  ``RUN_DIR/<curriculum.input>/`` (default ``score``) :class:`Example` shards.
Out: ``RUN_DIR/curriculum/`` — ``dataset/`` (HF ``save_to_disk``), ``train.parquet``,
     ``card.json`` / ``card.md`` (composition), ``stats.json`` (written by ``run_stage``).

Rows are in training order: never shuffle them. Their columns and rules (phases, disjoint
groups, no duplicate text per batch) are in docs/curriculum.md and :mod:`negsynth.data.curriculum`.
"""

from __future__ import annotations

import time
from collections import Counter

from negsynth.errors import UserError
from negsynth.pipeline import Stage, StageContext, Summary, config_hash, inputs_fingerprint
from negsynth.schemas.config import CurriculumConfig
from negsynth.stages.common import path_fingerprint, read_stage_records

NAME = "curriculum"


def anchor_template(cfg) -> str | None:
    """The anchor format: ``curriculum.instruction_template`` when instructions are on ("on", or
    "auto" with ``evaluate.instruct_queries``), else the bare query — train as you evaluate."""
    cc = cfg.curriculum
    on = cc.instructions == "on" or (cc.instructions == "auto" and cfg.evaluate.instruct_queries)
    return cc.instruction_template if on else None


def corpus_made(example: dict) -> bool:
    """Made by the corpus stage: its query written for (or taken from) a document, its negatives
    mined from the document's corpus (``model`` = ``mined:…:corpus``)."""
    m = str(example.get("model") or "")
    return m.startswith("mined:") and m.endswith(":corpus")


def _stock_rows(example: dict, candidates: str) -> bool:
    """Whether the stock recipe's rows can be made of ``example``: a labelled pair with its 4
    hardest mined negatives (``mined:…:top``), or the corpus stage's (query, document) pair, mined
    again by :func:`library_negatives` — unless its negatives came from hybrid candidates or carry
    a teacher's scores (``corpus.candidates``, ``corpus.teacher``: the stock recipe has neither)."""
    m = str(example.get("model") or "")
    if m.startswith("mined:") and m.endswith(":top"):
        return True
    return corpus_made(example) and candidates == "dense" and "teacher_label" not in (example.get("meta") or {})


def resolve_schedule(cc, examples: list[dict], candidates: str = "dense") -> str:
    """``curriculum.schedule``, with ``auto`` resolved: ``stock`` when the stock recipe's rows can
    be made of every example (:func:`_stock_rows`; why: docs/recipe.md), ``tuple`` (every row
    carries its 4 hardest negatives) for other mined negatives, else ``curriculum``, the method's
    order for LLM-graded negatives. ``candidates``: ``corpus.candidates``."""
    if cc.schedule != "auto":
        return cc.schedule
    models = [str(e.get("model") or "") for e in examples]
    if cc.negatives != "mined" and models and all(_stock_rows(e, candidates) for e in examples):
        return "stock"  # the stock recipe's rows, trained its way
    mined = cc.negatives == "mined" or (bool(models) and all(m.startswith("mined:") for m in models))
    return "tuple" if mined else "curriculum"


def remines(cfg, examples: list[dict]) -> bool:
    """Whether the curriculum mines ``examples`` again (a ``stock`` schedule over the corpus stage's)."""
    return resolve_schedule(cfg.curriculum, examples, cfg.corpus.candidates) == "stock" and any(map(corpus_made, examples))


def library_negatives(ctx: StageContext, examples: list[dict]) -> tuple[list[dict], int]:
    """The examples with the corpus stage's mined again as the stock recipe mines them
    (``mine_hard_negatives`` over each query's own corpus, read again from ``corpus.inputs``, with
    ``[embedder]`` and ``corpus.mining``), and the count left out: a query left with fewer than 4
    negatives, as the library leaves its row out. Other examples pass as they are."""
    from collections import defaultdict

    from negsynth.schemas.records import NUM_NEGATIVES
    from negsynth.stages.corpus import load_corpora
    from negsynth.stages.regenerate import run_miner

    todo: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(examples):
        if corpus_made(e):
            todo[str((e.get("meta") or {}).get("corpus"))].append(i)
    corpora = {c.name: c for c in load_corpora(ctx)}
    if missing := sorted(set(todo) - set(corpora)):
        raise UserError(
            f"curriculum: the corpus stage's examples come from corpus {missing[0]!r}, which corpus.inputs no longer reads; "
            'rerun `negsynth corpus`, or set curriculum.schedule = "tuple" to train its own negatives'
        )
    # the library's embeddings kept in the run dir: a curriculum built again (other settings,
    # --overwrite) does not embed the corpus again
    mine = run_miner(ctx, ctx.cfg.corpus.mining, NUM_NEGATIVES)
    model = ctx.load_mining_model()
    out, left_out = list(examples), set()
    for name, idx in todo.items():
        texts = [d.text for _, docs in corpora[name].batches() for d in docs]
        ctx.reporter.info(f"curriculum: mining {len(idx)} queries over the {len(texts)} documents of {name} (mine_hard_negatives) ...")
        found = mine(model, {str(i): examples[i]["query"] for i in idx}, {str(i): [examples[i]["positive"]] for i in idx}, texts)
        for i in idx:
            negs = found[str(i)]["negatives"]
            if len(negs) < NUM_NEGATIVES:
                left_out.add(i)
            else:  # score measured the corpus stage's negatives, not these
                out[i] = {**examples[i], "negatives": negs, "score": None}
    if len(left_out) == len(examples):
        from negsynth.data.curriculum import CurriculumError

        raise CurriculumError(
            f"curriculum: mine_hard_negatives kept none of the {len(examples)} queries (each needs 4 negatives under the margin "
            "within the library's candidate window); set curriculum.schedule = \"tuple\" to train the corpus stage's own "
            "negatives (searched over the whole corpus), or add documents"
        )
    return [e for i, e in enumerate(out) if i not in left_out], len(left_out)


def _hint(cc) -> str:
    return f"run `negsynth {cc.input}` first (curriculum.input = {cc.input!r})"


def run(ctx: StageContext) -> dict:
    """Build the dataset (derived data: ``run_stage`` reuses it while what it is made from is unchanged)."""
    from negsynth.data.curriculum import (
        BatchFillError,
        CurriculumError,
        build_curriculum,
        has_full_batch,
        largest_fitting_batch,
        save_curriculum,
    )
    from negsynth.data.stock import stock_curriculum

    cc = ctx.cfg.curriculum
    batch_size = cc.batch_size or ctx.cfg.train.batch_size
    out = ctx.run_dir / NAME
    t0 = time.monotonic()
    examples = list(read_stage_records(ctx.run_dir, cc.input, hint=_hint(cc)))
    try:
        schedule = resolve_schedule(cc, examples, ctx.cfg.corpus.candidates)
        too_few_mined = None
        if remines(ctx.cfg, examples):
            examples, too_few_mined = library_negatives(ctx, examples)
        options = {
            "schedule": schedule,
            "total_steps": cc.total_steps,
            "epochs": cc.epochs if cc.total_steps is None else None,
            "seed": cc.seed,
            "homogeneous_batches": cc.homogeneous_batches,
            "use_mined": cc.negatives == "mined",
            "instruction_template": anchor_template(ctx.cfg),
        }
        try:
            rows = (stock_curriculum if schedule == "stock" else build_curriculum)(examples, batch_size=batch_size, **options)
        except BatchFillError:
            rows = None
        # "stock" plans no batches: the trainer's shuffled sampler leaves one short rather than repeat a text
        if schedule != "stock" and not has_full_batch(rows):  # a small pool: no text may appear twice in a batch, so fewer rows share one
            wanted, fit = batch_size, largest_fitting_batch(examples, batch_size, **options)
            if fit is None:
                raise CurriculumError(
                    f"curriculum: {len(examples)} examples gave no batch of even 2 rows whose texts are all distinct "
                    "(no text may appear twice in a batch); make more examples"
                )
            batch_size, rows = fit
            rows.stats["batch_size_wanted"] = wanted
            mined = cc.negatives == "mined" or all(str(e.get("model") or "").startswith("mined:") for e in examples)
            why = ", and mined negatives are other examples' documents" if mined else ""
            ctx.reporter.warn(
                f"curriculum: {len(examples)} examples cannot fill a batch of {wanted} with distinct texts (no text may appear twice "
                f"in a batch{why}); using batch size {batch_size}, the largest that fills, "
                + (
                    f"for the curriculum's batches (train's shuffled sampler batches the rows itself, {wanted} at most)"
                    if ctx.cfg.train.batch_sampler == "shuffled"
                    else "for curriculum and train (more examples keep the size asked for)"
                )
            )
        if too_few_mined is not None:  # the queries the library's window left without 4 negatives
            rows.stats["dropped_too_few_mined"] = too_few_mined
        save_curriculum(rows, out, stats=dict(rows.stats))
    except CurriculumError as e:
        raise UserError(str(e)) from None
    return {
        "stage": NAME,
        "examples": len(examples),
        "rows": len(rows),
        "batches": rows.stats.get("steps", len(rows) // batch_size),
        "short_batches": rows.stats.get("short_batches", 0),
        "batch_size": batch_size,
        # the batch size asked for, when too few examples filled no batch of it (batch_size: the largest that did)
        "batch_size_wanted": rows.stats.get("batch_size_wanted"),
        "schedule": schedule,
        "schedule_setting": cc.schedule,
        "rows_per_phase": dict(Counter(str(r["phase"]) for r in rows)),
        "builder": dict(rows.stats),
        "output": str(out),
        "wall_time_s": round(time.monotonic() - t0, 3),
    }


def report(stats: dict) -> list[Summary]:
    return [
        Summary(
            "curriculum",
            [
                ("examples in", stats["examples"]),
                ("rows (training order)", stats["rows"]),
                (
                    (
                        "batches of",
                        f"the trainer's shuffled sampler (NO_DUPLICATES): {stats['batches']} steps x up to {stats['batch_size']}",
                    )
                    if stats["schedule"] == "stock"
                    else (
                        "batches of",
                        f"{stats['batches']} x {stats['batch_size']}"
                        + (f" ({stats['short_batches']} shorter: a phase's last rows)" if stats.get("short_batches") else "")
                        + (f" (too few examples for {stats['batch_size_wanted']})" if stats.get("batch_size_wanted") else ""),
                    )
                ),
                ("schedule", stats["schedule"] + (" (auto)" if stats.get("schedule_setting") == "auto" else "")),
                ("rows per phase", ", ".join(f"{k}: {v}" for k, v in stats["rows_per_phase"].items())),
                *[(f"  {k}", v) for k, v in stats["builder"].items() if k.startswith(("dropped", "skipped", "moved", "rows_in_short"))],
                ("output", stats.get("output", "")),
            ],
        )
    ]


class Curriculum(Stage):
    """Training rows in training order: see the module's docstring."""

    name = NAME
    summary = "training rows, easiest level first"
    config = CurriculumConfig
    relaunch = "rebuild"

    def inputs(self, cfg) -> tuple[str, ...]:
        return (cfg.curriculum.input,)

    def made_from(self, ctx: StageContext) -> str:
        """The hash of what the dataset is made from: settings, batch size, anchor format, input shards."""
        cc = ctx.cfg.curriculum
        batch_size = cc.batch_size or ctx.cfg.train.batch_size
        parts = {
            "curriculum": cc,
            "batch_size": batch_size,
            "anchor": anchor_template(ctx.cfg),
            "inputs": inputs_fingerprint(ctx.run_dir, cc.input),
        }
        if cc.schedule in ("auto", "stock") and remines(ctx.cfg, list(read_stage_records(ctx.run_dir, cc.input, hint=_hint(cc)))):
            # mined again here: the embedder, the margin and the documents mined over
            cfg = ctx.cfg
            parts["mined"] = {
                "embedder": cfg.embedder,
                "corpus": cfg.corpus,
                "files": [path_fingerprint(s.path) for s in cfg.corpus.inputs],
            }
        return config_hash(parts)

    run = staticmethod(run)
    report = staticmethod(report)


STAGE = Curriculum()
