"""Stage 3 — score: check the LLM's difficulty grading with a local embedder (docs/score.md).

MGH's claim is that an LLM can order 4 negatives from hardest (level 1, most similar to the
query) to easiest (level 4). ``score`` measures that claim per example (cosines of query and
positive / negatives, Kendall's tau against the claimed order) and flags negatives that are really
positives (``false_negative``: ``cos_neg >= fn_ratio * cos_pos``, NV-Retriever's TopK-PercPos) or
too unrelated to teach anything (``too_easy``); then its policy annotates, reorders or filters,
and its cleaning drops near-duplicates and evaluation-set overlap.

In: the finished shards of every stage that makes examples (``score.inputs``). Out:
``RUN_DIR/score/shard-XXXXX.jsonl``, one per input shard, in order (the mapping is in
``stats.json["inputs"]``), ``rejects/``, ``_shards/`` (per-shard measurements, from which a resumed
run rebuilds its stats) and ``stats.json`` (:func:`~negsynth.stages.score.stats.level_stats`).
"""

from negsynth.stages.score.measure import FLAGS, NAME, PAPER_TABLE4, apply_policy, fn_threshold, kendall_tau_claimed, measure
from negsynth.stages.score.stage import STAGE, run
from negsynth.stages.score.stats import report

__all__ = [
    "FLAGS",
    "NAME",
    "PAPER_TABLE4",
    "STAGE",
    "apply_policy",
    "fn_threshold",
    "kendall_tau_claimed",
    "measure",
    "run",
    "report",
]
