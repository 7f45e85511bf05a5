"""What the dataset and the model exports share: reading a run's JSON, the card's YAML front
matter, content-named data files and the staging folder that replaces ``OUT/dataset`` or
``OUT/model`` only once it is whole."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from negsynth.errors import UserError

PARQUET = "train-00000-of-00001.parquet"


def content_named(path: Path) -> str:
    """Rename ``path`` (``…/train-00000-of-00001.parquet``) to carry the first 12 hex digits of its
    content's SHA-256 and return its new name. ``datasets`` caches a local folder under its folder
    name, config and a hash of its card's ``configs`` (the data files' *relative* paths), so two
    exports whose files had the same names were one cache entry: loading the second gave the first
    one's rows, silently. A name that changes with the content makes each export its own entry."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    named = path.with_name(f"{path.stem}-{digest}{path.suffix}")
    path.rename(named)
    return named.name


def read_json(path: Path) -> dict | None:
    """``path``'s JSON; ``None`` when the file is missing (a stage the run skipped), one line
    naming the file when it is unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not readable JSON ({e}); rerun the stage that wrote it") from None


def yaml_front(meta: dict) -> str:
    """``meta`` as a card's YAML front matter (the Hub reads configs, licence and tags from it)."""
    import yaml

    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=1000) + "---\n"


def examples_stage(run_dir: Path) -> Path | None:
    """The folder of the run's latest Example records: those of the last stage of the method whose
    records are examples (score's) that has some."""
    from negsynth.stages import example_stages

    for st in reversed(example_stages()):
        if any((run_dir / st).glob("shard-*.jsonl")):
            return run_dir / st
    return None


def records_by_stage(folder: Path) -> Iterator[tuple[str, dict]]:
    """Each Example record of a stage folder with the stage that made it: the folder's own, or, for
    score's, the input stage its shard was scored from (``score/stats.json["inputs"]``)."""
    from negsynth.data.shards import iter_jsonl, list_shards

    made_by = {i["out"]: i["stage"] for i in (read_json(folder / "stats.json") or {}).get("inputs", [])} if folder.name == "score" else {}
    for p in list_shards(folder):
        stage = made_by.get(p.name, folder.name)
        for r in iter_jsonl(p):
            yield stage, r


@contextmanager
def staged_folder(out_dir: Path) -> Iterator[Path]:
    """A fresh folder beside ``out_dir`` to write the export into: moved into place as ``out_dir``
    (an existing folder is replaced) when the block ends, removed when it raises, so a failed
    export leaves the previous one whole and no half-written folder behind."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
