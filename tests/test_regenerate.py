"""regenerate: input formats, BEIR, errors, dedup, resume after SIGKILL, --mine, score on the output.

Everything LLM-side goes through the real-socket fake server; mining uses the bundled MiniLM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Reply, always_valid, valid_answer
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import read_stage
from negsynth.data.sources import load_source
from negsynth.errors import UserError
from negsynth.schemas.config import SourceSpec
from negsynth.schemas.records import Example

runner = CliRunner()

ROWS = [
    {
        "q": "what causes tides",
        "doc": "Tides are caused by the gravitational pull of the moon and the sun on the oceans.",
        "lbl": "yes",
        "negs": ["Waves are caused by wind."],
    },
    {
        "q": "how do vaccines work",
        "doc": "Vaccines train the immune system to recognise a pathogen without causing the disease.",
        "lbl": "no",
        "negs": [],
    },
    {
        "q": "why is the sky blue",
        "doc": "Sunlight is scattered by air molecules, and blue light is scattered the most.",
        "lbl": "yes",
        "negs": ["Sunsets are red."],
    },
]


def write_all_formats(tmp: Path) -> dict[str, tuple[Path, str]]:
    """The same three rows as jsonl / csv / tsv / parquet / HF dataset, with non-default column names."""
    import datasets
    import polars as pl

    df = pl.DataFrame(ROWS)
    out: dict[str, tuple[Path, str]] = {}
    p = tmp / "pairs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out["jsonl"] = (p, "jsonl")
    flat = df.with_columns(pl.col("negs").list.join(" || ").alias("negs"))
    p = tmp / "pairs.csv"
    flat.write_csv(p)
    out["csv"] = (p, "csv")
    p = tmp / "pairs.tsv"
    flat.write_csv(p, separator="\t", quote_style="never")
    out["tsv"] = (p, "tsv")
    p = tmp / "pairs.parquet"
    df.write_parquet(p)
    out["parquet"] = (p, "parquet")
    p = tmp / "hf_pairs"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(p))
    out["hf"] = (p, "hf")
    return out


def write_beir(root: Path, *, split_folder: bool = False) -> Path:
    """A tiny BEIR folder: query 1 has 2 relevant docs (+1 with score 0), query 2 has 1."""
    root.mkdir(parents=True, exist_ok=True)
    docs = [
        {"_id": "d1", "title": "Moon", "text": "The moon's gravity raises ocean tides twice a day."},
        {"_id": "d2", "title": "Sun", "text": "The sun also pulls on the oceans, giving spring and neap tides."},
        {"_id": "d3", "title": "Wind", "text": "Wind blowing over water makes waves."},
        {"_id": "d4", "title": "", "text": "Vaccines expose the immune system to a harmless antigen."},
    ]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    qdir = root / "train" if split_folder else root
    qdir.mkdir(exist_ok=True)
    (qdir / "queries.jsonl").write_text(
        json.dumps({"_id": "1", "text": "what causes tides"}) + "\n" + json.dumps({"_id": "2", "text": "how vaccines work"}) + "\n"
    )
    (qdir / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n1\td2\t2\n1\td3\t0\n2\td4\t1\n")
    return root


def config(tmp: Path, base_url: str, body: str = "", **llm: object) -> Path:
    lines = ["[llm]", f'base_url = "{base_url}"', 'model = "fake"', "backoff_initial = 0.01", "backoff_max = 0.05", "timeout = 10"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in llm.items()]
    lines += ["[pipeline]", "shard_size = 2", body]
    p = tmp / "run.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


# -- formats and column mapping --------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet", "hf"])
def test_each_format_with_column_mapping(tmp_path, fmt):
    path, f = write_all_formats(tmp_path)[fmt]
    spec = SourceSpec(
        path=str(path), columns={"query": "q", "positive": "doc", "negatives": "negs"}, name="toy", split="train" if fmt == "hf" else None
    )
    data = load_source(spec)
    assert [p.query for p in data.pairs] == [r["q"] for r in ROWS]
    assert [p.positive for p in data.pairs] == [r["doc"] for r in ROWS]
    assert data.columns["query"] == "q" and data.columns["positive"] == "doc"
    # existing negatives are read (kept for meta), whatever the storage
    assert data.pairs[0].negatives == ["Waves are caused by wind."]
    assert data.pairs[1].negatives == []
    assert len({p.source_id for p in data.pairs}) == 3 and all(p.source_id.startswith("toy:") for p in data.pairs)


def test_auto_format_and_default_columns(tmp_path):
    p = tmp_path / "nq" / "train.jsonl"
    p.parent.mkdir()
    p.write_text("".join(json.dumps({"question": r["q"], "answer": r["doc"]}) + "\n" for r in ROWS))
    data = load_source(SourceSpec(path=str(p)))
    assert data.name == "nq" and data.split == "train"  # split-like file stem -> parent folder name
    assert data.columns == {"query": "question", "positive": "answer"}
    assert data.pairs[2].source_id == "nq:train:2"


def test_tsv_filter_to_entailment_and_symmetric_instructions(tmp_path):
    tsv = tmp_path / "snli" / "test.tsv"
    tsv.parent.mkdir()
    premises = ["A dog runs in a field ."] * 2 + ["Two men play chess ."] * 2
    hypotheses = ["An animal is outside .", "A cat sleeps .", "People play a game .", "They are friends ."]
    rows = list(zip(premises, hypotheses, ["entailment", "contradiction", "entailment", "neutral"], strict=True))
    tsv.write_text("text1\ttext2\tlabel\n" + "".join("\t".join(r) + "\n" for r in rows))
    data = load_source(SourceSpec(path=str(tsv), columns={"query": "text1", "positive": "text2"}, filter={"label": "entailment"}))
    assert [(p.query, p.positive) for p in data.pairs] == [(r[0], r[1]) for r in rows if r[2] == "entailment"]
    assert [p.row for p in data.pairs] == [0, 2]
    with FakeOpenAI(always_valid) as srv:
        cfg = config(tmp_path, srv.base_url)
        columns = "--query-col text1 --positive-col text2 --filter label=entailment".split()
        r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "-i", tsv, *columns, "--json")
        assert r.exit_code == 0, r.output
        recs = list(read_stage(tmp_path / "run" / "regenerate"))
    assert {x["task_type"] for x in recs} == {"sts"} and all(x["attributes"]["symmetric"] for x in recs)
    assert [x["source_id"] for x in recs] == ["snli:test:0", "snli:test:2"]
    # rows 0 and 2 are both even -> the first NLI instruction; the prompt says negatives are non-entailed hypotheses
    assert {x["task"] for x in recs} == {"Given a premise, retrieve a hypothesis that is entailed by the premise"}
    # requests arrive concurrently: find the one about row 0 by its content
    prompt = next(q["messages"][-1]["content"] for q in srv.requests if "A dog runs in a field ." in q["messages"][-1]["content"])
    assert "NOT entailed" in prompt


def test_beir_several_positives_per_query(tmp_path):
    root = write_beir(tmp_path / "toybeir")
    data = load_source(SourceSpec(path=str(root)))
    ids = [p.source_id for p in data.pairs]
    assert ids == ["toybeir:test:1:d1", "toybeir:test:1:d2", "toybeir:test:2:d4"]  # d3 has score 0
    assert data.pairs[0].positive == "Moon The moon's gravity raises ocean tides twice a day."
    assert data.pairs[2].positive == "Vaccines expose the immune system to a harmless antigen."  # empty title
    assert data.positives_by_query["1"] == [data.pairs[0].positive, data.pairs[1].positive]
    # split layout: <root>/train/{queries.jsonl,qrels.tsv}, corpus in <root>
    root2 = write_beir(tmp_path / "split" / "toy2", split_folder=True)
    d2 = load_source(SourceSpec(path=str(root2), split="train"))
    assert [p.source_id for p in d2.pairs] == ["toy2:train:1:d1", "toy2:train:1:d2", "toy2:train:2:d4"]
    d3 = load_source(SourceSpec(path=str(root2 / "train")))  # the split folder itself
    assert d3.name == "toy2" and len(d3.pairs) == 3


# -- clear errors --------------------------------------------------------------------------
def test_missing_field_names_file_row_and_fix(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("query,positive\nfirst query,first doc\nsecond query,\nthird query,third doc\n")
    with pytest.raises(UserError) as e:
        load_source(SourceSpec(path=str(p)))
    msg = str(e.value)
    assert str(p) in msg and "row 2 (line 3)" in msg and "'positive'" in msg and "--positive-col" in msg
    assert len(load_source(SourceSpec(path=str(p), skip_invalid=True)).pairs) == 2
    # missing column: names the columns present and the option
    with pytest.raises(UserError, match=r"no column 'answer' for positive \(columns: query, positive\); fix --positive-col"):
        load_source(SourceSpec(path=str(p), columns={"positive": "answer"}))
    # jsonl: a missing key on line 2 -> row 2 (line 2)
    j = tmp_path / "bad.jsonl"
    j.write_text(json.dumps({"query": "a b", "positive": "c d"}) + "\n" + json.dumps({"query": "e f"}) + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl: row 2 \(line 2\): column 'positive'"):
        load_source(SourceSpec(path=str(j)))
    # through the CLI: one line on stderr, exit 2, no traceback
    r = runner.invoke(app, ["regenerate", "-d", str(tmp_path / "r"), "-i", str(p), "--set", "llm.base_url=http://127.0.0.1:9/v1"])
    assert r.exit_code == 2 and "row 2 (line 3)" in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_beir_qrel_pointing_nowhere(tmp_path):
    root = write_beir(tmp_path / "b")
    with open(root / "qrels.tsv", "a") as f:
        f.write("2\tmissing-doc\t1\n")
    with pytest.raises(UserError, match=r"qrels.tsv: row 5 \(line 6\): corpus-id 'missing-doc' has no text"):
        load_source(SourceSpec(path=str(root)))


# -- the stage through the CLI ----------------------------------------------------------------
def test_records_prompt_and_rejects(tmp_path):
    """Valid answers become Example records; answers repeating the positive are re-asked then rejected."""
    path = write_all_formats(tmp_path)["jsonl"][0]

    def responder(req, n):
        prompt = [m for m in req["messages"] if m["role"] == "user"][-1]["content"]
        if "why is the sky blue" in json.dumps(req):  # this pair always gets the positive back as a negative
            doc = ROWS[2]["doc"]
            return Reply(content=json.dumps({"hard_negative_documents": [doc, "b b b", "c c c", "d d d"]}))
        assert prompt.startswith("Task: ")
        return Reply(content=valid_answer(req, n))

    with FakeOpenAI(responder) as srv:
        cfg = config(tmp_path, srv.base_url)
        columns = "--query-col q --positive-col doc --negatives-col negs --source-name msmarco".split()
        r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "-i", path, *columns, "--json")
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout)
    assert stats["valid"] == 2 and stats["rejects_by_reason"] == {"negative_equals_positive": 1}
    recs = [Example.model_validate(x) for x in read_stage(tmp_path / "run" / "regenerate")]
    assert [x.source_id for x in recs] == ["msmarco:all:0", "msmarco:all:1"]
    assert all(
        x.source == "msmarco" and x.task == "Given a web search query, retrieve relevant passages that answer the query" for x in recs
    )
    assert recs[0].meta["source_negatives"] == ["Waves are caused by wind."] and "source_negatives" not in recs[1].meta
    assert recs[0].query == ROWS[0]["q"] and recs[0].positive == ROWS[0]["doc"] and len(recs[0].negatives) == 4
    last = next(q["messages"][-1]["content"] for q in srv.requests if ROWS[0]["q"] in q["messages"][-1]["content"])
    assert ROWS[0]["doc"] in last and "same language as the relevant document" in last
    assert "Waves are caused by wind" not in json.dumps(srv.requests)  # source negatives are never shown
    rej = list(read_stage(tmp_path / "run" / "regenerate" / "rejects"))
    assert rej[0]["reason"] == "negative_equals_positive" and rej[0]["input"]["source_id"] == "msmarco:all:2"


def test_dedup_across_sources(tmp_path):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.csv"
    a.write_text("".join(json.dumps({"query": r["q"], "positive": r["doc"]}) + "\n" for r in ROWS))
    # b repeats row 1 with other case / spacing / end punctuation, and repeats itself once
    b.write_text(
        f'query,positive\n"  {ROWS[1]["q"].upper()}?","{ROWS[1]["doc"]}  "\nnew query here,new positive text\nnew query here,new positive text\n'
    )
    body = f'[[regenerate.inputs]]\npath = "{a}"\nname = "srca"\n[[regenerate.inputs]]\npath = "{b}"\nname = "srcb"\n'
    with FakeOpenAI(always_valid) as srv:
        cfg = config(tmp_path, srv.base_url, body)
        r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "--json")
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout)
    recs = list(read_stage(tmp_path / "run" / "regenerate"))
    assert len(recs) == 4 and stats["duplicates"] == 2
    assert stats["sources"]["srca"]["duplicates"] == 0 and stats["sources"]["srcb"]["duplicates"] == 2
    assert [x["source"] for x in recs] == ["srca"] * 3 + ["srcb"]
    assert len(srv.requests) == 4


def test_resume_after_sigkill_equals_uninterrupted_run(tmp_path):
    """Kill the CLI process (SIGKILL) while request 3 is in flight; the rerun sends only what was missing."""
    root = write_beir(tmp_path / "toybeir")
    extra = tmp_path / "more.jsonl"
    extra.write_text("".join(json.dumps({"query": f"query number {i}", "positive": f"positive text number {i}"}) + "\n" for i in range(5)))
    body = f'[[regenerate.inputs]]\npath = "{root}"\n[[regenerate.inputs]]\npath = "{extra}"\nname = "more"\n'
    n_items = 3 + 5

    # uninterrupted reference run
    with FakeOpenAI(always_valid) as srv:
        cfg = config(tmp_path, srv.base_url, body, max_concurrency=1)
        assert invoke("regenerate", "-c", cfg, "-d", tmp_path / "ref", "-q").exit_code == 0
        ref_prompts = [q["messages"][-1]["content"] for q in srv.requests]
    assert len(ref_prompts) == n_items

    kill_at = 3
    proc: dict = {}
    killed = threading.Event()

    def responder(req, n):
        if n == kill_at and "p" in proc:
            os.kill(proc["p"].pid, signal.SIGKILL)  # requests 0..2 answered and recorded; 3 in flight
            killed.set()
            return Reply(content=valid_answer(req, n), delay=0.5)
        return Reply(content=valid_answer(req, n))

    with FakeOpenAI(responder) as srv:
        cfg = config(tmp_path, srv.base_url, body, max_concurrency=1)
        cmd = [
            sys.executable,
            "-c",
            "from negsynth.cli import main; main()",
            "regenerate",
            "-c",
            str(cfg),
            "-d",
            str(tmp_path / "run"),
            "-q",
        ]
        proc["p"] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc["p"].communicate(timeout=120)
        assert killed.is_set() and proc["p"].returncode == -signal.SIGKILL
        first = [q["messages"][-1]["content"] for q in srv.requests]
        assert len(first) == kill_at + 1
        assert list((tmp_path / "run" / "regenerate").glob("*.partial"))  # the kill left a partial shard
        r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "--json")
        assert r.exit_code == 0, r.output
        second = [q["messages"][-1]["content"] for q in srv.requests][len(first) :]
    # nothing answered before the kill was asked again; only the in-flight item and the rest were
    assert not set(first[:kill_at]) & set(second)
    assert sorted(second) == sorted(ref_prompts[kill_at:])
    ref = sorted(p.name for p in (tmp_path / "ref" / "regenerate").glob("shard-*.jsonl"))
    got = sorted(p.name for p in (tmp_path / "run" / "regenerate").glob("shard-*.jsonl"))
    assert ref == got and len(ref) == 4
    for name in ref:
        assert (tmp_path / "run" / "regenerate" / name).read_bytes() == (tmp_path / "ref" / "regenerate" / name).read_bytes()
    assert json.loads(r.stdout)["valid"] == n_items


# -- mining ---------------------------------------------------------------------------------
def test_mine_returns_negatives_that_are_not_positives(tmp_path):
    """Query 1 has two positives in a tiny corpus full of near topics: neither may come back as a negative."""
    root = write_beir(tmp_path / "minebeir")
    more = [
        {"_id": "d5", "title": "Tides", "text": "High tide and low tide alternate about every six hours."},
        {"_id": "d6", "title": "Moon phases", "text": "The moon's phases come from the changing angle of sunlight."},
        {"_id": "d7", "title": "Oceans", "text": "The Pacific is the largest and deepest ocean."},
        {"_id": "d8", "title": "Flu shot", "text": "The flu vaccine is updated every year."},
    ]
    with open(root / "corpus.jsonl", "a") as f:
        f.write("".join(json.dumps(d) + "\n" for d in more))
    with FakeOpenAI(always_valid) as srv:
        cfg = config(tmp_path, srv.base_url)
        r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "-i", root, "--mine", "3", "--json")
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout)
    recs = list(read_stage(tmp_path / "run" / "regenerate"))
    corpus = {json.loads(line)["_id"]: json.loads(line) for line in (root / "corpus.jsonl").read_text().splitlines()}
    text = {k: f"{d['title']} {d['text']}".strip() for k, d in corpus.items()}
    positives = {"1": {text["d1"], text["d2"]}, "2": {text["d4"]}}
    for x in recs:
        qid = x["meta"]["query_id"]
        mined = x["mined_negatives"]
        assert len(mined) >= 1 and len(mined) <= 3 and len(set(mined)) == len(mined)
        assert not set(mined) & positives[qid], (qid, mined)
        assert set(mined) <= set(text.values())
        # positive-aware margin: every kept negative scores below 95% of the (hardest) positive
        assert all(s <= 0.95 * x["meta"]["mined_pos_score"] + 1e-6 for s in x["meta"]["mined_scores"])
        assert x["meta"]["mined_scores"] == sorted(x["meta"]["mined_scores"], reverse=True)
    # the two pairs of query 1 share the mined list (same query, same known positives)
    q1 = [x for x in recs if x["meta"]["query_id"] == "1"]
    assert q1[0]["mined_negatives"] == q1[1]["mined_negatives"]
    assert stats["mining"]["k"] == 3
    # a rerun with --overwrite reuses the cached mining (no model load needed) and gives the same lists
    assert list((tmp_path / "run" / "regenerate" / "_mined").glob("*.json"))


# -- downstream: score accepts the output ---------------------------------------------------
def test_score_accepts_regenerated_records(tmp_path):
    path = write_all_formats(tmp_path)["jsonl"][0]
    with FakeOpenAI(always_valid) as srv:
        cfg = config(tmp_path, srv.base_url)
        assert (
            invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "-i", path, "--query-col", "q", "--positive-col", "doc", "-q").exit_code
            == 0
        )
    recs = list(read_stage(tmp_path / "run" / "regenerate"))
    for x in recs:
        Example.model_validate(x)
    try:
        import negsynth.stages.score  # noqa: F401
    except ImportError:
        pytest.skip("score stage not available")
    # annotate: every record must come through with its 4 negatives (the fake LLM's negatives are
    # arbitrary texts the measured policy would drop)
    r = invoke("score", "-c", cfg, "-d", tmp_path / "run", "--json", "--policy", "annotate")
    assert r.exit_code == 0, r.output
    scored = list(read_stage(tmp_path / "run" / "score"))
    assert [x["source_id"] for x in scored] == [x["source_id"] for x in recs]
    assert all(x["score"] is not None and len(x["score"]["cos_neg"]) == 4 for x in scored)


def test_mined_negatives_need_no_llm_and_give_verified_examples(tmp_path):
    """``regenerate.negatives = "mined"``: a user with no LLM still gets verified examples — the 4
    hardest positive-aware negatives, hardest first, through the same shards, stats and score."""
    from negsynth.schemas.config import RunConfig
    from negsynth.stages import get

    root = tmp_path / "beir"
    docs = _beir_topics(root)
    body = '[regenerate]\nnegatives = "mined"\n'
    cfg = config(tmp_path, "http://127.0.0.1:9/v1", body)  # nothing listens there: no request may be made
    assert not get("regenerate").uses_llm(RunConfig.model_validate({"regenerate": {"negatives": "mined"}}))
    assert get("regenerate").uses_llm(RunConfig()) and not get("score").uses_llm(RunConfig())
    r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "-i", root, "--json")
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["valid"] == 3 and stats["attempts"] == 0 and stats["mining"]["negatives"] == "mined"
    text = docs
    for x in read_stage(tmp_path / "run" / "regenerate"):
        Example.model_validate(x)
        pos = x["positive"]
        assert x["model"].startswith("mined:") and len(x["negatives"]) == 4 and len(set(x["negatives"])) == 4
        assert pos not in x["negatives"] and set(x["negatives"]) <= set(text.values())
        s = x["meta"]["mined_scores"]
        assert s == sorted(s, reverse=True) and s[0] <= 0.95 * x["meta"]["mined_pos_score"] + 1e-6
    # a rerun is a no-op, still without a server
    r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "-i", root, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["valid"] == 3
    # the 4 hardest mined: the curriculum's "auto" schedule writes the stock recipe's rows, once
    assert invoke("score", "-c", cfg, "-d", tmp_path / "run", "-q").exit_code == 0
    r = invoke(
        "curriculum",
        "-c",
        cfg,
        "-d",
        tmp_path / "run",
        "--set",
        "curriculum.batch_size=2",
        "--set",
        "curriculum.homogeneous_batches=false",
        "--json",
    )
    assert r.exit_code == 0, r.output
    cur = json.loads(r.stdout)
    assert cur["schedule"] == "stock" and cur["schedule_setting"] == "auto" and cur["rows"] == 3


def test_the_mining_options_bind_by_name():
    """``regenerate.mining`` options pass to ``mine_negatives`` under their own names: each is a
    parameter of that function and a field of the config, and the bound call carries its value."""
    import inspect

    from negsynth.embed.mining import mine_negatives
    from negsynth.schemas.config import MiningConfig
    from negsynth.stages.regenerate import MINING_OPTIONS, miner

    assert MINING_OPTIONS <= set(inspect.signature(mine_negatives).parameters) & set(MiningConfig.model_fields)
    bound = miner(MiningConfig(relative_margin=0.2, range_max=50), 3, batch_size=8)
    assert bound.func is mine_negatives and bound.keywords["relative_margin"] == 0.2 and bound.keywords["range_max"] == 50
    assert bound.keywords["k"] == 3


def _beir_topics(root: Path) -> dict[str, str]:
    """A BEIR folder of 120 documents over 5 topics and 3 queries (d0, d1, d2 their positives)."""
    import random

    root.mkdir()
    rng = random.Random(0)
    topics = [
        "ocean tides and the moon",
        "vaccines and the immune system",
        "volcanoes and lava",
        "bees and pollination",
        "black holes and gravity",
    ]
    words = "the of a shows study effect data rate high low new model cell energy water light heat plant animal".split()
    docs = {}
    for i in range(120):
        docs[f"d{i}"] = f"{topics[i % len(topics)]}: " + " ".join(rng.choice(words) for _ in range(12)) + f" ({i})"
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in docs.items()))
    queries = [
        ("1", "what causes ocean tides", "d0"),
        ("2", "how do vaccines train immunity", "d1"),
        ("3", "why do volcanoes erupt lava", "d2"),
    ]
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t, _ in queries))
    (root / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, _, d in queries))
    return docs


def test_the_teacher_drops_the_false_negatives_it_finds_and_labels_the_rest(tmp_path, monkeypatch, minilm):
    """``regenerate.teacher`` (RLHN): a mined candidate the teacher scores at or above the labelled
    positive is left out and the next one takes its place; the example's label is the positive's
    and the kept negatives' scores. A stand-in for the cross-encoder here finds every document of
    the positive's topic as relevant as the positive itself."""
    import negsynth.stages.regenerate as stage

    docs = _beir_topics(tmp_path / "beir")

    class SameTopicIsRelevant:
        def scores(self, query, texts):
            topic = texts[0].split(":")[0]
            return [-1.0] + [-1.0 if t.startswith(topic) else -2.0 - 0.01 * i for i, t in enumerate(texts[1:])]

    monkeypatch.setattr(stage, "teacher_scorer", lambda *a, **kw: SameTopicIsRelevant())
    body = f'[regenerate]\nnegatives = "mined"\nmine = 40\nteacher = "cross-encoder"\nteacher_model = {json.dumps(minilm)}\n'
    cfg = config(tmp_path, "http://127.0.0.1:9/v1", body)  # nothing listens there: the teacher is in-process
    r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "-i", tmp_path / "beir", "--json")
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    recs = list(read_stage(tmp_path / "run" / "regenerate"))
    assert stats["valid"] == 3 and stats["attempts"] == 0 and len(recs) == 3
    assert stats["teacher"]["pairs"] == 3 and stats["teacher"]["false_negatives"] == sum(x["meta"]["teacher_false_negatives"] for x in recs)
    for x in recs:
        topic = x["positive"].split(":")[0]
        meta = x["meta"]
        assert meta["teacher_false_negatives"] >= 1  # the nearest mined documents share the topic
        assert len(x["negatives"]) == 4 and not any(n.startswith(topic) for n in x["negatives"])
        assert meta["teacher_label"][0] == meta["teacher_pos_score"] == -1.0 and meta["teacher_label"][1:] == meta["teacher_scores"]
        assert len(meta["mined_scores"]) == 4 and meta["mined_scores"] == sorted(meta["mined_scores"], reverse=True)
        assert set(x["negatives"]) <= set(docs.values())
    # without room to replace them (mine = 4), the pairs whose candidates the teacher disputes are rejects saying so
    cfg = config(tmp_path, "http://127.0.0.1:9/v1", body.replace("mine = 40", "mine = 4"))
    r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run4", "-i", tmp_path / "beir", "--json")
    assert r.exit_code != 0  # nothing valid: the stage fails, blaming no model, in one line naming the reason
    out = " ".join(r.output.split())
    assert "no LLM request was made; too_few_mined:" in out and "the teacher scored" in out and "check llm.model" not in out
    rejects = [
        json.loads(line) for p in (tmp_path / "run4" / "regenerate" / "rejects").glob("*.jsonl") for line in p.read_text().splitlines()
    ]
    assert rejects and all(x["reason"] == "too_few_mined" and "the teacher scored" in x["detail"] for x in rejects)


@pytest.mark.parametrize(
    ("body", "message"),
    [('teacher = "cross-encoder"\nteacher_model = "m"', 'set negatives = "mined"')],
)
def test_a_teacher_regenerate_cannot_apply_is_refused_in_one_line(tmp_path, body, message):
    _beir_topics(tmp_path / "beir")
    cfg = config(tmp_path, "http://127.0.0.1:9/v1", "[regenerate]\n" + body)
    r = invoke("regenerate", "-c", cfg, "-d", tmp_path / "run", "-i", tmp_path / "beir")
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output


def test_the_default_mining_window_is_the_librarys_own(monkeypatch):
    """With ``range_max`` unset, ``mine_negatives`` asks ``mine_hard_negatives`` for the window the
    library itself takes under a margin (10 x k candidates + the most positives of one query), so
    a query keeps k negatives exactly where the stock recipe keeps them; a set value is passed as is."""
    import datasets
    import sentence_transformers.util

    from negsynth.embed.mining import mine_negatives

    seen = []

    def fake(ds, model, **kw):
        seen.append(kw["range_max"])
        return datasets.Dataset.from_dict({"query": [], "positive": [], "negative": [], "scores": []})

    monkeypatch.setattr(sentence_transformers.util, "mine_hard_negatives", fake)
    corpus = [f"doc {i}" for i in range(200)]
    known = {"a": ["doc 1", "doc 2", "doc 3"], "b": ["doc 4"]}
    mine_negatives(None, {"a": "query a", "b": "query b"}, known, corpus, 4)
    mine_negatives(None, {"a": "query a", "b": "query b"}, known, corpus, 4, range_max=77)
    assert seen == [10 * 4 + 3, 77]
