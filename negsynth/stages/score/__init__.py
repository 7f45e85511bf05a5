"""Stage 3 — score: check the LLM's difficulty grading with a local embedder.

MGH's claim is that an LLM can order 4 negatives from hardest (level 1, most similar to the
query) to easiest (level 4). ``score`` measures that claim per example and flags negatives that
are really positives (false negatives) or too unrelated to teach anything (too easy).

In:  finished shards of the stages in ``score.inputs`` (default ``generate``, ``regenerate``;
     absent stages are skipped); config ``[score]`` and ``[embedder]``.
Out: ``RUN_DIR/score/``

* ``shard-XXXXX.jsonl`` — the input :class:`~negsynth.schemas.records.Example` records with
  ``score`` (:class:`~negsynth.schemas.records.ExampleScore`) filled in. Output shards
  **mirror the input shards one to one**, numbered in order over ``score.inputs`` then shard
  name: with generate shards 0..2 and regenerate shards 0..1, ``generate/shard-00001.jsonl``
  becomes ``score/shard-00001.jsonl`` and ``regenerate/shard-00000.jsonl`` becomes
  ``score/shard-00003.jsonl``. The mapping is in ``stats.json["inputs"]``.
* ``rejects/shard-XXXXX.jsonl`` — with ``policy = "filter"``: examples left with fewer than
  ``min_negatives`` negatives, as :class:`~negsynth.schemas.records.Reject` (reason =
  the flags that removed negatives, e.g. ``false_negative``; ``input`` = the scored example).
* ``_shards/XXXXX.json`` — per-shard measurements in the LLM's order (task types, cosines,
  flags, tau), from which ``stats.json`` is rebuilt on a resumed run.
* ``stats.json`` — see :func:`summarize`.

What is measured, per example, with unit vectors from the embedder (each distinct text embedded
once per block of ``block_examples`` examples; queries with the task instruction when
``embedder.instruct_queries``):

* ``cos_pos = cos(q, pos)``, ``cos_neg[i] = cos(q, neg_i)``, rounded to 6 decimals;
* ``kendall_tau``: Kendall's tau-b between the LLM's claimed ranks and the measured cosines
  (1.0 = the LLM's order is exactly the embedder's order, -1.0 = reversed);
* ``monotonic``: the cosines strictly decrease along the LLM's order;
* ``false_negative[i]``: ``cos_neg[i] >= fn_threshold(cos_pos, fn_ratio)`` — NV-Retriever's
  TopK-PercPos (``fn_ratio * cos_pos``; default 0.95);
* ``too_easy[i]``: ``cos_neg[i] < too_easy_floor``.

Policies: ``annotate`` writes the flags only; ``reorder`` sorts each example's negatives by
measured cosine (stable) and stores the LLM ranks in ``score.llm_order``; ``filter`` drops
negatives carrying a flag in ``filter_flags`` and sends an example left with fewer than
``min_negatives`` to ``rejects/``. The per-level statistics always describe the LLM's levels,
before any policy — they are MGH's Table 4 (0.881 > 0.857 > 0.845 > 0.793).

Rerun: a shard whose output exists is skipped; a rerun with a different config or changed
inputs is refused unless ``--overwrite`` (manifest config hash).
"""

from negsynth.stages.score.measure import FLAGS, NAME, PAPER_TABLE4, apply_policy, fn_threshold, kendall_tau_claimed, measure
from negsynth.stages.score.stage import STAGE, run
from negsynth.stages.score.stats import report, summarize

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
    "summarize",
    "report",
]
