"""What a stage needs to run, independent of the CLI: config, run dir, options, reporter."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from negsynth.pipeline.progress import Reporter
from negsynth.schemas.config import RunConfig


@dataclass
class Budget:
    """Stop a stage cleanly once any limit is reached (in-flight requests still finish)."""

    max_requests: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None

    def __post_init__(self) -> None:
        for flag, v in (("--max-requests", self.max_requests), ("--max-tokens", self.max_tokens), ("--max-cost", self.max_cost)):
            if v is not None and v < 0:
                from negsynth.errors import UserError

                raise UserError(f"{flag} {v}: a budget must be >= 0 (omit the flag for no limit)")

    def exceeded(self, requests: int, tokens: int, cost: float) -> str | None:
        if self.max_requests is not None and requests >= self.max_requests:
            return f"max_requests={self.max_requests}"
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return f"max_tokens={self.max_tokens}"
        if self.max_cost is not None and cost >= self.max_cost:
            return f"max_cost={self.max_cost}"
        return None


@dataclass
class StageContext:
    cfg: RunConfig
    run_dir: Path
    overwrite: bool = False
    shard_index: int = 0
    num_shards: int = 1
    budget: Budget = field(default_factory=Budget)
    reporter: Reporter = field(default_factory=Reporter)
    mode: str = "online"  # or "batch" (OpenAI Batch API)
    # $NEGSYNTH_BATCH_POLL_S overrides llm.batch_poll_s (tests poll a fake server every 10 ms)
    batch_poll_s: float | None = field(
        default_factory=lambda: float(os.environ["NEGSYNTH_BATCH_POLL_S"]) if os.environ.get("NEGSYNTH_BATCH_POLL_S") else None
    )
    base_url: str | None = None  # resolved endpoint (the embedded server's URL when base_url = "embedded")
    #: stage -> the folder its outputs are written to instead of RUN_DIR/<stage> (an --overwrite
    #: builds the new outputs beside the old ones and swaps them in when the stage finishes)
    outputs: dict[str, Path] = field(default_factory=dict)
    #: what the stage's outputs are made from: its ``fingerprint(ctx)``, computed once by
    #: ``run_stage`` before the loop (an LLM stage's manifest entry is made from it)
    made_from: str | dict[str, Any] | None = None
    #: objects a Python caller already holds, used instead of loading what the config names
    #: (score: an :class:`~negsynth.embed.base.Embedder` for ``[embedder]``, a false-negative
    #: judge for ``score.judge_model``; tests pass fakes)
    embedder: Any = None
    judge: Any = None
    #: how a stage that needs ``[embedder]`` (and holds none in ``embedder``) makes it:
    #: ``EmbedderConfig -> Embedder``; None = loaded in this process. ``--executor ray`` sets a
    #: proxy whose encoding runs on Ray workers (:func:`negsynth.pipeline.ray_executor.ray_embedding`)
    embedder_factory: Any = None
    #: no data to read is an error (exit 2) instead of a skipped stage (the ``evaluate`` command;
    #: ``negsynth run`` ends its pipeline with one line instead)
    require_data: bool = False

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        if self.mode not in ("online", "batch"):
            from negsynth.errors import UserError

            raise UserError(f"--mode {self.mode!r}: choose 'online' (live requests) or 'batch' (OpenAI Batch API)")
        if self.num_shards < 1:
            from negsynth.errors import UserError

            raise UserError(f"--num-shards {self.num_shards}: must be >= 1 (the number of workers splitting the run)")
        if not (0 <= self.shard_index < self.num_shards):
            from negsynth.errors import UserError

            raise UserError(f"--shard-index {self.shard_index} must be in [0, --num-shards {self.num_shards})")

    def stage_dir(self, stage: str) -> Path:
        return self.outputs.get(stage) or self.run_dir / stage
