"""Small corpora just work. negsynth's own path (``curriculum.schedule = "tuple"``): when no batch
of the configured size can be filled with distinct texts (no text twice in a batch, and a mined
negative is another example's document), the curriculum takes the largest batch size that fills,
says so in one line, and train follows it. The default (the stock recipe's rows) plans no batches:
the stock sampler leaves a batch short rather than repeat a text, at the configured size."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeOpenAI
from test_corpus import answer
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.curriculum import build_curriculum, has_full_batch, largest_fitting_batch
from negsynth.data.shards import write_jsonl
from negsynth.data.text import text_key

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
runner = CliRunner()


def corpus_like(n: int) -> list[dict]:
    """``n`` examples whose 4 negatives are other examples' positives (spread over the corpus), as
    mining a small corpus gives."""
    return [
        {
            "id": f"c{i}",
            "task": "",
            "task_type": "short-long",
            "query": f"question about document {i}",
            "positive": f"document {i}",
            "negatives": [f"document {(i + 7 * k) % n}" for k in range(1, 5)],
            "model": "mined:default:corpus",
        }
        for i in range(n)
    ]


def test_largest_fitting_batch_is_the_largest_that_fills_and_keeps_texts_distinct():
    exs = corpus_like(44)
    # the old dead end: not one batch of 8 distinct texts (only a phase's short leftovers)
    assert not has_full_batch(build_curriculum(exs, schedule="tuple", batch_size=8, homogeneous_batches=False))
    b, rows = largest_fitting_batch(exs, 8, schedule="tuple", homogeneous_batches=False)
    assert 2 <= b < 8 and rows and has_full_batch(rows)
    assert not has_full_batch(build_curriculum(exs, schedule="tuple", batch_size=b + 1, homogeneous_batches=False)) or b + 1 == 8
    assert len(rows) == 44  # every example trains: the rows that fill no batch of b train in shorter ones
    for n in sorted({r["batch"] for r in rows}):
        batch = [r for r in rows if r["batch"] == n]
        assert len(batch) <= b
        texts = [text_key(r[c]) for r in batch for c in r if c in ("anchor", "positive") or c.startswith("negative_")]
        assert len(texts) == len(set(texts))
    assert largest_fitting_batch(corpus_like(3), 8, schedule="tuple", homogeneous_batches=False) is None


def test_the_curriculum_stage_falls_back_in_one_line_and_train_follows(tmp_path, monkeypatch):
    rd = tmp_path / "run"
    write_jsonl(rd / "score" / "shard-00000.jsonl", corpus_like(44))
    r = runner.invoke(app, ["curriculum", "-d", str(rd), "--set", "curriculum.batch_size=8", "--schedule", "tuple", "-q"])
    assert r.exit_code == 0, r.output
    warned = [line for line in r.output.splitlines() if "cannot fill a batch of 8" in line]
    assert len(warned) == 1 and "no text may appear twice" in warned[0]
    stats = json.loads((rd / "curriculum" / "stats.json").read_text())
    b = stats["batch_size"]
    assert 2 <= b < 8 and stats["batch_size_wanted"] == 8 and stats["rows"] == 44
    # train takes the curriculum's batch size, not train.batch_size
    seen = {}

    def fake_train(ds, tc, progress=None):
        seen["batch_size"] = tc.batch_size
        raise SystemExit(0)

    monkeypatch.setattr("negsynth.train.train", fake_train)
    runner.invoke(app, ["train", "-d", str(rd), "--set", "train.batch_size=8", "-q"])
    assert seen["batch_size"] == b


@pytest.mark.slow  # corpus, score and 2 steps of MiniLM: ~90 s on 2 loaded cores
def test_examples_corpus_toml_runs_on_the_50_sample_documents(tmp_path, minilm):
    """examples/corpus.toml as shipped (batch 32) on the package's sample corpus, the LLM a fake
    server, train capped at 2 steps, no evaluate (the shared benchmark data is not the point): the
    stock recipe's rows, batched by the stock sampler at the configured 32 (short where texts repeat)."""
    import negsynth

    rd = tmp_path / "run"
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        r = runner.invoke(
            app,
            [
                "run",
                "-c",
                str(ROOT / "examples" / "corpus.toml"),
                "-d",
                str(rd),
                "--set",
                f"llm.base_url={srv.base_url}",
                "--set",
                "llm.model=fake",
                "--set",
                f'corpus.inputs=[{{path="{negsynth.sample_corpus()}"}}]',
                "--set",
                'pipeline.stages=["corpus","score","curriculum","train"]',
                "--set",
                "train.max_steps=2",
                "-q",
            ],
        )
    assert r.exit_code == 0, r.output
    cur = json.loads((rd / "curriculum" / "stats.json").read_text())
    assert cur["schedule"] == "stock" and cur["batch_size"] == 32 and cur["batch_size_wanted"] is None
    assert not any("cannot fill a batch" in line for line in r.output.splitlines())
    train = json.loads((rd / "train" / "stats.json").read_text())
    assert train["steps"] == 2 and (rd / "train" / "final" / "modules.json").is_file()


def test_the_shuffled_sampler_keeps_the_configured_batch_when_the_curriculum_packed_a_smaller_one(tmp_path):
    """A curriculum too small for 32 distinct texts a batch packs its rows for a smaller batch, and
    train follows it; under ``batch_sampler = "shuffled"`` (sentence-transformers' NO_DUPLICATES,
    which batches the rows itself and leaves a batch short rather than repeat a text) train keeps
    the configured size, as the stock recipe trains the same rows."""
    from types import SimpleNamespace

    from negsynth.schemas.train import TrainConfig
    from negsynth.stages.train import _curriculum_batch

    (tmp_path / "curriculum").mkdir()
    (tmp_path / "curriculum" / "card.json").write_text(json.dumps({"build": {"batch_size": 25, "batch_size_wanted": 32}}))
    said: list[str] = []
    ctx = SimpleNamespace(run_dir=tmp_path, reporter=SimpleNamespace(info=said.append))
    assert _curriculum_batch(ctx, TrainConfig(batch_size=32)).batch_size == 25 and len(said) == 1
    assert _curriculum_batch(ctx, TrainConfig(batch_size=32, batch_sampler="shuffled")).batch_size == 32 and len(said) == 1
