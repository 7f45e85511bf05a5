"""negsynth export: the curriculum as a HF dataset folder and the model with a card, loaded back offline."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")

from typer.testing import CliRunner  # noqa: E402

from negsynth.cli import app  # noqa: E402
from negsynth.data.curriculum import build_curriculum, save_curriculum  # noqa: E402
from negsynth.data.shards import atomic_write_json, write_jsonl  # noqa: E402

runner = CliRunner()


def scored(i: int, n_negs: int = 4) -> dict:
    return {
        "id": f"ex-{i}",
        "task": "Retrieve a passage.",
        "task_type": "short-long",
        "query": f"query {i}",
        "positive": f"positive passage {i}",
        "negatives": [f"negative {i} level {k + 1}" for k in range(n_negs)],
        "model": "gpt-test",
        "attributes": {"clarity": "clear", "num_words": 50 + i},
        "score": {
            "embedder": "fake",
            "cos_pos": 0.9,
            "cos_neg": [0.8, 0.7, 0.6, 0.5][:n_negs],
            "kendall_tau": 1.0,
            "monotonic": True,
            "false_negative": [False] * n_negs,
            "too_easy": [False] * n_negs,
            "policy": "annotate",
            "llm_order": None,
        },
    }


def report(score: float) -> dict:
    from negsynth.evaluate.runner import SCHEMA

    return {
        "schema": SCHEMA,
        "embedder": "st:x",
        "suite": "quick",
        "model": "m",
        "tasks": {"STS12": {"category": "STS", "main_metric": "cos_sim_spearman", "main_score": score, "n": 8}},
        "categories": {"STS": score},
        "average": score,
    }


def made_by(stage: str) -> list[dict]:
    """score's ``stats.json["inputs"]``: its one shard was scored from ``stage``'s first."""
    return [{"stage": stage, "shard": "shard-00000.jsonl", "out": "shard-00000.jsonl"}]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from negsynth.train import train

    d = tmp_path_factory.mktemp("exp") / "run"
    exs = [scored(i) for i in range(15)] + [scored(15, n_negs=3)]
    write_jsonl(d / "generate" / "shard-00000.jsonl", [{k: v for k, v in e.items() if k != "score"} for e in exs])
    write_jsonl(d / "score" / "shard-00000.jsonl", exs)
    atomic_write_json(
        d / "score" / "stats.json",
        {
            "embedder": "fake",
            "policy": "annotate",
            "fn_ratio": 0.95,
            "too_easy_floor": 0.1,
            "kept": 16,
            "rejected": 0,
            "inputs": made_by("generate"),
        },
    )
    rows = build_curriculum(exs[:15] + [scored(16)], batch_size=4, seed=0)
    save_curriculum(rows, d / "curriculum", stats=dict(rows.stats))
    train(
        str(d / "curriculum" / "train.parquet"),
        {
            "model": "default",
            "batch_size": 4,
            "grad_accum": 1,
            "max_steps": 1,
            "max_length": 16,
            "output_dir": str(d / "train"),
            "save_steps": 1000,
        },
    )
    atomic_write_json(d / "evaluate" / "report.json", report(0.8123))
    atomic_write_json(d / "evaluate" / "baseline.json", report(0.8000))
    return d


def front_matter(path):
    import yaml

    text = path.read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1]), text


def test_export_dataset_and_model_load_back(run_dir, tmp_path):
    out = tmp_path / "out"
    r = runner.invoke(
        app, ["export", "-d", str(run_dir), "--out", str(out), "--ntuple", "4", "--with-shards", "--license", "cc-by-4.0", "--json"]
    )
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    configs = {"triplet": 16, "ntuple": 15, "pair": 16, "metadata": 16, "ntuple_metadata": 15, "generate": 16, "score": 16}
    assert res["dataset"]["configs"] == configs
    # the dataset: default config = the curriculum's triplets, text only, in training order
    ds = datasets.load_dataset(str(out / "dataset"))["train"]
    cur = datasets.load_from_disk(str(run_dir / "curriculum" / "dataset"))
    assert ds.column_names == ["anchor", "positive", "negative"] and ds["anchor"] == cur["anchor"]
    md = datasets.load_dataset(str(out / "dataset"), "metadata", split="train")
    assert md["phase"] == cur["phase"] and md["example_id"] == cur["example_id"] and "anchor" not in md.column_names
    nt = datasets.load_dataset(str(out / "dataset"), "ntuple", split="train")
    assert nt.column_names == ["anchor", "positive", "negative_1", "negative_2", "negative_3", "negative_4"] and len(nt) == 15
    sc = datasets.load_dataset(str(out / "dataset"), "score", split="train")
    assert sc[0]["score"]["cos_pos"] == 0.9 and json.loads(sc[0]["attributes"])["clarity"] == "clear"
    meta, text = front_matter(out / "dataset" / "README.md")
    assert meta["license"] == "cc-by-4.0" and meta["size_categories"] == ["n<1K"]
    assert [c["config_name"] for c in meta["configs"]] == list(configs)
    ns = meta["negsynth"]
    assert ns["generator_models"] == {"gpt-test": 16} and ns["schedule"] == "curriculum" and ns["batch_size"] == 4
    assert ns["composition"]["rows"] == 16 and ns["score_filters"]["fn_ratio"] == 0.95 and ns["ntuple"]["skipped_few_negatives"] == 1
    assert ns["provenance"]["origin"] == {"generate": 16} and ns["provenance"]["negatives"] == {"llm": 16}
    assert "do not shuffle" in text and "An LLM (`gpt-test`) wrote each query and its positive" in text
    # the model: loads with a plain SentenceTransformer, card with base model and evaluation table
    from sentence_transformers import SentenceTransformer

    m = SentenceTransformer(str(out / "model"), device="cpu")
    assert m.encode(["query 1"]).shape == (1, 384)
    meta, text = front_matter(out / "model" / "README.md")
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and meta["library_name"] == "sentence-transformers"
    assert meta["license"] == "cc-by-4.0"
    assert "| STS12 | STS | cos_sim_spearman | 8 | 81.23 | 80.00 | +1.23 |" in text
    assert "`mean`" in text and "gpt-test" in text and "trust_remote_code" not in text
    # the anchors were built with the instruction template: the model gets it as its query prompt
    prompts = json.loads((out / "model" / "config_sentence_transformers.json").read_text())["prompts"]
    assert prompts == {"query": "Instruct: Retrieve a passage.\nQuery: ", "document": ""}


def test_only_one_part_and_bad_input(run_dir, tmp_path):
    r = runner.invoke(app, ["export", "-d", str(run_dir), "--out", str(tmp_path / "o"), "--only", "dataset"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "o" / "dataset" / "README.md").is_file() and not (tmp_path / "o" / "model").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    r = runner.invoke(app, ["export", "-d", str(empty), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2
    line = r.output.strip()
    assert "\n" not in line and "curriculum/train.parquet" in line and "negsynth curriculum" in line
    r = runner.invoke(app, ["export", "-d", str(empty), "--out", str(tmp_path / "x"), "--only", "model"])
    assert r.exit_code == 2 and "train/final/modules.json" in r.output and "negsynth train" in r.output


def test_push_without_token_is_one_line(run_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    r = runner.invoke(app, ["export", "-d", str(run_dir), "--out", str(tmp_path / "o"), "--push", "me/data"])
    assert r.exit_code == 2 and "HF_TOKEN" in r.output and r.output.strip().count("\n") == 0
    assert not (tmp_path / "o").exists()  # nothing written before the check


def test_a_tuple_curriculum_exports_its_negative_columns(tmp_path):
    d = tmp_path / "run"
    exs = [scored(i) for i in range(8)]
    write_jsonl(d / "score" / "shard-00000.jsonl", exs)
    atomic_write_json(d / "score" / "stats.json", {"embedder": "fake", "policy": "annotate", "kept": 8, "rejected": 0})
    rows = build_curriculum(exs, schedule="tuple", batch_size=4, seed=0)
    save_curriculum(rows, d / "curriculum", stats=dict(rows.stats))
    r = runner.invoke(app, ["export", "-d", str(d), "--out", str(tmp_path / "o"), "--only", "dataset"])
    assert r.exit_code == 0, r.output
    meta, text = front_matter(tmp_path / "o" / "dataset" / "README.md")
    assert meta["negsynth"]["schedule"] == "tuple"
    assert "select_columns" not in text and 'load_dataset("REPO_ID", "ntuple", split="train")' in text
    assert "n-tuple rows" in text and "easiest level first" not in text
    assert [c["config_name"] for c in meta["configs"] if c.get("default")] == ["ntuple"]
    import polars as pl

    (ntuple_file,) = (tmp_path / "o" / "dataset" / "ntuple").glob("train-00000-of-00001-*.parquet")
    assert pl.read_parquet(ntuple_file).columns == [
        "anchor",
        "positive",
        "negative_1",
        "negative_2",
        "negative_3",
        "negative_4",
    ]
    # the triplet configuration: each row with its hardest negative
    tri = datasets.load_dataset(str(tmp_path / "o" / "dataset"), "triplet", split="train")
    assert tri.column_names == ["anchor", "positive", "negative"] and tri[0]["negative"].endswith("level 1")


def corpus_record(i: int, n: int) -> dict:
    """A scored record as the corpus stage makes it: the LLM wrote the query, the document is the
    positive, the negatives are other documents mined by the embedder."""
    styles = ["question", "claim"]
    return {
        "id": f"c-{i}",
        "task": f"Given a {styles[i % 2]}, retrieve the passage that answers it",
        "task_type": "short-long",
        "query": f"what about document {i}?",
        "positive": f"document {i} text",
        "negatives": [f"document {(i + k) % n} text" for k in range(1, 5)],
        "model": "mined:default:corpus",
        "source": "synthetic",
        "attributes": {"style": styles[i % 2], "query_index": 0},
        "meta": {"corpus": "my_docs", "doc_id": f"d{i}", "query_model": "smollm2-135m-instruct"},
        "score": scored(i)["score"],
    }


@pytest.fixture(scope="module")
def corpus_export(run_dir, tmp_path_factory):
    """A corpus run (mined negatives, tuple rows, instruction prefixes on the anchors) with the module's
    trained model, exported."""
    import shutil

    tmp = tmp_path_factory.mktemp("corpus")
    d = tmp / "run"
    exs = [corpus_record(i, 40) for i in range(40)]
    write_jsonl(d / "score" / "shard-00000.jsonl", exs)
    stats = {"embedder": "st:all-MiniLM-L6-v2", "policy": "measured", "kept": 40, "rejected": 0, "inputs": made_by("corpus")}
    atomic_write_json(d / "score" / "stats.json", stats)
    rows = build_curriculum(exs, schedule="tuple", batch_size=2, seed=0, homogeneous_batches=False)
    save_curriculum(rows, d / "curriculum", stats=dict(rows.stats))
    shutil.copytree(run_dir / "train" / "final", d / "train" / "final")
    r = runner.invoke(app, ["export", "-d", str(d), "--out", str(tmp / "o")])
    assert r.exit_code == 0, r.output
    return tmp / "o"


def test_a_corpus_run_is_described_as_one_and_its_prompts_reach_the_model(corpus_export):
    meta, text = front_matter(corpus_export / "dataset" / "README.md")
    prov = meta["negsynth"]["provenance"]
    assert prov["origin"] == {"corpus": 40} and prov["negatives"] == {"mined": 40}
    assert prov["llm_models"] == {"smollm2-135m-instruct": 40} and prov["sources"] == {"my_docs": 40}
    assert "wrote a query for each sampled document of the corpus `my_docs`; the document is the positive" in text
    assert "mined from the same documents" in text and "four hard negatives" not in text and "synthetic" not in meta["tags"]
    _, model_text = front_matter(corpus_export / "model" / "README.md")
    assert "the document is the positive" in model_text and "four hard negatives" not in model_text
    st_cfg = json.loads((corpus_export / "model" / "config_sentence_transformers.json").read_text())
    prompts = st_cfg["prompts"]
    assert prompts["document"] == ""
    assert {prompts["query"], prompts["query_claim"]} == {
        "Instruct: Given a question, retrieve the passage that answers it\nQuery: ",
        "Instruct: Given a claim, retrieve the passage that answers it\nQuery: ",
    }
    from sentence_transformers import SentenceTransformer

    m = SentenceTransformer(str(corpus_export / "model"), device="cpu")
    assert m.prompts["query"] == prompts["query"]


@pytest.mark.parametrize("config", ["triplet", "ntuple", "pair"])
def test_sentence_transformers_trains_on_each_exported_config_as_it_is(corpus_export, config, minilm, tmp_path):
    """No select_columns: every column of a text configuration is an input of the loss (a metadata
    column would be an extra negative, or an int the trainer refuses)."""
    ds = datasets.load_dataset(str(corpus_export / "dataset"), config, split="train")
    assert all(f.dtype == "string" for f in ds.features.values()), ds.features
    want = {"triplet": 3, "ntuple": 6, "pair": 2}[config]
    assert len(ds.column_names) == want
    assert stock_train_steps(minilm, ds, "MultipleNegativesRankingLoss", tmp_path / "st", steps=2, batch_size=2) == 2


def test_teacher_scores_export_as_the_label_column_sentence_transformers_distills_from(tmp_path, minilm):
    """A curriculum whose rows carry the teacher's scores exports them as ``label`` beside the texts
    of ``ntuple`` ([positive, negative_1..4]) and ``triplet`` ([positive, negative_1]), not in
    ``metadata``; sentence-transformers' MarginMSELoss trains on the ``ntuple`` config as it is."""
    from pytest import approx

    d = tmp_path / "run"

    def load(folder, config):  # a cache of its own: the shared one may hold another folder's "dataset" of the same name
        return datasets.load_dataset(str(folder), config, split="train", cache_dir=str(tmp_path / "hf"))

    exs = [{**scored(i), "meta": {"teacher_label": [1.8, 1.4, 1.3, 1.2, 1.1 - i / 100]}} for i in range(8)]
    write_jsonl(d / "score" / "shard-00000.jsonl", exs)
    atomic_write_json(d / "score" / "stats.json", {"embedder": "fake", "policy": "annotate", "kept": 8, "rejected": 0})
    rows = build_curriculum(exs, schedule="tuple", batch_size=4, seed=0)
    save_curriculum(rows, d / "curriculum", stats=dict(rows.stats))
    r = runner.invoke(app, ["export", "-d", str(d), "--out", str(tmp_path / "o"), "--only", "dataset"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "o" / "dataset"
    nt = load(out, "ntuple")
    assert nt.column_names == ["anchor", "positive", "negative_1", "negative_2", "negative_3", "negative_4", "label"]
    by_id = {int(r["example_id"].split("-")[1]): r["label"] for r in rows}
    assert nt["label"] == [approx(r["label"]) for r in rows] and by_id[3] == approx([1.8, 1.4, 1.3, 1.2, 1.07])
    tri = load(out, "triplet")
    assert tri.column_names == ["anchor", "positive", "negative", "label"] and tri["label"] == [approx(r["label"][:2]) for r in rows]
    assert "label" not in load(out, "metadata").column_names
    # --ntuple from score's records carries them too
    r = runner.invoke(app, ["export", "-d", str(d), "--out", str(tmp_path / "o2"), "--only", "dataset", "--ntuple", "2"])
    assert r.exit_code == 0, r.output
    nt2 = load(tmp_path / "o2" / "dataset", "ntuple")
    assert nt2.column_names[-1] == "label" and nt2[0]["label"] == approx([1.8, 1.4, 1.3])
    assert stock_train_steps(minilm, nt, "MarginMSELoss", tmp_path / "st", steps=1, batch_size=4) == 1


def stock_train_steps(model_path, dataset, loss: str, out, *, steps: int, batch_size: int) -> int:
    """Train ``model_path`` on ``dataset`` with sentence-transformers' own trainer and ``loss`` (a
    class of its losses, by name) for ``steps`` steps; the steps it ran."""
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer import losses

    model = SentenceTransformer(model_path, device="cpu")
    args = SentenceTransformerTrainingArguments(
        str(out), max_steps=steps, per_device_train_batch_size=batch_size, report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True
    )
    trainer = SentenceTransformerTrainer(model, args, train_dataset=dataset, loss=getattr(losses, loss)(model))
    trainer.train()
    return trainer.state.global_step


def test_two_exports_load_as_themselves_not_from_the_datasets_cache(tmp_path, monkeypatch):
    """``datasets`` caches a local folder by its name, config and the card's data-file paths: two
    exports named ``dataset`` with the same file names were one cache entry, and loading the second
    silently gave the first one's rows. Each export's file names carry its content's hash."""
    from datasets import load_dataset

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))  # one cache for both loads, none of the user's
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = []
    for n in (8, 4):
        d = tmp_path / f"run{n}"
        exs = [scored(i + 100 * n) for i in range(n)]
        write_jsonl(d / "score" / "shard-00000.jsonl", exs)
        atomic_write_json(d / "score" / "stats.json", {"embedder": "fake", "policy": "annotate", "kept": n, "rejected": 0})
        rows = build_curriculum(exs, schedule="tuple", batch_size=2, seed=0)
        save_curriculum(rows, d / "curriculum", stats=dict(rows.stats))
        out = tmp_path / f"export{n}"
        r = runner.invoke(app, ["export", "-d", str(d), "--out", str(out), "--only", "dataset"])
        assert r.exit_code == 0, r.output
        ds = load_dataset(str(out / "dataset"), "ntuple", split="train", cache_dir=str(tmp_path / "hf-cache"))
        loaded.append((len(ds), ds["anchor"]))
    assert loaded[0][0] == 8 and loaded[1][0] == 4, [n for n, _ in loaded]
    assert loaded[0][1] != loaded[1][1]
