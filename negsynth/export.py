"""Export a run as folders the Hugging Face ecosystem expects (``negsynth export``).

``OUT/dataset/``: a dataset repo folder — parquet files + ``README.md`` (dataset card with YAML
front matter: configs, licence, composition, what made the data, schedule, score filters).
Configurations, each in a layout ``SentenceTransformerTrainer`` takes with no column
selection: ``triplet`` (anchor, positive, negative), ``ntuple`` (anchor, positive,
negative_1..n: the curriculum's n-tuple rows, or with ``ntuple=n`` one row per scored example)
and ``pair`` (anchor, positive); where the run had a teacher (``corpus.teacher``) ``triplet`` and
``ntuple`` add ``label``, its scores of the positive and each negative (the layout of
``MarginMSELoss`` / ``DistillKLDivLoss``; MNRL ignores it). The default one is the curriculum's
own layout, in training order. ``metadata`` holds the rest of the curriculum's columns row for row; with ``with_shards``
the stage records (``generate``, ``regenerate``, ``score``) too.
``datasets.load_dataset("OUT/dataset", "triplet", split="train")`` reads it offline (a repo
layout: ``load_from_disk`` does not); ``push_to_hub`` / :func:`push` upload it as it is.

``OUT/model/``: a copy of ``RUN_DIR/train/final`` with a model card (base model, data, schedule,
pooling, training settings, and the evaluation table from ``RUN_DIR/evaluate/report.json`` and
``baseline.json`` when present). ``SentenceTransformer(OUT/model)`` loads it; anchors trained
with an instruction prefix give it ``query`` / ``document`` prompts.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from negsynth.errors import UserError

PARQUET = "train-00000-of-00001.parquet"


def _content_named(path: Path) -> str:
    """Rename ``path`` (``…/train-00000-of-00001.parquet``) to carry the first 12 hex digits of its
    content's SHA-256 and return its new name. ``datasets`` caches a local folder under its folder
    name, config and a hash of its card's ``configs`` (the data files' *relative* paths), so two
    exports whose files had the same names were one cache entry: loading the second gave the first
    one's rows, silently. A name that changes with the content makes each export its own entry."""
    import hashlib

    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    named = path.with_name(f"{path.stem}-{digest}{path.suffix}")
    path.rename(named)
    return named.name


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not readable JSON ({e}); rerun the stage that wrote it") from None


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):
        if n < limit:
            return name
    return "10M<n<100M"


def _yaml_front(meta: dict) -> str:
    import yaml

    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=1000) + "---\n"


def _flat_record(rec: dict) -> dict:
    """An Example record for parquet: free-form dicts (attributes, meta) as JSON strings."""
    out = dict(rec)
    for k in ("attributes", "meta"):
        if k in out:
            out[k] = json.dumps(out[k], ensure_ascii=False, sort_keys=True)
    return out


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), str(path))


def _examples_stage(run_dir: Path) -> Path | None:
    for st in ("score", "generate", "regenerate", "corpus"):
        if any((run_dir / st).glob("shard-*.jsonl")):
            return run_dir / st
    return None


def _generators(run_dir: Path) -> dict[str, int]:
    """Generator model -> examples, from the scored (else generated) records."""
    from negsynth.data.shards import read_stage

    folder = _examples_stage(run_dir)
    if folder is None:
        return {}
    c = Counter((r.get("model") or "unknown") for r in read_stage(folder))
    return dict(c.most_common())


def provenance(run_dir: Path) -> dict[str, Any]:
    """What made the examples, read from the records and the stages' stats: the stage (``corpus``:
    queries written for a user's documents, the document the positive; ``regenerate``: a
    dataset's (query, positive) pairs; ``generate``: everything written by the LLM), where the
    negatives came from (``mined`` / ``llm`` / ``mixed``), the LLM(s), the embedder that mined and
    scored, and the corpora or source datasets."""
    from negsynth.data.shards import read_stage

    folder = _examples_stage(run_dir)
    origins: Counter = Counter()
    negatives: Counter = Counter()
    llms: Counter = Counter()
    sources: Counter = Counter()
    miners: Counter = Counter()
    for r in read_stage(folder) if folder is not None else ():
        meta = r.get("meta") or {}
        model = str(r.get("model") or "")
        mined = model.startswith("mined:")
        if "query_model" in meta:  # the corpus stage: the LLM wrote the query for a document
            origins["corpus"] += 1
            llms[meta["query_model"]] += 1
            sources[str(meta.get("corpus") or "?")] += 1
        elif r.get("source") not in (None, "", "synthetic"):
            origins["regenerate"] += 1
            sources[str(r["source"])] += 1
        else:
            origins["generate"] += 1
        kind = "mixed" if meta.get("negative_sources") else "mined" if mined else "llm"
        negatives[kind] += 1
        if mined:
            miners[model.split(":")[1] if model.count(":") >= 1 else model] += 1
        elif model:
            llms[model] += 1
    score = _read_json(run_dir / "score" / "stats.json") or {}
    return {
        "origin": dict(origins.most_common()),
        "negatives": dict(negatives.most_common()),
        "llm_models": dict(llms.most_common()),
        "mining_embedder": dict(miners.most_common()),
        "score_embedder": score.get("embedder"),
        "sources": dict(sources.most_common()),
    }


def describe_provenance(prov: dict[str, Any]) -> str:
    """One paragraph for a card: what wrote the queries and positives, where the negatives came
    from, which models; only what the records say."""
    llm = ", ".join(f"`{m}`" for m in prov.get("llm_models", {})) or "an LLM"
    embedder = ", ".join(f"`{m}`" for m in prov.get("mining_embedder", {})) or (
        f"`{prov['score_embedder']}`" if prov.get("score_embedder") else "a local embedder"
    )
    srcs = ", ".join(f"`{s}`" for s in prov.get("sources", {})) or "?"
    neg = {
        "mined": f"its hard negatives were mined from the same documents with the embedder {embedder} (the hardest candidates below the positive-aware margin)",
        "llm": f"the LLM ({llm}) wrote four hard negatives graded hardest → easiest",
        "mixed": f"its hard negatives are mined ones (embedder {embedder}) and the LLM's ({llm}) that passed the same margin",
    }
    parts = []
    for origin in prov.get("origin", {}) or {"generate": 0}:
        kinds = list(prov.get("negatives", {})) or ["llm"]
        negs = "; ".join(neg[k] for k in kinds)
        if origin == "corpus":
            parts.append(
                f"An LLM ({llm}) wrote a query for each sampled document of the corpus {srcs}; the document is the positive; {negs}."
            )
        elif origin == "regenerate":
            parts.append(f"The (query, positive) pairs come from existing datasets ({srcs}); {negs}.")
        else:
            parts.append(f"An LLM ({llm}) wrote each query and its positive (MGH synthesis); {negs}.")
    if prov.get("score_embedder"):
        parts.append(f"A local embedder (`{prov['score_embedder']}`) measured every example and flagged false negatives.")
    return " ".join(parts)


def _score_filters(run_dir: Path) -> dict[str, Any]:
    st = _read_json(run_dir / "score" / "stats.json") or {}
    keys = ("embedder", "policy", "fn_ratio", "too_easy_floor", "kept", "rejected", "rejects_by_reason", "negatives_dropped", "reordered")
    out = {k: st[k] for k in keys if k in st}
    clean = st.get("clean")
    if isinstance(clean, dict):
        out["clean"] = {k: v for k, v in clean.items() if isinstance(v, (int, float, str, bool)) or v is None}
    return out


def _md_table(title: str, counts: dict) -> list[str]:
    return [f"| {title} | rows |", "|---|---:|", *[f"| {k} | {v} |" for k, v in counts.items()], ""]


# ----------------------------------------------------------------------------- dataset

#: the configurations a trainer reads as they are: text columns only, in training order
TEXT_CONFIGS = ("triplet", "ntuple", "pair")


def _configs_from_curriculum(table) -> dict[str, Any]:
    """The curriculum's rows (a pyarrow table) as text-only configurations and their metadata:
    ``triplet`` (anchor, positive, negative: graded rows as they are, n-tuple rows with their
    hardest negative), ``ntuple`` (anchor, positive, negative_1..K; n-tuple rows only), ``pair``
    (each distinct anchor, positive once, first occurrence first) and ``metadata`` (the other
    columns, row for row beside the default configuration). Rows with a teacher's scores keep
    them as ``label`` beside the texts of ``ntuple`` (``[positive, negative_1..K]``) and
    ``triplet`` (``[positive, negative]``): sentence-transformers' layout for ``MarginMSELoss`` and
    ``DistillKLDivLoss``."""
    import pyarrow as pa

    from negsynth.data.stock import text_columns

    cols = table.column_names
    text = text_columns(cols)
    labelled = "label" in cols
    out: dict[str, Any] = {}
    if "negative" in cols:
        out["triplet"] = table.select(["anchor", "positive", "negative", *(["label"] if labelled else [])])
    else:
        out["ntuple"] = table.select(text + (["label"] if labelled else []))
        out["triplet"] = table.select(["anchor", "positive", "negative_1"]).rename_columns(["anchor", "positive", "negative"])
        if labelled:
            pairs = [lab[:2] for lab in table.column("label").to_pylist()]
            out["triplet"] = out["triplet"].append_column("label", pa.array(pairs, type=pa.list_(pa.float64())))
    seen: set[tuple[str, str]] = set()
    keep = []
    for i, (a, p) in enumerate(zip(table.column("anchor").to_pylist(), table.column("positive").to_pylist())):
        if (a, p) not in seen:
            seen.add((a, p))
            keep.append(i)
    out["pair"] = table.select(["anchor", "positive"]).take(keep)
    out["metadata"] = table.select([c for c in cols if c not in text and c != "label"])
    return out


def export_dataset(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    with_shards: bool = False,
    ntuple: int | None = None,
    license: str = "unknown",
    pretty_name: str | None = None,
    repo_id: str | None = None,
) -> dict:
    """Write ``out_dir`` as a dataset repo folder (module docstring). Returns a summary dict."""
    import pyarrow.parquet as pq

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    cur = run_dir / "curriculum"
    parquet = cur / "train.parquet"
    if not parquet.is_file():
        raise UserError(
            f"{parquet}: no curriculum to export; run `negsynth curriculum -d {run_dir}` first (or export only the model with --only model)"
        )
    card = _read_json(cur / "card.json") or {}
    build = card.get("build", {}) or {}
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=_parent(out_dir)))
    try:
        tables = _configs_from_curriculum(pq.read_table(str(parquet)))
        default = "ntuple" if "ntuple" in tables else "triplet"
        nt_stats = None
        if ntuple:
            import pyarrow as pa

            from negsynth.data.curriculum import DEFAULT_TEMPLATE, CurriculumError
            from negsynth.data.shards import read_stage
            from negsynth.data.stock import ntuple_rows, text_columns

            score = run_dir / "score"
            if not any(score.glob("shard-*.jsonl")):
                raise UserError(f"{score}: no scored examples for --ntuple; run `negsynth score -d {run_dir}` first")
            try:
                rows = ntuple_rows(
                    read_stage(score),
                    ntuple,
                    instruction_template=build.get("instruction_template", DEFAULT_TEMPLATE),
                    use_mined=bool(build.get("use_mined")),
                )
            except CurriculumError as e:
                raise UserError(str(e)) from None
            if not rows:
                raise UserError(
                    f"{score}: no example has {ntuple} negatives (--ntuple {ntuple}); lower --ntuple or use score.policy=annotate"
                )
            t = pa.Table.from_pylist(list(rows))
            text = text_columns(t.column_names) + (["label"] if "label" in t.column_names else [])
            tables["ntuple"] = t.select(text)  # one row per scored example, in score's order (not the curriculum's)
            tables["ntuple_metadata"] = t.select([c for c in t.column_names if c not in text])
            nt_stats = {k: v for k, v in rows.stats.items() if k != "instruction_template"}
        configs: list[dict] = []
        summary: dict[str, Any] = {"dataset": str(out_dir), "configs": {}, "default": default}
        order = [default, *[c for c in TEXT_CONFIGS if c != default], "metadata", "ntuple_metadata"]
        for name in order:
            if name not in tables:
                continue
            (tmp / name).mkdir()
            # without the source file's schema metadata: its "huggingface" features list every
            # column of the curriculum, and datasets would read them back into a text-only config
            pq.write_table(tables[name].replace_schema_metadata(None), str(tmp / name / PARQUET))
            file = _content_named(tmp / name / PARQUET)
            configs.append(
                {
                    "config_name": name,
                    "data_files": [{"split": "train", "path": f"{name}/{file}"}],
                    **({"default": True} if name == default else {}),
                }
            )
            summary["configs"][name] = tables[name].num_rows
        shard_counts = {}
        if with_shards:
            from negsynth.data.shards import read_stage
            from negsynth.stages import METHOD

            for st in (s.name for s in METHOD if s.examples):
                if not any((run_dir / st).glob("shard-*.jsonl")):
                    continue
                recs = [_flat_record(r) for r in read_stage(run_dir / st)]
                if not recs:
                    continue
                _write_parquet(recs, tmp / st / PARQUET)
                file = _content_named(tmp / st / PARQUET)
                configs.append({"config_name": st, "data_files": [{"split": "train", "path": f"{st}/{file}"}]})
                shard_counts[st] = len(recs)
                summary["configs"][st] = len(recs)
        gens = _generators(run_dir)
        prov = provenance(run_dir)
        filters = _score_filters(run_dir)
        n_rows = int(card.get("rows") or 0)
        tags = ["sentence-transformers", "hard-negatives", "negsynth"]
        tags += (["synthetic"] if "generate" in prov["origin"] else []) + (["curriculum"] if default == "triplet" else [])
        meta = {
            "license": license,
            "language": ["en"],
            "pretty_name": pretty_name or f"negsynth training data ({run_dir.name})",
            "size_categories": [_size_category(n_rows)],
            "task_categories": ["sentence-similarity", "feature-extraction"],
            "tags": tags,
            "configs": configs,
            "negsynth": {
                "provenance": prov,
                "generator_models": gens,
                "schedule": build.get("schedule"),
                "levels_by_phase": build.get("levels"),
                "batch_size": build.get("batch_size"),
                "seed": build.get("seed"),
                "homogeneous_batches": build.get("homogeneous_batches"),
                "mined_negatives": build.get("use_mined"),
                "instruction_template": build.get("instruction_template"),
                "composition": {k: card.get(k) for k in ("rows", "batches", "per_phase", "per_level", "per_task_type", "per_source")},
                "score_filters": filters,
                **({"ntuple": nt_stats} if nt_stats else {}),
                **({"shards": shard_counts} if shard_counts else {}),
            },
        }
        (tmp / "README.md").write_text(
            _yaml_front(meta) + _dataset_body(meta, card, summary).replace("REPO_ID", repo_id or "REPO_ID"), encoding="utf-8"
        )
        if (cur / "card.json").is_file():
            shutil.copyfile(cur / "card.json", tmp / "negsynth_card.json")
        _replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


#: each configuration's columns, for the card
CONFIG_COLUMNS = {
    "triplet": "anchor, positive, negative (+ label = the teacher's [positive, negative] scores where the run had a teacher)",
    "ntuple": "anchor, positive, negative_1 … negative_n (hardest first); label = the teacher's scores [positive, negative_1 … negative_n] where the run had a teacher",
    "pair": "anchor, positive",
    "metadata": "level (1 hardest … 4 easiest; 0: every level), phase, batch, task_type, example_id, source — row for row beside the default configuration",
    "ntuple_metadata": "task_type, example_id, source — row for row beside `ntuple`",
}


def _dataset_body(meta: dict, card: dict, summary: dict) -> str:
    ns = meta["negsynth"]
    default = summary["default"]
    f = ns["score_filters"]
    tuple_rows = default == "ntuple"
    lines = [
        f"# {meta['pretty_name']}",
        "",
        "Contrastive training data made by negsynth. "
        + describe_provenance(ns["provenance"])
        + " "
        + (
            "Each row of the default configuration carries its hardest negatives (n-tuple rows, no curriculum order)."
            if tuple_rows
            else "The rows form a curriculum (easiest level first): keep their order."
        ),
        "",
        f"- **Schedule**: `{ns['schedule']}` (levels by phase {ns['levels_by_phase']}), batch size {ns['batch_size']}, seed {ns['seed']}, "
        f"homogeneous batches {ns['homogeneous_batches']}, instruction prefix on the anchors: "
        + (f"`{ns['instruction_template']!r}`" if ns.get("instruction_template") else "none"),
        f"- **Score filters**: embedder `{f.get('embedder', '?')}`, policy `{f.get('policy', '?')}`, false negative when "
        f"cos(q, neg) ≥ {f.get('fn_ratio', '?')} × cos(q, pos); kept {f.get('kept', '?')}, rejected {f.get('rejected', '?')} "
        f"{f.get('rejects_by_reason', '') or ''}",
        f"- **Licence**: `{meta['license']}`. Check the LLM's terms of use and each source's licence "
        f"(sources: {', '.join(map(str, ns['provenance'].get('sources') or (card.get('per_source') or {}))) or '?'}) before publishing.",
        "",
        "## Configurations",
        "",
        "The text configurations hold only the columns a loss embeds, so `SentenceTransformerTrainer` takes them as they are.",
        "",
        "| config | rows | columns |",
        "|---|---:|---|",
    ]
    for c in meta["configs"]:
        name = c["config_name"]
        lines.append(
            f"| `{name}`{' (default)' if c.get('default') else ''} | {summary['configs'].get(name)} | "
            f"{CONFIG_COLUMNS.get(name, 'negsynth Example records (query, positive, negatives, score, …)')} |"
        )
    lines += [
        "",
        "**The default rows are in training order: do not shuffle them.** Load this folder (or the Hub repo) with "
        '`load_dataset(PATH_OR_REPO, CONFIG, split="train")` (a dataset repo layout: `load_from_disk` does not read it). Train with the stock trainer:',
        "",
        "```python",
        "from datasets import load_dataset",
        "from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments",
        "from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss",
        "from negsynth.train.sampler import curriculum_batch_sampler  # pip install negsynth: order-keeping, phase-pure batches",
        "",
        'model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")',
        f'train_ds = load_dataset("REPO_ID", "{default}", split="train")',
        'batches = load_dataset("REPO_ID", "metadata", split="train")["batch"]  # the curriculum\'s batches, short ones included',
        f'args = SentenceTransformerTrainingArguments("out", per_device_train_batch_size={ns["batch_size"]}, batch_sampler=curriculum_batch_sampler(batches))',
        "SentenceTransformerTrainer(model, args, train_dataset=train_ds, loss=MultipleNegativesRankingLoss(model)).train()",
        "```",
        "",
        "## Composition",
        "",
    ]
    for key, title in (("per_phase", "phase"), ("per_level", "level"), ("per_task_type", "task_type"), ("per_source", "source")):
        if card.get(key):
            lines += _md_table(title, card[key])
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- model


def _eval_table(report: dict | None, baseline: dict | None) -> list[str]:
    if not report or not report.get("tasks"):
        return ["No evaluation report in the run (`negsynth evaluate` writes `RUN_DIR/evaluate/report.json`).", ""]
    pct = lambda x: "-" if x is None else f"{100 * x:.2f}"  # noqa: E731
    has_b = bool(baseline and baseline.get("tasks"))
    head = f"| task | category | metric | {'baseline | ' if has_b else ''}this model |{' Δ |' if has_b else ''}"
    lines = [
        f"Offline mini-MTEB (`negsynth evaluate`, suite `{report.get('suite')}`), main score × 100"
        + (f"; baseline `{baseline.get('model') or baseline.get('embedder')}`." if has_b else "."),
        "",
        head,
        "|---|---|---|" + ("---:|" * (3 if has_b else 1)),
    ]
    bt = (baseline or {}).get("tasks", {})
    for name, t in sorted(report["tasks"].items(), key=lambda kv: (kv[1].get("category", ""), kv[0])):
        b = bt.get(name, {}).get("main_score") if has_b else None
        row = f"| {name} | {t.get('category')} | {t.get('main_metric')} | "
        if has_b:
            d = None if b is None else t["main_score"] - b
            row += f"{pct(b)} | {pct(t['main_score'])} | {'-' if d is None else f'{100 * d:+.2f}'} |"
        else:
            row += f"{pct(t['main_score'])} |"
        lines.append(row)
    for cat, v in report.get("categories", {}).items():
        b = (baseline or {}).get("categories", {}).get(cat) if has_b else None
        lines.append(
            f"| **{cat} mean** | {cat} | | "
            + (f"{pct(b)} | {pct(v)} | {'-' if b is None or v is None else f'{100 * (v - b):+.2f}'} |" if has_b else f"{pct(v)} |")
        )
    a, b = report.get("average"), (baseline or {}).get("average") if has_b else None
    lines.append(
        "| **Average** | | | "
        + (f"{pct(b)} | **{pct(a)}** | {'-' if a is None or b is None else f'{100 * (a - b):+.2f}'} |" if has_b else f"**{pct(a)}** |")
    )
    if has_b and baseline.get("suite") != report.get("suite"):
        lines.append(f"\nNote: suites differ ({report.get('suite')} vs {baseline.get('suite')}); deltas are not comparable.")
    return lines + [""]


def export_model(run_dir: str | Path, out_dir: str | Path, *, license: str = "unknown", dataset_repo: str | None = None) -> dict:
    """Copy ``RUN_DIR/train/final`` to ``out_dir`` and write its model card. Returns a summary dict."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    final = run_dir / "train" / "final"
    if not (final / "modules.json").is_file():
        raise UserError(
            f"{final / 'modules.json'}: no trained model to export; run `negsynth train -d {run_dir}` first (or export only the data with --only dataset)"
        )
    log = _read_json(final / "train_log.json") or {}
    cfg = log.get("config", {}) or {}
    hist = log.get("log_history", []) or []
    losses = [e["loss"] for e in hist if "loss" in e]
    base = str(cfg.get("model", "unknown"))
    from negsynth.embed.models import hub_id

    base_id = hub_id(base) or (base if ("/" in base and not Path(base).exists() and base.count("/") == 1) else None)
    modules = json.loads((final / "modules.json").read_text(encoding="utf-8"))
    custom = [m.get("type") for m in modules if "negsynth" in str(m.get("type", ""))]
    card = _read_json(run_dir / "curriculum" / "card.json") or {}
    build = card.get("build", {}) or {}
    report = _read_json(run_dir / "evaluate" / "report.json")
    baseline = _read_json(run_dir / "evaluate" / "baseline.json")
    meta: dict[str, Any] = {
        "library_name": "sentence-transformers",
        "pipeline_tag": "sentence-similarity",
        "tags": ["sentence-transformers", "sentence-similarity", "feature-extraction", "negsynth", "hard-negatives"],
        "license": license,
        "language": ["en"],
    }
    if base_id:
        meta["base_model"] = base_id
    if dataset_repo:
        meta["datasets"] = [dataset_repo]
    rid = dataset_repo or "REPO_ID"
    load = (
        f'SentenceTransformer("{rid}", trust_remote_code=True)  # needs `pip install negsynth`'
        if custom
        else f'SentenceTransformer("{rid}")'
    )
    lora = cfg.get("lora") or {}
    prov = provenance(run_dir)
    prompts = query_prompts(run_dir, build.get("instruction_template"))
    from negsynth.data.curriculum import CurriculumError, parse_schedule

    try:
        tuple_rows = parse_schedule(str(build.get("schedule") or "curriculum"))[1] == [0]
    except CurriculumError:
        tuple_rows = None
    lines = [
        f"# {run_dir.name}: fine-tuned with negsynth",
        "",
        f"A sentence-transformers model fine-tuned from **{base_id or base}** by negsynth"
        + (" on a curriculum (easiest negatives first)." if tuple_rows is False else "."),
        "",
        "Its training data: " + describe_provenance(prov),
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        f"model = {load}",
        *(
            [
                'q = model.encode(["a query"], prompt_name="query")  # the instruction prefix it was trained with',
                'd = model.encode(["a passage"], prompt_name="document")',
            ]
            if prompts
            else ['emb = model.encode(["a query", "a passage"])']
        ),
        "```",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        f"| base model | {base_id or base} |",
        f"| data | {card.get('rows', '?')} rows"
        + (f" ([{dataset_repo}](https://huggingface.co/datasets/{dataset_repo}))" if dataset_repo else "")
        + f", made by `{'`, `'.join(prov['origin']) or '?'}`, LLM {', '.join(prov['llm_models']) or '-'}, negatives {', '.join(prov['negatives']) or '?'} |",
        f"| schedule | `{build.get('schedule', '?')}` (levels by phase {build.get('levels', '?')}), batch size {build.get('batch_size', '?')} |",
        f"| pooling | `{cfg.get('pooling', '?')}`{' (negsynth module: ' + ', '.join(custom) + ')' if custom else ''} |",
        f"| loss | MultipleNegativesRankingLoss (InfoNCE, in-batch + hard negatives), τ = {cfg.get('temperature') or 'auto'} |",
        f"| optimisation | lr {cfg.get('lr', '?')}, batch {cfg.get('batch_size', '?')} × accumulation {cfg.get('grad_accum', '?')}, max_steps {cfg.get('max_steps', '?')}, epochs {cfg.get('epochs', '?')}, max_length {cfg.get('max_length', '?')} |",
        f"| LoRA / bidirectional | {'r ' + str(lora.get('r')) if lora.get('enabled') else 'no'} / {cfg.get('bidirectional', 'none')} |",
        f"| steps, loss first → last | {len(losses)}, " + (f"{losses[0]:.4f} → {losses[-1]:.4f}" if losses else "-") + " |",
        "",
        "## Evaluation",
        "",
        *_eval_table(report, baseline),
    ]
    if custom:
        lines += [
            "The pooling module comes from the `negsynth` package: install it and pass `trust_remote_code=True` to load the model.",
            "",
        ]
    if prompts:
        lines += [
            "Trained with instruction prefixes on the queries, saved as the model's prompts (`config_sentence_transformers.json`): "
            + ", ".join(f"`{k}` = `{v!r}`" for k, v in prompts.items())
            + '. Pass `prompt_name="query"` for queries.',
            "",
        ]
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=_parent(out_dir)))
    try:
        shutil.copytree(final, tmp, dirs_exist_ok=True)
        if prompts:
            _write_prompts(tmp / "config_sentence_transformers.json", prompts)
        (tmp / "README.md").write_text(_yaml_front(meta) + "\n".join(lines) + "\n", encoding="utf-8")
        _replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "model": str(out_dir),
        "base_model": base_id or base,
        "evaluation": bool(report and report.get("tasks")),
        "needs_negsynth": bool(custom),
        "prompts": prompts,
    }


def query_prompts(run_dir: Path, template: str | None) -> dict[str, str]:
    """The instruction prefixes the anchors were trained with, as sentence-transformers prompts:
    ``query`` (the commonest instruction), one more per other instruction (named by the example's
    query style or task type) and an empty ``document`` prompt; ``{}`` when the anchors had none
    (``curriculum.instructions`` off) or the template is not a prefix (text after ``{query}``)."""
    from negsynth.data.shards import read_stage

    if not template or not template.endswith("{query}"):
        return {}
    folder = _examples_stage(run_dir)
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
    cfg = _read_json(path) or {}
    cfg["prompts"] = prompts
    cfg.setdefault("default_prompt_name", None)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- both, push


def _parent(out_dir: Path) -> Path:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return out_dir.parent


def _replace(tmp: Path, out_dir: Path) -> None:
    """Move ``tmp`` into place as ``out_dir`` (an existing folder is replaced)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)


def export_run(
    run_dir: str | Path,
    out: str | Path,
    *,
    only: str | None = None,
    with_shards: bool = False,
    ntuple: int | None = None,
    license: str = "unknown",
    push_repo: str | None = None,
) -> dict:
    """``out/dataset`` and ``out/model`` (``only``: ``dataset`` or ``model``); with ``push_repo`` uploads both."""
    run_dir, out = Path(run_dir), Path(out)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory; pass -d RUN_DIR of a run (e.g. runs/demo)")
    if only not in (None, "dataset", "model"):
        raise UserError(f"--only {only!r}: use 'dataset' or 'model'")
    if push_repo:
        _token()  # fail before writing anything
        if push_repo.count("/") != 1:
            raise UserError(f"--push {push_repo!r}: use USER/NAME (or ORG/NAME)")
    res: dict[str, Any] = {}
    parts = [p for p in ("dataset", "model") if only in (None, p)]
    check_out(out, parts)
    try:
        if "dataset" in parts:
            res["dataset"] = export_dataset(
                run_dir, out / "dataset", with_shards=with_shards, ntuple=ntuple, license=license, repo_id=push_repo
            )
        if "model" in parts:
            res["model"] = export_model(run_dir, out / "model", license=license, dataset_repo=push_repo if only is None else None)
    except OSError as e:
        if e.filename is None or not _under(Path(e.filename), out):
            raise
        raise UserError(f"--out {out}: cannot write {e.filename} ({e.strerror or e}); free some space or choose another --out") from None
    if push_repo:
        res["pushed"] = push(out, push_repo, only=only)
    return res


def _under(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except (ValueError, OSError):
        return False


def check_out(out: Path, parts: list[str]) -> None:
    """``--out`` is (or can be made) a writable folder, and OUT/dataset, OUT/model are not files:
    one line naming --out otherwise, before anything is written."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder; pass a folder (export writes OUT/dataset and OUT/model)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "a parent is a file, not a folder" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror or str(e)
        raise UserError(f"--out {out}: cannot create it ({why}); choose another --out") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: not writable; fix its permissions or choose another --out")
    for p in parts:
        if (out / p).exists() and not (out / p).is_dir():
            raise UserError(f"--out {out}: {out / p} is a file, not a folder; move it away or choose another --out")


def _token() -> str:
    tok = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if not tok:
        raise UserError(
            "--push: no Hugging Face token; set HF_TOKEN to a write token (https://huggingface.co/settings/tokens) or drop --push and upload OUT/ yourself"
        )
    return tok


def push(out: str | Path, repo: str, *, only: str | None = None) -> list[str]:
    """Upload ``out/dataset`` (dataset repo) and ``out/model`` (model repo) as ``repo``."""
    out = Path(out)
    token = _token()
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        raise UserError("--push: HF_HUB_OFFLINE is set; unset it to upload (the folders are written in OUT/)")
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    urls = []
    for kind, folder in (("dataset", out / "dataset"), ("model", out / "model")):
        if only not in (None, kind) or not folder.is_dir():
            continue
        try:
            api.create_repo(repo, repo_type=kind, exist_ok=True)
            api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type=kind, commit_message="negsynth export")
        except Exception as e:  # network, auth, permissions: one line
            raise UserError(
                f"--push {repo} ({kind}): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; check HF_TOKEN's write access and the network"
            ) from None
        urls.append(f"https://huggingface.co/{'datasets/' if kind == 'dataset' else ''}{repo}")
    return urls
