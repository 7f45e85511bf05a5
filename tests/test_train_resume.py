"""`negsynth train` continues an interrupted run by default.

A real `negsynth train` process is SIGKILLed (``NEGSYNTH_CRASH_AT=checkpoint_saved:3``: right
after the trainer wrote checkpoint-3, before negsynth sealed it, i.e. a kill mid-save), then the
same command is run again. A 1-layer BERT, 16 rows in batches of 4 (4 steps), a checkpoint every step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")

from test_cli_pipeline import runner  # noqa: E402

from negsynth.cli import app  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SETS = [
    "--set",
    "train.batch_size=4",
    "--set",
    "train.grad_accum=1",
    "--set",
    "train.max_length=32",
    "--set",
    "train.lr=1e-4",
    "--set",
    "train.save_steps=1",
    "--set",
    "train.save_total_limit=2",
    "--set",
    "train.warmup_ratio=0.0",
]
WORDS = ["amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "heron", "iris", "jade", "kelp", "lichen"]


@pytest.fixture(scope="module")
def tiny_bert(minilm, tmp_path_factory) -> str:
    """A 1-layer, 32-wide BERT with MiniLM's tokenizer: checkpoints of ~12 MB instead of ~270 MB."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    d = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    BertModel(
        BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ).save_pretrained(d)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(Path(minilm) / f, d / f)
    return str(d)


def make_curriculum(rd: Path, n: int = 16) -> None:
    """A finished curriculum stage of ``n`` rows, 4 phases (levels 4 -> 1), in training order."""
    from negsynth.data.curriculum import save_curriculum

    rows = [
        {
            "anchor": f"code {i} {WORDS[i % 12]}",
            "positive": f"{WORDS[(i + 3) % 12]} {i * 7}",
            "negative": f"{WORDS[(i + 5) % 12]} {i * 3 + 1}",
            "level": 4 - (i * 4) // n,
            "phase": (i * 4) // n,
            "batch": i // 4,
            "task_type": "short-short",
            "example_id": f"ex{i}",
            "source": "synthetic",
        }
        for i in range(n)
    ]
    save_curriculum(rows, rd / "curriculum", stats={"schedule": "curriculum", "batch_size": 4})
    (rd / "curriculum" / "stats.json").write_text(json.dumps({"stage": "curriculum", "rows": n}))


def train_cli(rd: Path, model: str, *extra: str):
    r = runner.invoke(app, ["train", "-d", str(rd), *SETS, "--set", f"train.model='{model}'", *extra])
    assert r.exit_code == 0, r.output
    return r, json.loads((rd / "train" / "stats.json").read_text())


def steps_logged(rd: Path) -> list[dict]:
    log = json.loads((rd / "train" / "final" / "train_log.json").read_text())["log_history"]
    return [e for e in log if "loss" in e]


def test_a_killed_train_continues_from_its_last_whole_checkpoint(tmp_path, tiny_bert):
    ref, rd = tmp_path / "ref", tmp_path / "killed"
    for d in (ref, rd):
        make_curriculum(d)
    _, want = train_cli(ref, tiny_bert, "-q")
    assert want["steps"] == 4 and want["resumed_from_step"] is None
    # a real kill of a real process, mid-save of checkpoint-3
    env = {**os.environ, "NEGSYNTH_CRASH_AT": "checkpoint_saved:3"}
    p = subprocess.run(
        [sys.executable, "-m", "negsynth", "train", "-d", str(rd), *SETS, "--set", f"train.model='{tiny_bert}'", "-q"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == -9, p.stderr[-2000:]
    ck = rd / "train"
    assert sorted(c.name for c in ck.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert not (ck / "checkpoint-3" / "negsynth_checkpoint.json").exists() and not (ck / "final").exists()
    # the same command again: continues from checkpoint-2 (checkpoint-3 is not whole), to the same 4 steps
    r, got = train_cli(rd, tiny_bert)
    said = "".join(r.stderr.split())  # the console wraps long lines
    assert "resumingfrom" in said and "checkpoint-2(aninterrupted" in said, r.stderr
    assert got["resumed_from_step"] == 2 and got["steps"] == want["steps"] == 4
    a, b = steps_logged(ref), steps_logged(rd)
    assert (
        [(e["step"], e["phase"], e["level"]) for e in b]
        == [(e["step"], e["phase"], e["level"]) for e in a]
        == [(1, 0, 4), (2, 1, 3), (3, 2, 2), (4, 3, 1)]
    )
    assert [e["loss"] for e in b] == pytest.approx([e["loss"] for e in a], rel=1e-4)  # the same batches, the same optimizer state
    assert sorted(c.name for c in ck.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]  # save_total_limit 2, all sealed
    assert all((c / "negsynth_checkpoint.json").exists() for c in ck.glob("checkpoint-*"))
    # finished: the same command reuses it
    r, again = train_cli(rd, tiny_bert)
    assert again.get("reused") or "up to date" in r.stderr


def test_overwrite_or_a_changed_config_starts_afresh(tmp_path):
    from negsynth.pipeline.context import StageContext
    from negsynth.pipeline.progress import Reporter
    from negsynth.schemas.config_io import load_config
    from negsynth.stages.train import _resume_point

    rd = tmp_path / "run"
    make_curriculum(rd)
    out = rd / "train"

    def point(overwrite=False, sets=()):
        cfg = load_config(None, [s for s in SETS if s != "--set"] + list(sets))
        ctx = StageContext(cfg=cfg, run_dir=rd, overwrite=overwrite, reporter=Reporter(quiet=True))
        return _resume_point(ctx, cfg.train.model_copy(update={"output_dir": str(out)}))

    def fake_checkpoint(step):
        c = out / f"checkpoint-{step}"
        c.mkdir(parents=True)
        (c / "model.safetensors").write_bytes(b"x" * 10)
        (c / "negsynth_checkpoint.json").write_text(json.dumps({"step": step, "files": {"model.safetensors": 10}}))

    assert point().resume is False  # nothing to resume: afresh, and the run's config is noted
    fake_checkpoint(1)
    fake_checkpoint(2)
    (out / "checkpoint-3").mkdir()  # a kill mid-save: not sealed
    assert point().resume == str(out / "checkpoint-2")
    assert point(sets=["train.lr=3e-4"]).resume is False and not list(out.glob("checkpoint-*"))  # another config
    point()  # back to the first config: noted again
    fake_checkpoint(1)
    assert point().resume == str(out / "checkpoint-1")
    assert point(overwrite=True).resume is False and not list(out.glob("checkpoint-*"))
