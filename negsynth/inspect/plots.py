"""``negsynth inspect --plots DIR``: PNG figures of a run's scored examples (matplotlib, off screen)."""

from __future__ import annotations

import json
from pathlib import Path

from negsynth.errors import UserError
from negsynth.inspect.report import collect_shards, example_stage, level_word, negatives_mined, resolve, scan_shards, score_frame


def write_plots(path: str | Path, out_dir: str | Path, *, task_type: str | None = None) -> list[Path]:
    """PNG figures of the examples under ``path`` (each ``_plot_*``'s; docs/score.md, "inspect") -> the files written."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("--plots needs matplotlib; run: pip install 'negsynth[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path, out = Path(path), Path(out_dir)
    run_dir, stages = resolve(path)
    ex_stage = example_stage(stages)
    if ex_stage is None:
        raise UserError(f"{path}: no shard-*.jsonl found; nothing to plot")
    files = stages[ex_stage]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--plots {out}: cannot create it ({e.strerror}); choose a writable directory") from None
    written = [_plot_task_mix(files, ex_stage, out / "task_type_mix.png", plt)]  # works without scores
    neg = score_frame(files, task_type=task_type)
    if neg.height == 0:
        return written
    mined = negatives_mined(files)
    ex = neg.unique(subset=["_file", "_row"], keep="first")  # one row per example
    levels = sorted(neg.get_column("level").unique().to_list())
    emb = _embedder_name(run_dir, path, ex_stage)
    written.append(_plot_cos_by_level(neg, ex, levels, mined, emb, out / "cos_by_level.png", plt))
    written.append(_plot_flags_by_level(neg, levels, mined, out / "flags_by_level.png", plt))
    tau = ex.get_column("kendall_tau").drop_nulls().to_numpy()
    if len(tau) and not mined:  # mined negatives: no LLM order to compare with the cosines
        written.append(_plot_kendall_tau(tau, out / "kendall_tau.png", plt))
    return written


def _plot_task_mix(files: list[Path], ex_stage: str, png: Path, plt) -> Path:
    """Examples per task type, with each one's share."""
    import polars as pl

    lf = scan_shards(files, {"task_type": pl.String})
    mix = collect_shards(lf, files).get_column("task_type").drop_nulls().value_counts(sort=True)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    names, counts = mix.get_column("task_type").to_list(), mix.get_column("count").to_list()
    bars = ax.barh(names[::-1], counts[::-1], color="#4C72B0")
    total = sum(counts) or 1
    for b, c in zip(bars, counts[::-1], strict=True):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {c} ({100 * c / total:.0f}%)", va="center", fontsize=9)
    ax.set_xlabel("examples")
    ax.set_title(f"task-type mix ({ex_stage}, {total} examples)")
    ax.set_xlim(0, max(counts or [1]) * 1.25)
    fig.tight_layout()
    return _save(fig, png, plt)


def _plot_cos_by_level(neg, ex, levels: list[int], mined: bool, emb: str | None, png: Path, plt) -> Path:
    """cos(q, pos) and cos(q, neg) per level (violin + box, each one's mean), next to MGH Table 4's
    means for an LLM's levels (their embedder: a reference, not a target)."""
    import numpy as np
    import polars as pl

    data = [ex.get_column("cos_pos").to_numpy()] + [neg.filter(pl.col("level") == lv).get_column("cos_neg").to_numpy() for lv in levels]
    labels = ["positive"] + [f"{'band' if mined else 'level'} {lv}" for lv in levels]
    fig, ax = plt.subplots(figsize=(7.2, 4.4))
    pos = np.arange(1, len(data) + 1)
    parts = ax.violinplot(data, positions=pos, showextrema=False, widths=0.8)
    for i, body in enumerate(parts["bodies"]):
        body.set_facecolor("#55A868" if i == 0 else "#4C72B0")
        body.set_alpha(0.35)
    ax.boxplot(data, positions=pos, widths=0.18, showfliers=False, medianprops={"color": "black"})
    means = [float(np.mean(d)) for d in data]
    ax.plot(pos, means, "o-", color="#C44E52", label="mean (this data)", zorder=3)
    from negsynth.stages.score import PAPER_TABLE4

    paper = [] if mined else [(p, PAPER_TABLE4[lv - 1]) for p, lv in zip(pos[1:], levels, strict=True) if lv <= len(PAPER_TABLE4)]
    if paper:
        ax.plot([p for p, _ in paper], [v for _, v in paper], "x--", color="grey", label="MGH Table 4 mean (their embedder)")
    ax.set_xticks(pos, labels)
    ax.set_ylabel("cosine similarity to the query")
    ax.set_title(f"cos(query, ·) by {level_word(mined)} — {len(ex)} examples" + (f", {emb}" if emb else ""), fontsize=10)
    ax.axhline(0, color="lightgrey", lw=0.8, zorder=0)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return _save(fig, png, plt)


def _plot_flags_by_level(neg, levels: list[int], mined: bool, png: Path, plt) -> Path:
    """False-negative and too-easy rate per level, one bar per task type beside all of them."""
    import numpy as np
    import polars as pl

    agg = neg.group_by("task_type", "level").agg(pl.col("false_negative").mean(), pl.col("too_easy").mean())
    overall = neg.group_by("level").agg(pl.col("false_negative").mean(), pl.col("too_easy").mean()).sort("level")
    tts = ["all"] + sorted(agg.get_column("task_type").unique().to_list())
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    width = 0.8 / len(tts)
    x = np.arange(len(levels))
    for col, ax, title in (("false_negative", axes[0], "false-negative rate"), ("too_easy", axes[1], "too-easy rate")):
        for j, tt in enumerate(tts):
            src = overall if tt == "all" else agg.filter(pl.col("task_type") == tt)
            vals = {r["level"]: r[col] for r in src.iter_rows(named=True)}
            ax.bar(
                x + (j - (len(tts) - 1) / 2) * width,
                [100 * vals.get(lv, 0.0) for lv in levels],
                width,
                label=tt,
                color="black" if tt == "all" else None,
                alpha=0.85,
            )
        ax.set_xticks(x, [f"{'band' if mined else 'level'} {lv}" for lv in levels])
        ax.set_ylabel("% of negatives")
        ax.set_title(title)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(tts), fontsize=8, frameon=False)
    fig.suptitle(
        f"flags per {level_word(mined)} (1 = {'the hardest rank band' if mined else 'claimed hardest'}), by task type", fontsize=10
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return _save(fig, png, plt)


def _plot_kendall_tau(tau, png: Path, plt) -> Path:
    """Histogram of the per-example Kendall tau between the LLM's order and the cosines."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    vals, counts = np.unique(np.round(tau, 3), return_counts=True)
    ax.bar(vals, counts, width=0.06, color="#8172B2")
    ax.axvline(float(tau.mean()), color="#C44E52", ls="--", label=f"mean {tau.mean():.3f}")
    ax.set_xlabel("Kendall tau: LLM's order vs measured cosines (1 = identical)")
    ax.set_ylabel("examples")
    ax.set_xlim(-1.1, 1.1)
    ax.legend(fontsize=8)
    ax.set_title("how well the LLM's difficulty order matches the embedder", fontsize=10)
    fig.tight_layout()
    return _save(fig, png, plt)


def _embedder_name(run_dir: Path | None, path: Path, stage: str) -> str | None:
    folder = (run_dir / stage) if run_dir else (path if path.is_dir() else path.parent)
    try:
        return json.loads((folder / "stats.json").read_text(encoding="utf-8")).get("embedder")
    except (OSError, json.JSONDecodeError):
        return None


def _save(fig, p: Path, plt) -> Path:
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
