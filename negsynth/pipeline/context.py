"""What a stage runs with: config, run dir, options, reporter, budget."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from negsynth.errors import UserError
from negsynth.pipeline.progress import Reporter
from negsynth.schemas.config import RunConfig


@dataclass
class Budget:
    """Stop a stage cleanly once any limit is reached (in-flight requests still finish)."""

    max_requests: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    scope: ClassVar[str] = "this invocation"
    #: what earlier stages of the same ``negsynth run`` spent: the limits cover the whole run
    spent_requests: int = 0
    spent_tokens: int = 0
    spent_cost: float = 0.0

    def __post_init__(self) -> None:
        for flag, v in (("--max-requests", self.max_requests), ("--max-tokens", self.max_tokens), ("--max-cost", self.max_cost)):
            if v is not None and v < 0:
                raise UserError(f"{flag} {v}: a budget must be >= 0 (omit the flag for no limit)")

    def exceeded(self, requests: int, tokens: int, cost: float) -> str | None:
        requests, tokens, cost = requests + self.spent_requests, tokens + self.spent_tokens, cost + self.spent_cost
        if self.max_requests is not None and requests >= self.max_requests:
            return f"max_requests={self.max_requests}"
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return f"max_tokens={self.max_tokens}"
        if self.max_cost is not None and cost >= self.max_cost:
            return f"max_cost={self.max_cost}"
        return None

    def limits(self) -> dict[str, Any]:
        """Its limits and whose requests count, as the stats record them."""
        return {"max_requests": self.max_requests, "max_tokens": self.max_tokens, "max_cost": self.max_cost, "scope": self.scope}

    def after(self, this_run: dict[str, Any]) -> Budget:
        """This budget with what a finished stage spent (its stats' ``this_run``) counted as spent."""
        return replace(
            self,
            spent_requests=self.spent_requests + int(this_run.get("requests", 0)),
            spent_tokens=self.spent_tokens + int(this_run.get("prompt_tokens", 0)) + int(this_run.get("completion_tokens", 0)),
            spent_cost=self.spent_cost + float(this_run.get("cost_usd", 0.0)),
        )


@dataclass
class SharedBudget(Budget):
    """One budget for the ranks of ``--executor ray``: the counts live in one Ray actor
    (``ledger``, a :class:`~negsynth.pipeline.ray_executor.BudgetLedger`) that runs its calls one
    at a time, so the ranks together never overshoot a limit. :meth:`exceeded` is the ledger's
    last verdict."""

    scope: ClassVar[str] = "this invocation, shared by every Ray worker"
    ledger: Any = None
    stopped: str | None = field(default=None, init=False)

    def exceeded(self, requests: int, tokens: int, cost: float) -> str | None:
        return self.stopped

    async def reserve(self) -> str | None:
        """Count one request about to be sent, or the reason not to send it (a limit is reached)."""
        if self.stopped is None:
            self.stopped = await self.ledger.reserve.remote()
        return self.stopped

    def unreserve(self) -> None:
        self.ledger.unreserve.remote()

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        # one process's calls run on the actor in order: this worker's next reserve sees these tokens
        self.ledger.add.remote(prompt_tokens, completion_tokens)


@dataclass(frozen=True)
class StageContext:
    """What a stage runs with. Immutable: the runner makes a changed copy (``dataclasses.replace``)."""

    cfg: RunConfig
    run_dir: Path
    reporter: Reporter = field(default_factory=Reporter)
    budget: Budget = field(default_factory=Budget)
    overwrite: bool = False
    #: ``--verify``: hash every finished output before reusing it, not only its size
    verify: bool = False
    mode: str = "online"  # or "batch" (OpenAI Batch API)
    base_url: str | None = None  # resolved endpoint (the embedded server's URL when base_url = "embedded")
    #: this worker's rank and how many split the stage (locally 0 of 1)
    rank: int = 0
    world_size: int = 1
    #: RPM / TPM shared by Ray's ranks (a :class:`~negsynth.llm.ratelimit.RateLedger` actor), or None
    rate_ledger: Any = None
    #: a caller's own ``[embedder]`` and ``score.judge_model``, used instead of loading them
    embedder: Any = None
    judge: Any = None
    #: ``--executor ray``'s embedding workers (:class:`~negsynth.pipeline.ray_embed.RayEmbedding`); None: here
    embedding: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        if self.mode not in ("online", "batch"):
            raise UserError(f"--mode {self.mode!r}: choose 'online' (live requests) or 'batch' (OpenAI Batch API)")

    def load_embedder(self) -> Any:
        """The ``[embedder]`` a stage embeds with: the one the caller holds, Ray's, or loaded here."""
        if self.embedder is not None:
            return self.embedder
        if self.embedding is not None:
            return self.embedding.embedder(self.cfg.embedder)
        from negsynth.embed import load_embedder

        return load_embedder(self.cfg.embedder)

    def load_mining_model(self) -> Any:
        """The ``SentenceTransformer`` a stage mines with (``[embedder]``): Ray's, or loaded here."""
        if self.embedding is not None:
            return self.embedding.mining_model(self.cfg.embedder)
        from negsynth.embed.mining import load_mining_model

        return load_mining_model(self.cfg.embedder)
