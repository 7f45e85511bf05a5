"""Helpers shared by the stage modules."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from negsynth.data.shards import ShardError, list_shards, read_stage
from negsynth.errors import UserError
from negsynth.llm.errors import ValidationFailure
from negsynth.schemas.records import first_problem


def short_id(prefix: str, *parts: object, n: int = 16) -> str:
    h = hashlib.sha1("|".join(str(p) for p in parts).encode("utf-8")).hexdigest()[:n]
    return f"{prefix}-{h}"


def read_stage_records(run_dir: Path, stage: str, *, hint: str) -> Iterator[dict]:
    folder = Path(run_dir) / stage
    if not list_shards(folder):
        raise UserError(f"{folder}: no finished shards; {hint}")
    try:
        yield from read_stage(folder)
    except ShardError as e:
        raise UserError(str(e)) from None


def schema_failure(e: ValidationError) -> ValidationFailure:
    """Turn a pydantic error on the LLM's JSON into a short reason and a message for the re-ask."""
    errs = e.errors()
    first = errs[0]
    loc, msg = first_problem(e, "the object")
    if first["type"] == "missing":
        detail = f"the key '{loc}' is missing"
    elif first["type"] in ("model_type", "dict_type"):
        detail = "the answer must be a JSON object"
    else:
        detail = f"'{loc}': {msg}"
    if len(errs) > 1:
        detail += f" (and {len(errs) - 1} more problems)"
    return ValidationFailure("schema", detail)


def path_fingerprint(path: str, *, mtime: bool = False) -> list:
    """Names and sizes of an input's files, hidden ones left out as the readers leave them out;
    ``mtime``: with their modification times (a rewritten file of the same size differs)."""
    p = Path(path)

    def stat(fp: Path) -> list:
        st = fp.stat()
        return [st.st_size, st.st_mtime_ns] if mtime else [st.st_size]

    if p.is_file():
        return [p.name, *stat(p)]
    if p.is_dir():
        out = []
        for root, _, files in sorted(os.walk(p)):
            if any(part.startswith(".") for part in Path(root).relative_to(p).parts):
                continue
            for f in sorted(x for x in files if not x.startswith(".")):
                fp = Path(root) / f
                out.append([str(fp.relative_to(p)), *stat(fp)])
        return out
    return [path]  # a hub name
