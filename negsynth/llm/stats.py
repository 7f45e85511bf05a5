"""The counters an :class:`~negsynth.llm.client.LLMClient` keeps: what it sent, what the cache
answered, what failed and how, and the outages it waited out. The stages' budget gate reads them
before every request, and each stage's stats.json records :meth:`ClientStats.as_dict`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ClientStats:
    requests: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasks: int = 0
    failed_attempts: Counter = field(default_factory=Counter)  # validation reason -> attempts
    transport_retries: Counter = field(default_factory=Counter)
    transport_failures: Counter = field(default_factory=Counter)
    outage_waits: int = 0  # outages waited out (the server came back within llm.outage_wait)
    outage_wait_s: float = 0.0  # seconds spent waiting for the server
    requeued: int = 0  # items whose retries ran out, sent again (an outage ridden out)

    def as_dict(self) -> dict[str, Any]:
        d = {k: dict(v) if isinstance(v, Counter) else v for k, v in vars(self).items()}
        return {**d, "outage_wait_s": round(self.outage_wait_s, 3)}
