"""Options removed from the package (measured to tie or trail; their figures stay in docs/): a run
file or ``--set`` that still names one is refused in one line that says what to use instead, and
the config hashes of the sections they left are what run dirs made before recorded, so those run
dirs resume with no request paid again."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.schemas.config import CorpusConfig, CurriculumConfig, EmbedderConfig, MiningConfig, RegenerateConfig, ScoreConfig
from negsynth.schemas.config_io import config_hash

# (section, key, value as TOML, what the line names as removed, what it says to use instead)
REMOVED = [
    ("corpus", "teacher", '"hybrid"', "teacher = 'hybrid'", 'use "cross-encoder" (with corpus.teacher_model) or "none"'),
    ("corpus", "teacher", '"llm-likelihood"', "teacher = 'llm-likelihood'", 'use "cross-encoder"'),
    ("corpus", "teacher", '"hybrid+llm-likelihood"', "teacher = 'hybrid+llm-likelihood'", 'use "cross-encoder"'),
    ("corpus", "likelihood", '"embedded"', "likelihood", 'the teacher is corpus.teacher = "cross-encoder"'),
    ("corpus", "negatives", '"mined"', "negatives", "corpus always mines its negatives"),
    ("corpus", "negatives", '"mixed"', "negatives", "corpus always mines its negatives"),
    ("corpus", "max_doc_chars", "400", "max_doc_chars", "which corpus no longer asks for; delete the key"),
    ("corpus", "queries", '"llm+title"', "queries = 'llm+title'", 'use "llm" (or "title" alone'),
    ("corpus", "queries", '"llm+sentence"', "queries = 'llm+sentence'", 'use "llm"'),
    ("corpus", "queries", '"sentence"', "queries = 'sentence'", 'use "llm" (or "title" alone, the no-LLM floor)'),
    ("curriculum", "incomplete_batches", '"drop"', "incomplete_batches", "always train as short batches"),
    ("curriculum", "balance", '"queries"', "balance", "a pass is every example once"),
    ("curriculum", "schedule", '"reverse"', "schedule = 'reverse'", "choose auto, curriculum, tuple, tuple:K or stock"),
    ("curriculum", "schedule", '"random"', "schedule = 'random'", "choose auto, curriculum, tuple, tuple:K or stock"),
    ("curriculum", "schedule", '"fixed:2"', "schedule = 'fixed:2'", "choose auto, curriculum, tuple, tuple:K or stock"),
    ("regenerate", "teacher", '"llm-likelihood"', "teacher = 'llm-likelihood'", 'use "cross-encoder" (with regenerate.teacher_model)'),
    ("regenerate", "likelihood", '"llm"', "likelihood", 'the teacher is regenerate.teacher = "cross-encoder"'),
    ("regenerate.mining", "strategy", '"graded"', "strategy", 'the old default, "top"'),
    ("regenerate.mining", "bands", "[[1, 2], [3, 5]]", "bands", "delete the key"),
    ("corpus.mining", "seed", "3", "seed", "delete the key"),
    ("train", "hardness_mode", '"hard_negatives"', "hardness_mode", "InfoNCE weighs every negative alike"),
    ("train", "hardness_strength", "5.0", "hardness_strength", "delete the key"),
    ("train", "no_duplicates", "false", "no_duplicates", "every batch keeps each text once"),
    ("train", "check_batches", "false", "check_batches", "nothing to check"),
    ("train", "ata_pool", '"all"', "ata_pool", 'the old default, "embed_mask"'),
    ("train", "pooling", '"latent"', "pooling = 'latent'", 'use "ata" (or "mean")'),
    ("train", "latent_num", "16", "latent_num", "delete the key"),
    ("train", "latent_heads", "4", "latent_heads", "delete the key"),
    ("evaluate", "backend", '"onnx"', "backend = 'onnx'", 'use "openvino" (the same export, faster) or "torch"'),
    ("embedder", "backend", '"onnx-int8"', "backend = 'onnx-int8'", 'use "openvino"'),
    ("embedder", "reba_variant", '"code"', "reba_variant", "ReBA pools the paper's e_n"),
    ("generate", "worked_examples", '"fixed"', "worked_examples", 'the old default, "rotate"'),
    ("score", "easy_margin", "0.1", "easy_margin", "no example is rejected as too easy"),
    ("score", "dedup_labelled", '"near"', "dedup_labelled", "a dataset's pairs go only as exact duplicates"),
    (
        "score",
        "judge_model",
        '"llm"',
        "judge_model = 'llm'",
        "use a cross-encoder (its folder or hub name) as the judge, or delete the key",
    ),
]


@pytest.mark.parametrize("section, key, value, named, instead", REMOVED, ids=[f"{s}.{k}={v}" for s, k, v, *_ in REMOVED])
@pytest.mark.parametrize("where", ["file", "set"])
def test_a_removed_option_is_one_line_that_says_what_to_use_instead(tmp_path, section, key, value, named, instead, where):
    if where == "file":
        f = tmp_path / "run.toml"
        f.write_text(f"[{section}]\n{key} = {value}\n")
        args = ["config", "-c", str(f)]
    else:
        args = ["config", "--set", f"{section}.{key}={value}"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code != 0 and "Traceback" not in r.output
    line = r.output.strip()
    assert "\n" not in line, line
    doc = {
        "train": "docs/train.md",
        "train.ata_pool": "docs/zeroshot.md",
        "train.pooling": "docs/zeroshot.md",
        "train.latent_num": "docs/zeroshot.md",
        "train.latent_heads": "docs/zeroshot.md",
        "evaluate.backend": "docs/benchmarks.md",
        "embedder.backend": "docs/benchmarks.md",
        "embedder.reba_variant": "docs/zeroshot.md",
        "generate.worked_examples": "docs/demo.md",
        "regenerate.mining": "docs/recipe.md",
        "corpus.mining": "docs/recipe.md",
        "curriculum.schedule": "docs/recipe.md",
        "score.easy_margin": "docs/recipe.md",
        "score.dedup_labelled": "docs/recipe.md",
        "score.judge_model": "docs/recipe.md",
    }
    doc = doc.get(f"{section}.{key}", doc.get(section, "docs/corpus.md"))
    why = "no measurement showed a gain" if (section, key) == ("corpus", "queries") else "measured no gain"
    assert f"[{section}] {named} was removed ({why}: {doc}); " in line and instead in line, line


@pytest.mark.parametrize(
    "section, key, value, why",
    [
        ("llm", "transport", '"http1"', "every request goes through the openai SDK"),
        ("serve", "engine", '"llama-cpp-python"', "the embedded LLM is llama.cpp's llama-server only"),
        ("embedder", "devices", "2", "--executor ray --workers N spreads the embedding over devices"),
        ("embedder", "padding_side", '"left"', "the decoder embedder's answers are the same on either side"),
        ("train", "ata_detach", "true", "an ablation never measured to help: ATA's weights always get gradients"),
    ],
)
def test_a_removed_transport_or_engine_is_one_line_that_says_why(tmp_path, section, key, value, why):
    f = tmp_path / "run.toml"
    f.write_text(f"[{section}]\n{key} = {value}\n")
    r = CliRunner().invoke(app, ["config", "-c", str(f)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    line = r.output.strip()
    assert "\n" not in line and f"[{section}] {key} was removed ({why}); delete the key" in line, line


# (section, its hash as a value, its hash inside a stage's parts dict, which reads its repr): the
# figures of the code before the options left. The corpus section's value hashes moved once, when
# ``chunk_tokens``' default went from 224 to 0 (whole documents); no stage hashes that value: they
# read the repr, which leaves the chunk settings out, and add them only where a document is split
# (the stage digests pinned below did not move)
PINNED = [
    (CorpusConfig(), "e4144555cf491736", "21df7691f2b47936"),
    (
        CorpusConfig(
            teacher="cross-encoder",
            teacher_model="m",
            teacher_k=3,
            queries="title",
            queries_per_doc=1,
            candidates="hybrid",
            round_trip_k=5,
        ),
        "d31d189fec4435c2",
        "8efa4c99dc3bf086",
    ),
    (RegenerateConfig(), "d25c71042daa8066", "80cdbaeefd0c6e77"),
    (RegenerateConfig(negatives="mined", mine=20, teacher="cross-encoder", teacher_model="m"), "0ff5b20f93879ee4", "7e907706a2fc25ce"),
    (CurriculumConfig(), "305f0e5b36bc429a", "54cea7ac60d4ddc0"),
    (MiningConfig(), "8323e35b406b3cdc", "5aebbf3fddf3db0b"),
    (RegenerateConfig(negatives="mined", mining={"relative_margin": 0.1, "range_max": 50}), "a049bfec23163511", "f5572fb0c441e89f"),
    (CurriculumConfig(schedule="tuple", epochs=2, instructions="off"), "fda436c5860bd4a1", "691e1969071040f5"),
    (EmbedderConfig(), "0cbb13c00d59742b", "83f4711d562968bc"),
    (EmbedderConfig(kind="decoder", model="m", method="echo"), "700ee96340985f60", "d29cca92c46021fc"),
    (ScoreConfig(), "f2504d635d7eba62", "236571a81eaf073c"),
    (
        ScoreConfig(policy="filter", judge_model="cross-encoder/ms-marco-MiniLM-L6-v2", dedup_threshold=None, decontam_sets=[]),
        "6d1b44803ca1a108",
        "ca512eb33a9fdd28",
    ),
]


@pytest.mark.parametrize(
    "section, as_value, in_parts",
    PINNED,
    ids=[
        "corpus",
        "corpus-set",
        "regenerate",
        "regenerate-set",
        "curriculum",
        "mining",
        "regenerate-mining-set",
        "curriculum-set",
        "embedder",
        "embedder-set",
        "score",
        "score-set",
    ],
)
def test_the_sections_hash_as_before_the_options_left(section, as_value, in_parts):
    assert config_hash(section) == as_value
    assert config_hash({"x": section}) == in_parts


def test_the_whole_run_config_hashes_as_before():
    """Every section as before; ``score.inputs`` now defaults to ``"auto"``, which score hashes as
    the list of stages it names (the old default), so with that list the whole config is the old one
    (as a value: moved once with ``corpus.chunk_tokens``' default, see PINNED; the repr, which stages
    read, did not)."""
    from negsynth.schemas.config_io import load_config

    cfg = load_config()
    assert config_hash(cfg) == "262cbb316869f474" and config_hash({"x": cfg}) == "31efbb6705e270f0"
    cfg.score.inputs = ["generate", "regenerate", "corpus"]
    assert config_hash(cfg) == "d3789d38af6fd6a1" and config_hash({"x": cfg}) == "5b51bfbfadb0aeee"


@pytest.mark.parametrize(
    "corpus, pinned",
    [
        ({}, "891884e32fa1bfac"),
        ({"teacher": "cross-encoder", "teacher_model": "m", "candidates": "hybrid"}, "042c8612bd78160a"),
        ({"queries": "title"}, "698eb77139c3c43e"),
    ],
    ids=["defaults", "cross-encoder-hybrid", "title"],
)
def test_the_corpus_stages_digest_is_what_an_older_run_dir_recorded(tmp_path, monkeypatch, corpus, pinned):
    """The whole digest of a corpus run (section, LLM, prompts, documents, embedder)."""
    from negsynth.pipeline.context import StageContext
    from negsynth.schemas.config import RunConfig
    from negsynth.stages.corpus import STAGE

    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    for i in range(6):
        (tmp_path / "docs" / f"{i}.md").write_text(f"# Note {i}\n\nThe note number {i} is about tides and moons.\n")
    cfg = RunConfig.model_validate({"corpus": {"inputs": [{"path": "docs"}], **corpus}})
    assert STAGE.made_from(StageContext(cfg=cfg, run_dir=tmp_path / "run"))["config_hash"] == pinned


@pytest.mark.parametrize(
    "regenerate, pinned",
    [({}, "bf31e68f6eec1198"), ({"negatives": "mined", "mine": 20, "teacher": "cross-encoder", "teacher_model": "m"}, "e2012a89f2639a14")],
    ids=["llm", "mined-cross-encoder"],
)
def test_the_regenerate_stages_digest_is_what_an_older_run_dir_recorded(tmp_path, regenerate, pinned):
    from negsynth.pipeline.context import StageContext
    from negsynth.schemas.config import RunConfig
    from negsynth.stages.regenerate import STAGE

    cfg = RunConfig.model_validate({"regenerate": regenerate})
    assert STAGE.made_from(StageContext(cfg=cfg, run_dir=tmp_path / "run"))["config_hash"] == pinned


@pytest.mark.parametrize(
    "train, settings, as_repr",
    [
        ({}, "ec2a8e477e53a433", "6d3d52d04b246b74"),
        ({"batch_size": 8, "loss": "margin-mse", "pooling": "ata"}, "805d3803667af17e", "d30974e444e29e02"),
    ],
    ids=["defaults", "set"],
)
def test_the_train_settings_hash_as_before_the_options_left(train, settings, as_repr):
    """What the train stage's fingerprint hashes (its settings) and the section's repr, as before
    hardness weighting, no_duplicates and check_batches left ``[train]``."""
    from negsynth.schemas.config import added_at_default
    from negsynth.schemas.train import TrainConfig

    tc = TrainConfig(**train)
    assert config_hash(added_at_default(tc, tc.model_dump(exclude={"resume", "output_dir", "device"}))) == settings
    assert config_hash({"x": tc}) == as_repr
