"""Evaluator: metrics vs. hand-computed values, suite loader on the real files, report plumbing."""

from __future__ import annotations

import json
import math
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import RecordingEmbedder

from negsynth.data.readers import read_beir, read_tsv
from negsynth.embed.base import Embedder
from negsynth.evaluate import (
    TASKS,
    EvalDataError,
    UnknownTask,
    compare,
    evaluate,
    load_report,
    render_table,
    select_tasks,
)
from negsynth.evaluate import metrics as M
from negsynth.resources import default_data_dir

DATA = default_data_dir()
needs_data = pytest.mark.skipif(DATA is None or not Path(DATA).is_dir(), reason="shared benchmark data (../shared/data) not found")


class HashBOW(RecordingEmbedder):
    """Cheap deterministic embedder: hashed bag of lower-cased words (a lexical baseline)."""

    name = "hash-bow"

    def __init__(self, dim: int = 512, instruct_queries: bool = False):
        super().__init__(dim)
        self.instruct_queries = instruct_queries

    def vectors(self, texts):
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z0-9]+", t.lower()):
                out[i, zlib.crc32(w.encode()) % self._dim] += 1.0
        return out


def unit(deg: float) -> np.ndarray:
    r = math.radians(deg)
    return np.array([math.cos(r), math.sin(r)], dtype=np.float32)


# ---------------------------------------------------------------- metrics, hand-computed
def test_retrieval_graded_ndcg_mrr_recall():
    # q1 = 0 deg; docs at 10, 5, 20, 30 deg -> ranking d2, d1, d3, d4
    # q2 = 30 deg -> ranking d4 (30), d3 (20), d1 (10), d2 (5)
    q = np.stack([unit(0), unit(30)])
    d = np.stack([unit(10), unit(5), unit(20), unit(30)])
    dids = ["d1", "d2", "d3", "d4"]
    qrels = {"q1": {"d1": 3, "d3": 1}, "q2": {"d4": 1}, "q3": {"d1": 2}}  # q3 not among the queries
    m = M.retrieval_scores(q, d, ["q1", "q2"], dids, qrels, recall_k=2)
    # q1: DCG = 3/log2(3) + 1/log2(4); IDCG = 3/log2(2) + 1/log2(3); q2: perfect = 1
    ndcg_q1 = (3 / math.log2(3) + 1 / 2) / (3 + 1 / math.log2(3))
    assert m["ndcg@10"] == pytest.approx((ndcg_q1 + 1.0) / 2, abs=1e-6)
    assert m["mrr@10"] == pytest.approx((1 / 2 + 1) / 2)  # q1: first hit at rank 2
    assert m["recall@2"] == pytest.approx((1 / 2 + 1) / 2)  # q1: d1 of {d1, d3} in top 2
    full = M.retrieval_scores(q, d, ["q1", "q2"], dids, qrels)
    assert full["recall@100"] == 1.0 and full["queries"] == 2
    pq = M.retrieval_scores(q, d, ["q1", "q2"], dids, qrels, per_query=True)["per_query"]
    assert pq == pytest.approx({"q1": ndcg_q1, "q2": 1.0}, abs=1e-6)  # the per-query values behind the mean
    assert "per_query" not in full


def test_evaluate_a_beir_folder_by_path_with_per_query_scores(tmp_path):
    from helpers import write_beir

    from negsynth.evaluate.suite import retrieval_task

    dev = write_beir(tmp_path / "mydomain")  # c's qrel is wrong on purpose (d1, not the soup)
    task = retrieval_task("mydomain-dev", dev)
    rep = evaluate(HashBOW(), suite="full", data_dir=None, tasks=[task], progress=False, per_query=True)
    t = rep["tasks"]["mydomain-dev"]
    assert set(t["per_query"]) == {"a", "b", "c"} and t["n"] == 3
    assert t["per_query"]["a"] == 1.0 and t["per_query"]["b"] == 1.0 and t["per_query"]["c"] < 1.0  # c's qrel is wrong on purpose
    assert t["main_score"] == pytest.approx(sum(t["per_query"].values()) / 3)
    assert "per_query" not in evaluate(HashBOW(), suite="full", tasks=[task], progress=False)["tasks"]["mydomain-dev"]


def test_retrieval_ignores_queries_without_relevant_docs():
    q = np.stack([unit(0), unit(30)])
    d = np.stack([unit(10), unit(5)])
    m = M.retrieval_scores(q, d, ["q1", "q2"], ["d1", "d2"], {"q1": {"d2": 1}, "q2": {"d1": 0}})
    assert m["queries"] == 1 and m["ndcg@10"] == pytest.approx(1.0) and m["mrr@10"] == 1.0


def test_spearman_ap_triplets():
    cos = [0.9, 0.1, 0.5, 0.3]
    e1 = np.stack([unit(0)] * 4)
    e2 = np.stack([unit(math.degrees(math.acos(c))) for c in cos])
    # ranks of cos [4,1,3,2] vs gold [4,1,2,3]: sum d^2 = 2 -> rho = 1 - 6*2/(4*(16-1)) = 0.8
    assert M.sts_scores(e1, e2, [4, 1, 2, 3])["spearman"] == pytest.approx(0.8)
    # AP, cos ranking 0.9 (1), 0.5 (1), 0.3 (0), 0.1 (0) with labels -> precision at hits 1/1, 2/2
    assert M.pair_scores(e1, e2, [1, 0, 1, 0])["ap"] == pytest.approx(1.0)
    # labels [0,1,0,1]: ranking 0.9(0) 0.5(0) 0.3(1) 0.1(1): AP = (1/3 + 2/4) / 2
    assert M.pair_scores(e1, e2, [0, 1, 0, 1])["ap"] == pytest.approx((1 / 3 + 2 / 4) / 2)
    t = M.triplet_scores(np.stack([unit(0)] * 3), np.stack([unit(10), unit(40), unit(5)]), np.stack([unit(20), unit(30), unit(5)]))
    assert t["accuracy"] == pytest.approx(1 / 3)  # only the first; a tie counts as wrong


def test_v_measure_hand_computed_and_classification():
    # 3 points at one place, 1 elsewhere, labels a a b b -> clusters {p1,p2,p3}, {p4}
    x = np.array([[0, 0], [0, 0], [0, 0], [10, 10]], dtype=np.float32)
    h_c = math.log(2)
    h_c_given_k = 0.75 * -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    h_k = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    h_k_given_c = 0.5 * math.log(2)
    h, c = 1 - h_c_given_k / h_c, 1 - h_k_given_c / h_k
    assert M.clustering_scores(x, ["a", "a", "b", "b"])["v_measure"] == pytest.approx(2 * h * c / (h + c), abs=1e-9)
    sep = np.array([[0, 1], [0, 1.1], [5, 0], [5.1, 0], [9, 9], [9, 9.2]], dtype=np.float32)
    assert M.clustering_scores(sep, ["x", "x", "y", "y", "z", "z"])["v_measure"] == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.normal(0, 0.1, (20, 3)), rng.normal(3, 0.1, (20, 3))])
    ys = ["p"] * 20 + ["q"] * 20
    assert M.classification_scores(None, None, xs, ys)["accuracy"] == 1.0
    assert M.classification_scores(xs[::2], ys[::2], xs[1::2], ys[1::2])["accuracy"] == 1.0


# ---------------------------------------------------------------- suite and loaders
def test_select_tasks():
    assert [t.name for t in select_tasks("quick", "STS12,scifact")] == ["STS12", "SciFact"]
    assert {t.category for t in select_tasks("full", ["STS"])} == {"STS"}
    assert all(t.default for t in select_tasks("full"))
    with pytest.raises(UnknownTask, match="unknown task 'nope'"):
        select_tasks("quick", ["nope"])
    with pytest.raises(UnknownTask, match="suite"):
        select_tasks("medium")
    assert all(t.instruction == "Retrieve semantically similar text." for t in TASKS if t.category == "STS")


@needs_data
def test_suite_files_load_with_expected_sizes():
    data = Path(DATA)
    counts = {}
    for spec in TASKS:
        if spec.category == "Retr":
            q, corpus, qrels = read_beir(data / spec.files[0], doc_title=spec.doc_title)
            counts[spec.name] = (len(q), len(corpus))
            assert all(d in corpus for rel in qrels.values() for d in rel)
        else:
            for f in spec.files:
                cols = read_tsv(data / f, tuple(spec.columns.values()))
                counts[f] = len(next(iter(cols.values())))
    # sizes from shared/data/README.md
    assert counts["SciFact"] == (300, 5183) and counts["Cranfield"] == (225, 1400)
    assert counts["stsb/test.tsv"] == 1379 and counts["sts12/test.tsv"] == 3108 and counts["sts16/test.tsv"] == 1186
    assert counts["mrpc/test.tsv"] == 1725 and counts["ag_news/test.tsv"] == 7600 and counts["trec/test.tsv"] == 500
    assert counts["snli/triples_test.tsv"] == 3247 and counts["sickr/triples_test.tsv"] == 200


@needs_data
def test_quick_run_on_real_data_with_lexical_embedder(tmp_path):
    emb = HashBOW(instruct_queries=True)
    rep = evaluate(emb, suite="quick", tasks=["STS12", "SciFact", "SICK-E", "TREC"], progress=False, out=tmp_path / "r.json")
    assert set(rep["tasks"]) == {"STS12", "SciFact", "SICK-E", "TREC"}
    assert rep["tasks"]["STS12"]["n"] == 500 and rep["tasks"]["STS12"]["subsampled"]
    assert rep["tasks"]["SciFact"]["metrics"]["corpus"] <= 1000
    # raw term counts (no idf) with the instruction words in every query: weak, but far above
    # a random ranking of 1,000 documents (nDCG@10 ~ 0.01); BM25 gets 0.66
    assert 0.1 < rep["tasks"]["SciFact"]["main_score"] < 0.9
    assert rep["tasks"]["TREC"]["main_score"] > 0.4  # 6 classes, chance ~0.28
    # instructions: symmetric inputs carry the STS instruction; retrieval docs carry none
    assert any(s.startswith("Instruct: Retrieve semantically similar text.\nQuery: ") for s in emb.seen)
    assert any(s.startswith("Instruct: Given a scientific claim") for s in emb.seen)
    assert sum(s.startswith("Instruct:") for s in emb.seen) < len(emb.seen)
    assert load_report(tmp_path / "r.json") == json.loads(json.dumps(rep))
    assert rep["average"] == pytest.approx(np.mean([t["main_score"] for t in rep["tasks"].values()]))


@pytest.mark.skipif(DATA is None, reason="shared benchmark data not found")
def test_minilm_on_a_few_real_pairs():
    st = pytest.importorskip("sentence_transformers")
    from negsynth.resources import MissingResource, minilm_path

    try:
        path = minilm_path()
    except MissingResource as e:
        pytest.skip(str(e))
    model = st.SentenceTransformer(str(path), device="cpu", local_files_only=True)

    class MiniLM(Embedder):
        name = "minilm"

        @property
        def dim(self):
            return 384

        def _encode(self, texts, *, batch_size, show_progress):
            return model.encode(texts, batch_size=32)

    cols = read_tsv(Path(DATA) / "stsb/test.tsv", ("sentence1", "sentence2", "score"))
    n = 40
    e1 = MiniLM().encode_queries(cols["sentence1"][:n])
    e2 = MiniLM().encode_queries(cols["sentence2"][:n])
    rho = M.sts_scores(e1, e2, [float(s) for s in cols["score"][:n]])["spearman"]
    assert rho > 0.6  # MiniLM gets ~0.82 on the full STSB test


# ---------------------------------------------------------------- report plumbing
def _tiny_data(root: Path) -> Path:
    (root / "sts").mkdir(parents=True)
    (root / "sts/test.tsv").write_text(
        "sentence1\tsentence2\tscore\n"
        "a cat sits\ta cat sits\t5\nthe dog runs\ta dog runs fast\t4\nred car\tblue sky\t0\nhot tea\ttea is hot\t3.5\n"
    )
    return root


def test_evaluate_with_explicit_data_dir_missing_sets_and_compare(tmp_path, monkeypatch):
    import negsynth.evaluate.suite as S

    data = _tiny_data(tmp_path / "data")
    spec = S.TaskSpec("TinySTS", "STS", ("sts/test.tsv",), S.STS_INSTRUCTION, dict(S._STS_COLS))
    gone = S.TaskSpec("GoneSTS", "STS", ("nothere/test.tsv",), S.STS_INSTRUCTION, dict(S._STS_COLS))
    monkeypatch.setattr(S, "TASKS", (spec, gone))
    rep = evaluate(HashBOW(), suite="full", data_dir=data, progress=False)
    assert rep["tasks"]["TinySTS"]["n"] == 4 and "GoneSTS" in rep["skipped"]
    assert rep["categories"] == {"STS": rep["tasks"]["TinySTS"]["main_score"]}
    base = json.loads(json.dumps(rep))
    base["tasks"]["TinySTS"]["main_score"] -= 0.1
    cmp = compare(rep, base)
    assert cmp["tasks"]["TinySTS"]["delta"] == pytest.approx(0.1)
    assert cmp["average"]["delta"] == pytest.approx(0.1)
    from rich.console import Console

    console = Console(record=True, width=140)
    console.print(render_table(rep, base))
    text = console.export_text()
    assert "TinySTS" in text and "+10.00" in text and "Average" in text


def test_no_data_gives_one_line_and_empty_report(tmp_path, capsys):
    rep = evaluate(HashBOW(), data_dir=tmp_path / "nope", out=tmp_path / "r.json")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no evaluation data" in err[0] and "NEGSYNTH_DATA_DIR" in err[0]
    assert rep["tasks"] == {} and rep["average"] is None
    assert json.loads((tmp_path / "r.json").read_text())["tasks"] == {}


def test_malformed_file_names_file_and_line(tmp_path):
    p = tmp_path / "bad.tsv"
    p.write_text("sentence1\tsentence2\tscore\na\tb\t1\nc\td\n")
    with pytest.raises(EvalDataError, match=r"bad.tsv:3: 2 tab-separated fields"):
        read_tsv(p, ("sentence1", "sentence2", "score"))
    p.write_text("s1\ts2\tscore\n")
    with pytest.raises(EvalDataError, match=r"lacks column\(s\) \['sentence1', 'sentence2'\]"):
        read_tsv(p, ("sentence1", "sentence2", "score"))
    p.write_text("sentence1\tsentence2\tscore\na\tb\tfive\n")
    from negsynth.data.readers import parse_floats

    cols = read_tsv(p, ("sentence1", "sentence2", "score"))
    with pytest.raises(EvalDataError, match=r"bad.tsv:2: column 'score' holds 'five'"):
        parse_floats(p, "score", cols["score"])


def test_texts_shared_by_tasks_are_embedded_once(tmp_path, monkeypatch):
    import negsynth.evaluate.suite as S

    d = tmp_path / "data"
    d.mkdir()
    lines = ["text\tlabel"] + [f"{w} story number {i}\t{w}" for i in range(10) for w in ("sport", "money")]
    (d / "news.tsv").write_text("\n".join(lines) + "\n")
    cls = S.TaskSpec("NewsCls", "Class", ("news.tsv",), "Classify", dict(S._CLS_COLS), eval_mode="cv")
    clu = S.TaskSpec("NewsClust", "Clust", ("news.tsv",), "Cluster", dict(S._CLS_COLS))
    monkeypatch.setattr(S, "TASKS", (cls, clu))
    plain = HashBOW(instruct_queries=False)
    rep = evaluate(plain, suite="full", data_dir=d, progress=False)
    assert rep["tasks"]["NewsCls"]["main_score"] == 1.0 and rep["tasks"]["NewsClust"]["main_score"] == pytest.approx(1.0)
    assert len(plain.seen) == 20  # the clustering task reused the classification embeddings
    instructed = HashBOW(instruct_queries=True)
    evaluate(instructed, suite="full", data_dir=d, progress=False)
    assert len(instructed.seen) == 40 and len(set(instructed.seen)) == 40  # different instructions
