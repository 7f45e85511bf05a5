"""What makes the data improve a model: the trainer's batch sampler, temperature by model family,
portable pooling, measured difficulty levels and multi-granularity mined negatives."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")

from negsynth.data.text import text_key  # noqa: E402
from negsynth.schemas.train import TrainConfig  # noqa: E402
from negsynth.train.sampler import CurriculumBatchSampler, plan_batches  # noqa: E402


def _texts_per_batch(ds, batches):
    cols = [c for c in ds.column_names if c not in ("phase", "level")]
    return [[text_key(ds[i][c]) for i in b for c in cols] for b in batches]


# ----------------------------------------------------------------------------- sampler


def test_sampler_never_repeats_a_text_and_keeps_order():
    # SciFact-like: several queries share a positive, two rows repeat a query
    rows = {
        "anchor": [f"q{i}" for i in range(10)] + ["q1", "Q3 "],
        "positive": ["p0", "p0", "p1", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9"],
    }
    ds = datasets.Dataset.from_dict(rows)
    s = CurriculumBatchSampler(ds, batch_size=4)
    batches = list(s)
    assert sorted(i for b in batches for i in b) == list(range(12))  # every row once, none dropped
    for texts in _texts_per_batch(ds, batches):
        assert len(texts) == len(set(texts)), texts
    firsts = [b[0] for b in batches]
    assert firsts == sorted(firsts)  # batches open in dataset order
    for b in batches:
        assert b == sorted(b)  # rows keep their order inside a batch
    assert s.counts["moved"] > 0


def test_sampler_is_identity_on_a_clean_curriculum_and_never_mixes_phases():
    rows = [(f"a{i}", f"p{i}", f"n{i}") for i in range(12)]
    batches, counts = plan_batches(rows, 4, phases=[1] * 4 + [2] * 4 + [3] * 4)
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] and counts["moved"] == 0
    # a phase of 6 rows with batch 4: the leftover 2 stay in their own phase's (short) batch
    batches, _ = plan_batches(rows, 4, phases=[1] * 6 + [2] * 6)
    assert batches == [[0, 1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
    batches, counts = plan_batches(rows, 4, phases=[1] * 6 + [2] * 6, drop_last=True)
    assert batches == [[0, 1, 2, 3], [6, 7, 8, 9]] and counts["dropped_incomplete"] == 4


def test_sampler_skips_a_row_that_repeats_its_own_text():
    batches, counts = plan_batches([("a", "p", "p"), ("b", "q", "r")], 2)
    assert batches == [[1]] and counts["skipped_self_duplicate"] == 1


def test_trainer_batches_have_no_duplicates_for_any_dataset(minilm, tmp_path):
    from negsynth.train.trainer import make_trainer

    n = 40
    ds = datasets.Dataset.from_dict(
        {"anchor": [f"claim {i % 30}" for i in range(n)], "positive": [f"abstract {i % 7}" for i in range(n)], "level": [1] * n}
    )
    trainer, _ = make_trainer(ds, TrainConfig(model=minilm, batch_size=8, max_steps=1, max_length=16, output_dir=str(tmp_path)))
    assert trainer.train_dataset.column_names == ["anchor", "positive"]  # metadata is not an input
    loader = trainer.get_train_dataloader()
    sampler = loader.batch_sampler
    seen_rows = 0
    for b in sampler:
        texts = [t for i in b for t in (ds[i]["anchor"], ds[i]["positive"])]
        assert len(texts) == len(set(texts))
        seen_rows += len(b)
    assert seen_rows == n


# ----------------------------------------------------------------------------- defaults


def test_temperature_defaults_by_model_family(minilm, tmp_path):
    from negsynth.train.trainer import make_trainer, resolve_temperature

    assert resolve_temperature(TrainConfig(), is_decoder=False) == 0.05
    assert resolve_temperature(TrainConfig(), is_decoder=True) == 0.02
    assert resolve_temperature(TrainConfig(temperature=0.1), is_decoder=True) == 0.1
    ds = datasets.Dataset.from_dict({"anchor": ["a", "b"], "positive": ["c", "d"], "negative": ["e", "f"]})
    trainer, _ = make_trainer(ds, TrainConfig(model=minilm, batch_size=2, max_steps=1, max_length=16, output_dir=str(tmp_path)))
    assert trainer.loss.scale == pytest.approx(20.0)  # MiniLM was pretrained with MNRL scale 20
    assert trainer.args.max_grad_norm == 1.0 and trainer.args.warmup_steps == pytest.approx(0.1)


def test_ntuple_rows_use_every_negative_column(minilm, tmp_path):
    from negsynth.train.trainer import make_trainer

    ds = datasets.Dataset.from_dict(
        {"anchor": ["a", "b"], "positive": ["c", "d"], "negative_1": ["e", "f"], "negative_2": ["g", "h"], "phase": [1, 1]}
    )
    trainer, _ = make_trainer(ds, TrainConfig(model=minilm, batch_size=2, max_steps=1, max_length=16, output_dir=str(tmp_path)))
    assert trainer.train_dataset.column_names == ["anchor", "positive", "negative_1", "negative_2"]


# ----------------------------------------------------------------------------- portable models


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_trained_model_loads_with_plain_sentence_transformer(minilm, tmp_path, pooling):
    """No trust_remote_code: what MTEB, vector databases and most user code do."""
    from sentence_transformers import SentenceTransformer

    from negsynth.train.trainer import make_trainer

    ds = datasets.Dataset.from_dict(
        {
            "anchor": ["a red fox", "blue sea", "old oak"],
            "positive": ["fox", "sea water", "oak tree"],
            "negative": ["car", "desert", "metal"],
        }
    )
    cfg = TrainConfig(model=minilm, pooling=pooling, batch_size=3, max_steps=2, lr=1e-3, max_length=16, output_dir=str(tmp_path / "run"))
    trainer, model = make_trainer(ds, cfg)
    trainer.train()
    texts = ["a cat sat on the mat", "rivers flow to the sea", "x"]
    e1 = model.encode(texts, convert_to_numpy=True)
    model.save(str(tmp_path / "m"))
    m2 = SentenceTransformer(str(tmp_path / "m"), device="cpu")  # plain load
    names = [type(m).__name__ for m in m2]
    assert names == ["Transformer", "Pooling", "Normalize"], names  # MiniLM ends in Normalize: kept
    np.testing.assert_allclose(e1, m2.encode(texts, convert_to_numpy=True), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(e1, axis=1), 1.0, atol=1e-5)


def test_ata_model_still_needs_trust_remote_code(minilm, tmp_path):
    from sentence_transformers import SentenceTransformer

    from negsynth.train.trainer import build_model

    build_model(TrainConfig(model=minilm, pooling="ata", max_length=16), device="cpu").save(str(tmp_path / "m"))
    m = SentenceTransformer(str(tmp_path / "m"), device="cpu", trust_remote_code=True)
    assert type(m[1]).__name__ == "EmbeddingPooling"


# ----------------------------------------------------------------------------- measured levels


def test_measured_policy_drops_false_negatives_and_orders_by_cosine():
    from negsynth.schemas.config import ScoreConfig
    from negsynth.stages.score import apply_policy

    row = {"id": "e1", "negatives": ["n0", "n1", "n2", "n3"], "usage": {}}
    m = {
        "cos_pos": 0.8,
        "cos_neg": [0.2, 0.79, 0.5, 0.6],
        "false_negative": [False, True, False, False],
        "too_easy": [False] * 4,
        "kendall_tau": -0.3,
        "monotonic": False,
    }
    out, rej = apply_policy(row, m, ScoreConfig(policy="measured", min_negatives=3), "st:x")
    assert rej is None and out["negatives"] == ["n3", "n2", "n0"]  # the false negative is gone, hardest first
    assert out["score"]["cos_neg"] == [0.6, 0.5, 0.2] and out["score"]["llm_order"] == [3, 2, 0]
    out, rej = apply_policy(row, m, ScoreConfig(policy="measured"), "st:x")  # default min_negatives 4
    assert out is None and rej["reason"] == "false_negative"
    easy = {**m, "false_negative": [False] * 4, "too_easy": [True, False, False, False]}
    out, rej = apply_policy(row, easy, ScoreConfig(policy="measured"), "st:x")
    assert rej is None and out["negatives"] == ["n1", "n3", "n2", "n0"]  # too easy is kept (as the easiest level)
    assert ScoreConfig().policy == "measured"


def test_curriculum_anchor_follows_evaluation_format():
    from negsynth.schemas.config import RunConfig
    from negsynth.stages.curriculum import anchor_template

    cfg = RunConfig()
    assert anchor_template(cfg) is None  # MiniLM evaluated without instructions: trained without them
    cfg.evaluate.instruct_queries = True
    assert "{query}" in anchor_template(cfg)
    cfg.evaluate.instruct_queries = False
    cfg.curriculum.instructions = "on"
    assert "{query}" in anchor_template(cfg)


# ----------------------------------------------------------------------------- mining


def test_mining_is_positive_aware_and_hardest_first(minilm):
    from sentence_transformers import SentenceTransformer

    from negsynth.embed.mining import mine_negatives

    model = SentenceTransformer(minilm, device="cpu")
    topic = [
        "The heart pumps blood through the arteries of the body.",
        "Blood pressure rises when arteries stiffen with age.",
        "Red blood cells carry oxygen from the lungs.",
        "The liver filters toxins out of the blood.",
        "Plants turn sunlight into sugar by photosynthesis.",
        "Volcanoes erupt when magma pressure builds up.",
        "The stock market fell sharply on Monday.",
        "A recipe for chocolate cake with cream.",
        "Football teams train twice a day in summer.",
        "The novel describes a journey across the desert.",
    ]
    positive = "The heart pumps blood around the body through arteries and veins."
    corpus = topic + [positive + " "]  # a near-copy of the positive must never come back as a negative
    found = mine_negatives(model, {"q": "How does the heart move blood?"}, {"q": [positive]}, corpus, 4, relative_margin=0.05)
    f = found["q"]
    assert len(f["negatives"]) == 4
    assert f["scores"] == sorted(f["scores"], reverse=True)  # level 1 hardest ... level 4 easiest
    assert all(s < 0.95 * f["pos_score"] for s in f["scores"])
    assert positive + " " not in f["negatives"] and positive not in f["negatives"]
