"""Data-parallel training: the curriculum sampler under accelerate's sharding, and a real
2-process torchrun (gloo, CPU) against one process with the same global batch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")

from negsynth.data.text import text_key  # noqa: E402
from negsynth.train.sampler import CurriculumBatchSampler, plan_batches, split_global_batches  # noqa: E402


def _rank_batches(sampler, world: int) -> list[list[list[int]]]:
    """What each rank's dataloader gets: accelerate wraps the trainer's batch sampler in
    ``BatchSamplerShard`` (split_batches=False, even_batches=False, as the ST trainer sets)."""
    from accelerate.data_loader import BatchSamplerShard

    return [
        list(BatchSamplerShard(sampler, num_processes=world, process_index=r, split_batches=False, even_batches=False))
        for r in range(world)
    ]


def test_sampler_slices_global_batches_per_rank():
    # SciFact-like collisions (shared positives, a repeated query) and phases of uneven length
    n = 30
    rows = {
        "anchor": [f"q{i % 26}" for i in range(n)],
        "positive": [f"p{i % 11}" for i in range(n)],
        "negative": [f"n{i}" for i in range(n)],
    }
    phases = [1] * 14 + [2] * 10 + [3] * 6
    ds = datasets.Dataset.from_dict(rows)
    single = list(CurriculumBatchSampler(ds, batch_size=8, phases=phases, num_replicas=1))
    for world in (2, 4):
        s = CurriculumBatchSampler(ds, batch_size=8 // world, phases=phases, num_replicas=world)
        assert s.global_batches == plan_batches(list(zip(*rows.values())), 8, phases=phases)[0]
        per_rank = _rank_batches(s, world)
        assert len({len(b) for b in per_rank}) == 1  # every rank takes the same number of steps
        # the global batches are the single-process batches, minus the uneven tail of a short one
        expected = [ref[: len(ref) - len(ref) % world] for ref in single if len(ref) >= world]
        assert len(per_rank[0]) == len(expected)
        for step, slices in enumerate(zip(*per_rank)):
            assert len({len(x) for x in slices}) == 1  # equal shapes for the all_gather
            glob = [i for x in slices for i in x]
            assert {phases[i] for i in glob} == {phases[glob[0]]}  # one phase on all ranks
            texts = [text_key(ds[i][c]) for i in glob for c in ds.column_names]
            assert len(texts) == len(set(texts))  # no text twice in the global batch
            assert glob == expected[step]
        assert sum(len(b) for b in s.global_batches) - sum(len(b) for b in s.batches) == s.counts["dropped_uneven"]


def test_split_global_batches_keeps_whole_batches():
    slices, dropped = split_global_batches([[0, 1, 2, 3], [4, 5, 6], [7]], 2)
    assert slices == [[0, 1], [2, 3], [4], [5]] and dropped == 2


def test_trainer_gives_each_rank_its_slice(tmp_path, monkeypatch):
    """make_trainer under a launcher: per-device batch = global / W and the sampler the HF trainer
    builds plans global batches (world size read from the launcher's environment)."""
    from negsynth.schemas.train import TrainConfig
    from negsynth.train.distributed import per_device_batch_size
    from negsynth.train.sampler import curriculum_batch_sampler

    assert per_device_batch_size(8, 2) == 4
    with pytest.raises(ValueError, match="multiple of the 3 processes"):
        per_device_batch_size(8, 3)
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = datasets.Dataset.from_dict({"anchor": [f"a{i}" for i in range(8)], "positive": [f"p{i}" for i in range(8)]})
    s = curriculum_batch_sampler([1] * 8)(ds, batch_size=per_device_batch_size(TrainConfig(batch_size=4).batch_size))
    assert s.global_batches == [[0, 1, 2, 3], [4, 5, 6, 7]] and s.batches == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert s.batch_size is None


# ----------------------------------------------------------------------------- real 2-process run


def _tiny_model(folder: Path) -> Path:
    """A 2-layer BERT (hidden 32, no dropout, so both runs draw no random masks) with MiniLM's
    tokenizer, saved as a transformers folder."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from negsynth.resources import MissingResource, minilm_path

    try:
        tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    except MissingResource as e:
        pytest.skip(str(e))
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    BertModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _curriculum(folder: Path) -> Path:
    n = 16
    words = "cell gene protein tumour virus drug dose trial brain heart lung liver blood bone skin immune".split()
    ds = datasets.Dataset.from_dict(
        {
            "anchor": [f"what does the {w} study {i} claim" for i, w in enumerate(words[:n])],
            "positive": [f"the {w} result {i} shows an effect" for i, w in enumerate(words[:n])],
            "negative": [f"an unrelated note {i} about {words[(i + 5) % n]}" for i in range(n)],
            "phase": [1] * 8 + [2] * 8,
            "level": [4] * 8 + [3] * 8,
        }
    )
    ds.save_to_disk(str(folder))
    return folder


def _run_dir(folder: Path, data: Path) -> Path:
    """A run dir whose curriculum is the rows of ``data``, in batches of 4."""
    from negsynth.data.curriculum import save_curriculum

    rows = datasets.load_from_disk(str(data)).to_list()
    for i, r in enumerate(rows):
        r.update(batch=i // 4, task_type="short-short", example_id=f"ex{i}", source="synthetic")
    save_curriculum(rows, folder / "curriculum", stats={"schedule": "curriculum", "batch_size": 4})
    (folder / "curriculum" / "stats.json").write_text(json.dumps({"stage": "curriculum", "rows": len(rows)}))
    return folder


def _env() -> dict:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(Path(__file__).parents[1]),
    }
    env.pop("WORLD_SIZE", None)
    return env


@pytest.mark.slow  # ~80 s on the shared 2-core machine: three interpreters import torch + transformers
def test_two_process_torchrun_matches_one_process(tmp_path):
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun not on PATH")
    model = _tiny_model(tmp_path / "tiny")
    data = _curriculum(tmp_path / "data")
    sets = [f"train.model='{model}'", "train.batch_size=4", "train.grad_accum=1", "train.lr=1e-3", "train.max_length=16"]
    sets += ["train.temperature=0.05", "train.save_steps=1000", "train.logging_steps=1", "train.seed=7"]
    args = ["-m", "negsynth", "train", "--json", *[a for s in sets for a in ("--set", s)]]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    for cmd, k in (([sys.executable], "one"), (torchrun, "two")):
        p = subprocess.run(
            [*cmd, *args, "-d", str(_run_dir(tmp_path / k, data))], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stderr[-4000:]

    logs = {}
    for k in ("one", "two"):
        hist = json.loads((tmp_path / k / "train" / "final" / "train_log.json").read_text())["log_history"]
        logs[k] = [(e["loss"], e.get("phase")) for e in hist if "loss" in e]
    assert len(logs["one"]) == len(logs["two"]) == 4  # 16 rows / global batch 4
    assert [p for _, p in logs["one"]] == [p for _, p in logs["two"]] == [1, 1, 2, 2]
    assert [loss for loss, _ in logs["one"]] == pytest.approx([loss for loss, _ in logs["two"]], rel=1e-4, abs=1e-5)
    assert logs["one"][-1][0] < logs["one"][0][0]  # it did learn

    from sentence_transformers import SentenceTransformer

    m1 = SentenceTransformer(str(tmp_path / "one" / "train" / "final"), device="cpu")
    m2 = SentenceTransformer(str(tmp_path / "two" / "train" / "final"), device="cpu")
    sd1, sd2 = m1.state_dict(), m2.state_dict()
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        torch.testing.assert_close(sd1[k], sd2[k], rtol=1e-4, atol=1e-5)
    base = SentenceTransformer(str(model), device="cpu")
    assert not torch.allclose(base[0].auto_model.embeddings.word_embeddings.weight, m1[0].auto_model.embeddings.word_embeddings.weight)


@pytest.mark.slow  # two torchrun launches of 2 interpreters each (~1-2 min on the shared machine)
def test_negsynth_train_under_torchrun_trains_once_and_rank0_alone_speaks(tmp_path):
    """`torchrun -m negsynth train` takes the launcher's ranks: one JSON on stdout (rank 0's), the
    manifest and stats written, exit 0; relaunched, rank 0 finds the model up to date and the
    other rank exits with it instead of waiting for a training that never starts."""
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun not on PATH")
    model = _tiny_model(tmp_path / "tiny")
    rd = _run_dir(tmp_path / "run", _curriculum(tmp_path / "data"))
    sets = [f"train.model='{model}'", "train.batch_size=4", "train.grad_accum=1", "train.max_length=16", "train.save_steps=1000"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "negsynth", "train"]
    cmd += ["-d", str(rd), "--json", *[a for s in sets for a in ("--set", s)]]
    env = _env()
    for attempt in ("trains", "up to date"):
        p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        assert p.returncode == 0, (attempt, p.stderr[-4000:])
        stats = json.loads(p.stdout)  # one JSON document: rank 1 printed nothing
        assert stats["steps"] == 4, stats  # 16 rows / global batch 4, split over the 2 ranks
        assert "Traceback" not in p.stderr, p.stderr[-4000:]
    assert json.loads((rd / "manifest.json").read_text())["stages"]["train"]
    assert json.loads((rd / "train" / "stats.json").read_text())["steps"] == 4


def test_negsynth_run_under_a_launcher_says_in_one_line_what_to_type(tmp_path, monkeypatch):
    """Every rank of ``torchrun -m negsynth run`` would call the LLM: the command refuses before
    any work, exit 2, and names the three commands (data stages, train under the launcher, the rest)."""
    from typer.testing import CliRunner

    from negsynth.cli import app

    monkeypatch.setenv("WORLD_SIZE", "2")
    r = CliRunner().invoke(app, ["run", "-d", str(tmp_path / "run"), "--stages", "corpus,score,curriculum,train,evaluate"])
    assert r.exit_code == 2, r.output
    msg = " ".join(r.output.split())
    assert "WORLD_SIZE=2" in msg and "Traceback" not in r.output
    assert "--stages corpus,score,curriculum ;" in msg
    assert "torchrun --nproc_per_node 2 -m negsynth train" in msg and "--stages evaluate" in msg
    assert not (tmp_path / "run" / "corpus").exists()
