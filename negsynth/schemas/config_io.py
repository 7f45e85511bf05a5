"""Load a TOML run file into :class:`RunConfig`, apply ``--set a.b=v`` overrides, and explain errors.

One set of defaults: a user's run file is layered over the built-in one
(``negsynth/defaults/default.toml``, what ``negsynth config`` prints), key by key, so a file that
names only ``[llm]`` trains with exactly the ``[train]`` values ``negsynth config`` shows. A key the
built-in file leaves out takes the section's own default (the pydantic field), as it does there.

Every error is one line naming the file, the section/key and the fix, e.g.::

    demo.toml: [llm] unknown key 'temprature' (allowed: base_url, model, ...)
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from negsynth.errors import UserError
from negsynth.schemas.config import SCHEDULES, RunConfig, Section, run_config_class


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


#: why most options left: each was measured here to tie or trail (their figures: docs/corpus.md,
#: "Options removed, and their figures")
MEASURED = "measured no gain: docs/corpus.md"
TRAIN_MEASURED = "measured no gain: docs/train.md"
RECIPE_MEASURED = "measured no gain: docs/recipe.md"
BACKEND_MEASURED = "measured no gain: docs/benchmarks.md"

#: options taken out of the package: run-file key -> (the values removed, or None for the key itself;
#: why they left; what to use instead), so a run file that still names one is told so in one line
REMOVED: dict[str, tuple[tuple[str, ...] | None, str, str]] = {
    "corpus.teacher": (
        ("hybrid", "llm-likelihood", "hybrid+llm-likelihood"),
        MEASURED,
        'use "cross-encoder" (with corpus.teacher_model) or "none"',
    ),
    "corpus.likelihood": (
        None,
        MEASURED,
        'it chose the llm-likelihood teacher\'s model; delete it (the teacher is corpus.teacher = "cross-encoder")',
    ),
    "corpus.negatives": (None, MEASURED, 'corpus always mines its negatives (the old default, "mined"); delete the key'),
    "corpus.max_doc_chars": (None, MEASURED, "it bounded the LLM-written negatives, which corpus no longer asks for; delete the key"),
    "corpus.queries": (
        ("llm+title", "llm+sentence", "sentence"),
        "no measurement showed a gain: docs/corpus.md",  # the mixes tied; "sentence" was never measured to the end
        'use "llm" (or "title" alone, the no-LLM floor)',
    ),
    "curriculum.incomplete_batches": (
        None,
        MEASURED,
        'a phase\'s leftover rows always train as short batches (the old default, "train"); delete the key',
    ),
    "curriculum.schedule": (
        ("reverse", "random", "fixed:1", "fixed:2", "fixed:3", "fixed:4"),
        RECIPE_MEASURED,
        f"choose {SCHEDULES}",
    ),
    "curriculum.balance": (None, MEASURED, 'a pass is every example once (the old default, "examples"); delete the key'),
    "regenerate.teacher": (("llm-likelihood",), MEASURED, 'use "cross-encoder" (with regenerate.teacher_model) or "none"'),
    "regenerate.likelihood": (
        None,
        MEASURED,
        'it chose the llm-likelihood teacher\'s model; delete it (the teacher is regenerate.teacher = "cross-encoder")',
    ),
    "score.easy_margin": (None, RECIPE_MEASURED, "no example is rejected as too easy (the old default, off); delete the key"),
    "score.judge_model": (
        ("llm",),
        RECIPE_MEASURED,
        "use a cross-encoder (its folder or hub name) as the judge, or delete the key (no judge)",
    ),
    "score.dedup_labelled": (
        None,
        RECIPE_MEASURED,
        'a dataset\'s pairs go only as exact duplicates (the old default, "exact"); delete the key',
    ),
    "llm.transport": (None, "every request goes through the openai SDK", "delete the key"),
    "embedder.padding_side": (None, "the decoder embedder's answers are the same on either side", "delete the key"),
    "embedder.devices": (None, "--executor ray --workers N spreads the embedding over devices", "delete the key"),
    "serve.engine": (
        None,
        "the embedded LLM is llama.cpp's llama-server only",
        "delete the key (build it: bash scripts/build_llama_server.sh)",
    ),
    "regenerate.mining.strategy": (None, RECIPE_MEASURED, 'mined negatives are the hardest ones (the old default, "top"); delete the key'),
    "regenerate.mining.bands": (None, RECIPE_MEASURED, "it set the rank bands of the removed graded mining; delete the key"),
    "regenerate.mining.seed": (None, RECIPE_MEASURED, "it seeded the draws within the removed graded mining's bands; delete the key"),
    "corpus.mining.strategy": (None, RECIPE_MEASURED, 'mined negatives are the hardest ones (the old default, "top"); delete the key'),
    "corpus.mining.bands": (None, RECIPE_MEASURED, "it set the rank bands of the removed graded mining; delete the key"),
    "corpus.mining.seed": (None, RECIPE_MEASURED, "it seeded the draws within the removed graded mining's bands; delete the key"),
    "train.hardness_mode": (None, TRAIN_MEASURED, "InfoNCE weighs every negative alike (the old default, off); delete the key"),
    "train.hardness_strength": (None, TRAIN_MEASURED, "it set the strength of the removed hardness weighting; delete the key"),
    "train.no_duplicates": (None, TRAIN_MEASURED, "every batch keeps each text once (the old default, true); delete the key"),
    "train.ata_pool": (
        None,
        "measured no gain: docs/zeroshot.md",
        'ATA leaves the instruction prefix out (the old default, "embed_mask"); delete the key',
    ),
    "embedder.backend": (("onnx", "onnx-int8"), BACKEND_MEASURED, 'use "openvino" (the same export, faster) or "torch"'),
    "evaluate.backend": (("onnx", "onnx-int8"), BACKEND_MEASURED, 'use "openvino" (the same export, faster) or "torch"'),
    "embedder.reba_variant": (
        None,
        "measured no gain: docs/zeroshot.md",
        'ReBA pools the paper\'s e_n (the old default, "paper"); delete the key',
    ),
    "generate.worked_examples": (
        None,
        "measured no gain: docs/demo.md",
        'the worked example is drawn per request from the pool (the old default, "rotate"); delete the key',
    ),
    "train.pooling": (("latent",), "measured no gain: docs/zeroshot.md", 'use "ata" (or "mean")'),
    "train.latent_num": (None, "measured no gain: docs/zeroshot.md", "it sized the removed latent pooling; delete the key"),
    "train.latent_heads": (None, "measured no gain: docs/zeroshot.md", "it set the removed latent pooling's heads; delete the key"),
    "train.ata_detach": (None, "an ablation never measured to help: ATA's weights always get gradients", "delete the key"),
    "train.check_batches": (
        None,
        TRAIN_MEASURED,
        "the order-keeping sampler never puts a text twice in a batch, so there is nothing to check; delete the key",
    ),
}


def _removed(err: dict, loc: tuple[str, ...]) -> str | None:
    """``key was removed (why); fix`` when the error is a removed option's (:data:`REMOVED`), else None."""
    values, why, fix = REMOVED.get(".".join(loc), ((), "", ""))
    if values is None and err["type"] == "extra_forbidden":
        return f"{loc[-1]} was removed ({why}); {fix}"
    if values and isinstance(err.get("input"), str) and err["input"] in values:
        return f"{loc[-1]} = {err['input']!r} was removed ({why}); {fix}"
    return None


def explain(e: ValidationError, source: str, cls: type[BaseModel] = RunConfig) -> str:
    err = e.errors()[0]
    loc = tuple(str(x) for x in err["loc"])
    section = f"[{'.'.join(loc[:-1])}] " if len(loc) > 1 else ""
    key = loc[-1] if loc else "?"
    more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    removed = _removed(err, loc)
    if removed:
        return f"{source}: {section}{removed}{more}"
    if err["type"] == "extra_forbidden":
        allowed = _allowed(cls, loc)
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return f"{source}: {section}unknown key {key!r}{hint}{more}"
    msg = err["msg"].removeprefix("Value error, ")
    given = err.get("input")
    given_s = "" if isinstance(given, dict) else f" (got {given!r})"
    return f"{source}: {section}{key}: {msg}{given_s}{more}"


def _parse_toml(text: str, source: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{source}: invalid TOML: {e}") from None


def layer(base: dict, top: dict) -> dict:
    """``top`` over ``base``, table by table: a table merges key by key, any other value (an array,
    an array of tables) replaces the base's."""
    out = dict(base)
    for k, v in top.items():
        out[k] = layer(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _recipe_yields(defaults: dict, user: dict) -> dict:
    """The built-in values a named ``train.recipe`` sets itself are left out: a recipe fills what the
    user did not set (``TrainConfig``), and a built-in default is not the user's choice."""
    from negsynth.schemas.train import BELLM_RECIPE

    if (user.get("train") or {}).get("recipe") != "bellm" or "train" not in defaults:
        return defaults
    return {**defaults, "train": {k: v for k, v in defaults["train"].items() if k not in BELLM_RECIPE}}


def config_layers(path: str | Path | None = None, overrides: list[str] | None = None) -> tuple[dict, dict, str]:
    """(the built-in run file's table, the user's table: ``path`` then ``overrides``, the source
    named in errors). Without ``path`` the user's table holds the overrides alone."""
    defaults = _parse_toml(default_config_text(), "default config")
    if path is None:
        source, user = "default config", {}
    else:
        p = Path(path)
        source = str(p)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(f"{p}: config file not found; pass an existing --config FILE.toml") from None
        except (PermissionError, IsADirectoryError, UnicodeDecodeError) as e:
            raise UserError(f"{p}: cannot read config ({type(e).__name__}); check the path") from None
        user = _parse_toml(text, source)
    for o in overrides or []:
        apply_override(user, o)
    if overrides:
        source += " with --set"
    return defaults, user, source


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, sections: tuple = ()) -> RunConfig:
    """The run config: the built-in run file (what ``negsynth config`` prints), ``path``'s keys over
    it, then ``overrides`` (``["train.lr=1e-5", ...]``, as ``--set``), validated; ``sections``: the
    ``(name, section class)`` of stages RunConfig does not list (``negsynth.stages.sections()``)."""
    defaults, user, source = config_layers(path, overrides)
    cls = run_config_class(sections)
    try:
        return cls.model_validate(layer(_recipe_yields(defaults, user), user))
    except ValidationError as e:
        raise UserError(explain(e, source, cls)) from None


def changed_keys(user: dict, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every key path the user's table sets (tables recursed, arrays of tables as one key)."""
    out: set[tuple[str, ...]] = set()
    for k, v in user.items():
        if isinstance(v, dict):
            out |= changed_keys(v, (*prefix, k))
        else:
            out.add((*prefix, k))
    return out


def config_hash(obj: Any) -> str:
    """Stable short hash of JSON-able data (pydantic models are dumped first)."""
    if isinstance(obj, Section):
        obj = obj.hash_dump()
    elif isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _at(data: Any, path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(data, dict) or k not in data:
            return _MISSING
        data = data[k]
    return data


_MISSING = object()


def marked_toml(path: str | Path | None = None, overrides: list[str] | None = None, sections: tuple = ()) -> str:
    """``negsynth config [-c FILE] [--set ...]``: the effective config as TOML, every key the file
    or a ``--set`` gave marked with a comment (``# FILE`` or ``# --set``; ``(= default)`` added when
    it repeats the built-in value), so a reader sees what the file changed and what it inherits."""
    import re

    import tomli_w

    cfg = load_config(path, overrides, sections).model_dump(mode="json", exclude_none=True)
    text = tomli_w.dumps(cfg)
    if path is None and not overrides:
        return text
    by_file = changed_keys(config_layers(path)[1]) if path is not None else set()
    by_set: dict = {}
    for o in overrides or []:
        apply_override(by_set, o)
    base = load_config().model_dump(mode="json", exclude_none=True)
    marks = {
        p: f"# {'--set' if p in changed_keys(by_set) else path}" + (" (= default)" if _at(base, p) == _at(cfg, p) else "")
        for p in by_file | changed_keys(by_set)
    }
    out, table = [], ()
    for line in text.splitlines():
        head = re.fullmatch(r"\[\[?([^\]]+)\]\]?", line)
        if head:
            table = tuple(k.strip().strip('"') for k in head.group(1).split("."))
            if line.startswith("[[") and table in marks:
                line += f"  {marks[table]}"
        else:
            kv = re.match(r'("[^"]+"|[A-Za-z0-9_-]+) = ', line)
            if kv and (*table, kv.group(1).strip('"')) in marks:
                line += f"  {marks[(*table, kv.group(1).strip(chr(34)))]}"
        out.append(line)
    return "\n".join(out) + "\n"
