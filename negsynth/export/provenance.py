"""What made a run's examples, read from its records and stats: for the dataset and model cards."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from negsynth.export.common import examples_stage, read_json, records_by_stage


def provenance(run_dir: Path) -> dict[str, Any]:
    """What made the examples, read from the records and score's stats: examples per stage that
    made them (``origin``), per kind of negatives (``mined`` / ``llm`` / ``mixed``), per LLM, mining
    embedder, source and record ``model`` (``generator_models``), and the scoring embedder."""
    folder = examples_stage(run_dir)
    origins, negatives, llms, sources, miners, generators = (Counter() for _ in range(6))
    for stage, r in records_by_stage(folder) if folder is not None else ():
        meta = r.get("meta") or {}
        model = str(r.get("model") or "")
        generators[model or "unknown"] += 1
        mined = model.startswith("mined:")
        origins[stage] += 1
        if "query_model" in meta:  # the LLM wrote the query for a document (corpus)
            llms[meta["query_model"]] += 1
            sources[str(meta.get("corpus") or "?")] += 1
        elif r.get("source") not in (None, "", "synthetic"):  # a dataset's pair (regenerate)
            sources[str(r["source"])] += 1
        kind = "mixed" if meta.get("negative_sources") else "mined" if mined else "llm"
        negatives[kind] += 1
        if mined:
            miners[model.split(":")[1] if model.count(":") >= 1 else model] += 1
        elif model:
            llms[model] += 1
    score = read_json(run_dir / "score" / "stats.json") or {}
    return {
        "origin": dict(origins.most_common()),
        "negatives": dict(negatives.most_common()),
        "llm_models": dict(llms.most_common()),
        "mining_embedder": dict(miners.most_common()),
        "score_embedder": score.get("embedder"),
        "sources": dict(sources.most_common()),
        "generator_models": dict(generators.most_common()),
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
        elif origin == "generate":
            parts.append(f"An LLM ({llm}) wrote each query and its positive (MGH synthesis); {negs}.")
        else:
            parts.append(f"The stage `{origin}` made its examples; {negs}.")
    if prov.get("score_embedder"):
        parts.append(f"A local embedder (`{prov['score_embedder']}`) measured every example and flagged false negatives.")
    return " ".join(parts)
