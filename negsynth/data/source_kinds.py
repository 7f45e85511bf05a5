"""How each public source is framed for regenerate: its instruction(s), symmetry and task type,
looked up by the source's name (MGH Table 7 = LLM2Vec's E5_EMBEDDING_PROMPTS)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SourceKind:
    """How one public source is framed: its instruction(s), symmetry and task type.

    Symmetric sources (NLI, Quora duplicates) list two instructions that alternate by row
    (row ``i`` uses ``instructions[i % 2]``, as LLM2Vec's E5 loader does) and get the task type
    ``"sts"`` so that curriculum/trainer group them with the other symmetric data.
    """

    instructions: tuple[str, ...]
    symmetric: bool = False
    task_type: str = "short-long"


_WIKI = "Given a question, retrieve Wikipedia passages that answer the question"
INSTRUCTION_TABLE: dict[str, SourceKind] = {
    "nli": SourceKind(
        ("Given a premise, retrieve a hypothesis that is entailed by the premise", "Retrieve semantically similar text"), True, "sts"
    ),
    "quora": SourceKind(
        (
            "Given a question, retrieve questions that are semantically equivalent to the given question",
            "Find questions that have the same meaning as the input question",
        ),
        True,
        "sts",
    ),
    "dureader": SourceKind(("Given a Chinese search query, retrieve web passages that answer the question",)),
    "t2ranking": SourceKind(("Given a Chinese search query, retrieve web passages that answer the question",)),
    "eli5": SourceKind(("Provided a user question, retrieve the highest voted answers on Reddit ELI5 forum",)),
    "fever": SourceKind(("Given a claim, retrieve documents that support or refute the claim",)),
    "hotpotqa": SourceKind(("Given a multi-hop question, retrieve documents that can help answer the question",)),
    "miracl": SourceKind((_WIKI,)),
    "mrtydi": SourceKind((_WIKI,)),
    "nq": SourceKind((_WIKI,)),
    "msmarco_passage": SourceKind(("Given a web search query, retrieve relevant passages that answer the query",)),
    "msmarco_document": SourceKind(("Given a web search query, retrieve relevant documents that answer the query",)),
    "squad": SourceKind(("Retrieve Wikipedia passages that answer the question",)),
    "triviaqa": SourceKind(("Retrieve Wikipedia passages that answer the question",)),
    # not in Table 7: the instruction E5-mistral uses for SciFact in its BEIR evaluation
    "scifact": SourceKind(("Given a scientific claim, retrieve documents that support or refute the claim",)),
}
#: other spellings of the table's keys
ALIASES = {
    "snli": "nli",
    "mnli": "nli",
    "allnli": "nli",
    "multinli": "nli",
    "sick": "nli",
    "quora_duplicates": "quora",
    "qqp": "quora",
    "quora_duplicate_questions": "quora",
    "msmarco": "msmarco_passage",
    "ms_marco": "msmarco_passage",
    "msmarco_doc": "msmarco_document",
    "natural_questions": "nq",
    "naturalquestions": "nq",
    "mr_tydi": "mrtydi",
    "trivia_qa": "triviaqa",
    "hotpot_qa": "hotpotqa",
    "squad_v2": "squad",
}
DEFAULT_KIND = SourceKind(("Given a query, retrieve relevant documents that answer the query",))


def source_key(name: str) -> str:
    k = name.lower().replace("-", "_").replace(" ", "_")
    return ALIASES.get(k, k)


def source_kind(name: str, overrides: dict[str, Any] | None = None, default: SourceKind = DEFAULT_KIND) -> tuple[SourceKind, bool]:
    """The :class:`SourceKind` of a source name and whether it came from the table (else ``default``).

    ``overrides`` (``regenerate.instructions`` in the run file) maps a source name to one
    instruction or a list of instructions that alternate; it wins over the table.
    """
    key = source_key(name)
    base = INSTRUCTION_TABLE.get(key)
    found = base is not None
    base = base or default
    if overrides:
        for k, v in overrides.items():
            if source_key(k) == key:
                ins = (v,) if isinstance(v, str) else tuple(v)
                return SourceKind(ins, base.symmetric, base.task_type), True
    return base, found
