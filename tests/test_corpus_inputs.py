"""Documents as teams keep them: a folder of .txt / .md / .html / .pdf / .jsonl(.gz) / .csv(.gz) /
.parquet files, single files of those types, long documents split into overlapping passages,
ids that repeat (an error unless told how to make ids), and inputs that are none of these (one
line saying what to do). The end-to-end checks run the corpus stage against the real-socket fake
server, as tests/test_corpus.py does.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI
from helpers import write_run_config
from test_corpus import DOCS, answer, document_of
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.corpus import read_corpus
from negsynth.data.documents import Document as Doc
from negsynth.data.documents import chunk_spans, count_tokens, split_document
from negsynth.data.shards import read_stage
from negsynth.errors import UserError
from negsynth.schemas.config import CorpusConfig, CorpusSpec

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def write_pdf(path: Path, lines: list[str]) -> Path:
    """A one-page PDF whose text layer holds ``lines`` (Helvetica, no compression)."""
    content = "BT /F1 12 Tf 72 720 Td " + " ".join(f"({x}) Tj 0 -16 Td" for x in lines) + " ET"
    objs = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(content)} >>\nstream\n{content}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n{o}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{off:010d} 00000 n \n".encode() for off in offsets)
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(out)
    return path


def write_team_folder(root: Path) -> Path:
    """A team's docs/: Markdown (a heading, front matter), text, JSONL, gzipped CSV, a hidden file
    and a .docx that is no corpus file."""
    (root / "guides").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "guides" / "tides.md").write_text("# Moon tides\n\nThe moon's gravity raises ocean tides twice a day.\n")
    (root / "guides" / "front.md").write_text("---\ntitle: 'Vaccines'\nauthor: x\n---\nVaccines train the immune system.\n")
    (root / "glaciers_notes.txt").write_text("Glaciers form where snow accumulates faster than it melts.\n")
    (root / "faq.jsonl").write_text(json.dumps({"id": "q1", "text": "Rainbows need sunlight and raindrops."}) + "\n")
    with gzip.open(root / "more.csv.gz", "wt") as f:
        f.write('text,title\n"Volcanoes erupt lava, ash and gas.",Volcanoes\n')
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "report.docx").write_bytes(b"PK\x03\x04" + b"\x00" * 20)
    return root


def test_a_folder_of_documents_is_read_recursively(tmp_path):
    folder = write_team_folder(tmp_path / "docs")
    c = read_corpus(CorpusSpec(path=str(folder)))
    docs = list(c.documents())
    assert [d.id for d in docs] == ["faq.jsonl:q1", "glaciers_notes.txt", "guides/front.md", "guides/tides.md", "more.csv.gz:0"]
    by = {d.id: d for d in docs}
    assert (
        by["guides/tides.md"].title == "Moon tides"
        and by["guides/tides.md"].text == "Moon tides The moon's gravity raises ocean tides twice a day."
    )
    assert by["guides/front.md"].title == "Vaccines" and "author" not in by["guides/front.md"].text
    assert by["glaciers_notes.txt"].title == "glaciers notes"  # no heading: the file name
    assert by["more.csv.gz:0"].text == "Volcanoes erupt lava, ash and gas." and by["more.csv.gz:0"].title == "Volcanoes"
    assert c.count == 5 and c.fmt == "folder" and c.name == "docs" and c.skipped_files == {".docx": 1}
    # a glob picks a subset; one that picks a file no reader knows says so
    md = read_corpus(CorpusSpec(path=str(folder), glob="**/*.md"))
    assert [d.id for d in md.documents()] == ["guides/front.md", "guides/tides.md"]
    with pytest.raises(
        UserError, match=r"report\.docx: picked by glob '\*\.docx' but '\.docx' is no corpus file type; convert it to JSONL"
    ):
        read_corpus(CorpusSpec(path=str(folder), glob="*.docx"))
    with pytest.raises(UserError, match="glob .* picks files of a folder"):
        read_corpus(CorpusSpec(path=str(folder / "faq.jsonl"), glob="*.md"))


def test_single_files_of_each_type(tmp_path):
    (tmp_path / "note.md").write_text("intro line\n\n## Spring tides\nfollow the new and full moon\n")
    c = read_corpus(CorpusSpec(path=str(tmp_path / "note.md")))
    assert [(d.id, d.title, d.text) for d in c.documents()] == [
        ("note.md", "Spring tides", "Spring tides intro line\n\n\nfollow the new and full moon")
    ]
    (tmp_path / "page.rst").write_text("Sphinx page\n###########\n\nSome text.\n\nSection\n-------\nmore\n")
    (tmp_path / "setext.md").write_text("Setext title\n============\n\nbody\n\n---\n\nafter a rule\n")
    titles = [(d.title, d.text) for f in ("page.rst", "setext.md") for d in read_corpus(CorpusSpec(path=str(tmp_path / f))).documents()]
    assert titles == [
        ("Sphinx page", "Sphinx page Some text.\n\nSection\n-------\nmore"),
        ("Setext title", "Setext title body\n\n---\n\nafter a rule"),
    ]
    rows = [{"_id": f"d{i}", "text": x} for i, (_, _, x) in enumerate(DOCS)]
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    c = read_corpus(CorpusSpec(path=str(tmp_path / "c.jsonl.gz")))
    assert c.name == "c" and [d.id for d in c.documents()] == [r["_id"] for r in rows]
    with gzip.open(tmp_path / "c.tsv.gz", "wt") as f:
        f.write("id\ttext\n" + "".join(f"{r['_id']}\t{r['text']}\n" for r in rows))
    assert [d.text for d in read_corpus(CorpusSpec(path=str(tmp_path / "c.tsv.gz"))).documents()] == [r["text"] for r in rows]


def test_html_and_pdf_documents(tmp_path):
    pytest.importorskip("bs4")
    pytest.importorskip("pypdf")
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "page.html").write_text(
        "<html><head><title>Rainbows</title><style>p {color: red}</style></head>"
        "<body><h1>Rainbows</h1><p>Sunlight is <b>refracted</b> in raindrops.</p><script>var x = 1;</script></body></html>"
    )
    write_pdf(folder / "paper.pdf", ["Earthquakes release stress", "stored along faults."])
    docs = {d.id: d for d in read_corpus(CorpusSpec(path=str(folder))).documents()}
    assert docs["page.html"].title == "Rainbows" and docs["page.html"].text == "Rainbows Sunlight is refracted in raindrops."
    assert docs["paper.pdf"].title == "paper" and "Earthquakes release stress" in docs["paper.pdf"].text
    assert "stored along faults." in docs["paper.pdf"].text


def test_a_pdf_is_parsed_once_for_the_reads_of_a_run_within_a_bounded_cache(tmp_path, monkeypatch):
    pytest.importorskip("pypdf")
    from collections import OrderedDict

    import negsynth.data.documents as documents_mod

    monkeypatch.setattr(documents_mod, "_EXTRACTED", OrderedDict())  # this test's cache alone
    monkeypatch.setattr(documents_mod, "_extracted_held", 0)
    for i in range(3):
        write_pdf(tmp_path / f"p{i}.pdf", [f"Paper {i} reports a finding about topic {i}."])
    parsed: list[str] = []
    real = documents_mod._read_pdf
    monkeypatch.setattr(documents_mod, "_read_pdf", lambda p: parsed.append(p.name) or real(p))
    c = read_corpus(CorpusSpec(path=str(tmp_path)))  # the count
    assert [d.id for _, d in c.documents_at([0, 2])] == ["p0.pdf", "p2.pdf"] and len(list(c.documents())) == 3
    assert sorted(parsed) == ["p0.pdf", "p1.pdf", "p2.pdf"]  # three reads, each file parsed once
    (tmp_path / "p1.pdf").touch()  # a file changed since: parsed again
    write_pdf(tmp_path / "p1.pdf", ["Paper 1 now reports another finding entirely."])
    assert "another finding" in [d.text for d in c.documents()][1] and parsed.count("p1.pdf") == 2
    assert len(documents_mod._EXTRACTED) == 4  # p1's old text stays until pushed out
    monkeypatch.setattr(documents_mod, "_EXTRACTED_BYTES", 60)  # room for about one text: the oldest go
    write_pdf(tmp_path / "p3.pdf", ["Paper 3 is new."])
    list(read_corpus(CorpusSpec(path=str(tmp_path / "p3.pdf"))).documents())
    assert (
        list(documents_mod._EXTRACTED)[-1][0] == str(tmp_path / "p3.pdf")
        and len(documents_mod._EXTRACTED) <= 2
        and documents_mod._extracted_held == sum(len(t) + len(b) for t, b in documents_mod._EXTRACTED.values())
    )


@pytest.mark.parametrize("fmt", ["pdf", "html"])
def test_a_missing_reader_names_the_extra_to_install(tmp_path, monkeypatch, fmt):
    import importlib.util

    real = importlib.util.find_spec
    module = {"pdf": "pypdf", "html": "bs4"}[fmt]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    p = write_pdf(tmp_path / "a.pdf", ["x"]) if fmt == "pdf" else tmp_path / "a.html"
    if fmt == "html":
        p.write_text("<p>x</p>")
    (tmp_path / "b.txt").write_text("a text file is read without extras")
    cfg = write_run_config(tmp_path, "http://127.0.0.1:9/v1")
    r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", tmp_path, "-q")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.output
    assert f"pip install 'negsynth[{fmt}]'" in r.stderr and str(tmp_path) in r.stderr


# -- chunks -------------------------------------------------------------------------------------
def test_the_fast_ascii_count_is_the_regex_count():
    """Pass 1 counts passages with count_tokens, pass 2 splits by the regex: the two must agree on
    every string, control characters (\\x1c-\\x1f are whitespace to \\s) and non-ASCII included."""
    import random
    import re

    rng = random.Random(0)
    alphabet = [chr(i) for i in range(128)] + ["é", "ß", "\u00a0", "\u2003", "漢", "–"]
    token = re.compile(r"\w+|[^\w\s]")
    for _ in range(5000):
        t = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        assert count_tokens(t) == len(token.findall(t)), repr(t)


def test_chunk_spans_cover_every_token_with_the_overlap():
    for size, overlap in ((16, 0), (16, 4), (256, 32), (100, 50)):
        for n in list(range(1, 3 * size)) + [10 * size + 7]:
            spans = chunk_spans(n, size, overlap)
            assert spans[0][0] == 0 and spans[-1][1] == n
            assert all(b - a <= size for a, b in spans), (n, size, overlap, spans)
            assert all(b1 - a2 >= overlap for (_, b1), (a2, _) in zip(spans, spans[1:])), (n, size, overlap, spans)
            lengths = [b - a for a, b in spans]
            assert max(lengths) - min(lengths) <= 1 and (len(spans) == 1) == (n <= size)


def test_a_long_document_becomes_overlapping_passages_headed_by_its_title():
    words = [f"w{i}" for i in range(600)]
    d = Doc("guide.md", "Tide tables " + " ".join(words) + ".", "Tide tables")
    parts = split_document(d, 100, 10)
    assert [p.id for p in parts] == [f"guide.md#chunk{k}" for k in range(1, len(parts) + 1)] and len(parts) == 7
    assert all(p.text.startswith("Tide tables ") and count_tokens(p.text) <= 100 for p in parts)
    bodies = [p.text.removeprefix("Tide tables ").split() for p in parts]
    assert bodies[0][0] == "w0" and bodies[-1][-1] == "w599."
    for a, b in zip(bodies, bodies[1:]):  # consecutive passages share at least the overlap (10 tokens)
        assert " ".join(b[:10]) in " ".join(a[-11:]) and b[10] not in a[:-11]
    short = Doc("n.md", "A short note.", "")
    assert split_document(short, 100, 10) == [short]  # within the limit: the document itself, its id kept


def test_chunked_documents_are_counted_sampled_and_read_as_passages(tmp_path):
    long = " ".join(f"token{i}" for i in range(1000))
    rows = [
        {"_id": "short", "text": "only a few words"},
        {"_id": "long", "title": "Big", "text": long},
        {"_id": "s2", "text": "again short"},
    ]
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = read_corpus(CorpusSpec(path=str(p)), chunk_tokens=256, chunk_overlap=32)
    docs = list(c.documents())
    assert c.count == len(docs) == 2 + 5 and c.chunked == 1 and c.rows == 3
    assert [d.id for d in docs] == ["short", *(f"long#chunk{k}" for k in range(1, 6)), "s2"]
    assert [d.id for _, d in c.documents_at([0, 3, 6])] == ["short", "long#chunk3", "s2"]
    assert read_corpus(CorpusSpec(path=str(p))).count == 3  # chunk_tokens 0: never split


def test_chunk_settings_are_checked():
    with pytest.raises(ValueError, match="chunk_overlap = 200: must be at most half"):
        CorpusConfig(chunk_tokens=224, chunk_overlap=200)
    with pytest.raises(ValueError, match="must be 0 .* or at least 16"):
        CorpusConfig(chunk_tokens=8, chunk_overlap=0)
    assert CorpusConfig().chunk_tokens == 0  # whole documents by default
    assert CorpusConfig(chunk_overlap=200).chunk_overlap == 200  # read only where documents are split
    # the new settings stay out of the section's repr, which the stage's config hash reads
    assert not any(k in str(CorpusConfig(inputs=[CorpusSpec(path="x")])) for k in ("chunk", "glob", "ids"))


# -- ids ----------------------------------------------------------------------------------------
def pairs_csv(tmp: Path, ids: list[str]) -> Path:
    p = tmp / "docs.csv"
    p.write_text("pid,text\n" + "".join(f"{i},document number {n} about topic {n * 7}\n" for n, i in enumerate(ids)))
    return p


def test_repeated_ids_are_an_error_unless_told_how_to_make_ids(tmp_path):
    p = pairs_csv(tmp_path, [str(i // 2) for i in range(20)])
    with pytest.raises(UserError) as e:
        read_corpus(CorpusSpec(path=str(p), columns={"id": "pid"}))
    msg = str(e.value)
    assert msg.startswith(
        f"{p}: 10 of 20 documents repeat an earlier id in column 'pid' (first: '0' at rows 1 and 2, '1' at rows 3 and 4, '2'"
    )
    assert "--ids first" in msg and "\n" not in msg
    first = read_corpus(CorpusSpec(path=str(p), columns={"id": "pid"}, ids="first"))
    assert (first.count, first.duplicate_ids) == (10, 10) and [d.id for d in first.documents()][:3] == ["0", "1", "2"]
    row = read_corpus(CorpusSpec(path=str(p), columns={"id": "pid"}, ids="row"))
    assert row.count == 20 and [d.id for d in row.documents()][:3] == ["0", "1", "2"] and len({d.id for d in row.documents()}) == 20
    # hash: identical texts are one document
    q = tmp_path / "same.jsonl"
    q.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["alpha text", "beta text", "alpha text"]))
    h = read_corpus(CorpusSpec(path=str(q), ids="hash"))
    ids = [d.id for d in h.documents()]
    assert h.count == 2 and h.duplicate_ids == 1 and len(ids[0]) == 16 and ids[0] != ids[1]


def test_the_cli_names_a_missing_id_column_and_repeated_ids(tmp_path):
    p = pairs_csv(tmp_path, [str(i // 2) for i in range(20)])
    cfg = write_run_config(tmp_path, "http://127.0.0.1:9/v1")
    r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", p, "--id-col", "doc", "-q")
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {p}: no column 'doc' for id (columns: pid, text); fix --id-col or columns.id"
    r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", p, "--id-col", "pid", "-q")
    assert r.exit_code == 2 and "10 of 20 documents repeat an earlier id in column 'pid'" in r.stderr and r.stderr.count("\n") == 1
    r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "--ids", "row", "-q")
    assert r.exit_code == 2 and "--glob/--ids describe an --input" in r.stderr


def test_a_corpus_that_collapses_is_named_before_any_request(tmp_path):
    """20 documents sharing one id, kept first-of-each: one document is left, and the stage says so
    (the rows, why they went) instead of sending requests whose mining then fails."""
    p = pairs_csv(tmp_path, ["7"] * 20)
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        cfg = write_run_config(tmp_path, srv.base_url)
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", p, "--id-col", "pid", "--ids", "first", "-q")
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
        assert f"{p}: 1 document of 20 rows (19 left out as repeats of an earlier id (ids = 'first'))" in r.stderr
        assert "--ids row" in r.stderr
        assert srv.requests == []


# -- what is not a corpus -----------------------------------------------------------------------
def test_inputs_that_are_not_corpora_say_what_to_do(tmp_path):
    cfg = write_run_config(tmp_path, "http://127.0.0.1:9/v1")

    def err(path, *extra) -> str:
        r = invoke("corpus", "-c", cfg, "-d", tmp_path / "run", "-i", path, "-q", *extra)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.output, r.output
        return r.stderr

    pdf = write_pdf(tmp_path / "paper.csv", ["not a table"])  # a PDF named .csv
    assert f"{pdf}: is a PDF file, not csv text; name it .pdf" in err(pdf)
    (tmp_path / "scan.jsonl").write_bytes((tmp_path / "paper.csv").read_bytes())
    assert "is a PDF file, not jsonl text" in err(tmp_path / "scan.jsonl")
    (tmp_path / "r.docx").write_bytes(b"PK\x03\x04rest")
    assert "unknown file type '.docx'" in err(tmp_path / "r.docx") and "convert it to JSONL with a 'text' field" in err(tmp_path / "r.docx")
    assert "is a ZIP archive" in err(tmp_path / "r.docx", "--format", "csv")
    (tmp_path / "x.xml.gz").write_bytes(gzip.compress(b"<a/>"))
    assert "unknown file type '.xml.gz'" in err(tmp_path / "x.xml.gz")
    office = tmp_path / "office"
    office.mkdir()
    (office / "a.docx").write_bytes(b"PK\x03\x04")
    (office / "b.docx").write_bytes(b"PK\x03\x04")
    assert f"{office}: no corpus files here (.docx ×2); it reads .txt, .md" in err(office)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    assert "not UTF-8 text (byte 0xe9 at offset 3); convert it to UTF-8" in err(tmp_path / "latin1.txt")


# -- the stage ----------------------------------------------------------------------------------
def test_the_stage_prompts_and_trains_on_passages_of_a_folder(tmp_path, minilm):
    """A folder with one long Markdown document: each passage is asked about on its own, is the
    positive of its examples, and is what mining searches; short documents keep their ids."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, t, x in DOCS:
        (folder / f"{i}.md").write_text(f"# {t}\n\n{x}\n")
    sentences = [f"Paragraph {k} of the long guide explains topic number {k} in plain words." for k in range(60)]
    (folder / "long.md").write_text("# Long guide\n\n" + " ".join(sentences) + "\n")
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        cfg = write_run_config(tmp_path, srv.base_url, corpus={"mining": {"relative_margin": 0.0}})
        r = runner.invoke(
            app, ["corpus", "-c", str(cfg), "-d", str(tmp_path / "run"), "-i", str(folder), "--chunk-tokens", "128", "--json"]
        )
        assert r.exit_code == 0, r.output
        prompted = [document_of(req) for req in srv.requests]
    stats = json.loads((tmp_path / "run" / "corpus" / "stats.json").read_text())
    n_long = len([x for x in prompted if x.startswith("Long guide")])
    assert n_long >= 6 and stats["documents"]["split_into_passages"] == 1
    assert stats["documents"]["in_corpus"] == len(prompted) == len(DOCS) + n_long
    assert stats["corpora"]["docs"]["files"] == len(DOCS) + 1
    from negsynth.stages.corpus import report

    assert ("long documents split into passages", "1") in report(stats)[0].rows
    recs = list(read_stage(tmp_path / "run" / "corpus"))
    by_doc = {r["meta"]["doc_id"]: r for r in recs}
    assert "d1.md" in by_doc and by_doc["d1.md"]["positive"] == f"{DOCS[0][1]} {DOCS[0][2]}"
    passages = sorted((k for k in by_doc if k.startswith("long.md#chunk")), key=lambda k: int(k.split("chunk")[1]))
    assert len(passages) == n_long
    for k in passages:
        pos = by_doc[k]["positive"]
        assert pos.startswith("Long guide ") and count_tokens(pos) <= 128 and pos in prompted  # the whole passage was prompted
    # a passage's negatives may be other passages of the same guide, never itself
    assert all(r["positive"] not in r["negatives"] for r in recs)


def test_an_empty_id_cell_is_named(tmp_path):
    p = tmp_path / "docs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in [{"pid": "a", "text": "one"}, {"text": "two"}, {"pid": "c", "text": "three"}]))
    with pytest.raises(UserError, match=r"docs\.jsonl: row 2 has no id in column 'pid'; fill it, or make ids another way"):
        read_corpus(CorpusSpec(path=str(p), columns={"id": "pid"}))
    assert [d.id for d in read_corpus(CorpusSpec(path=str(p), columns={"id": "pid"}, ids="row")).documents()] == ["0", "1", "2"]


def test_the_config_hash_moves_only_where_passages_change_what_is_read(tmp_path):
    """Short documents: the chunk settings do not enter the stage's hash (an older run dir resumes);
    a split document: they do. Hidden files of a folder (.git) are no input."""
    from negsynth.pipeline.context import StageContext
    from negsynth.schemas.config import RunConfig
    from negsynth.stages.corpus import STAGE

    folder = tmp_path / "docs"
    folder.mkdir()
    for i, t, x in DOCS:
        (folder / f"{i}.md").write_text(f"# {t}\n\n{x}\n")

    def digest(**corpus) -> str:
        cfg = RunConfig.model_validate({"corpus": {"inputs": [{"path": str(folder)}], **corpus}})
        return STAGE.made_from(StageContext(cfg=cfg, run_dir=tmp_path / "run"))["config_hash"]

    short = digest()
    assert digest(chunk_tokens=0) == short == digest(chunk_tokens=64, chunk_overlap=8)
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert digest() == short
    (folder / "long.md").write_text("# Long\n\n" + " ".join(f"word{i}" for i in range(300)) + "\n")
    long_whole = digest()  # the default keeps documents whole: as an older run dir with chunk_tokens = 0
    assert long_whole == digest(chunk_tokens=0) != short
    long_split = digest(chunk_tokens=224)
    assert long_split != long_whole and long_split != digest(chunk_tokens=128, chunk_overlap=16)
