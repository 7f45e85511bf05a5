"""The benchmarks' shared harness and their arm names: repetitions rotate the arms, run files layer
key by key, and every arm a documented command names resolves (an unknown one is one line)."""

from __future__ import annotations

import pytest
from helpers import load_benchmark


def test_repetitions_rotate_the_arms_and_note_the_load():
    harness = load_benchmark("harness")
    order = []
    runs = harness.interleaved(["a", "b", "c"], 3, lambda arm, rep: order.append((rep, arm)) or {"x": 1.0})
    assert order == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"), (2, "c"), (2, "a"), (2, "b")]
    assert all(len(v) == 3 and all("load" in r for r in v) for v in runs.values())
    assert harness.median([{"s": 3.0}, {"s": 1.0}, {"s": None}, {}], "s") == 2.0


def test_run_files_layer_key_by_key():
    harness = load_benchmark("harness")
    base = {"train": {"batch_size": 32, "lr": 2e-5}, "corpus": {"inputs": [{"path": "a"}]}}
    got = harness.layered(base, {"train": {"batch_size": 12}, "score": {"dedup": False}})
    assert got == {"train": {"batch_size": 12, "lr": 2e-5}, "corpus": {"inputs": [{"path": "a"}]}, "score": {"dedup": False}}
    assert base["train"]["batch_size"] == 32  # the protocol itself is left as it was


def test_the_documented_fleet_and_training_arms_resolve():
    fleet = load_benchmark("llm_fleet")
    assert fleet.arm_sets("fleet2", 2) == ["serve.servers=2", "serve.n_threads=1", "serve.prompt_cache=pinned"]
    assert (
        fleet.arm_sets("fleet16-whole", 2)[2] == "serve.prompt_cache=off" and fleet.arm_sets("fleet2-pc", 2)[2] == "serve.prompt_cache=on"
    )
    assert fleet.arm_sets("single", 4)[1] == "serve.n_threads=4" and fleet.arm_sets("single-auto", 4)[1] == "serve.n_threads=0"
    assert fleet.arm_sets("single16", 4)[1] == "serve.n_threads=16"
    step = load_benchmark("train_step")
    assert step.settings("gc+cached8") == {"gradient_checkpointing": True, "mini_batch_size": 8}
    assert step.settings("eager+ata") == {"attn_implementation": "eager", "pooling": "ata"} and step.settings("base") == {}
    for bad in (lambda: fleet.arm_sets("fleet", 2), lambda: step.settings("cached")):
        with pytest.raises(SystemExit, match="unknown"):
            bad()


def test_decoder_arms_are_valid_embedder_and_trainer_settings():
    from negsynth.schemas.config import EmbedderConfig
    from negsynth.train import TrainConfig

    dec = load_benchmark("decoder_sts")
    for sets in dec.ZERO_SHOT.values():
        EmbedderConfig(kind="decoder", **sets)  # a bad template or method would raise here
    for sets in dec.TRAINED.values():
        TrainConfig(model="smollm2", **sets)
    assert dec.text_key("  The cat.") == dec.text_key("the   CAT") == "the cat"
