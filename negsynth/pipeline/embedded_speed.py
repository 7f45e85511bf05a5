"""How fast the embedded LLM is on this machine, for ``negsynth estimate``'s wall time: seconds per
prompt and per completion token *as the estimate counts them*, measured on the servers a run would
start (:func:`measure_embedded`).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the long prompt: plain prose, long enough that its processing dominates its request
_PROSE = (
    "The committee reviewed the proposal for the new river crossing. Engineers described the soil "
    "under the eastern bank, the tides that reach the site twice a day and the traffic the bridge "
    "would carry in its first decade. Residents asked about noise during construction, the path "
    "for cyclists and whether the old ferry would keep running while the work went on. "
)
_LONG_PROMPT = _PROSE * 6 + "\nIn one word, what is the text about?"
_SHORT_PROMPT = "Write the numbers from 1 to 300 in words, separated by commas."
_ANSWER_TOKENS = 64


@dataclass
class EmbeddedSpeed:
    """Seconds per prompt and per completion token, seconds per request beyond both, requests at once."""

    prompt_s_per_token: float
    completion_s_per_token: float
    request_overhead_s: float
    parallel: int
    basis: str
    #: the servers pin each request's shared prefix: its tokens are restored, not evaluated
    pinned: bool = False

    def seconds(self, requests: int, prompt_tokens: int, completion_tokens: int, prefix_tokens: int = 0) -> float:
        evaluated = prompt_tokens - (min(prefix_tokens, prompt_tokens) if self.pinned else 0)
        work = evaluated * self.prompt_s_per_token + completion_tokens * self.completion_s_per_token
        return (work + requests * self.request_overhead_s) / self.parallel


def _ask(url: str, prompt: str, max_tokens: int, n: int) -> tuple[float, str]:
    import httpx

    body: dict[str, Any] = {
        "model": "embedded",
        "messages": [{"role": "user", "content": f"[{n}] {prompt}"}],  # a distinct prefix: no cached prompt reused
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "cache_prompt": False,
    }
    t0 = time.perf_counter()
    r = httpx.post(url.rstrip("/") + "/chat/completions", json=body, timeout=300.0)
    r.raise_for_status()
    text = r.json()["choices"][0]["message"].get("content") or ""
    return time.perf_counter() - t0, text


def _all_at_once(urls: list[str], prompt: str, max_tokens: int, n: int) -> list[tuple[float, str]]:
    """One request to every server at once; the first failure is raised here."""
    with ThreadPoolExecutor(len(urls)) as pool:
        return list(pool.map(lambda i: _ask(urls[i], prompt, max_tokens, n * 100 + i), range(len(urls))))


def measure_embedded(cfg, run_dir: Path, reporter, count) -> EmbeddedSpeed:
    """Start the embedded LLM as ``negsynth run`` would for ``run_dir`` and time a tiny request, a
    long prompt and a long answer on every server at once; ``count(text) -> tokens``: the
    estimate's token counter."""
    import shutil

    from negsynth.llm.prefix_pin import PrefixPin, guard
    from negsynth.pipeline.embedded import SERVER_RECORD, llm_endpoint

    with tempfile.TemporaryDirectory(prefix="negsynth-estimate-") as tmp:
        record = Path(run_dir) / SERVER_RECORD
        if record.is_file():  # a run dir begun with another thread count resumes with it: time that
            shutil.copy(record, Path(tmp) / SERVER_RECORD)
        with llm_endpoint(cfg, Path(tmp), reporter) as url:
            urls = url.split()
            pinned = isinstance(guard(urls[0]), PrefixPin)
            _all_at_once(urls, "Say yes.", 1, 0)  # warm-up: weights paged in, first-request costs paid
            tiny = _all_at_once(urls, "Say yes.", 1, 1)
            long = _all_at_once(urls, _LONG_PROMPT, 1, 2)
            short = _all_at_once(urls, _SHORT_PROMPT, _ANSWER_TOKENS, 3)
    slots = 1 if cfg.serve.parallel is None else cfg.serve.parallel
    parallel = max(1, min(len(urls) * slots, cfg.llm.max_concurrency))
    t_tiny, t_long, t_short = (statistics.median(t for t, _ in answers) for answers in (tiny, long, short))
    p_tiny, p_long, p_short = count("Say yes."), count(_LONG_PROMPT), count(_SHORT_PROMPT)
    answer = statistics.median(max(1, count(text)) for _, text in short)
    # three requests, three unknowns: the tiny one is mostly the per-request cost (HTTP, the chat
    # template, one token), the long prompt adds prompt tokens, the long answer completion tokens
    prompt_rate = max(1e-6, (t_long - t_tiny) / max(1, p_long - p_tiny))
    completion_rate = max(1e-5, (t_short - t_tiny - (p_short - p_tiny) * prompt_rate) / max(1, answer - 1))
    overhead = max(0.0, t_tiny - p_tiny * prompt_rate)
    n = len(urls)
    basis = (
        f"measured on this machine: {n} embedded server{'s' * (n != 1)} at once, "
        f"{1000 * prompt_rate:.1f} ms per prompt token, {1000 * completion_rate:.1f} ms per completion token, "
        f"{1000 * overhead:.0f} ms per request, {parallel} request{'s' * (parallel != 1)} at a time"
        + ("; each request's shared prefix pinned (restored, not evaluated)" if pinned else "")
    )
    return EmbeddedSpeed(prompt_rate, completion_rate, overhead, parallel, basis, pinned)
