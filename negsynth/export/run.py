"""``negsynth export``: both folders into ``--out``, checked before anything is written, and the
upload to the Hub (``--push``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from negsynth.errors import UserError
from negsynth.export.dataset import export_dataset
from negsynth.export.model import export_model


def export_run(
    run_dir: str | Path,
    out: str | Path,
    *,
    only: str | None = None,
    with_shards: bool = False,
    ntuple: int | None = None,
    license: str = "unknown",
    push_repo: str | None = None,
) -> dict:
    """``out/dataset`` and ``out/model`` (``only``: ``dataset`` or ``model``); with ``push_repo`` uploads both."""
    run_dir, out = Path(run_dir), Path(out)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory; pass -d RUN_DIR of a run (e.g. runs/demo)")
    if only not in (None, "dataset", "model"):
        raise UserError(f"--only {only!r}: use 'dataset' or 'model'")
    if push_repo:
        _token()  # fail before writing anything
        if push_repo.count("/") != 1:
            raise UserError(f"--push {push_repo!r}: use USER/NAME (or ORG/NAME)")
    res: dict[str, Any] = {}
    parts = [p for p in ("dataset", "model") if only in (None, p)]
    check_out(out, parts)
    try:
        if "dataset" in parts:
            res["dataset"] = export_dataset(
                run_dir, out / "dataset", with_shards=with_shards, ntuple=ntuple, license=license, repo_id=push_repo
            )
        if "model" in parts:
            res["model"] = export_model(run_dir, out / "model", license=license, dataset_repo=push_repo if only is None else None)
    except OSError as e:
        if e.filename is None or not Path(e.filename).resolve().is_relative_to(out.resolve()):
            raise
        raise UserError(f"--out {out}: cannot write {e.filename} ({e.strerror or e}); free some space or choose another --out") from None
    if push_repo:
        res["pushed"] = push(out, push_repo, only=only)
    return res


def check_out(out: Path, parts: list[str]) -> None:
    """``--out`` is (or can be made) a writable folder, and OUT/dataset, OUT/model are not files:
    one line naming --out otherwise, before anything is written."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder; pass a folder (export writes OUT/dataset and OUT/model)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "a parent is a file, not a folder" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror or str(e)
        raise UserError(f"--out {out}: cannot create it ({why}); choose another --out") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: not writable; fix its permissions or choose another --out")
    for p in parts:
        if (out / p).exists() and not (out / p).is_dir():
            raise UserError(f"--out {out}: {out / p} is a file, not a folder; move it away or choose another --out")


def _token() -> str:
    tok = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if not tok:
        raise UserError(
            "--push: no Hugging Face token; set HF_TOKEN to a write token (https://huggingface.co/settings/tokens) or drop --push and upload OUT/ yourself"
        )
    return tok


def push(out: str | Path, repo: str, *, only: str | None = None) -> list[str]:
    """Upload ``out/dataset`` (dataset repo) and ``out/model`` (model repo) as ``repo``."""
    out = Path(out)
    token = _token()
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        raise UserError("--push: HF_HUB_OFFLINE is set; unset it to upload (the folders are written in OUT/)")
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    urls = []
    for kind, folder in (("dataset", out / "dataset"), ("model", out / "model")):
        if only not in (None, kind) or not folder.is_dir():
            continue
        try:
            api.create_repo(repo, repo_type=kind, exist_ok=True)
            api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type=kind, commit_message="negsynth export")
        except Exception as e:  # network, auth, permissions: one line
            raise UserError(
                f"--push {repo} ({kind}): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; check HF_TOKEN's write access and the network"
            ) from None
        urls.append(f"https://huggingface.co/{'datasets/' if kind == 'dataset' else ''}{repo}")
    return urls
