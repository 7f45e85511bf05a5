"""``OUT/model/``: a copy of ``RUN_DIR/train/final`` with a model card; see :mod:`negsynth.export`."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from negsynth.errors import UserError
from negsynth.export.common import examples_stage, read_json, staged_folder, yaml_front
from negsynth.export.provenance import describe_provenance, provenance


def _eval_table(report: dict | None, baseline: dict | None) -> list[str]:
    """The evaluation report as the terminal's table (:func:`negsynth.evaluate.runner.table_rows`) in Markdown."""
    from negsynth.evaluate.runner import report_notes, table_rows

    if not report or not report.get("tasks"):
        return ["No evaluation report in the run (`negsynth evaluate` writes `RUN_DIR/evaluate/report.json`).", ""]
    baseline = baseline if baseline and baseline.get("tasks") else None
    _, header, rows = table_rows(report, baseline)
    lines = [
        f"Offline mini-MTEB (`negsynth evaluate`, suite `{report.get('suite')}`), main score × 100"
        + (f"; baseline `{baseline.get('model') or baseline.get('embedder')}`." if baseline else "."),
        "",
        "| " + " | ".join(header) + " |",
        "|---|---|---|" + "---:|" * (len(header) - 3),
    ]
    lines += ["| " + " | ".join(re.sub(r"\[/?(bold|green|red|white)\]", "", c) for c in row) + " |" for row in rows if row]
    return [*lines, "", *report_notes(report, baseline), ""]


def _verdict_lines(v: dict | None) -> list[str]:
    """The verdict on the team's own documents (``RUN_DIR/evaluate/verdict.json``): its line and,
    where there is one, base and tuned model per metric."""
    if not v:
        return []
    lines = [
        "On the training corpus's own documents, held out (never trained on), one query each written by the LLM:",
        "",
        f"**{v['line']}**",
        "",
    ]
    own = v.get("own_corpus")
    if own:
        lines += ["| metric | base | this model | Δ (95 % CI) |", "|---|---:|---:|---:|"]
        for name, m in own["metrics"].items():
            lines.append(
                f"| {name} | {m['base']:.2f} | {m['tuned']:.2f} | {m['mean_diff']:+.2f} ({m['ci_low']:+.2f} … {m['ci_high']:+.2f}) |"
            )
        lines += ["", f"Rule: {v['rule']}.", ""]
    return lines


@dataclass(frozen=True)
class _TrainedModel:
    """What the model card says about a run's trained model, read once from the run dir."""

    run_dir: Path
    base: str  # the base model's Hub id where it has one, else its name or path
    base_id: str | None
    cfg: dict  # the training settings (train_log.json's config)
    losses: list[float]
    custom: list[str]  # negsynth's own modules in modules.json: loading needs the package
    card: dict  # the curriculum's card
    report: dict | None
    baseline: dict | None
    verdict: dict | None  # the verdict on the held-out documents of the training corpus
    prov: dict[str, Any]
    prompts: dict[str, str]
    tuple_rows: bool | None  # trained on n-tuple rows (no curriculum order); None: schedule unreadable
    dataset_repo: str | None

    @property
    def build(self) -> dict:
        return self.card.get("build", {}) or {}


def export_model(run_dir: str | Path, out_dir: str | Path, *, license: str = "unknown", dataset_repo: str | None = None) -> dict:
    """Copy ``RUN_DIR/train/final`` to ``out_dir`` and write its model card. Returns a summary dict."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    final = run_dir / "train" / "final"
    if not (final / "modules.json").is_file():
        raise UserError(
            f"{final / 'modules.json'}: no trained model to export; run `negsynth train -d {run_dir}` first (or export only the data with --only dataset)"
        )
    model = _read_trained_model(run_dir, final, dataset_repo)
    meta: dict[str, Any] = {
        "library_name": "sentence-transformers",
        "pipeline_tag": "sentence-similarity",
        "tags": ["sentence-transformers", "sentence-similarity", "feature-extraction", "negsynth", "hard-negatives"],
        "license": license,
        "language": ["en"],
    }
    if model.base_id:
        meta["base_model"] = model.base_id
    if dataset_repo:
        meta["datasets"] = [dataset_repo]
    lines = _model_card_lines(model)
    with staged_folder(out_dir) as tmp:
        shutil.copytree(final, tmp, dirs_exist_ok=True)
        if model.prompts:
            _write_prompts(tmp / "config_sentence_transformers.json", model.prompts)
        (tmp / "README.md").write_text(yaml_front(meta) + "\n".join(lines) + "\n", encoding="utf-8")
    return {
        "model": str(out_dir),
        "base_model": model.base,
        "evaluation": bool(model.report and model.report.get("tasks")),
        "verdict": (model.verdict or {}).get("line"),
        "needs_negsynth": bool(model.custom),
        "prompts": model.prompts,
    }


def _read_trained_model(run_dir: Path, final: Path, dataset_repo: str | None) -> _TrainedModel:
    """The training log, the saved modules, the curriculum's card, the evaluation reports and the
    records' provenance of ``run_dir`` (``final``: its trained model folder)."""
    from negsynth.data.curriculum import CurriculumError, parse_schedule
    from negsynth.embed.models import hub_id

    log = read_json(final / "train_log.json") or {}
    cfg = log.get("config", {}) or {}
    hist = log.get("log_history", []) or []
    base = str(cfg.get("model", "unknown"))
    # a Hub id by its registry entry, else a name that looks like one (USER/NAME, not a local path)
    base_id = hub_id(base) or (base if ("/" in base and not Path(base).exists() and base.count("/") == 1) else None)
    modules = json.loads((final / "modules.json").read_text(encoding="utf-8"))
    card = read_json(run_dir / "curriculum" / "card.json") or {}
    build = card.get("build", {}) or {}
    report = read_json(run_dir / "evaluate" / "report.json")
    baseline = read_json(run_dir / "evaluate" / "baseline.json")
    prov = provenance(run_dir)
    prompts = query_prompts(run_dir, build.get("instruction_template"))
    try:
        tuple_rows = parse_schedule(str(build.get("schedule") or "curriculum"))[1] == [0]
    except CurriculumError:
        tuple_rows = None
    return _TrainedModel(
        run_dir=run_dir,
        base=base_id or base,
        base_id=base_id,
        cfg=cfg,
        losses=[e["loss"] for e in hist if "loss" in e],
        custom=[m.get("type") for m in modules if "negsynth" in str(m.get("type", ""))],
        card=card,
        report=report,
        baseline=baseline,
        verdict=read_json(run_dir / "evaluate" / "verdict.json"),
        prov=prov,
        prompts=prompts,
        tuple_rows=tuple_rows,
        dataset_repo=dataset_repo,
    )


def _model_card_lines(m: _TrainedModel) -> list[str]:
    """The model card's Markdown, line by line: what the model is, how to load it, how it was
    trained and evaluated, and what loading it needs (the negsynth package, the query prompt)."""
    lines = [
        f"# {m.run_dir.name}: fine-tuned with negsynth",
        "",
        f"A sentence-transformers model fine-tuned from **{m.base}** by negsynth"
        + (" on a curriculum (easiest negatives first)." if m.tuple_rows is False else "."),
        "",
        "Its training data: " + describe_provenance(m.prov),
        "",
        *_usage_lines(m),
        "",
        "## Training",
        "",
        *_training_table(m),
        "",
        "## Evaluation",
        "",
        *_verdict_lines(m.verdict),
        *_eval_table(m.report, m.baseline),
    ]
    if m.custom:
        lines += [
            "The pooling module comes from the `negsynth` package: install it and pass `trust_remote_code=True` to load the model.",
            "",
        ]
    if m.prompts:
        lines += [
            "Trained with instruction prefixes on the queries, saved as the model's prompts (`config_sentence_transformers.json`): "
            + ", ".join(f"`{k}` = `{v!r}`" for k, v in m.prompts.items())
            + '. Pass `prompt_name="query"` for queries.',
            "",
        ]
    return lines


def _usage_lines(m: _TrainedModel) -> list[str]:
    """A Python block that loads the model (from the Hub repo once pushed) and encodes with it."""
    rid = m.dataset_repo or "REPO_ID"
    load = (
        f'SentenceTransformer("{rid}", trust_remote_code=True)  # needs `pip install negsynth`'
        if m.custom
        else f'SentenceTransformer("{rid}")'
    )
    return [
        "```python",
        "from sentence_transformers import SentenceTransformer",
        f"model = {load}",
        *(
            [
                'q = model.encode(["a query"], prompt_name="query")  # the instruction prefix it was trained with',
                'd = model.encode(["a passage"], prompt_name="document")',
            ]
            if m.prompts
            else ['emb = model.encode(["a query", "a passage"])']
        ),
        "```",
    ]


def _training_table(m: _TrainedModel) -> list[str]:
    """The card's training table: base model, data, schedule, pooling, loss and settings."""
    cfg, build, prov, losses = m.cfg, m.build, m.prov, m.losses
    lora = cfg.get("lora") or {}
    custom = m.custom
    return [
        "| | |",
        "|---|---|",
        f"| base model | {m.base} |",
        f"| data | {m.card.get('rows', '?')} rows"
        + (f" ([{m.dataset_repo}](https://huggingface.co/datasets/{m.dataset_repo}))" if m.dataset_repo else "")
        + f", made by `{'`, `'.join(prov['origin']) or '?'}`, LLM {', '.join(prov['llm_models']) or '-'}, negatives {', '.join(prov['negatives']) or '?'} |",
        f"| schedule | `{build.get('schedule', '?')}` (levels by phase {build.get('levels', '?')}), batch size {build.get('batch_size', '?')} |",
        f"| pooling | `{cfg.get('pooling', '?')}`{' (negsynth module: ' + ', '.join(custom) + ')' if custom else ''} |",
        f"| loss | MultipleNegativesRankingLoss (InfoNCE, in-batch + hard negatives), τ = {cfg.get('temperature') or 'auto'} |",
        f"| optimisation | lr {cfg.get('lr', '?')}, batch {cfg.get('batch_size', '?')} × accumulation {cfg.get('grad_accum', '?')}, max_steps {cfg.get('max_steps', '?')}, epochs {cfg.get('epochs', '?')}, max_length {cfg.get('max_length', '?')} |",
        f"| LoRA / bidirectional | {'r ' + str(lora.get('r')) if lora.get('enabled') else 'no'} / {cfg.get('bidirectional', 'none')} |",
        f"| steps, loss first → last | {len(losses)}, " + (f"{losses[0]:.4f} → {losses[-1]:.4f}" if losses else "-") + " |",
    ]


def query_prompts(run_dir: Path, template: str | None) -> dict[str, str]:
    """The instruction prefixes the anchors were trained with, as sentence-transformers prompts:
    ``query`` (the commonest instruction), one more per other instruction (named by the example's
    query style or task type) and an empty ``document`` prompt; ``{}`` when the anchors had none
    (``curriculum.instructions`` off) or the template is not a prefix (text after ``{query}``)."""
    from negsynth.data.shards import read_stage

    if not template or not template.endswith("{query}"):
        return {}
    folder = examples_stage(run_dir)
    by_prefix: Counter = Counter()
    names: dict[str, str] = {}
    for r in read_stage(folder) if folder is not None else ():
        task = str(r.get("task") or "").strip()
        if not task:
            continue
        prefix = template.format(instruction=task, query="")
        by_prefix[prefix] += 1
        names.setdefault(prefix, str((r.get("attributes") or {}).get("style") or r.get("task_type") or ""))
    if not by_prefix:
        return {}
    ordered = [p for p, _ in by_prefix.most_common()]
    prompts = {"query": ordered[0]}
    for i, prefix in enumerate(ordered[1:], start=2):
        name = f"query_{names[prefix]}" if names[prefix] and f"query_{names[prefix]}" not in prompts else f"query_{i}"
        prompts[name] = prefix
    prompts["document"] = ""
    return prompts


def _write_prompts(path: Path, prompts: dict[str, str]) -> None:
    """Set ``prompts`` in a sentence-transformers config (kept: its other keys)."""
    cfg = read_json(path) or {}
    cfg["prompts"] = prompts
    cfg.setdefault("default_prompt_name", None)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
