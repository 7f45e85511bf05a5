"""Prompt templates (package data, ``string.Template`` placeholders ``${name}`` so JSON braces need
no escaping) and worked examples (``examples/*.json``, shown as a prior user/assistant turn).
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from importlib import resources
from string import Template
from typing import Any


@cache
def load_template(name: str) -> str:
    try:
        return resources.files(__package__).joinpath("templates", f"{name}.txt").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KeyError(f"no prompt template named {name!r}") from None


@cache
def load_example(name: str) -> dict:
    text = resources.files(__package__).joinpath("examples", f"{name}.json").read_text(encoding="utf-8")
    return json.loads(text)


@cache
def load_examples(name: str) -> tuple[dict, ...]:
    """The pool of worked examples of ``name``: ``name.json`` first, then ``name.2.json``, ``name.3.json``, ..."""
    root = resources.files(__package__).joinpath("examples")
    extra = sorted(
        (
            f.name
            for f in root.iterdir()
            if f.name.startswith(f"{name}.") and f.name.endswith(".json") and f.name[len(name) + 1 : -5].isdigit()
        ),
        key=lambda n: int(n[len(name) + 1 : -5]),
    )
    return (load_example(name), *(json.loads(root.joinpath(n).read_text(encoding="utf-8")) for n in extra))


def render(name: str, **variables: Any) -> str:
    """Render template ``name`` with ``variables``; every ``${placeholder}`` must be given."""
    return Template(load_template(name)).substitute(**{k: str(v) for k, v in variables.items()}).strip()


def reask_template() -> str:
    """What the LLM is told after an invalid answer (``${detail}``: the validator's reason)."""
    return load_template("reask").strip()


def templates_fingerprint(*prefixes: str) -> str:
    """A hash of the templates and worked examples whose names start with ``prefixes`` (all when
    none are given): part of a stage's config hash."""
    h = hashlib.sha256()
    root = resources.files(__package__)
    for sub in ("templates", "examples"):
        for f in sorted(root.joinpath(sub).iterdir(), key=lambda p: p.name):
            if prefixes and not f.name.startswith(prefixes):
                continue
            if f.name.endswith((".txt", ".json")):
                h.update(f.name.encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]
