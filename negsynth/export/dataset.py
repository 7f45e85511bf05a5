"""``OUT/dataset/``: the run's curriculum as a Hugging Face dataset repo folder — a parquet file per
configuration and a dataset card (``README.md``); see :mod:`negsynth.export`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from negsynth.errors import UserError
from negsynth.export.common import PARQUET, content_named, read_json, staged_folder, yaml_front
from negsynth.export.provenance import describe_provenance, provenance


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):
        if n < limit:
            return name
    return "10M<n<100M"


def _flat_record(rec: dict) -> dict:
    """An Example record for parquet: free-form dicts (attributes, meta) as JSON strings."""
    out = dict(rec)
    for k in ("attributes", "meta"):
        if k in out:
            out[k] = json.dumps(out[k], ensure_ascii=False, sort_keys=True)
    return out


def _score_filters(run_dir: Path) -> dict[str, Any]:
    st = read_json(run_dir / "score" / "stats.json") or {}
    keys = ("embedder", "policy", "fn_ratio", "too_easy_floor", "kept", "rejected", "rejects_by_reason", "negatives_dropped", "reordered")
    out = {k: st[k] for k in keys if k in st}
    clean = st.get("clean")
    if isinstance(clean, dict):
        out["clean"] = {k: v for k, v in clean.items() if isinstance(v, (int, float, str, bool)) or v is None}
    return out


# ----------------------------------------------------------------------------- dataset

#: the configurations a trainer reads as they are: text columns only, in training order
TEXT_CONFIGS = ("triplet", "ntuple", "pair")


def _configs_from_curriculum(table) -> dict[str, Any]:
    """The curriculum's rows (a pyarrow table) as the tables ``triplet`` (n-tuple rows with their
    hardest negative), ``ntuple`` (n-tuple rows only), ``pair`` (each distinct pair once, first
    occurrence first) and ``metadata``; a teacher's ``label`` is cut to ``[positive, negative]``
    for ``triplet`` (layouts: docs/train.md)."""
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
    card = read_json(cur / "card.json") or {}
    build = card.get("build", {}) or {}
    with staged_folder(out_dir) as tmp:
        tables = _configs_from_curriculum(pq.read_table(str(parquet)))
        default = "ntuple" if "ntuple" in tables else "triplet"
        nt_stats = None
        if ntuple:
            nt_tables, nt_stats = _scored_ntuple_tables(run_dir, build, ntuple)
            tables.update(nt_tables)
        summary: dict[str, Any] = {"dataset": str(out_dir), "configs": {}, "default": default}
        configs = _write_configs(tmp, tables, default, summary["configs"])
        shard_counts = _write_stage_configs(run_dir, tmp, configs, summary["configs"]) if with_shards else {}
        meta = _card_meta(run_dir, card, configs, default, license=license, nt_stats=nt_stats, shard_counts=shard_counts)
        (tmp / "README.md").write_text(
            yaml_front(meta) + _dataset_body(meta, card, summary).replace("REPO_ID", repo_id or "REPO_ID"), encoding="utf-8"
        )
        if (cur / "card.json").is_file():
            shutil.copyfile(cur / "card.json", tmp / "negsynth_card.json")
    return summary


def _scored_ntuple_tables(run_dir: Path, build: dict, ntuple: int) -> tuple[dict[str, Any], dict]:
    """``--ntuple n``: one row per scored example with its ``n`` hardest negatives, read from
    ``RUN_DIR/score`` (in score's order, not the curriculum's) with the curriculum's instruction
    template, as the ``ntuple`` and ``ntuple_metadata`` tables, and the rows' stats for the card."""
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
        raise UserError(f"{score}: no example has {ntuple} negatives (--ntuple {ntuple}); lower --ntuple or use score.policy=annotate")
    t = pa.Table.from_pylist(list(rows))
    text = text_columns(t.column_names) + (["label"] if "label" in t.column_names else [])
    tables = {"ntuple": t.select(text), "ntuple_metadata": t.select([c for c in t.column_names if c not in text])}
    return tables, {k: v for k, v in rows.stats.items() if k != "instruction_template"}


def _write_configs(tmp: Path, tables: dict[str, Any], default: str, counts: dict[str, int]) -> list[dict]:
    """Write each table (:func:`_write_config`), the default configuration first, and return the
    card's ``configs`` entries; ``counts`` gets each one's rows."""
    configs: list[dict] = []
    order = [default, *[c for c in TEXT_CONFIGS if c != default], "metadata", "ntuple_metadata"]
    for name in order:
        if name not in tables:
            continue
        # without the source file's schema metadata: its "huggingface" features list every
        # column of the curriculum, and datasets would read them back into a text-only config
        configs.append(_write_config(tmp, name, tables[name].replace_schema_metadata(None)))
        if name == default:
            configs[-1]["default"] = True
        counts[name] = tables[name].num_rows
    return configs


def _write_config(tmp: Path, name: str, table) -> dict:
    """Write ``table`` as ``tmp/NAME/`` (one content-named parquet file); its card ``configs`` entry."""
    import pyarrow.parquet as pq

    (tmp / name).mkdir()
    pq.write_table(table, str(tmp / name / PARQUET))
    file = content_named(tmp / name / PARQUET)
    return {"config_name": name, "data_files": [{"split": "train", "path": f"{name}/{file}"}]}


def _write_stage_configs(run_dir: Path, tmp: Path, configs: list[dict], counts: dict[str, int]) -> dict[str, int]:
    """``--with-shards``: each stage's Example records (``generate``, ``regenerate``, ``score``) as
    one more configuration, appended to ``configs``; returns records per stage (``counts`` too)."""
    import pyarrow as pa

    from negsynth.data.shards import read_stage
    from negsynth.schemas.records import Example
    from negsynth.stages import METHOD

    shard_counts = {}
    for st in (s.name for s in METHOD if s.records is Example):
        if not any((run_dir / st).glob("shard-*.jsonl")):
            continue
        recs = [_flat_record(r) for r in read_stage(run_dir / st)]
        if not recs:
            continue
        configs.append(_write_config(tmp, st, pa.Table.from_pylist(recs)))
        shard_counts[st] = len(recs)
        counts[st] = len(recs)
    return shard_counts


def _card_meta(
    run_dir: Path,
    card: dict,
    configs: list[dict],
    default: str,
    *,
    license: str,
    nt_stats: dict | None,
    shard_counts: dict[str, int],
) -> dict[str, Any]:
    """The dataset card's front matter: what the Hub reads (licence, size, tags, configs) and,
    under ``negsynth``, how the data was made (provenance, schedule, composition, score filters)."""
    build = card.get("build", {}) or {}
    prov = provenance(run_dir)
    filters = _score_filters(run_dir)
    n_rows = int(card.get("rows") or 0)
    tags = ["sentence-transformers", "hard-negatives", "negsynth"]
    tags += (["synthetic"] if "generate" in prov["origin"] else []) + (["curriculum"] if default == "triplet" else [])
    return {
        "license": license,
        "language": ["en"],
        "pretty_name": f"negsynth training data ({run_dir.name})",
        "size_categories": [_size_category(n_rows)],
        "task_categories": ["sentence-similarity", "feature-extraction"],
        "tags": tags,
        "configs": configs,
        "negsynth": {
            "provenance": prov,
            "generator_models": prov["generator_models"],
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
            lines += [f"| {title} | rows |", "|---|---:|", *[f"| {k} | {v} |" for k, v in card[key].items()], ""]
    return "\n".join(lines) + "\n"
