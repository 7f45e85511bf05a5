"""The evaluation results cache: a task scored once for a model is taken from the cache, and any
change a score depends on (data, code, model files, encoding settings) scores it again."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import write_beir
from test_evaluate import HashBOW

from negsynth.evaluate import cache as stored
from negsynth.evaluate import evaluate
from negsynth.evaluate.suite import retrieval_task


class Known(HashBOW):
    """A HashBOW with an identity: its results may be cached."""

    def __init__(self, tag: str = "a", **kw):
        super().__init__(**kw)
        self.tag = tag

    def identity(self) -> dict:
        return {"kind": "hash-bow", "dim": self.dim, "tag": self.tag}


def beir(root):
    return retrieval_task("mydomain-dev", write_beir(root, qrels="a\td1\nb\td2\nc\td3\n"))


def run(emb, task, folder, **kw):
    return evaluate(emb, suite="full", tasks=[task], progress=False, results_cache=folder, **kw)["tasks"]["mydomain-dev"]


def test_a_task_scored_once_is_taken_from_the_cache(tmp_path):
    task, folder = beir(tmp_path / "dom"), tmp_path / "cache"
    first, emb = run(Known(), task, folder), Known()
    second = run(emb, task, folder)
    assert emb.seen == []  # nothing encoded
    assert second.pop("cached") is True and "cached" not in first
    assert second == first
    # another embedder identity (or none at all) is scored
    other = Known(tag="b")
    run(other, task, folder)
    assert other.seen
    plain = HashBOW()
    run(plain, task, tmp_path / "never")
    assert plain.seen and not (tmp_path / "never").exists()
    # without a cache folder nothing is looked up
    again = Known()
    evaluate(again, suite="full", tasks=[task], progress=False)
    assert again.seen


def test_changed_data_code_cut_or_per_query_score_again(tmp_path, monkeypatch):
    task, folder = beir(tmp_path / "dom"), tmp_path / "cache"
    base = run(Known(), task, folder)
    # per-query scores asked for: another entry
    emb = Known()
    assert "per_query" in run(emb, task, folder, per_query=True) and emb.seen
    # a data file changed (here the qrels: c's relevant document moves, so the score drops)
    (tmp_path / "dom" / "dev" / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\na\td1\t1\nb\td2\t1\nc\td1\t1\n")  # c: d3 -> d1
    emb = Known()
    changed = run(emb, task, folder)
    assert emb.seen and "cached" not in changed and changed["main_score"] < base["main_score"]
    # the evaluation code changed
    monkeypatch.setattr(stored, "code_digest", lambda: "another version")
    emb = Known()
    assert "cached" not in run(emb, task, folder) and emb.seen


def test_an_unreadable_entry_is_scored_again_and_rewritten(tmp_path):
    task, folder = beir(tmp_path / "dom"), tmp_path / "cache"
    run(Known(), task, folder)
    (entry,) = folder.rglob("*.json")
    entry.write_text('{"key": "tru')
    emb = Known()
    assert "cached" not in run(emb, task, folder) and emb.seen
    assert json.loads(entry.read_text())["key"] == entry.stem
    assert run(Known(), task, folder)["cached"] is True


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path):
    task = beir(tmp_path / "dom")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert run(Known(), task, blocker)["n"] == 3  # scored; nothing stored, no error


def test_model_digest_is_by_content(tmp_path, minilm):
    from negsynth.embed.models import model_digest

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(minilm, a)
    shutil.copytree(minilm, b)
    assert model_digest(a) == model_digest(b) == model_digest(minilm)
    cfg = b / "config.json"
    cfg.write_text(cfg.read_text() + " ")
    assert model_digest(b) != model_digest(a)


def test_sentence_transformer_identity_names_what_changes_vectors(minilm):
    from negsynth.embed.st import SentenceTransformerEmbedder

    e = SentenceTransformerEmbedder.load(minilm, batch_size=16)
    ident = e.identity()
    assert ident is not None and ident == e.identity()
    assert ident["backend"] == "torch" and ident["batch_size"] == 16 and ident["max_seq_length"] == e.model.max_seq_length
    e.batch_size = 32
    assert e.identity() != ident
    e.source = None  # not loaded from a folder: never cached
    assert e.identity() is None


@pytest.mark.parametrize("cache", [True, False])
def test_the_evaluate_stage_caches_unless_told_not_to(tmp_path, monkeypatch, cache):
    """The stage hands the cache folder to the runner only with ``evaluate.cache`` on."""
    import negsynth.evaluate as E
    from negsynth.pipeline.context import StageContext
    from negsynth.schemas.config import RunConfig
    from negsynth.stages import evaluate as stage

    seen = {}

    def fake_evaluate(emb, **kw):
        seen["results_cache"] = kw.get("results_cache")
        return {"tasks": {}, "notes": ["no data"]}

    monkeypatch.setattr(E, "evaluate", fake_evaluate)
    monkeypatch.setattr(stage, "embedder_for", lambda *a, **k: HashBOW())
    cfg = RunConfig()
    cfg.evaluate.cache = cache
    cfg.evaluate.baseline = ""
    ctx = StageContext(cfg=cfg, run_dir=tmp_path / "run")
    stage.run(ctx)
    want = stored.default_folder() if cache else None
    assert seen["results_cache"] == want


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_the_evaluate_stage_embeds_in_float32_unless_told_otherwise(tmp_path, monkeypatch, dtype, minilm):
    """``evaluate.dtype`` (float32 by default, on every device) reaches the embedder, whose weights
    are then in that precision; the results cache keys on it."""
    import torch

    import negsynth.evaluate as E
    from negsynth.embed import embedder_for
    from negsynth.pipeline.context import StageContext
    from negsynth.schemas.config import RunConfig
    from negsynth.stages import evaluate as stage

    seen = {}

    def spy(*a, **k):
        seen["dtype"] = k.get("dtype")
        return HashBOW()

    monkeypatch.setattr(E, "evaluate", lambda emb, **kw: {"tasks": {}, "notes": ["no data"]})
    monkeypatch.setattr(stage, "embedder_for", spy)
    cfg = RunConfig()
    if dtype:
        cfg.evaluate.dtype = dtype
    cfg.evaluate.baseline = ""
    stage.run(StageContext(cfg=cfg, run_dir=tmp_path / "run"))
    assert seen["dtype"] == (dtype or "float32")
    emb = embedder_for(str(minilm), batch_size=8, dtype=seen["dtype"])
    assert next(emb.model.parameters()).dtype == getattr(torch, seen["dtype"])
    assert emb.identity()["dtype"] == f"torch.{seen['dtype']}"


@pytest.mark.parametrize(("args", "want"), [([], True), (["--no-cache"], False)])
def test_evaluate_command_no_cache_turns_the_cache_off(tmp_path, monkeypatch, args, want):
    from typer.testing import CliRunner

    import negsynth.cli as cli
    from negsynth.cli import stages as stage_commands

    seen = {}

    def fake_execute(name, opts, ctx):
        seen["cache"] = ctx.cfg.evaluate.cache
        return {"stage": name}

    monkeypatch.setattr(stage_commands, "_execute", fake_execute)
    r = CliRunner().invoke(cli.app, ["evaluate", "-d", str(tmp_path / "run"), "-q", *args])
    assert r.exit_code == 0, r.output
    assert seen["cache"] is want
