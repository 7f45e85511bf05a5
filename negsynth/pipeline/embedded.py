"""The embedded LLM servers around the stages that call the LLM (``llm.base_url = "embedded"``),
and the run dir's record of them, so that a resumed run answers as its first servers did."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from negsynth.data.shards import atomic_write_json
from negsynth.pipeline.manifest import read_json

#: the run dir's record of its first embedded servers (engine, threads per server, servers, prompt mode, build)
SERVER_RECORD = "embedded-server.json"
ENGINE = "llama-server"


def server_record(run_dir: Path) -> dict:
    """The run dir's :data:`SERVER_RECORD` ({} when there is none or it cannot be read)."""
    rec = read_json(Path(run_dir) / SERVER_RECORD)
    return rec if isinstance(rec, dict) else {}


def keep_record(run_dir: Path, **record) -> None:
    """Write the run dir's :data:`SERVER_RECORD` (its first servers) unless it has one."""
    path = Path(run_dir) / SERVER_RECORD
    if not path.exists():
        atomic_write_json(path, {"engine": ENGINE, **record})


def kept_threads(run_dir: Path) -> int | None:
    """The threads per server of the run dir's first llama-server(s), or None (no record, another
    engine): llama.cpp's answers depend on its thread count, so a resumed run keeps it."""
    rec = server_record(run_dir)
    t = rec.get("threads") if rec.get("engine") == ENGINE else None
    return t if isinstance(t, int) and t > 0 else None


def build_id(binary: Path | None) -> str | None:
    """A llama-server build's identity (16 hex digits of its SHA-256): builds for other CPU
    instructions write other text for the same request (docs/llm_server.md)."""
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
    "off"), or None (no record, another engine): a pinned prefix gives other answers, so a run dir
    keeps its first mode."""
    rec = server_record(run_dir)
    if rec.get("engine") != ENGINE:
        return None
    mode = rec.get("prompt", "off")
    return mode if mode in ("pinned", "on", "off") else "off"


def prompt_mode(cfg, run_dir: Path, in_process: bool) -> tuple[str, str]:
    """``(serve.prompt_cache to start the servers with, a note when it is not the configured one)``;
    under Ray (``in_process`` False) a pin cannot hold."""
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
    """The one place ``llm.base_url = "embedded"`` becomes servers: the llama.cpp fleet
    (:class:`~negsynth.llm.server.EmbeddedFleet`) for the block, yielding its URLs joined by spaces;
    any other base URL, or ``needed`` False, yields None. ``in_process``: every request comes from
    this process, so the prompt prefix may be pinned (:mod:`negsynth.llm.prefix_pin`)."""
    if cfg.llm.base_url != "embedded" or not needed:
        yield None
        return
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
        keep_record(run_dir, threads=fleet.threads, servers=len(fleet), prompt=fleet.prompt_mode, **({"build": build} if build else {}))
        rss = [r for r in fleet.rss_mib() if r is not None]
        mem = f" ({max(rss):.0f} MiB resident per server at start)" if rss and len(fleet) > 1 else ""
        reporter.info(f"embedded LLM ready at {', '.join(fleet.urls)}{mem}")
        yield fleet.url
