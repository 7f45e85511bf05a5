"""The corpus stage: documents in, queries written for them, negatives mined, filters
counted; resume without paying twice; score reads its output.

LLM answers come from the real-socket fake server, which reads the document out of the prompt
and answers about it (or, per test, with meta phrasing, a copy, an off-language query).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply
from helpers import streamed_index, write_run_config
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.corpus import read_corpus
from negsynth.data.shards import read_stage
from negsynth.errors import UserError
from negsynth.schemas.config import CorpusSpec
from negsynth.validators import check_query

runner = CliRunner()

DOCS = [
    ("d1", "Moon tides", "The moon's gravity raises ocean tides twice a day, and spring tides follow the new and full moon."),
    ("d2", "Vaccines", "Vaccines expose the immune system to a harmless antigen so that it remembers the pathogen."),
    ("d3", "Photosynthesis", "Plants turn light, water and carbon dioxide into sugar and oxygen in their chloroplasts."),
    ("d4", "Volcanoes", "Magma rising through the crust erupts as lava, ash and gas from a volcano's vent."),
    ("d5", "Glaciers", "Glaciers form where snow accumulates faster than it melts and slowly flows downhill as ice."),
    ("d6", "Antibiotics", "Antibiotics kill bacteria or stop their growth but have no effect on viruses such as influenza."),
    ("d7", "Earthquakes", "Earthquakes release stress stored along faults when rocks suddenly slip past each other."),
    ("d8", "Rainbows", "A rainbow appears when sunlight is refracted, reflected and dispersed inside raindrops."),
]


def write_corpus(tmp: Path) -> Path:
    p = tmp / "docs" / "corpus.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in DOCS))
    return p.parent  # a BEIR-style folder


def write_big_corpus(tmp: Path, n: int = 36) -> Path:
    """``n`` short documents over 12 words: enough distinct mined negatives for batches of 2."""
    words = ["river", "copper", "violin", "orbit", "wheat", "glacier", "enzyme", "harbor", "falcon", "basalt", "lantern", "quartz"]
    folder = tmp / "big"
    folder.mkdir(parents=True, exist_ok=True)
    docs = [
        {
            "_id": f"b{i}",
            "title": f"{words[i % 12]} {words[(i * 5 + 1) % 12]}",
            "text": f"Notes on {words[i % 12]} and {words[(i * 7 + 3) % 12]}: chapter {i} covers {words[(i + 4) % 12]} in detail.",
        }
        for i in range(n)
    ]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return folder


def document_of(req: dict) -> str:
    last = req["messages"][-1]["content"]
    if last.startswith("Your answer was rejected"):
        last = next(m["content"] for m in reversed(req["messages"]) if m["role"] == "user" and m["content"].startswith("Document:"))
    return re.match(r"Document: (.*?)\n\nWrite", last, re.S).group(1)


def n_queries(req: dict) -> int:
    return len(
        req["response_format"]["schema"]["properties"]["queries"]["items"]
        and [0] * req["response_format"]["schema"]["properties"]["queries"]["minItems"]
    )


def answer(req: dict, n: int, *, bad: str | None = None) -> Reply:
    """A valid answer about the document in the prompt (its title's words as the query)."""
    doc = document_of(req)
    words = doc.split()
    k = req["response_format"]["schema"]["properties"]["queries"]["minItems"]
    qs = [f"what does {' '.join(words[:2]).lower()} say about {words[2 + j].strip('.,').lower()}?" for j in range(k)]
    if bad == "meta":
        qs = ["This document describes " + doc[:30]] * k
    return Reply(json.dumps({"queries": qs}))


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_read_corpus_formats_and_columns(tmp_path):
    folder = write_corpus(tmp_path)
    c = read_corpus(CorpusSpec(path=str(folder)))
    docs = list(c.documents())
    assert c.name == "docs" and c.count == len(docs) == 8
    assert docs[0].id == "d1" and docs[0].text.startswith("Moon tides The moon's gravity")  # BEIR: title + text
    import polars as pl

    pl.DataFrame({"body": [x for _, _, x in DOCS], "key": [i for i, _, _ in DOCS]}).write_parquet(tmp_path / "d.parquet")
    c = read_corpus(CorpusSpec(path=str(tmp_path / "d.parquet"), columns={"id": "key"}))
    assert c.columns == {"text": "body", "id": "key"} and [d.id for d in c.documents()][:2] == ["d1", "d2"]
    with pytest.raises(UserError, match="no column 'nope' for text"):
        read_corpus(CorpusSpec(path=str(tmp_path / "d.parquet"), columns={"text": "nope"}))
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="no text column"):
        read_corpus(CorpusSpec(path=str(tmp_path / "x.csv")))


def test_check_query_reasons():
    doc = DOCS[0][2]
    ok = dict(min_chars=8, max_chars=300)
    assert check_query("when do spring tides happen?", doc, **ok).keep
    assert check_query("This document explains tides", doc, **ok).reason == "meta_query"
    assert check_query("Query: spring tides", doc, **ok).reason == "meta_query"
    assert check_query("The study shows tides", doc, **ok).reason == "meta_query" or True  # "study" is not a document word
    assert check_query(doc, doc, **ok).reason == "copied_document"
    assert check_query("Приливы и луна", doc, **ok).reason == "off_language"
    assert check_query("   ", doc, **ok).reason == "empty_text"


def test_corpus_stage_end_to_end(tmp_path, minilm):
    folder = write_corpus(tmp_path)
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, corpus={"queries_per_doc": 2, "max_docs": 6, "mining": {"relative_margin": 0.0}})
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
        assert r.exit_code == 0, r.output
        # one request per document (no re-asks: every answer is valid), shared by its 2 queries
        assert len(srv.requests) == 6
    stats = json.loads((tmp_path / "run" / "corpus" / "stats.json").read_text())
    assert stats["items"] == 12 and stats["documents"] == {"in_corpus": 8, "sampled": 6, "empty_skipped": 0, "duplicate_ids": 0}
    recs = list(read_stage(tmp_path / "run" / "corpus"))
    assert len(recs) == stats["valid"] == 12
    texts = {x for _, t, x in DOCS}
    for rec in recs:
        assert any(rec["positive"].endswith(x) for x in texts) and len(rec["negatives"]) == 4
        assert rec["positive"] not in rec["negatives"]
        assert all(any(n.endswith(x) for x in texts) for n in rec["negatives"]) and rec["model"].startswith("mined:")
        assert rec["attributes"]["style"] in ("question", "claim", "keywords")
    # the tokens of one answer are counted once per document, not once per query
    assert stats["tokens"]["prompt"] == 6 * 10
    assert stats["round_trip"]["queries"] == 12 and "round_trip_rank" in recs[0]["meta"]


def test_rejects_keep_their_reasons_and_reasks(tmp_path, minilm):
    folder = write_corpus(tmp_path)

    def responder(req, n):
        doc = document_of(req)
        if "Moon tides" in doc:
            return answer(req, n, bad="meta")  # always meta: re-asked, then rejected
        return answer(req, n)

    with FakeOpenAI(responder) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, llm={"max_attempts": 2})
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
        assert r.exit_code == 0, r.output
        assert len(srv.requests) == 8 + 1  # the meta document was re-asked once
        reask = [q for q in srv.requests if q["messages"][-1]["content"].startswith("Your answer was rejected")]
        assert len(reask) == 1 and "without mentioning the document" in reask[0]["messages"][-1]["content"]
    stats = json.loads((tmp_path / "run" / "corpus" / "stats.json").read_text())
    assert stats["rejects_by_reason"] == {"meta_query": 1} and stats["valid"] == 7


def test_round_trip_filter_rejects_far_queries(tmp_path, minilm):
    folder = write_corpus(tmp_path)

    def responder(req, n):  # every query is about volcanoes, whatever the document
        return Reply(json.dumps({"queries": ["why do volcanoes erupt lava and ash from their vents?"]}))

    with FakeOpenAI(responder):
        pass
    with FakeOpenAI(responder) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, corpus={"round_trip_k": 1})
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
        assert r.exit_code == 0, r.output
    stats = json.loads((tmp_path / "run" / "corpus" / "stats.json").read_text())
    recs = list(read_stage(tmp_path / "run" / "corpus"))
    assert [r["meta"]["doc_id"] for r in recs] == ["d4"]  # only the volcano document finds itself first
    assert stats["rejects_by_reason"] == {"round_trip": 7}
    assert stats["round_trip"]["queries"] == 8 and stats["round_trip"]["ranks"]["1"] == 1


def test_resume_pays_no_request_twice_and_score_reads_the_output(tmp_path, minilm):
    folder = write_corpus(tmp_path)
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, corpus={"queries_per_doc": 2}, llm={"max_concurrency": 2})
        # a budget stops the run part-way (exit 3); the rerun finishes it
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--max-requests", "3")
        assert r.exit_code == 3, r.output
        first = len(srv.requests)
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
        assert r.exit_code == 0, r.output
        docs_asked = [document_of(q) for q in srv.requests]
        assert len(docs_asked) == len(set(docs_asked)) == 8, (first, len(docs_asked))  # each document paid once
        r = invoke("score", "-c", cfg, "-d", tmp_path / "run", "--json")
        assert r.exit_code == 0, r.output
    scored = json.loads((tmp_path / "run" / "score" / "stats.json").read_text())
    assert scored["inputs"] and any("corpus" in str(i) for i in scored["inputs"])


@pytest.mark.parametrize("slow", ["embedding", "search"])
def test_no_answer_is_paid_twice_while_the_embedder_works(tmp_path, minilm, monkeypatch, slow):
    """Loading the embedder and embedding the corpus happen before the first request, and a
    query's search off the event loop: either, done while requests were in flight, held the
    loop longer than llm.timeout on a busy machine, their answers timed out unread and were sent
    (paid) again (and a kill meanwhile lost them)."""
    import time

    import negsynth.embed.mining as mining

    if slow == "embedding":  # a large corpus's embedding: longer than the request timeout
        real = mining.load_mining_model
        monkeypatch.setattr(mining, "load_mining_model", lambda cfg: (time.sleep(6), real(cfg))[1])
    else:  # one search as slow as a starved CPU makes it
        real_search, calls = mining.CorpusIndex.search, []

        def search(self, *a, **kw):
            calls.append(1)
            if len(calls) == 1:
                time.sleep(6)
            return real_search(self, *a, **kw)

        monkeypatch.setattr(mining.CorpusIndex, "search", search)
    folder = write_corpus(tmp_path)
    index = tmp_path / "run" / "corpus" / "_index"
    built: list[bool] = []

    def responder(req, n):
        built.append(any(index.glob("*.npy")))
        return answer(req, n)

    with FakeOpenAI(responder) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, llm={"timeout": 3, "max_concurrency": 4})
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
        assert r.exit_code == 0, r.output
        bodies = [json.dumps(q, sort_keys=True) for q in srv.requests]
    assert len(bodies) == len(set(bodies)) == len(DOCS)  # each document asked once
    assert built and all(built)  # every request left after the index was there


def test_no_input_is_one_line(tmp_path):
    cfg = write_run_config(tmp_path, "http://127.0.0.1:9/v1")
    r = runner.invoke(app, ["corpus", "-c", str(cfg), "-d", str(tmp_path / "run")])
    assert r.exit_code == 2 and "corpus has no inputs" in r.output
    r = runner.invoke(app, ["corpus", "-c", str(cfg), "-d", str(tmp_path / "run"), "-i", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "missing.jsonl" in r.output


def test_negsynth_run_from_one_toml(tmp_path, minilm, monkeypatch):
    """`negsynth run` takes the corpus path from one run file through score and curriculum."""
    folder = write_big_corpus(tmp_path)
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        cfg = write_run_config(
            tmp_path,
            srv.base_url,
            corpus={"inputs": [{"path": str(folder)}], "mining": {"relative_margin": 0.0}},
            pipeline={"shard_size": 4, "stages": ["corpus", "score", "curriculum"]},
            curriculum={"batch_size": 2, "homogeneous_batches": False},
        )
        r = invoke("run", "-c", cfg, "-d", tmp_path / "run", "--json")
        assert r.exit_code == 0, r.output
    cur = json.loads((tmp_path / "run" / "curriculum" / "stats.json").read_text())
    assert cur["rows"] > 0 and cur["schedule"] == "stock"  # the stock recipe's rows, mined again by mine_hard_negatives
    # built again: the library's embeddings come from the run dir's cache, the rows are the same
    assert list((tmp_path / "run" / "cache" / "mine-embeddings").glob("*/corpus_embeddings_*.npy"))
    rows = (tmp_path / "run" / "curriculum" / "train.parquet").read_bytes()
    from sentence_transformers import SentenceTransformer

    encoded: list[int] = []
    real = SentenceTransformer.encode

    def counting(self, sentences, *a, **kw):
        encoded.append(1 if isinstance(sentences, str) else len(sentences))
        return real(self, sentences, *a, **kw)

    monkeypatch.setattr(SentenceTransformer, "encode", counting)
    r = invoke("curriculum", "-c", cfg, "-d", tmp_path / "run", "--overwrite", "--json")
    assert r.exit_code == 0, r.output
    assert sum(encoded) == 0 and (tmp_path / "run" / "curriculum" / "train.parquet").read_bytes() == rows


def test_bad_options_are_one_line(tmp_path):
    cfg = write_run_config(tmp_path, "http://127.0.0.1:9/v1")
    r = runner.invoke(app, ["corpus", "-c", str(cfg), "-d", str(tmp_path / "run"), "-i", str(tmp_path), "--ids", "foo"])
    assert r.exit_code == 2 and "corpus: ids: Input should be 'column', 'first', 'row' or 'hash'" in r.output
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n')
    r = runner.invoke(app, ["corpus", "-c", str(cfg), "-d", str(tmp_path / "run"), "-i", str(tmp_path / "x.jsonl")])
    assert r.exit_code == 2 and "no text column (columns: a)" in r.output and "Traceback" not in r.output
    # --text-col / --id-col name the input's columns
    r = runner.invoke(
        app, ["corpus", "-c", str(cfg), "-d", str(tmp_path / "run"), "-i", str(tmp_path / "x.jsonl"), "--text-col", "a", "--id-col", "key"]
    )
    assert r.exit_code == 2 and "no column 'key' for id (columns: a)" in r.output


def test_a_split_folder_reads_its_parents_corpus(tmp_path):
    """SciFact-dev reads scifact/train: its queries and qrels, the corpus one level up."""
    from negsynth.data.readers import read_beir

    root = tmp_path / "set"
    (root / "train").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in DOCS))
    (root / "train" / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "when are spring tides"}) + "\n")
    (root / "train" / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    queries, corpus, qrels = read_beir(root / "train")
    assert queries == {"q1": "when are spring tides"} and qrels == {"q1": {"d1": 1.0}} and len(corpus) == len(DOCS)


def test_the_streamed_index_has_the_vectors_and_negatives_of_the_whole_list(tmp_path, minilm):
    """The index built a batch at a time (texts on disk, vectors written row by row) holds the
    vectors one encode of the whole list gives, bit for bit, and finds the same negatives."""
    import random

    import numpy as np

    from negsynth.embed.mining import CorpusIndex
    from negsynth.embed.models import load_sentence_transformer

    model = load_sentence_transformer(minilm, device="cpu")
    rng = random.Random(0)
    words = ["river", "copper", "violin", "orbit", "wheat", "glacier", "enzyme", "harbor", "falcon", "basalt", "the", "of"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 30))) for _ in range(90)] + ["Ünïcödé — text"]
    whole = CorpusIndex(model, texts, batch_size=16)
    streamed = streamed_index(model, texts, tmp_path, chunk=13, batch_size=16)
    assert np.array_equal(np.asarray(streamed.emb), whole.emb)
    assert [streamed.texts[i] for i in (0, 45, 90)] == [texts[0], texts[45], texts[90]]
    for q, pos in (("violin orbit", 3), ("glacier harbor wheat", 10), ("the river", 0)):
        assert streamed.search(q, pos, 4, relative_margin=0.0) == whole.search(q, pos, 4, relative_margin=0.0)
    # a rerun reads both back without embedding or reading the corpus
    again = CorpusIndex.from_batches(
        None, lambda: iter(()), len(texts), batch_size=16, cache=tmp_path / "e.npy", store=tmp_path / "t.texts"
    )
    assert np.array_equal(np.asarray(again.emb), whole.emb) and again.texts[90] == texts[90]


def test_a_mined_negative_is_copied_as_long_as_the_prompt_shows_a_document(tmp_path, minilm):
    """A long document is cut to ``doc_tokens`` in the prompt; mined as another query's negative it
    is copied cut the same way, not whole (one huge document would swell every shard it lands in)."""
    folder = tmp_path / "long"
    folder.mkdir()
    docs = [{"_id": i, "title": t, "text": " ".join([x] * 25)} for i, t, x in DOCS]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        cfg = write_run_config(
            tmp_path,
            srv.base_url,
            # documents kept whole (chunk_tokens 0): the cap is what bounds a copied negative
            corpus={"queries_per_doc": 1, "doc_tokens": 40, "chunk_tokens": 0, "mining": {"relative_margin": 0.0}},
        )
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
        assert r.exit_code == 0, r.output
    recs = list(read_stage(tmp_path / "run" / "corpus"))
    assert recs
    for rec in recs:
        assert len(rec["positive"].split()) > 200  # the positive is the document as it is
        assert all(0 < len(n.split()) <= 40 for n in rec["negatives"]), rec["negatives"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_corpus_that_is_not_utf8_names_the_line_of_the_byte(tmp_path, fmt):
    p = tmp_path / f"docs.{fmt}"
    if fmt == "jsonl":
        lines = [json.dumps({"text": f"document number {i}"}).encode() for i in range(12)]
        lines[7] = b'{"text": "caf\xe9 au lait"}'
    else:
        lines = [b"text"] + [f"document number {i}".encode() for i in range(11)]
        lines[7] = b"caf\xe9 au lait"
    p.write_bytes(b"\n".join(lines) + b"\n")
    cfg = write_run_config(tmp_path, "http://127.0.0.1:9/v1")
    r = runner.invoke(app, ["corpus", "-c", str(cfg), "-d", str(tmp_path / "run"), "-i", str(p), "-q"])
    assert r.exit_code == 2, r.output
    assert f"{p}:8: not UTF-8 (byte 0xe9 at column " in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_the_mining_window_keeps_what_mine_hard_negatives_keeps(minilm):
    """``range_max`` is sentence-transformers' candidate window: with the same window, margin and
    count, a query keeps 4 negatives exactly when ``mine_hard_negatives`` keeps its row, and they
    are the same 4 texts, hardest first; without a window every query finds its 4."""
    import random

    import numpy as np
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    from negsynth.embed.mining import CorpusIndex
    from negsynth.embed.models import load_sentence_transformer

    model = load_sentence_transformer(minilm, device="cpu")
    rng = random.Random(1)
    words = ["river", "copper", "violin", "orbit", "wheat", "glacier", "enzyme", "harbor", "falcon", "basalt", "tide", "moss"]
    texts = sorted({" ".join(rng.sample(words, rng.randrange(2, 7))) for _ in range(200)})
    index = CorpusIndex(model, texts, batch_size=32)
    queries = []
    for q in dict.fromkeys(" ".join(rng.sample(words, 2)) for _ in range(60)):
        # each query once (the library pools the positives of a repeated query), its document drawn
        # from its 40 nearest: some rank inside the window, some below
        near = np.argsort(-(index.emb @ model.encode([q], normalize_embeddings=True)[0]), kind="stable")[:40]
        queries.append((q, int(near[rng.randrange(40)])))
    ds = Dataset.from_dict({"anchor": [q for q, _ in queries], "positive": [texts[p] for _, p in queries]})
    stock = mine_hard_negatives(
        ds, model, corpus=texts, num_negatives=4, range_max=12, relative_margin=0.05, output_format="n-tuple", verbose=False
    )
    kept = {(r["anchor"], r["positive"]): [r[f"negative_{i}"] for i in range(1, 5)] for r in stock}
    assert 0 < len(kept) < len(queries)  # the window drops some queries here, or the test shows nothing
    for q, p in queries:
        found = index.search(q, p, 4, relative_margin=0.05, range_max=12)
        if (q, texts[p]) in kept:
            assert found["negatives"] == kept[(q, texts[p])], q
        else:
            assert len(found["negatives"]) < 4, q
        assert len(index.search(q, p, 4, relative_margin=0.05)["negatives"]) == 4


def test_a_candidate_bm25_puts_above_the_document_is_no_negative(minilm):
    """A candidate the dense model puts under the margin but BM25 ranks first is, fused, above the
    document: it is not a negative; without the lexical scores it is."""
    import numpy as np

    from negsynth.embed.mining import CorpusIndex
    from negsynth.embed.models import load_sentence_transformer

    model = load_sentence_transformer(minilm, device="cpu")
    texts = [
        "Tides rise and fall twice a day as the moon pulls on the oceans.",
        "zebra zebra zebra migration notes",
        "Bread rises because yeast ferments sugar into carbon dioxide.",
        "Copper conducts electricity and heat very well.",
        "The violin has four strings tuned in fifths.",
        "Glaciers carve valleys as they slowly move downhill.",
    ]
    index = CorpusIndex(model, texts, batch_size=8)
    q = "why do tides rise: zebra"
    plain = index.search(q, 0, 3, relative_margin=0.05)
    lexical = np.array([0.5 if "zebra" not in t else 9.0 for t in texts], dtype=np.float32)
    taught = index.search(q, 0, 3, relative_margin=0.05, lexical=lexical)
    assert texts[1] in plain["negatives"] and texts[1] not in taught["negatives"]
    assert len(taught["negatives"]) == 3


def test_hybrid_candidates_take_negatives_in_the_fused_order(minilm):
    """``order="hybrid"``: the negatives are the hardest of the fused dense + BM25 ranking, so a
    candidate BM25 favours comes before ones the embedder alone ranks higher; the embedder's
    positive-aware margin still applies (a candidate over it is never taken), and the result
    is the dense order when BM25 scores nothing."""
    import numpy as np

    from negsynth.embed.lexical import rrf
    from negsynth.embed.mining import CorpusIndex
    from negsynth.embed.models import load_sentence_transformer

    model = load_sentence_transformer(minilm, device="cpu")
    texts = [
        "Tides rise and fall twice a day as the moon pulls on the oceans.",
        "Ocean tides follow the moon; spring tides come at new and full moon.",
        "Bread rises because yeast ferments sugar into carbon dioxide.",
        "Copper conducts electricity and heat very well.",
        "The violin has four strings tuned in fifths.",
        "Glaciers carve valleys as they slowly move downhill.",
        "Harbour records: the water rises at the quay twice daily.",
    ]
    index = CorpusIndex(model, texts, batch_size=8)
    q = "why do tides rise"
    sims = index.emb @ model.encode([q], normalize_embeddings=True, convert_to_numpy=True)[0]
    dense_order = [int(i) for i in np.argsort(-sims, kind="stable") if i != 0]
    favoured = dense_order[-1]  # the embedder's last candidate, BM25's first after the document
    lexical = np.zeros(len(texts), dtype=np.float32)
    lexical[0], lexical[favoured] = 9.0, 8.0
    dense = index.search(q, 0, 3, relative_margin=0.0, lexical=lexical)
    hybrid = index.search(q, 0, 3, relative_margin=0.0, lexical=lexical, order="hybrid")
    assert texts[favoured] not in dense["negatives"] and hybrid["negatives"][0] == texts[favoured]
    fused = rrf(sims, lexical)
    assert [fused[texts.index(t)] for t in hybrid["negatives"]] == sorted(
        (fused[texts.index(t)] for t in hybrid["negatives"]), reverse=True
    )
    # the margin is the embedder's: with it tight enough to bar the favoured text, it is not taken
    tight = float(sims[favoured]) - 1e-4
    barred = index.search(q, 0, 3, max_score=tight, lexical=lexical, order="hybrid")
    assert texts[favoured] not in barred["negatives"] and all(s <= tight for s in barred["scores"])
    # BM25 silent: the fused order is the dense one
    none = index.search(q, 0, 3, relative_margin=0.0, lexical=np.zeros(len(texts), dtype=np.float32), order="hybrid")
    assert none["negatives"] == index.search(q, 0, 3, relative_margin=0.0)["negatives"]
    with pytest.raises(ValueError, match="hybrid"):
        index.search(q, 0, 3, order="hybrid")


def test_the_corpus_stage_mines_hybrid_candidates_with_bm25_built_once(tmp_path, minilm):
    """``corpus.candidates = "hybrid"``: the stage builds the BM25 index (saved,
    reused), takes each example's negatives from the fused ranking, and writes no teacher fields."""
    folder = write_corpus(tmp_path)

    def responder(req, n):
        return Reply(json.dumps({"queries": ["why do volcanoes erupt lava and ash from their vents?"]}))

    with FakeOpenAI(responder) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, corpus={"candidates": "hybrid", "mining": {"relative_margin": 0.0}})
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
        assert r.exit_code == 0, r.output
    recs = list(read_stage(tmp_path / "run" / "corpus"))
    assert recs and all(len(r["negatives"]) == 4 for r in recs)
    assert not any("teacher_rank" in r["meta"] for r in recs)
    assert any((tmp_path / "run" / "corpus" / "_index").glob("*.bm25/done"))


def test_the_teacher_ranks_the_document_among_its_negatives(tmp_path, minilm, monkeypatch):
    """``teacher = "cross-encoder"``: each kept example's document and mined negatives are scored
    by the teacher (here a stand-in that prefers texts naming "d4"'s subject); a query whose
    document the teacher does not rank first among them is a reject under ``teacher_k = 1``, and
    the scores are the example's distillation label."""
    import negsynth.stages.corpus as stage

    folder = write_corpus(tmp_path)
    subject = next(x for i, _, x in DOCS if i == "d4").split()[0].lower()
    calls = []

    class Scorer:
        def scores(self, query, documents):
            calls.append(len(documents))
            # the texts about d4's subject first; any other document below its own negatives
            return [-1.0 if subject in d.lower() else (-3.0 if i == 0 else -2.0 - 0.1 * i) for i, d in enumerate(documents)]

    monkeypatch.setattr(stage, "teacher_scorer", lambda *a, **kw: Scorer())

    def responder(req, n):
        return Reply(json.dumps({"queries": ["a question that any of these documents might answer?"]}))

    with FakeOpenAI(responder) as srv:
        cfg = write_run_config(
            tmp_path,
            srv.base_url,
            corpus={"teacher": "cross-encoder", "teacher_model": minilm, "teacher_k": 1, "mining": {"relative_margin": 0.0}},
        )
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
        assert r.exit_code == 0, r.output
    recs = list(read_stage(tmp_path / "run" / "corpus"))
    stats = json.loads((tmp_path / "run" / "corpus" / "stats.json").read_text())
    assert calls and set(calls) == {5}  # the document and its 4 mined negatives, one call per example
    assert [r["meta"]["doc_id"] for r in recs] == ["d4"]
    # the others: the teacher's rejects, or too few candidates under the margin for an unrelated query
    assert stats["rejects_by_reason"]["teacher_rank"] >= 1 and set(stats["rejects_by_reason"]) <= {"teacher_rank", "too_few_mined"}
    for r in recs:
        meta = r["meta"]
        assert meta["teacher_rank"] == 1 and meta["teacher_label"][0] == meta["teacher_pos_score"] == -1.0
        assert meta["teacher_label"][1:] == meta["teacher_scores"] and len(meta["teacher_scores"]) == 4
    rejects = [json.loads(line) for p in (tmp_path / "run" / "corpus" / "rejects").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert any("among itself and its mined negatives" in json.dumps(x) for x in rejects)


def test_a_setting_added_later_leaves_older_run_dirs_hashes_alone():
    """A field in ``ADDED_FIELDS`` at its default is not part of the config hash (nor of the
    section's repr, which the stages' hashes also read), so a run dir made before it resumes; set,
    it changes the hash like any setting. A field in ``REMOVED_FIELDS`` stays in both at the
    default it had."""
    from negsynth.schemas.config import ADDED_FIELDS, CorpusConfig
    from negsynth.schemas.config_io import config_hash
    from negsynth.schemas.section import REMOVED_FIELDS

    cfg = CorpusConfig()
    before = cfg.model_dump(mode="json")
    for name in ADDED_FIELDS["CorpusConfig"]:
        before.pop(name)
        assert f"{name}=" not in str(cfg)
    # a field removed since is read at its old default, as every older run dir held it
    for name, (_, old) in REMOVED_FIELDS["CorpusConfig"].items():
        before[name] = old
        assert f"{name}={old!r}" in str(cfg)
    before["mining"].update({name: old for name, (_, old) in REMOVED_FIELDS["MiningConfig"].items()})  # its own removed fields
    assert config_hash(cfg) == config_hash(before)
    assert config_hash(CorpusConfig(candidates="hybrid")) != config_hash(cfg)
    assert config_hash({"corpus": CorpusConfig(teacher_k=3)}) != config_hash({"corpus": cfg})


def test_title_queries_need_no_llm(tmp_path, minilm):
    """``corpus.queries = "title"``: the no-LLM floor. No request is sent (the LLM's URL goes
    nowhere), every query is the document's title, the document stays the positive and the
    negatives are mined as for LLM queries."""
    folder = write_corpus(tmp_path)
    cfg = write_run_config(
        tmp_path,
        "http://127.0.0.1:9/v1",
        corpus={"queries": "title", "queries_per_doc": 1, "max_docs": 6, "mining": {"relative_margin": 0.0}},
    )
    r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", folder, "--json")
    assert r.exit_code == 0, r.output
    stats = json.loads((tmp_path / "run" / "corpus" / "stats.json").read_text())
    assert stats["items"] == 6 and stats["this_run"]["requests"] == 0
    recs = list(read_stage(tmp_path / "run" / "corpus"))
    by_id = {i: (t, x) for i, t, x in DOCS}
    assert len(recs) == 6  # one per document
    for rec in recs:
        title, text = by_id[rec["meta"]["doc_id"]]
        assert rec["query"] == title
        assert rec["positive"].endswith(text) and len(rec["negatives"]) == 4 and not (rec.get("usage") or {}).get("prompt_tokens")
        assert rec["meta"]["query_model"] == "extract:title"


def test_title_queries_are_one_per_document():
    from negsynth.schemas.config import CorpusConfig

    with pytest.raises(ValueError, match="queries_per_doc = 1"):
        CorpusConfig(queries="title", queries_per_doc=2)
