"""The embedded LLM server around the stages that call the LLM (``llm.base_url = "embedded"``).

Below the stage contract (:mod:`negsynth.pipeline.stage` starts it around an LLM stage, one
server for a whole ``negsynth run``) and the Ray executor; the LLM stages' own plumbing is
:mod:`negsynth.pipeline.llm_stage`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: the run dir's record of its first embedded server (engine and thread count)
SERVER_RECORD = "embedded-server.json"


def kept_threads(run_dir: Path, engine: str) -> int | None:
    """The thread count of the run dir's first llama-server, or None (no record, another engine).

    llama.cpp's answers depend on its thread count (1 and 2 threads give different text for the
    same request and seed), and the count chosen by default follows the machine's load when the
    server starts. A run dir therefore keeps the count of its first server: a resumed or extended
    run writes what an uninterrupted one would have, whatever the load. ``serve.n_threads``
    still overrides it."""
    try:
        rec = json.loads((Path(run_dir) / SERVER_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    t = rec.get("threads") if isinstance(rec, dict) and rec.get("engine") == engine else None
    return t if isinstance(t, int) and t > 0 else None


@contextmanager
def llm_endpoint(cfg, run_dir: Path, reporter, *, needed: bool = True) -> Iterator[str | None]:
    """The one place ``llm.base_url = "embedded"`` becomes a server: start the bundled llama.cpp
    server for the duration of the block and yield its URL; any other base URL, or ``needed``
    False, yields None (the configured URL is used as it is)."""
    if cfg.llm.base_url != "embedded" or not needed:
        yield None
        return
    from negsynth.data.shards import atomic_write_json
    from negsynth.llm.server import EmbeddedServer, resolve_engine

    engine = resolve_engine(cfg.serve)[0]
    kept = None if cfg.serve.n_threads else kept_threads(run_dir, engine)
    log_path = Path(run_dir) / "logs" / "llama-server.log"
    srv = EmbeddedServer(cfg.serve, cfg.llm.model, log_path=log_path, slots=cfg.llm.max_concurrency, threads=kept)
    why = " (this run dir's first count: the same answers; serve.n_threads changes it)" if kept else ""
    reporter.info(f"starting the embedded LLM server ({cfg.llm.model}): {srv.describe()}{why} ...")
    with srv:
        if srv.engine == "llama-server" and not (Path(run_dir) / SERVER_RECORD).exists():
            atomic_write_json(Path(run_dir) / SERVER_RECORD, {"engine": srv.engine, "threads": srv.threads})
        reporter.info(f"embedded server ready at {srv.base_url}")
        yield srv.base_url
