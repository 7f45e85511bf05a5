"""regenerate's inputs with a limit are streamed: the same pairs as reading the whole file, in
bounded memory, the first request soon; binary or NUL input is refused after a bounded read."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply
from helpers import write_run_config
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.sources import load_source, read_tabular, read_tabular_stream, select
from negsynth.errors import UserError
from negsynth.schemas.config import SourceSpec

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


def rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        r = {
            "query": f"question number {i % 37} about topic {i % 11}",
            "positive": f"passage {i} " + "words " * (i % 5),
            "id": f"r{i}",
            "label": ["keep", "drop"][i % 3 == 0],
        }
        if i % 17 == 5:
            r["positive"] = "   "  # an empty cell
        if i % 23 == 7:
            r["negatives"] = [f"neg {i}"]
        out.append(r)
    return out


def write(tmp: Path, fmt: str, data: list[dict]) -> Path:
    import polars as pl

    df = pl.DataFrame([{**r, "negatives": json.dumps(r.get("negatives", []))} if fmt != "jsonl" else r for r in data])
    p = tmp / f"pairs.{fmt}"
    if fmt == "jsonl":
        p.write_text("".join(json.dumps(r) + "\n" for r in data))
    elif fmt == "csv":
        df.write_csv(p)
    elif fmt == "tsv":
        df.write_csv(p, separator="\t", quote_style="never")
    else:
        df.write_parquet(p)
    return p


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet"])
@pytest.mark.parametrize("seed", [0, 3, -1])
def test_a_streamed_limit_picks_the_same_pairs_as_a_whole_read(tmp_path, fmt, seed, monkeypatch):
    import negsynth.data.tables as tables

    monkeypatch.setattr(tables, "_CHUNK", 4096)  # many small batches
    p = write(tmp_path, fmt, rows(3000))
    for extra in ({}, {"filter": {"label": "keep"}}):
        spec = SourceSpec(path=str(p), limit=25, seed=seed, skip_invalid=True, **extra)
        whole = read_tabular(spec, fmt, "pairs", "all")
        streamed = read_tabular_stream(spec, fmt, "pairs", "all")
        assert select(streamed.pairs, 25, seed) == select(whole.pairs, 25, seed)
        assert streamed.columns == whole.columns
        if seed >= 0:
            assert streamed.total_rows == whole.total_rows and streamed.skipped_rows == whole.skipped_rows
        # the mining corpus and the known positives, read again on first use
        assert streamed.corpus == whole.corpus and streamed.positives_by_query == whole.positives_by_query
    # load_source streams exactly when a limit is set
    assert load_source(SourceSpec(path=str(p), limit=5, seed=seed, skip_invalid=True)).mining_loader is not None
    assert load_source(SourceSpec(path=str(p), skip_invalid=True)).mining_loader is None


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_gzipped_file_reads_as_the_plain_one(tmp_path, fmt, monkeypatch):
    """regenerate's sources: ``.jsonl.gz`` / ``.csv.gz`` give the pairs the plain file gives, whole
    and streamed (a limit), and a file that is not gzip behind the name is one line."""
    import gzip

    import negsynth.data.tables as tables

    monkeypatch.setattr(tables, "_CHUNK", 4096)
    p = write(tmp_path, fmt, rows(400))
    gz = tmp_path / f"pairs.{fmt}.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    for limit in (None, 20):
        plain = load_source(SourceSpec(path=str(p), limit=limit, skip_invalid=True, name="pairs"))
        packed = load_source(SourceSpec(path=str(gz), limit=limit, skip_invalid=True, name="pairs"))
        assert packed.pairs == plain.pairs and packed.columns == plain.columns
    gz.write_bytes(p.read_bytes())  # plain text named .gz
    with pytest.raises(UserError, match=r"pairs\.(jsonl|csv)\.gz: cannot read it \(Not a gzipped file"):
        load_source(SourceSpec(path=str(gz), skip_invalid=True))


def test_an_empty_cell_is_the_same_one_line_as_a_whole_read(tmp_path):
    p = write(tmp_path, "jsonl", rows(100))
    spec = SourceSpec(path=str(p), limit=5)
    with pytest.raises(Exception) as whole:
        read_tabular(spec, "jsonl", "pairs", "all")
    with pytest.raises(Exception) as streamed:
        read_tabular_stream(spec, "jsonl", "pairs", "all")
    assert str(streamed.value) == str(whole.value) and "row 6 (line 6)" in str(streamed.value)


@pytest.mark.parametrize("case", ["nul", "zeros_parquet", "one_long_line"])
def test_binary_input_is_refused_in_one_line_after_a_bounded_read(tmp_path, case):
    if case == "nul":
        p = tmp_path / "x.jsonl"
        p.write_bytes(b'{"query": "a", "positive": "b"}\n' + b"\x00" * (4 << 20))
    elif case == "zeros_parquet":
        p = tmp_path / "x.parquet"
        p.write_bytes(b"\x00" * (4 << 20))
    else:
        p = tmp_path / "x.jsonl"
        p.write_bytes(b"a" * (70 << 20))  # no line break at all
    cfg = write_run_config(tmp_path, "http://127.0.0.1:9/v1")
    r = runner.invoke(app, ["regenerate", "-c", str(cfg), "-d", str(tmp_path / "run"), "-i", str(p), "--limit", "10", "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and str(p) in r.stderr
    assert {"nul": "NUL bytes", "zeros_parquet": "not a parquet file", "one_long_line": "longer than 64 MiB"}[case] in r.stderr
    if case == "nul":  # the corpus stage reads its documents through the same check
        r = runner.invoke(app, ["corpus", "-c", str(cfg), "-d", str(tmp_path / "run2"), "-i", str(p), "-q"])
        assert r.exit_code == 2 and "NUL bytes" in r.stderr and r.stderr.count("\n") == 1


def write_many_lines(p: Path, row) -> Path:
    """300,000 JSON lines ``row(i)`` in ``p``, written 10,000 at a time."""
    with open(p, "w") as f:
        for start in range(0, 300_000, 10_000):
            f.write("".join(json.dumps(row(i)) + "\n" for i in range(start, start + 10_000)))
    return p


@pytest.fixture(scope="module")
def big_jsonl(tmp_path_factory) -> Path:
    """About 250 MB of JSON lines."""
    body = "word " * 160
    return write_many_lines(
        tmp_path_factory.mktemp("big") / "big.jsonl", lambda i: {"query": f"query {i}", "positive": f"{i} {body}", "extra": body}
    )


def test_a_limit_on_a_large_file_reads_it_in_bounded_memory(big_jsonl):
    size_mb = big_jsonl.stat().st_size >> 20
    code = textwrap.dedent(f"""
        import resource, polars, pyarrow.parquet
        from negsynth.data.sources import load_source
        from negsynth.schemas.config import SourceSpec
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        d = load_source(SourceSpec(path={str(big_jsonl)!r}, limit=10))
        print(len(d.pairs), d.total_rows, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=300).stdout.split()
    n, total, grown_mb = map(int, out)
    assert n == 10 and total == 300_000
    # a whole read grew by ~2.6 x the file; the stream by a few batches
    assert grown_mb < 200 < size_mb, (grown_mb, size_mb)


def test_the_first_request_leaves_soon_with_a_limit_on_a_large_file(tmp_path, big_jsonl):
    sent: list[float] = []

    def responder(req, n):
        sent.append(time.monotonic())
        return Reply(content=json.dumps({"hard_negative_documents": [f"unrelated text number {k} about cooking pasta" for k in range(4)]}))

    with FakeOpenAI(responder) as srv:
        cfg = write_run_config(tmp_path, srv.base_url)
        t0 = time.monotonic()
        r = runner.invoke(app, ["regenerate", "-c", str(cfg), "-d", str(tmp_path / "run"), "-i", str(big_jsonl), "--limit", "10", "-q"])
    assert sent, r.output
    # the first request within seconds (two reads of the file, no more); generous for a loaded machine
    assert sent[0] - t0 < 120
    assert len({json.dumps(x["messages"]) for x in srv.requests}) <= 10 * 3


# -- the corpus stage -------------------------------------------------------------------------
def corpus_rows(n: int) -> list[dict]:
    """Documents with repeated ids (d0..d449), empty titles, no title, and rows with no text
    (Python's whitespace, which polars' own strip does not know: \\x1c)."""
    out = []
    for i in range(n):
        r = {"_id": f"d{i % 450}", "title": ["", f"T{i}", None][i % 3], "text": f"body {i} " + "w " * (i % 7)}
        if i % 31 == 4:
            r["text"], r["title"] = " \x1c ", None
        out.append(r)
    return out


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_the_corpus_sample_is_the_one_a_whole_read_drew(tmp_path, fmt, monkeypatch):
    """The documents sampled for a seed are the ones the whole-file reader drew (pinned from it):
    cached LLM answers of earlier runs stay valid."""
    import negsynth.data.tables as tables
    from negsynth.data.corpus import read_corpus, sample_indices
    from negsynth.pipeline.context import StageContext
    from negsynth.schemas.config import CorpusSpec, RunConfig
    from negsynth.stages.corpus import load_corpora, plan_items

    monkeypatch.setattr(tables, "_CHUNK", 1024)  # many small batches
    p = write(tmp_path, fmt, corpus_rows(500)) if fmt != "jsonl" else tmp_path / "c.jsonl"
    if fmt == "jsonl":
        p.write_text("".join(json.dumps(r) + "\n" for r in corpus_rows(500)))
    with pytest.raises(UserError, match="47 of 484 documents repeat an earlier id in column '_id'"):
        read_corpus(CorpusSpec(path=str(p)))  # repeated ids are an error unless told how to make ids
    c = read_corpus(CorpusSpec(path=str(p), ids="first"))  # the first of each id: as every run read them before
    assert (c.count, c.empty_skipped, c.duplicate_ids) == (437, 16, 47)
    docs = list(c.documents())
    assert len(docs) == 437 and len({d.id for d in docs}) == 437
    for seed, ids in ((0, ["d0", "d54", "d200", "d265", "d297", "d404"]), (5, ["d21", "d119", "d137", "d178", "d285", "d305"])):
        picked = [d.id for _, d in c.documents_at(sample_indices(c.count, 6, seed))]
        assert picked == ids
    # two corpora: one sample over both, as the stage plans it
    cfg = RunConfig.model_validate(
        {
            "corpus": {
                "inputs": [{"path": str(p), "ids": "first"}, {"path": str(p), "name": "second", "ids": "first"}],
                "max_docs": 8,
                "seed": 3,
            }
        }
    )
    ctx = StageContext(cfg=cfg, run_dir=tmp_path / "run")
    corpora = load_corpora(ctx)
    items = plan_items(ctx, corpora)
    assert [(it.payload["corpus_index"], it.payload["doc_id"]) for it in items] == [
        (0, "d1"),
        (0, "d38"),
        (0, "d129"),
        (0, "d301"),
        (1, "d277"),
        (1, "d324"),
        (1, "d385"),
        (1, "d404"),
    ]
    assert corpora[1].positions == {d: [x.id for x in docs].index(d) for d in ("d277", "d324", "d385", "d404")}


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
    """About 110 MB of documents (300,000 JSON lines)."""
    body = "word " * 60
    return write_many_lines(
        tmp_path_factory.mktemp("bigc") / "corpus.jsonl", lambda i: {"_id": f"d{i}", "title": f"title {i}", "text": f"{i} {body}"}
    )


def test_a_corpus_sample_of_a_large_file_is_read_in_bounded_memory(big_corpus):
    size_mb = big_corpus.stat().st_size >> 20
    code = textwrap.dedent(f"""
        import resource, polars, pyarrow.parquet, numpy
        from negsynth.pipeline.context import StageContext
        from negsynth.schemas.config import RunConfig
        from negsynth.stages.corpus import load_corpora, plan_items
        cfg = RunConfig.model_validate({{"corpus": {{"inputs": [{{"path": {str(big_corpus)!r}}}], "max_docs": 10}}}})
        ctx = StageContext(cfg=cfg, run_dir="/nonexistent")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        corpora = load_corpora(ctx)
        items = plan_items(ctx, corpora)
        print(len(items), corpora[0].count, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=600).stdout.split()
    n, count, grown_mb = map(int, out)
    assert n == 10 and count == 300_000
    # a whole read held the frame and every Document (several times the file); the stream a few
    # batches, and while counting the ids (about 20 bytes a document)
    assert grown_mb < 100 < size_mb, (grown_mb, size_mb)


@pytest.mark.parametrize("case", ["nul_late", "zeros_parquet"])
def test_the_corpus_stage_refuses_binary_input_in_one_line(tmp_path, case):
    if case == "nul_late":  # valid lines first, NUL bytes still within the first 64 KiB
        p = tmp_path / "docs.jsonl"
        p.write_bytes(b'{"text": "a document"}\n' * 100 + b"\x00" * (4 << 20))
    else:
        p = tmp_path / "docs.parquet"
        p.write_bytes(b"\x00" * (4 << 20))
    cfg = write_run_config(tmp_path, "http://127.0.0.1:9/v1")
    r = runner.invoke(app, ["corpus", "-c", str(cfg), "-d", str(tmp_path / "run"), "-i", str(p), "--max-docs", "5", "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and str(p) in r.stderr
    assert ("NUL bytes" if case == "nul_late" else "not a parquet file") in r.stderr
