"""Command-line options as config overrides: each option a user gave becomes a ``--set``
assignment (``section.key=VALUE``), its value serialised as TOML, so a path or name with a quote
or a backslash in it arrives in the config as typed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from negsynth.errors import UserError


def toml_value(v: Any) -> str:
    """``v`` as a TOML value (a list as an inline array), for the right-hand side of a ``--set``."""
    import tomli_w

    if isinstance(v, Path):
        v = str(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return tomli_w.dumps({"v": v}).removeprefix("v = ").rstrip("\n")


def config_sets(section: str, **values: Any) -> list[str]:
    """The ``--set`` overrides of ``section`` for the options a user gave (None: not given)."""
    return [f"{section}.{key}={toml_value(v)}" for key, v in values.items() if v is not None]


def embedder_overrides(spec: str | None) -> list[str]:
    """``--embedder`` shortcut -> ``--set`` overrides.

    ``decoder`` / ``decoder:MODEL`` -> a zero-shot decoder embedder (method via
    ``--set embedder.method=echo``); ``st`` / ``st:MODEL`` / ``sentence-transformers`` -> a
    sentence-transformers model; anything else is a sentence-transformers folder or hub name.
    """
    if not spec:
        return []
    kind, _, model = spec.partition(":") if spec.split(":", 1)[0] in ("decoder", "st", "sentence-transformers") else ("st", "", spec)
    out = ["embedder.kind=decoder"] if kind == "decoder" else ["embedder.kind=sentence-transformers"]
    if model:
        out += config_sets("embedder", model=model)
    elif kind == "decoder" or spec in ("st", "sentence-transformers"):
        out.append("embedder.model='default'")
    return out


def filter_arg(items: list[str] | None) -> dict[str, str | list[str]]:
    """``--filter label=entailment`` / ``--filter label=a,b`` -> the source spec's ``filter``."""
    out: dict[str, str | list[str]] = {}
    for it in items or []:
        col, sep, val = it.partition("=")
        if not sep or not col.strip():
            raise UserError(f"--filter {it!r}: expected COLUMN=VALUE (or COLUMN=V1,V2), e.g. --filter label=entailment")
        vals = [v.strip() for v in val.split(",")]
        out[col.strip()] = vals if len(vals) > 1 else vals[0]
    return out
