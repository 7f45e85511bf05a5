"""The held-out set: documents set aside from the corpus stage's training sample (seeded, the
same whatever ``corpus.max_docs``, none for a small corpus, with the reason), and the ``heldout``
stage that writes one evaluation query per held-out document against the fake LLM (records,
rejects, resume with no request paid twice)."""

from __future__ import annotations

import json

from fake_openai import FakeOpenAI, Reply
from helpers import write_run_config
from test_corpus import answer, document_of, invoke, write_big_corpus

from negsynth.data.shards import read_stage
from negsynth.schemas.config import HeldoutConfig, RunConfig, run_config_class
from negsynth.stages import sections
from negsynth.stages.corpus import heldout_indices, training_sample


def config(**sections_: dict) -> RunConfig:
    """A run config with the method's sections, as the run file is read."""
    return run_config_class(sections()).model_validate(sections_)


def test_the_held_out_documents_are_seeded_and_the_same_whatever_max_docs():
    held, reason = heldout_indices(config(), 2000)
    assert reason is None and len(held) == 100 and held == sorted(held) and len(set(held)) == 100
    assert heldout_indices(config(), 2000)[0] == held  # the same on every call
    assert heldout_indices(config(heldout={"seed": 2}), 2000)[0] != held
    # another training sample of the same corpus: the held-out set is the start of the same draw
    small = heldout_indices(config(corpus={"max_docs": 400}), 2000)[0]
    assert len(small) == 60 and set(small) <= set(held)
    assert heldout_indices(config(corpus={"max_docs": 1000}), 2000)[0] == held


def test_the_training_sample_leaves_the_held_out_documents_out():
    cfg = config(corpus={"max_docs": 1000, "seed": 3})
    held = set(heldout_indices(cfg, 5000)[0])
    sample, removed = training_sample(cfg, 5000)
    off = training_sample(config(corpus={"max_docs": 1000, "seed": 3}, heldout={"queries": 0}), 5000)[0]
    assert removed and set(removed) <= held and not held & set(sample)
    assert list(sample) == [i for i in off if i not in held]  # the sample it was, less the held-out documents
    assert len(off) == 1000 and removed == sorted(held & set(off))


def test_a_small_corpus_gets_no_held_out_set_and_says_why():
    held, reason = heldout_indices(config(), 150)
    assert held == [] and reason.startswith("150 documents: too few to set aside a held-out set (needs 200")
    assert training_sample(config(), 150) == (range(150), [])  # the sample of old, untouched
    assert heldout_indices(config(heldout={"queries": 0}), 5000) == ([], "heldout.queries = 0: no held-out set, no verdict")
    # the requests stay within the share of the run's at the defaults
    held = heldout_indices(config(), 400)[0]
    assert len(held) == 60 and len(held) / 400 <= HeldoutConfig().share


def test_the_heldout_stage_writes_one_query_per_document_and_resumes_without_paying_twice(tmp_path, minilm):
    folder = write_big_corpus(tmp_path, 40)
    run = tmp_path / "run"
    sections_ = {"corpus": {"inputs": [{"path": str(folder)}]}, "heldout": {"min_queries": 3, "share": 0.2}}
    held = heldout_indices(config(**sections_), 40)[0]
    meta = f"chapter {held[0]} "  # this document's answers are always meta phrasing: re-asked, then rejected

    def responder(req, n):
        doc = document_of(req)
        return Reply(json.dumps({"queries": ["This document describes " + doc[:30]]})) if meta in doc else answer(req, n)

    with FakeOpenAI(responder) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, **sections_, llm={"max_attempts": 2, "max_concurrency": 2, "seed": 7})
        r = invoke("heldout", "-c", cfg, "-d", run, "--max-requests", "3")  # a budget stops it part-way
        assert r.exit_code == 3, r.output
        r = invoke("heldout", "-c", cfg, "-d", run, "--json")
        assert r.exit_code == 0, r.output
        first = [document_of(q) for q in srv.requests if not q["messages"][-1]["content"].startswith("Your answer was rejected")]
        assert len(first) == len(set(first)) == len(held) == 8  # each held-out document asked once over both runs
        assert len(srv.requests) == 8 + 1  # and the meta one re-asked once
        shard = (run / "heldout" / "shard-00000.jsonl").read_bytes()
        r = invoke("heldout", "-c", cfg, "-d", run, "--overwrite", "--json")  # made again from the request cache
        assert r.exit_code == 0, r.output
        assert len(srv.requests) == 9
    assert (run / "heldout" / "shard-00000.jsonl").read_bytes() == shard  # byte-identical
    stats = json.loads((run / "heldout" / "stats.json").read_text())
    recs = list(read_stage(run / "heldout"))
    assert stats["heldout"]["held_out"] == 8 and stats["valid"] == 7 and stats["rejects_by_reason"] == {"meta_query": 1}
    assert sorted(int(r["doc_id"][1:]) for r in recs) == held[1:]
    assert all(set(r) == {"id", "query", "corpus", "doc_id", "style", "model", "usage"} for r in recs)
    assert {r["style"] for r in recs} <= {"question", "keywords"}
    # its own draw: the LLM's seed of a held-out request is moved by heldout.seed (the corpus stage's is llm.seed)
    assert {q["seed"] for q in srv.requests} == {7 + 1}


def test_a_small_corpus_skips_the_stage_with_its_reason(tmp_path):
    folder = write_big_corpus(tmp_path, 12)
    cfg = write_run_config(tmp_path, "http://127.0.0.1:9/v1", corpus={"inputs": [{"path": str(folder)}]})
    r = invoke("heldout", "-c", cfg, "-d", tmp_path / "run", "--json")
    assert r.exit_code == 0, r.output
    stats = json.loads((tmp_path / "run" / "heldout" / "stats.json").read_text())
    assert stats["skipped"] and stats["reason"].startswith("12 documents: too few to set aside a held-out set")


def test_estimate_counts_the_held_out_requests_beside_the_training_ones(tmp_path):
    folder = write_big_corpus(tmp_path, 40)
    r = invoke("estimate", "-d", tmp_path / "r", "-i", folder, "--set", "heldout.min_queries=3", "--set", "heldout.share=0.2", "--json")
    assert r.exit_code == 0, r.output
    est = json.loads(r.stdout)["stages"]
    assert est["heldout"]["requests"] == 8 and est["corpus"]["requests"] == 40 - 8  # the training sample less the held-out documents


def test_the_chunk_settings_enter_the_held_out_digest_only_where_a_document_is_split(tmp_path):
    """As in the corpus stage: short documents keep one digest whatever the chunk settings (a run dir
    made under the old 224-token default resumes); a split document makes them count."""
    import shutil

    from negsynth.pipeline.context import StageContext
    from negsynth.stages.heldout import STAGE

    folder = write_big_corpus(tmp_path, n=120)

    def digest(**corpus) -> str:
        cfg = config(corpus={"inputs": [{"path": str(folder)}], **corpus})
        return STAGE.made_from(StageContext(cfg=cfg, run_dir=tmp_path / "run"))["config_hash"]

    assert digest() == digest(chunk_tokens=224) == digest(chunk_tokens=64, chunk_overlap=8)
    long = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines()]
    long[0]["text"] = " ".join(f"word{i}" for i in range(400))
    shutil.rmtree(folder)
    folder.mkdir()
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in long))
    assert digest() != digest(chunk_tokens=224) != digest(chunk_tokens=128, chunk_overlap=16)
