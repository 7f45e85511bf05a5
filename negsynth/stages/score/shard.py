"""What becomes of one input shard's examples once its block is scored: the records it keeps, the
rejects and their reasons, and the measurements that go into its ``_shards/XXXXX.json`` sidecar
(from which ``stats.json`` is rebuilt on a resumed run)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from negsynth.stages.score.measure import reject


@dataclass
class ShardOutcome:
    """One shard's examples sorted into kept records and rejects (``scored`` and ``kept`` hold
    indices into the block's examples)."""

    records: list[dict] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)
    cleaned: Counter = field(default_factory=Counter)  # near duplicates and contamination removed
    by_set: Counter = field(default_factory=Counter)  # contaminated examples per evaluation set
    scored: list[int] = field(default_factory=list)  # examples that stay in the statistics (not cleaned out)
    kept: list[int] = field(default_factory=list)
    dropped: int = 0  # negatives the policy removed
    reordered: int = 0  # examples whose negatives the policy reordered

    @classmethod
    def sort(cls, examples: list[dict], span: range, contam: list, policy: list, dups: dict[int, Any], policy_name: str) -> ShardOutcome:
        """Sort the examples ``span`` of the block, in input order: contaminated -> rejected; a near
        duplicate of an example kept before -> rejected; else what the policy decided (``policy[e]``:
        its ``(record, reject)``). Cleaned examples leave the statistics; the others stay in them."""
        out = cls()
        for e in span:
            row = examples[e]
            if contam[e] is not None:
                set_name, detail = contam[e]
                out.rejects.append(reject(row, "contaminated", detail))
                out.cleaned["contaminated"] += 1
                out.by_set[set_name] += 1
                continue
            rec, rej = policy[e]
            if e in dups:
                d = dups[e]
                out.rejects.append(reject(rec, "near_duplicate", d.detail()))
                out.cleaned["near_duplicate"] += 1
                out.cleaned["near_duplicate_exact"] += int(d.cos_query is None)
                continue
            out.scored.append(e)
            sc = rec if rec is not None else rej["input"]
            out.dropped += len(row["negatives"]) - len(sc["negatives"])
            out.reordered += int(policy_name == "reorder" and sc["score"]["llm_order"] != sorted(sc["score"]["llm_order"]))
            if rec is not None:
                out.records.append(rec)
                out.kept.append(e)
            else:
                out.rejects.append(rej)
        return out

    def sidecar(self, embedder: str, examples: list[dict], per_ex: list[dict], n_examples: int, judged: bool) -> dict:
        """The shard's ``_shards/XXXXX.json``: the measurements of its scored examples in the LLM's
        order (``per_ex``), its counts, and what cleaning removed. ``judged``: a false-negative
        judge ran, so its verdicts are kept too."""
        reasons = Counter(r["reason"] for r in self.rejects)
        ms = [per_ex[e] for e in self.scored]
        return {
            "embedder": embedder,
            "examples": n_examples,
            "task_type": [examples[e]["task_type"] for e in self.scored],
            "cos_pos": [m["cos_pos"] for m in ms],
            "cos_neg": [m["cos_neg"] for m in ms],
            "false_negative": [m["false_negative"] for m in ms],
            "too_easy": [m["too_easy"] for m in ms],
            "kendall_tau": [m["kendall_tau"] for m in ms],
            "monotonic": [m["monotonic"] for m in ms],
            **({"judged_false_negative": [m.get("judged_false_negative") for m in ms]} if judged else {}),
            "kept": len(self.records),
            "rejected": len(self.rejects),
            "reasons": dict(reasons),
            "negatives_dropped": self.dropped,
            "reordered": self.reordered,
            "mined": sum(str(examples[e].get("model") or "").startswith("mined:") for e in self.scored),
            "cleaned": {
                **{k: self.cleaned[k] for k in ("near_duplicate", "near_duplicate_exact", "contaminated")},
                "contaminated_by_set": dict(sorted(self.by_set.items())),
            },
        }
