"""Load a TOML run file into :class:`RunConfig`, apply ``--set a.b=v`` overrides, and explain errors.

Every error is one line naming the file, the section/key and the fix, e.g.::

    demo.toml: [llm] unknown key 'temprature' (allowed: base_url, model, ...)
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, ValidationError

from negsynth.errors import UserError
from negsynth.schemas.config import RunConfig, Section


def default_config_text() -> str:
    return resources.files("negsynth").joinpath("defaults", "default.toml").read_text(encoding="utf-8")


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare string


def apply_override(data: dict, assignment: str, source: str = "--set") -> None:
    if "=" not in assignment:
        raise UserError(f"{source} {assignment!r}: expected KEY=VALUE, e.g. --set llm.base_url=http://127.0.0.1:8000/v1")
    key, raw = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise UserError(f"{source} {assignment!r}: empty key")
    node = data
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise UserError(f"{source} {assignment!r}: {p!r} is not a section")
        node = nxt
    node[parts[-1]] = _parse_value(raw.strip())


def _allowed(model: type[BaseModel], loc: tuple) -> list[str]:
    import typing

    m: Any = model
    for part in loc[:-1]:
        if part.isdigit():  # an entry of a list of sections (llm.endpoints.0)
            continue
        f = getattr(m, "model_fields", {}).get(part)
        if f is None:
            return []
        m = f.annotation
        if typing.get_origin(m) is list:
            m = typing.get_args(m)[0]
    return list(getattr(m, "model_fields", {}).keys())


def explain(e: ValidationError, source: str) -> str:
    err = e.errors()[0]
    loc = tuple(str(x) for x in err["loc"])
    section = f"[{'.'.join(loc[:-1])}] " if len(loc) > 1 else ""
    key = loc[-1] if loc else "?"
    more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    if err["type"] == "extra_forbidden":
        allowed = _allowed(RunConfig, loc)
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return f"{source}: {section}unknown key {key!r}{hint}{more}"
    msg = err["msg"].removeprefix("Value error, ")
    given = err.get("input")
    given_s = "" if isinstance(given, dict) else f" (got {given!r})"
    return f"{source}: {section}{key}: {msg}{given_s}{more}"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read ``path`` (or the built-in default run file), apply overrides, validate."""
    if path is None:
        source = "default config"
        text = default_config_text()
    else:
        p = Path(path)
        source = str(p)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(f"{p}: config file not found; pass an existing --config FILE.toml") from None
        except (PermissionError, IsADirectoryError, UnicodeDecodeError) as e:
            raise UserError(f"{p}: cannot read config ({type(e).__name__}); check the path") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{source}: invalid TOML: {e}") from None
    for o in overrides or []:
        apply_override(data, o)
    if overrides:
        source += " with --set"
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise UserError(explain(e, source)) from None


def config_hash(obj: Any) -> str:
    """Stable short hash of JSON-able data (pydantic models are dumped first)."""
    if isinstance(obj, Section):
        obj = obj.hash_dump()
    elif isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
