"""The embedded LLM server around the stages that call the LLM (``llm.base_url = "embedded"``):
:func:`~negsynth.pipeline.executor.run_stage` starts it around an LLM stage, one server for a whole
``negsynth run``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: the run dir's record of its first embedded servers (engine, threads per server, servers)
SERVER_RECORD = "embedded-server.json"
#: the engine a record names (run dirs of earlier versions may name another, whose counts do not carry over)
ENGINE = "llama-server"


def server_record(run_dir: Path) -> dict:
    """The run dir's :data:`SERVER_RECORD` ({} when there is none or it cannot be read)."""
    try:
        rec = json.loads((Path(run_dir) / SERVER_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def kept_threads(run_dir: Path) -> int | None:
    """The threads per server of the run dir's first llama-server(s), or None (no record, another engine).

    llama.cpp's answers depend on its thread count (1 and 2 threads give different text for the
    same request and seed). Every server has 1 thread unless ``serve.n_threads`` says otherwise,
    so a run dir begun with the default resumes with the default; one begun with another count
    (``serve.n_threads``, or a run dir of the single multi-threaded server of earlier versions,
    whose count followed the load) keeps that count per server, so that a resumed or extended run
    writes what an uninterrupted one would have. ``serve.n_threads`` still overrides it."""
    rec = server_record(run_dir)
    t = rec.get("threads") if rec.get("engine") == ENGINE else None
    return t if isinstance(t, int) and t > 0 else None


def build_id(binary: Path | None) -> str | None:
    """A short identity of a llama-server build (the SHA-256 of its file, 16 hex digits): builds for
    other CPU instructions (AVX2 against AVX-512) write other text for the same request (6 of 16
    answers equal, docs/llm_server.md), so a run dir records which build answered first."""
    import hashlib

    try:
        with open(binary, "rb") as f:  # type: ignore[arg-type]
            return hashlib.file_digest(f, "sha256").hexdigest()[:16]
    except (OSError, TypeError):
        return None


def other_build(run_dir: Path, build: str | None) -> str | None:
    """The build the run dir's first servers were, when it is not ``build`` (else None)."""
    first = server_record(run_dir).get("build")
    return first if isinstance(first, str) and build and first != build else None


def kept_prompt_mode(run_dir: Path) -> str | None:
    """How the run dir's first llama-server(s) treated a prompt's shared prefix ("pinned", "on" or
    "off"; a record from before the pin: "off"), or None (no record, another engine). An answer
    computed from a pinned prefix is not the answer computed on the whole prompt, so a run dir
    keeps its first mode: a resumed or extended run writes what an uninterrupted one would have."""
    rec = server_record(run_dir)
    if rec.get("engine") != ENGINE:
        return None
    mode = rec.get("prompt", "off")
    return mode if mode in ("pinned", "on", "off") else "off"


def prompt_mode(cfg, run_dir: Path, in_process: bool) -> tuple[str, str]:
    """``(serve.prompt_cache to start the servers with, a note when it is not the configured one)``.

    A run dir begun with every prompt evaluated whole (before the pin, or under Ray) stays so under
    the default; ``serve.prompt_cache = "off"`` is honoured on a pinned run dir, with a note. Under
    Ray (``in_process`` False) a pin cannot hold: the prompt is evaluated whole."""
    want = cfg.serve.prompt_cache
    kept = kept_prompt_mode(run_dir)
    notes = []
    if kept == "off" and want == "pinned":
        want = "off"
        notes.append("prompts evaluated whole: this run dir's first mode")
    elif kept == "pinned" and want == "off":
        notes.append("serve.prompt_cache = off: new answers may differ from this run dir's pinned ones")
    if want == "pinned" and not in_process:
        want = "off"
        notes.append(
            "under Ray every prompt is evaluated whole"
            + (": new answers may differ from this run dir's pinned ones" if kept == "pinned" else "")
        )
    return want, "; ".join(notes)


@contextmanager
def llm_endpoint(cfg, run_dir: Path, reporter, *, needed: bool = True, in_process: bool = True) -> Iterator[str | None]:
    """The one place ``llm.base_url = "embedded"`` becomes servers: start the bundled llama.cpp
    server fleet (:class:`~negsynth.llm.server.EmbeddedFleet`) for the duration of the block and
    yield its URL (several servers: their URLs joined by spaces, which
    :func:`~negsynth.llm.server.fleet_llm_config` turns into ``llm.endpoints``); any other base
    URL, or ``needed`` False, yields None (the configured URL is used as it is). ``in_process``:
    every request will come from this process, so the servers' prompt prefix may be pinned
    (:mod:`negsynth.llm.prefix_pin`); else it is evaluated whole."""
    if cfg.llm.base_url != "embedded" or not needed:
        yield None
        return
    from negsynth.data.shards import atomic_write_json
    from negsynth.llm.server import EmbeddedFleet

    kept = None if cfg.serve.n_threads is not None else kept_threads(run_dir)
    mode, mode_why = prompt_mode(cfg, run_dir, in_process)
    serve = cfg.serve if mode == cfg.serve.prompt_cache else cfg.serve.model_copy(update={"prompt_cache": mode})
    fleet = EmbeddedFleet(serve, cfg.llm.model, log_dir=Path(run_dir) / "logs", threads=kept, pin=in_process)
    whys = (
        [f"{kept} threads per server: this run dir's first count, whose answers differ from other counts; serve.n_threads changes it"]
        if kept and kept != 1
        else []
    )
    whys += [mode_why] if mode_why else []
    why = f" ({'; '.join(whys)})" if whys else ""
    reporter.info(f"starting the embedded LLM ({cfg.llm.model}): {fleet.describe()}{why} ...")
    build = build_id(fleet.binary)
    first = other_build(run_dir, build)
    if first:
        reporter.warn(
            f"this run dir's first answers came from another llama-server build ({first}; this one is {build}): "
            "answers cached so far are reused, new ones may differ from what the first build would write "
            "(a build for other CPU instructions writes other text)"
        )
    with fleet:
        if not (Path(run_dir) / SERVER_RECORD).exists():
            record = {"engine": ENGINE, "threads": fleet.threads, "servers": len(fleet), "prompt": fleet.prompt_mode}
            atomic_write_json(Path(run_dir) / SERVER_RECORD, {**record, "build": build} if build else record)
        rss = [r for r in fleet.rss_mib() if r is not None]
        mem = f" ({max(rss):.0f} MiB resident per server at start)" if rss and len(fleet) > 1 else ""
        reporter.info(f"embedded LLM ready at {', '.join(fleet.urls)}{mem}")
        yield fleet.url
