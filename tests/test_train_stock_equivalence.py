"""negsynth's trainer against sentence-transformers' stock recipe on the same rows.

The recipe benchmarks compare negsynth's path with the stock recipe (``benchmarks/harness.py``:
``SentenceTransformerTrainer`` + ``MultipleNegativesRankingLoss``, ``NO_DUPLICATES``, 10 % warmup).
Every tenth of a point between the two must be attributable to a named setting, so: with the stock
recipe's sampler (``batch_sampler = "shuffled"``) and one forward pass per batch
(``mini_batch_size = "off"``), negsynth's trainer must give the stock recipe's model bit for bit;
and the settings negsynth adds (its order-keeping sampler, GradCache chunks) must each change it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

STOCK = Path(__file__).resolve().parents[1] / "benchmarks" / "harness.py"
PROBE = ["a query about topic 3", "a document discussing topic 5 in detail", "unrelated text on subject 2"]


def _harness():
    """``benchmarks/harness.py``: the stock recipe as the benchmarks run it (loaded once)."""
    if "_negsynth_bench_stock" not in sys.modules:
        spec = importlib.util.spec_from_file_location("_negsynth_bench_stock", STOCK)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["_negsynth_bench_stock"]


def _stock_recipe():
    return _harness().train_stock_recipe


def _rows():
    from datasets import Dataset

    n = 24
    return Dataset.from_dict(
        {
            "anchor": [f"query number {i} about topic {i % 7}" for i in range(n)],
            "positive": [f"document {i} discussing topic {i % 7} in detail" for i in range(n)],
            "negative_1": [f"unrelated text {i} on subject {(i + 3) % 11}" for i in range(n)],
        }
    )


@pytest.fixture(scope="module")
def stock_embeddings(minilm, tmp_path_factory):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(minilm, device="cpu")
    _stock_recipe()(model, _rows(), tmp_path_factory.mktemp("stock"), batch_size=8, lr=5e-5, seed=3, max_length=48, steps=4)
    return model.encode(PROBE, convert_to_tensor=True)


def _negsynth_embeddings(minilm, tmp_path, **settings):
    from sentence_transformers import SentenceTransformer

    from negsynth.train import TrainConfig, make_trainer

    shared = {"batch_size": 8, "grad_accum": 1, "lr": 5e-5, "max_steps": 4, "max_length": 48, "seed": 3, "save_steps": 10**6}
    cfg = TrainConfig(model=minilm, output_dir=str(tmp_path / "ns"), **{**shared, **settings})
    # the base model loaded as the stock recipe loads it: what differs is the trainer alone
    trainer, model = make_trainer(_rows(), cfg, model=SentenceTransformer(minilm, device="cpu"))
    trainer.train()
    model.max_seq_length = 256
    return model.encode(PROBE, convert_to_tensor=True)


def test_with_the_stock_sampler_and_one_pass_per_batch_negsynths_trainer_is_the_stock_recipe(minilm, tmp_path, stock_embeddings):
    import torch

    mine = _negsynth_embeddings(minilm, tmp_path, batch_sampler="shuffled", mini_batch_size="off")
    assert torch.equal(mine, stock_embeddings), (mine - stock_embeddings).abs().max().item()


@pytest.mark.parametrize(
    "settings",
    [
        {"batch_sampler": "ordered", "mini_batch_size": "off"},  # negsynth's sampler: the rows' order kept
        {"batch_sampler": "shuffled", "mini_batch_size": 4},  # GradCache chunks: the same loss, other float sums and dropout draws
        {"batch_sampler": "shuffled", "mini_batch_size": "off", "lr": 4e-5},  # the comparison can tell one setting apart
    ],
    ids=["ordered-sampler", "gradcache", "lr"],
)
def test_each_setting_negsynth_adds_changes_the_model(minilm, tmp_path, stock_embeddings, settings):
    import torch

    mine = _negsynth_embeddings(minilm, tmp_path, **settings)
    assert not torch.equal(mine, stock_embeddings)
    assert torch.nn.functional.cosine_similarity(mine, stock_embeddings).min() > 0.9  # the same model, trained a little differently


def _trained_by_the_train_stage(ds, run_dir: Path, out: Path, minilm, shared: dict):
    """The probe's embeddings after negsynth's trainer trains ``ds`` with the train stage's settings
    for a ``stock`` curriculum (its shuffled sampler, one pass per batch, 4 steps here)."""
    from types import SimpleNamespace

    from sentence_transformers import SentenceTransformer

    from negsynth.stages.train import _stock_schedule
    from negsynth.train import TrainConfig, make_trainer

    tc = _stock_schedule(SimpleNamespace(run_dir=run_dir), TrainConfig(model=minilm, output_dir=str(out), **shared))
    assert (tc.batch_sampler, tc.mini_batch_size, tc.max_steps) == ("shuffled", None, 4)
    trainer, model = make_trainer(ds, tc, model=SentenceTransformer(minilm, device="cpu"))
    trainer.train()
    model.max_seq_length = 256
    return model.encode(PROBE, convert_to_tensor=True)


def test_a_stock_curriculum_through_the_train_stage_settings_is_the_stock_recipe(minilm, tmp_path):
    """negsynth's default for labelled pairs with mined negatives, end to end from the examples: the
    ``stock`` schedule writes the rows in input order and the train stage trains them with the
    stock sampler, one pass per batch and the curriculum's ``total_steps``, with every train
    setting left at its default — the stock recipe's model on ``mine_hard_negatives``' n-tuples, bit for bit."""

    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer

    from negsynth.data.curriculum import load_curriculum, save_curriculum
    from negsynth.data.stock import stock_curriculum

    src = _rows()
    negs = [[f"unrelated text {i} on subject {(i + k) % 11}, take {k}" for k in range(4)] for i in range(len(src))]
    stock_rows = Dataset.from_dict(
        {"anchor": src["anchor"], "positive": src["positive"], **{f"negative_{k + 1}": [n[k] for n in negs] for k in range(4)}}
    )
    stock = SentenceTransformer(minilm, device="cpu")
    _stock_recipe()(stock, stock_rows, tmp_path / "stock", batch_size=8, lr=5e-5, seed=3, max_length=48, steps=4)
    want = stock.encode(PROBE, convert_to_tensor=True)

    examples = [
        {
            "id": f"e{i}",
            "task": "",
            "task_type": "short-long",
            "query": q,
            "positive": p,
            "negatives": n,
            "model": "mined:x:top",
            "source": "beir",
        }
        for i, (q, p, n) in enumerate(zip(src["anchor"], src["positive"], negs))
    ]
    rows = stock_curriculum(examples, batch_size=8, total_steps=4, instruction_template=None)
    save_curriculum(rows, tmp_path / "curriculum", stats=rows.stats)
    ds = load_curriculum(tmp_path / "curriculum")
    assert ds.select_columns(stock_rows.column_names).to_dict() == stock_rows.to_dict()
    shared = {"batch_size": 8, "grad_accum": 1, "lr": 5e-5, "max_length": 48, "seed": 3, "save_steps": 10**6}
    mine = _trained_by_the_train_stage(ds, tmp_path, tmp_path / "ns", minilm, shared)
    assert torch.equal(mine, want), (mine - want).abs().max().item()


def test_rows_not_built_as_batches_under_the_order_keeping_sampler_are_named_in_a_warning(caplog):
    """A ``stock`` curriculum handed to the library trainer with its default (order-keeping)
    sampler would train in input order, unshuffled: the trainer says so and names the setting."""
    import logging

    from datasets import Dataset

    from negsynth.train import TrainConfig
    from negsynth.train.trainer import _batch_sampler

    ds = Dataset.from_dict({"anchor": ["a", "b"], "positive": ["p", "q"], "phase": [1, 1], "batch": [-1, -1]})
    with caplog.at_level(logging.WARNING, logger="negsynth.train.trainer"):
        texts = ds.select_columns(["anchor", "positive"])
        _batch_sampler(TrainConfig(), ds, texts, ds["phase"], 2)
        assert "set batch_sampler = 'shuffled'" in caplog.text
        caplog.clear()
        _batch_sampler(TrainConfig(batch_sampler="shuffled"), ds, texts, ds["phase"], 2)
        planned = ds.remove_columns("batch").add_column("batch", [0, 0])
        _batch_sampler(TrainConfig(), planned, texts, planned["phase"], 2)
        assert caplog.text == ""


def _words_corpus(folder: Path, n: int = 90) -> Path:
    """``n`` documents over a dozen words, each titled by three of them (the query ``corpus.queries
    = "title"`` takes, no LLM): enough shared words that some titles' documents rank outside the
    library's candidate window (41 for 4 negatives) and their queries find no 4 negatives there."""
    import json
    import random

    words = ["river", "copper", "violin", "orbit", "wheat", "glacier", "enzyme", "harbor", "falcon", "basalt", "lantern", "quartz"]
    rng = random.Random(5)
    titles = rng.sample([f"{a} {b} {c}" for a in words for b in words for c in words if len({a, b, c}) == 3], n)
    docs = [{"_id": f"d{i}", "title": t, "text": " ".join(rng.choices(words, k=rng.randrange(6, 14)))} for i, t in enumerate(titles)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return folder


def test_the_no_label_default_is_the_stock_recipe_fed_the_corpus_stages_queries(minilm, tmp_path):
    """negsynth's default without labels, by construction: ``corpus`` -> ``score`` -> ``curriculum``
    at their defaults train the rows sentence-transformers' stock recipe makes of the corpus stage's
    valid records (``mine_hard_negatives``: 4 negatives, relative margin 0.05, its own candidate
    window, as ``benchmarks/harness.py`` calls it), in their order, and the train stage's settings
    give the stock trainer's model, bit for bit. The corpus stage keeps queries the library's window
    leaves without 4 negatives (it searches the whole corpus, for ``curriculum.schedule = "tuple"``):
    the default leaves them out, as the stock recipe does."""

    import tomli_w
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer

    import negsynth
    from negsynth.data.curriculum import load_curriculum

    folder = _words_corpus(tmp_path / "docs")
    shared = {"batch_size": 8, "grad_accum": 1, "lr": 5e-5, "max_length": 48, "seed": 3, "save_steps": 10**6}
    run_file = {
        "embedder": {"model": minilm, "device": "cpu"},
        "corpus": {"inputs": [{"path": str(folder)}], "queries": "title"},
        "score": {"inputs": ["corpus"], "decontam_sets": []},
        "curriculum": {"total_steps": 4},
        "train": {"model": minilm, **shared},
    }
    (tmp_path / "run.toml").write_text(tomli_w.dumps(run_file))
    run = tmp_path / "run"
    negsynth.run(tmp_path / "run.toml", run, stages=["corpus", "score", "curriculum"], quiet=True)

    harness = _harness()
    records = harness.records(run / "corpus")  # the corpus stage's valid records, in order
    miner = SentenceTransformer(minilm, device="cpu")  # [embedder]: the model at its own length
    pairs = Dataset.from_dict({"anchor": [r["query"] for r in records], "positive": [r["positive"] for r in records]})
    stock_rows = harness.mine_stock(pairs, miner, list(harness.documents(folder / "corpus.jsonl").values()), 4)
    assert 0 < len(stock_rows) < len(records)  # the window left some queries out, or the test shows nothing

    ds = load_curriculum(run / "curriculum")
    assert ds.select_columns(stock_rows.column_names).to_dict() == stock_rows.to_dict()
    card = json.loads((run / "curriculum" / "card.json").read_text())["build"]
    assert card["schedule"] == "stock" and card["dropped_too_few_mined"] == len(records) - len(stock_rows)

    stock = SentenceTransformer(minilm, device="cpu")
    harness.train_stock_recipe(stock, stock_rows, tmp_path / "stock", batch_size=8, lr=5e-5, seed=3, max_length=48, steps=4)
    want = stock.encode(PROBE, convert_to_tensor=True)
    mine = _trained_by_the_train_stage(ds, run, tmp_path / "ns", minilm, shared)
    assert torch.equal(mine, want), (mine - want).abs().max().item()
