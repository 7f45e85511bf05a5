"""The embedded LLM server around the stages that call the LLM (``llm.base_url = "embedded"``).

Below the stage contract (:mod:`negsynth.pipeline.stage` starts it around an LLM stage, one
server for a whole ``negsynth run``) and the Ray executor; the LLM stages' own plumbing is
:mod:`negsynth.pipeline.llm_stage`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def llm_endpoint(cfg, run_dir: Path, reporter, *, needed: bool = True) -> Iterator[str | None]:
    """The one place ``llm.base_url = "embedded"`` becomes a server: start the bundled llama.cpp
    server for the duration of the block and yield its URL; any other base URL, or ``needed``
    False, yields None (the configured URL is used as it is)."""
    if cfg.llm.base_url != "embedded" or not needed:
        yield None
        return
    from negsynth.llm.server import EmbeddedServer

    srv = EmbeddedServer(cfg.serve, cfg.llm.model, log_path=Path(run_dir) / "logs" / "llama-server.log", slots=cfg.llm.max_concurrency)
    reporter.info(f"starting the embedded LLM server ({cfg.llm.model}): {srv.describe()} ...")
    with srv:
        reporter.info(f"embedded server ready at {srv.base_url}")
        yield srv.base_url
