"""The saved curriculum trains with the stock SentenceTransformerTrainer + MNRL (docs/train.md recipe),
and the n-tuple layout (anchor, positive, negative_1..n) for several hard negatives per row."""

from __future__ import annotations

import pytest

pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")

from negsynth.data.curriculum import CurriculumError, build_curriculum, save_curriculum  # noqa: E402
from negsynth.data.shards import read_stage, write_jsonl  # noqa: E402
from negsynth.data.stock import ntuple_rows  # noqa: E402
from negsynth.train import for_stock_trainer  # noqa: E402

B = 4


def example(i: int, tt: str = "short-long", n_negs: int = 4, fn=None) -> dict:
    d = {
        "id": f"ex-{i}",
        "task": "Retrieve a passage.",
        "task_type": tt,
        "query": f"query {i}",
        "positive": f"positive passage {i}",
        "negatives": [f"negative {i} level {k + 1}" for k in range(n_negs)],
    }
    if fn is not None:
        d["score"] = {
            "embedder": "f",
            "cos_pos": 0.9,
            "cos_neg": [0.5] * n_negs,
            "kendall_tau": 1.0,
            "monotonic": True,
            "false_negative": list(fn),
            "too_easy": [False] * n_negs,
        }
    return d


@pytest.fixture
def run_dir(tmp_path):
    rows = build_curriculum([example(i) for i in range(32)], batch_size=B, seed=0)
    save_curriculum(rows, tmp_path / "run" / "curriculum", stats=dict(rows.stats))
    return tmp_path / "run"


def test_for_stock_trainer_keeps_text_columns_and_curriculum_order(run_dir):
    full = datasets.load_from_disk(str(run_dir / "curriculum" / "dataset"))
    train_ds, sampler = for_stock_trainer(run_dir)
    assert train_ds.column_names == ["anchor", "positive", "negative"]
    assert train_ds["anchor"] == full["anchor"]
    # what SentenceTransformerTrainer.get_batch_sampler does with the callable
    bs = sampler(train_ds, batch_size=B, drop_last=False, valid_label_columns=[], generator=None, seed=123)
    n = len(train_ds)
    assert list(bs) == [list(range(s, s + B)) for s in range(0, n, B)]
    assert all(len({full["phase"][i] for i in b}) == 1 for b in bs)
    # the same from the Dataset itself and from the parquet copy
    assert for_stock_trainer(full)[0]["negative"] == train_ds["negative"]
    assert for_stock_trainer(run_dir / "curriculum" / "train.parquet")[0]["positive"] == train_ds["positive"]


def test_missing_curriculum_names_the_fix(tmp_path):
    with pytest.raises(CurriculumError, match="run `negsynth curriculum` first"):
        for_stock_trainer(tmp_path)


def test_stock_trainer_consumes_rows_in_order_and_trains(run_dir, tmp_path):
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from negsynth.resources import minilm_path

    model = SentenceTransformer(str(minilm_path()), device="cpu")
    model.max_seq_length = 16
    # the documented recipe
    train_ds, sampler = for_stock_trainer(run_dir)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=B,
        max_steps=3,
        batch_sampler=sampler,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        use_cpu=True,
        learning_rate=1e-4,
    )
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_ds, loss=MultipleNegativesRankingLoss(model))
    seen: list[list[str]] = []

    class Recording:  # the trainer's own collator, noting the rows of each batch it is handed
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __call__(self, features):
            seen.append([f["anchor"] for f in features])
            assert set(features[0]) == {"anchor", "positive", "negative"}  # no metadata reaches the model
            return self.inner(features)

    trainer.data_collator = Recording(trainer.data_collator)
    before = model.encode(["query 0"], convert_to_numpy=True)
    out = trainer.train()
    assert out.global_step == 3
    anchors = train_ds["anchor"]
    assert seen[:3] == [anchors[0:B], anchors[B : 2 * B], anchors[2 * B : 3 * B]]
    after = model.encode(["query 0"], convert_to_numpy=True)
    assert abs(after - before).max() > 0  # it trained


def test_ntuple_rows_hardest_first_and_counts(tmp_path):
    exs = [example(0), example(1, n_negs=3), example(2, fn=(True, False, False, False)), example(3)]
    exs[3]["negatives"][2] = exs[3]["positive"].upper()  # a negative repeating the positive
    write_jsonl(tmp_path / "score" / "shard-00000.jsonl", exs)
    rows = ntuple_rows(read_stage(tmp_path / "score"), 4)
    assert [r["example_id"] for r in rows] == ["ex-0", "ex-2"]
    r = rows[0]
    assert list(r)[:6] == ["anchor", "positive", "negative_1", "negative_2", "negative_3", "negative_4"]
    assert r["negative_1"] == "negative 0 level 1" and r["negative_4"] == "negative 0 level 4"
    assert r["anchor"] == "Instruct: Retrieve a passage.\nQuery: query 0"
    assert rows.stats["skipped_few_negatives"] == 1 and rows.stats["skipped_self_duplicate"] == 1 and rows.stats["rows"] == 2
    # n is configurable: the 3 hardest; dropping flagged false negatives leaves ex-2 with 3
    rows = ntuple_rows(read_stage(tmp_path / "score"), 3, drop_false_negatives=True, instruction_template=None)
    assert [r["example_id"] for r in rows] == ["ex-0", "ex-1", "ex-2"]
    assert rows[2]["negative_1"] == "negative 2 level 2" and "negative_4" not in rows[0]
    assert rows[0]["anchor"] == "query 0"
    # the n-tuple layout goes through the same helper: no phases, plain order
    ds = datasets.Dataset.from_list(list(rows))
    train_ds, sampler = for_stock_trainer(ds)
    assert train_ds.column_names == ["anchor", "positive", "negative_1", "negative_2", "negative_3"]
    assert list(sampler(train_ds, batch_size=2, drop_last=False)) == [[0, 1], [2]]
