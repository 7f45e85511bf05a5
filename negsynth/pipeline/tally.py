"""What an LLM stage's estimator fills in (:meth:`Stage.estimate <negsynth.pipeline.stage.Stage.estimate>`):
the requests it would send, counted before any is sent; :mod:`negsynth.estimate` prices them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from negsynth.errors import UserError
from negsynth.llm.prefix_pin import prefix_length

#: tokens a chat format adds per message (OpenAI's rule of thumb: role and separators)
PER_MESSAGE = 4


class TokenCounter:
    """tiktoken for a model it knows, when installed; else characters / 4, labelled as such."""

    def __init__(self, model: str):
        self.enc = None
        self.name = "approx: characters / 4"
        try:
            import tiktoken
        except ImportError:
            return
        try:
            self.enc = tiktoken.encoding_for_model(model)
        except KeyError:
            return
        self.name = f"tiktoken:{self.enc.name}"

    def text(self, s: str) -> int:
        if self.enc is not None:
            return len(self.enc.encode(s, disallowed_special=()))
        return math.ceil(len(s) / 4)

    def messages(self, msgs: list[dict[str, str]]) -> int:
        return sum(self.text(m.get("content") or "") + PER_MESSAGE for m in msgs) + 3


@dataclass
class StageEstimate:
    stage: str
    items: int = 0
    requests: int = 0
    requests_max: int = 0
    prompt_tokens: int = 0
    prompt_tokens_max: int = 0
    completion_tokens: int = 0
    completion_tokens_max: int = 0
    #: of the prompt tokens, those of each request's shared prefix (a pinned server restores them)
    prefix_tokens: int = 0
    prefix_tokens_max: int = 0
    basis: list[str] = field(default_factory=list)
    done: bool = False
    wall_s: float = 0.0
    wall_s_max: float = 0.0
    cost_usd: float = 0.0
    cost_usd_max: float = 0.0

    def add(
        self,
        msgs: list[dict[str, str]],
        answer_tokens: int,
        tc: TokenCounter,
        attempts: int,
        max_tokens: int,
        reask_tokens: int,
        n: int = 1,
    ) -> None:
        """``n`` requests of ``msgs``: first attempts, and the worst case of ``attempts`` tries (each
        re-ask resends the conversation)."""
        p = tc.messages(msgs)
        answer = min(answer_tokens, max_tokens)
        self.requests += n
        self.requests_max += n * attempts
        self.prompt_tokens += n * p
        extra = answer + reask_tokens + 2 * PER_MESSAGE
        self.prompt_tokens_max += n * (attempts * p + extra * attempts * (attempts - 1) // 2)
        self.completion_tokens += n * answer
        self.completion_tokens_max += n * attempts * max_tokens
        k = prefix_length(msgs)
        prefix = tc.messages(msgs[:k]) if k else 0
        self.prefix_tokens += n * prefix
        self.prefix_tokens_max += n * attempts * prefix


class Tally:
    """One stage's estimate in the making: :meth:`request` per request, :meth:`note` for what it rests on."""

    def __init__(
        self,
        est: StageEstimate,
        tc: TokenCounter,
        *,
        attempts: int,
        max_tokens: int,
        reask_tokens: int,
        fallback: int,
    ):
        self.est, self.tc = est, tc
        self.attempts, self.max_tokens, self.reask_tokens = attempts, max_tokens, reask_tokens
        #: expected answer tokens where a request has no worked example (min(llm.max_tokens, 256))
        self.fallback = fallback

    @property
    def stage(self) -> str:
        return self.est.stage

    def request(self, msgs: list[dict[str, str]], *, answer_tokens: int | None = None, n: int = 1, items: int = 1) -> None:
        """``n`` requests of ``msgs`` for ``items`` work items; the answer as long as the worked example's
        unless ``answer_tokens`` says."""
        if answer_tokens is None:  # the worked example's answer: the last assistant turn
            answer_tokens = next((self.tc.text(m["content"]) for m in reversed(msgs) if m["role"] == "assistant"), self.fallback)
        self.est.items += items
        self.est.add(msgs, answer_tokens, self.tc, self.attempts, self.max_tokens, self.reask_tokens, n=n)

    def count(self, items: int) -> None:
        """Work items that send no request of their own (corpus: a document's later queries)."""
        self.est.items += items

    def note(self, line: str) -> None:
        self.est.basis.append(line)

    def no_inputs(self) -> UserError:
        """The one line for a stage with no inputs: the ways ``negsynth estimate`` takes them."""
        stage = self.stage
        flag = "pass --input PATH (the documents), " if stage == "corpus" else ""
        return UserError(
            f'estimate: {stage} has no inputs; {flag}add [[{stage}.inputs]] path = "..." to the run file (-c FILE), '
            f"or pass --set '{stage}.inputs=[{{path=\"docs.jsonl\"}}]'"
        )
