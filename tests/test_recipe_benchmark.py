"""The recipe benchmarks (benchmarks/scifact_recipe.py, corpus_recipe.py and their harness): results of
arms run in parallel processes are all kept; the splits, the paired test against the stock recipe and
the checks that keep the side-by-side a same-input, same-rows comparison."""

import argparse
import json
import multiprocessing
from pathlib import Path

from helpers import load_benchmark


def load_script():
    return load_benchmark("scifact_recipe")


def _save(args):
    path, arm, seed = args
    harness = load_benchmark("harness")
    for k in range(5):  # several writes each, interleaved with the other processes'
        harness.save_result(Path(path), {"arm": arm, "seed": seed, "scores": {"SciFact": 0.5 + k / 100}}, ("arm", "seed"))


def test_parallel_processes_keep_each_others_results(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"args": {}, "results": [{"arm": "base", "seed": 0, "scores": {"SciFact": 0.64}}]}))
    jobs = [(str(path), "ns-pipeline", s) for s in (0, 1, 2)] + [(str(path), "st-mined-4", 0)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_save, jobs)
    got = {(r["arm"], r["seed"]): r["scores"]["SciFact"] for r in json.loads(path.read_text())["results"]}
    # every arm once (a rerun replaces its own entry), nobody's result lost
    assert got == {("base", 0): 0.64, ("ns-pipeline", 0): 0.54, ("ns-pipeline", 1): 0.54, ("ns-pipeline", 2): 0.54, ("st-mined-4", 0): 0.54}


def _run_file(tmp_path, name, cfg):
    import tomli_w

    from negsynth.schemas.config_io import load_config

    toml = tmp_path / f"{name}.toml"
    toml.write_text(tomli_w.dumps(cfg))
    return load_config(toml)


def test_pipeline_arms_are_valid_run_files_that_differ_only_where_they_say(tmp_path):
    mod = load_script()
    args = mod.build_parser().parse_args(["--steps", "28"])
    cfgs = {}
    for arm, extra in mod.PIPELINE_ARMS.items():
        assert arm in mod.ALL_ARMS
        cfgs[arm] = _run_file(tmp_path, arm, mod.pipeline_toml(tmp_path / "data", args, 1, extra.format(tuple_range_max=44, steps=28)))
    base = cfgs["ns-pipeline"]
    assert (
        base.regenerate.negatives == "mined" and base.train.grad_accum == 1 and base.curriculum.total_steps == 28 and base.train.seed == 1
    )
    assert base.regenerate.mining.range_max is None and cfgs["ns-pipeline-wide"].regenerate.mining.range_max == 340
    # both arms mine at the training length, as the stock arm mines
    assert base.embedder.max_length == 128 and base.curriculum.schedule == "auto"
    # the stock rows in the tuple builder's seeded order, through the stock trainer
    reordered = cfgs["ns-pipeline-reordered"]
    assert reordered.curriculum.schedule == "tuple" and reordered.curriculum.total_steps is None and reordered.curriculum.epochs == 1
    assert (reordered.train.max_steps, reordered.train.batch_sampler, reordered.train.mini_batch_size) == (28, "shuffled", None)
    old = cfgs["ns-pipeline-tuple"]  # the default before: tuple builder, 4 x the positives in the window
    assert old.curriculum.schedule == "tuple" and old.regenerate.mining.range_max == 44 and old.train == base.train
    llm = cfgs["ns-pipeline-llm"]
    assert llm.regenerate.negatives == "llm" and llm.curriculum.schedule == "curriculum" and llm.llm.base_url == "embedded"
    assert llm.regenerate.inputs[0].limit == 128 and base.regenerate.inputs[0].limit is None  # the LLM grades a sample of the pairs
    for arm, cfg in cfgs.items():
        changed = {k for k in ("regenerate", "score", "curriculum", "train", "llm") if getattr(cfg, k) != getattr(base, k)}
        assert (
            changed
            <= {
                "ns-pipeline": set(),
                "ns-pipeline-wide": {"regenerate"},
                "ns-pipeline-gc8": {"train"},
                "ns-pipeline-b12": {"train"},
                "ns-pipeline-reordered": {"curriculum", "train"},
                "ns-pipeline-tuple": {"regenerate", "curriculum"},
                "ns-pipeline-llm": {"regenerate", "curriculum", "llm"},
            }[arm]
        ), (arm, changed)
    gc8 = cfgs["ns-pipeline-gc8"].train  # its one line joins the protocol's [train] table
    assert gc8.mini_batch_size == 8 and base.train.mini_batch_size == "auto"
    assert gc8.model_copy(update={"mini_batch_size": "auto"}) == base.train
    b12 = cfgs["ns-pipeline-b12"]  # an arm's key replaces the protocol's, in the protocol's own table
    assert b12.train.batch_size == 12 and b12.train.model_copy(update={"batch_size": base.train.batch_size}) == base.train
    assert b12.curriculum == base.curriculum


def test_default_invocation_is_the_headline_and_all_means_every_arm():
    import pytest

    mod = load_script()
    harness = load_benchmark("harness")
    args = mod.build_parser().parse_args([])
    # the default run is the headline (an hour or so on 2 cores): base, the stock recipe, negsynth's default
    assert harness.names(args.arms, mod.ALL_ARMS) == ["base", "st-mined-4", "ns-pipeline"] and args.seeds == [0]
    assert harness.names("all", mod.ALL_ARMS) == list(mod.ALL_ARMS)
    assert harness.names(" st-inbatch , base ", mod.ALL_ARMS) == ["st-inbatch", "base"]
    with pytest.raises(SystemExit, match=r"unknown arm\(s\) \['st-mined-9'\]"):
        harness.names("base,st-mined-9", mod.ALL_ARMS)
    with pytest.raises(SystemExit, match=r"unknown arm\(s\) ' , '"):
        harness.names(" , ", mod.ALL_ARMS)
    mod.build_parser().format_help()  # the docstring epilog renders (a stray % would raise here)


def test_bad_seeds_stop_in_one_line(capsys):
    import pytest

    mod = load_script()
    assert mod.build_parser().parse_args(["--seeds", "0, 1,2"]).seeds == [0, 1, 2]
    for bad, says in (("zero", "'zero': expected comma-separated integers, e.g. 0,1,2"), (",", "no value given; e.g. 0")):
        with pytest.raises(SystemExit) as e:
            mod.build_parser().parse_args(["--seeds", bad])
        last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse: usage line, then one error line
        assert e.value.code == 2 and last.endswith(f"argument --seeds: {says}")


def _beir(root, layout: str, n_train: int = 50, n_test: int = 20):
    """A tiny BEIR folder: this project's layout (test at the top, train/ beside) or BEIR's (qrels/{train,test}.tsv)."""
    root.mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"document {i}"}) + "\n" for i in range(40))
    )
    train_q = {f"t{i}": f"train query {i}" for i in range(n_train)}
    test_q = {f"s{i}": f"test query {i}" for i in range(n_test)}
    train_rel = "query-id\tcorpus-id\tscore\n" + "".join(f"t{i}\td{i % 40}\t1\n" for i in range(n_train)) + "t0\td39\t1\n"
    test_rel = "query-id\tcorpus-id\tscore\n" + "".join(f"s{i}\td{i}\t1\n" for i in range(n_test))

    def q(d):
        return "".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in d.items())

    if layout == "project":
        (root / "train").mkdir()
        (root / "queries.jsonl").write_text(q(test_q))
        (root / "qrels.tsv").write_text(test_rel)
        (root / "train" / "queries.jsonl").write_text(q(train_q))
        (root / "train" / "qrels.tsv").write_text(train_rel)
    else:
        (root / "qrels").mkdir()
        (root / "queries.jsonl").write_text(q({**train_q, **test_q}))
        (root / "qrels" / "train.tsv").write_text(train_rel)
        (root / "qrels" / "test.tsv").write_text(test_rel)
    return root


def test_dev_split_is_held_out_by_query_seeded_and_read_in_both_layouts(tmp_path):
    import pytest

    from negsynth.data.readers import read_beir

    mod = load_script()
    for layout in ("project", "beir"):
        root = _beir(tmp_path / layout / "mydomain", layout)
        info = mod.make_splits(root, tmp_path / layout / "split", 0.2, 0)
        assert (info["train_queries"], info["dev_queries"], info["fit_queries"], info["test_queries"]) == (50, 10, 40, 20)
        fit_q, _, fit_rel = read_beir(tmp_path / layout / "split" / "fit")
        dev_q, _, dev_rel = read_beir(tmp_path / layout / "split" / "dev")
        test_q, corpus, _ = read_beir(tmp_path / layout / "split" / "test")
        assert not set(fit_q) & set(dev_q) and len(fit_q) + len(dev_q) == 50 and len(corpus) == 40
        assert set(test_q) == {f"s{i}" for i in range(20)}  # the test split untouched, never mixed into fit / dev
        assert info["fit_pairs"] + info["dev_pairs"] == 51  # t0's two positives stay together
        if layout == "project":
            first_dev = set(dev_q)
        else:
            assert set(dev_q) == first_dev  # the same seed holds out the same queries whatever the layout
    again = mod.make_splits(tmp_path / "project" / "mydomain", tmp_path / "again", 0.2, 0)
    assert again["dev_queries"] == 10 and set(read_beir(tmp_path / "again" / "dev")[0]) == first_dev
    mod.make_splits(tmp_path / "project" / "mydomain", tmp_path / "other", 0.2, 1)
    assert set(read_beir(tmp_path / "other" / "dev")[0]) != first_dev
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "corpus.jsonl").write_text("")
    with pytest.raises(SystemExit, match="not a BEIR folder with train and test splits .missing a train split, a test split"):
        mod.dataset_files(bare)
    with pytest.raises(SystemExit, match="holds out 2 of 50"):
        mod.make_splits(tmp_path / "project" / "mydomain", tmp_path / "tiny", 0.04, 0)


def test_headline_is_a_paired_per_query_test_against_the_stock_recipe(capsys):
    import numpy as np

    mod = load_script()
    rng = np.random.default_rng(0)
    dev_ids, test_ids = [f"q{i}" for i in range(120)], [f"s{i}" for i in range(150)]
    dev_base, test_base = rng.uniform(0.3, 0.9, 120), rng.uniform(0.3, 0.9, 150)

    def res(arm, seed, shift, test=True, noise=0.02):
        dev = {q: float(v + shift + rng.normal(0, noise)) for q, v in zip(dev_ids, dev_base)}
        pq = {"dom-dev": dev}
        scores = {"dom-dev": float(np.mean(list(dev.values())))}
        if test:
            t = {q: float(v + shift + rng.normal(0, noise)) for q, v in zip(test_ids, test_base)}
            pq["dom-test"], scores["dom-test"] = t, float(np.mean(list(t.values())))
        return {"arm": arm, "seed": seed, "scores": scores, "per_query": pq, "seconds": 1}

    same = {"shift": 0.0, "noise": 0.0}  # the default ties the stock recipe exactly
    results = [
        res("base", 0, -0.05),
        res("st-mined-4", 0, **same),
        res("st-mined-4", 1, **same),
        res("ns-pipeline", 0, **same),
        res("ns-pipeline", 1, **same),
        res("ns-pipeline-gc8", 0, 0.05, test=False),
    ]
    args = argparse.Namespace(
        dev_name="dom-dev",
        test_name="dom-test",
        eval_tasks=[],
        resamples=2000,
        name="dom",
        steps=22,
        batch_size=32,
        lr=2e-5,
        eval_suite="full",
        split_info={"fit_queries": 480, "fit_pairs": 500, "dev_queries": 120, "test_queries": 150, "split_seed": 0},
    )
    harness = load_benchmark("harness")
    tie = harness.paired(results, "ns-pipeline", mod.STOCK_ARM, "dom-test", 2000)
    assert tie["seeds_a"] == tie["seeds_b"] == 2 and tie["queries"] == 150 and tie["p_value"] == 1.0 and tie["mean_diff"] == 0.0
    lead = harness.paired(results, "ns-pipeline-gc8", mod.STOCK_ARM, "dom-dev", 2000)
    assert lead["p_value"] < 0.01 and 0.04 < lead["mean_diff"] < 0.06
    assert harness.paired(results, "ns-pipeline-gc8", mod.STOCK_ARM, "dom-test", 2000) is None  # never evaluated on test
    # the dev choice, and who is reported on test: base, the stock recipe, the default and the dev choice
    assert mod.choose_on_dev(results, args) == "ns-pipeline-gc8"
    assert mod.report_arms(results, args) == ["base", "st-mined-4", "ns-pipeline", "ns-pipeline-gc8"]
    tied = [dict(r, scores={"dom-dev": 0.5}) for r in results]  # a tie keeps the default, whatever the order of the results
    assert mod.choose_on_dev(tied, args) == mod.choose_on_dev(tied[::-1], args) == "ns-pipeline"
    mod.print_table(results, args)
    out = capsys.readouterr().out
    assert "Per query against st-mined-4" in out and "chosen on dom-dev: ns-pipeline-gc8" in out
    row = next(line for line in out.splitlines() if line.startswith("| ns-pipeline-gc8 |") and "[" in line)
    assert row.rstrip().endswith("| - |")  # no test figure for an arm the protocol did not report


def test_one_labelled_query_set_is_split_into_train_and_test_by_query(tmp_path):
    """--test-frac: a Cranfield-like folder (one queries.jsonl + qrels.tsv) becomes train / test by
    query, seeded; a judged document with no text stays out of train only; the result reads as a
    folder with train and test splits."""
    import pytest

    from negsynth.data.readers import read_beir

    root = tmp_path / "cran"
    root.mkdir()
    docs = [{"_id": f"d{i}", "title": "", "text": "" if i == 7 else f"document {i}"} for i in range(40)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n" for i in range(60)))
    (root / "qrels.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i % 40}\t2\nq{i}\td{(i + 7) % 40}\t1\n" for i in range(60))
    )
    mod = load_script()
    dest = mod.split_one_set(root, tmp_path / "a", 0.25, 0)
    train_q, corpus, train_rel = read_beir(dest / "train")
    test_q, _, test_rel = read_beir(dest / "test")
    assert len(test_q) == 15 and len(train_q) == 45 and not set(train_q) & set(test_q) and len(corpus) == 40
    assert "d7" not in {d for rels in train_rel.values() for d in rels}  # the empty document: not a training positive
    assert sum("d7" in rels for rels in test_rel.values()) == sum(int(q[1:]) % 40 == 7 or (int(q[1:]) + 7) % 40 == 7 for q in test_q)
    assert set(read_beir(mod.split_one_set(root, tmp_path / "b", 0.25, 0) / "test")[0]) == set(test_q)  # seeded
    assert set(read_beir(mod.split_one_set(root, tmp_path / "c", 0.25, 1) / "test")[0]) != set(test_q)
    info = mod.make_splits(dest, tmp_path / "split", 0.3, 0)  # the dev protocol reads it like any train/test folder
    assert (info["train_queries"], info["dev_queries"], info["test_queries"]) == (45, 14, 15)
    with pytest.raises(SystemExit, match="holds out 3 of 60"):
        mod.split_one_set(root, tmp_path / "d", 0.05, 0)


def test_a_test_frac_dataset_is_not_decontaminated_against_its_own_query_file(tmp_path):
    """--test-frac splits one query file by query: the pipeline arms decontaminate against every
    default evaluation set but that dataset's own (which holds the train queries as well), and an
    arm's own [score] lines still apply; without the flag the default ("auto") stays."""
    mod = load_script()
    args = mod.build_parser().parse_args(["--steps", "17"])
    args.split_from = "cranfield"
    cfgs = {}
    for arm in ("ns-pipeline", "ns-pipeline-wide", "ns-pipeline-gc8"):
        cfgs[arm] = _run_file(tmp_path, arm, mod.pipeline_toml(tmp_path / "data", args, 0, mod.PIPELINE_ARMS[arm]))
    for arm, cfg in cfgs.items():
        sets = cfg.score.decontam_sets
        assert isinstance(sets, list) and "cranfield" not in sets and {"scifact", "stsb"} <= set(sets), (arm, sets)
    assert cfgs["ns-pipeline-wide"].regenerate.mining.range_max == 340
    assert cfgs["ns-pipeline-gc8"].train.mini_batch_size == 8
    del args.split_from
    assert _run_file(tmp_path, "plain", mod.pipeline_toml(tmp_path / "data", args, 0)).score.decontam_sets == "auto"


def test_the_stock_and_default_arms_must_start_from_the_same_examples(capsys):
    """Both recipe benchmarks refuse a table whose stock arm and negsynth default read different
    examples (the check that keeps the side-by-side honest), and say so when they match."""
    import pytest

    sci = load_script()
    same = {"pairs": 10, "duplicates_dropped": 0, "ids_sha256": "a"}
    sci.check_same_input([{"arm": sci.STOCK_ARM, "same_input": same}, {"arm": sci.DEFAULT_ARM, "same_input": same}])
    assert "read the same 10 pairs" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="did not start from the same pairs"):
        sci.check_same_input([{"arm": sci.STOCK_ARM, "same_input": same}, {"arm": sci.DEFAULT_ARM, "same_input": {**same, "pairs": 9}}])
    with pytest.raises(SystemExit, match="did not start from the same pairs"):
        sci.check_same_input(
            [{"arm": sci.STOCK_ARM, "same_input": same}, {"arm": sci.DEFAULT_ARM, "same_input": {**same, "ids_sha256": "b"}}]
        )

    corpus = load_benchmark("corpus_recipe")
    rows = [
        {"dataset": "cranfield", "arm": corpus.STOCK_ARM, "seed": 0, "same_input": {"examples": 5, "ids_sha256": "x"}},
        {"dataset": "cranfield", "arm": corpus.DEFAULT_ARM, "seed": 0, "same_input": {"examples": 5, "ids_sha256": "x"}},
    ]
    corpus.check_same_input(rows, "cranfield")
    assert "same input (cranfield): st-stock and mined: {'examples': 5" in capsys.readouterr().out
    rows[1]["same_input"] = {"examples": 4, "ids_sha256": "y"}
    with pytest.raises(SystemExit, match="differ in same_input"):
        corpus.check_same_input(rows, "cranfield")


def test_the_corpus_stock_arm_reads_the_default_arms_records(tmp_path):
    """corpus_recipe's st-stock trains on the default arm's corpus records, so its recorded input
    is that run dir's: the digest is of the records' ids, in any shard order."""
    from negsynth.data.shards import write_jsonl

    corpus = load_benchmark("corpus_recipe")
    run = tmp_path / "run" / "corpus"
    run.mkdir(parents=True)
    write_jsonl(run / "shard-00000.jsonl", [{"id": "b"}, {"id": "a"}])
    write_jsonl(run / "shard-00001.jsonl", [{"id": "c"}])
    d = corpus.input_digest(tmp_path / "run")
    assert d["examples"] == 3
    write_jsonl(run / "shard-00001.jsonl", [{"id": "d"}])
    assert corpus.input_digest(tmp_path / "run")["ids_sha256"] != d["ids_sha256"]


def test_every_arm_of_a_table_is_scored_at_one_token_length(tmp_path, monkeypatch, minilm):
    """The corpus benchmark's stock arm mines as negsynth's default mines, with the base model at its
    own length, and hands the trainer (which saves at the length it gets) the base model's; and a table whose arms were evaluated at
    different lengths is refused in one line (a stock model once saved at 128 tokens was scored on
    truncated documents beside negsynth's at 256)."""
    import pytest
    import sentence_transformers.util
    from datasets import Dataset

    from negsynth.data.shards import atomic_write_json, write_jsonl

    corpus = load_benchmark("corpus_recipe")
    data = tmp_path / "data" / "cranfield"
    data.mkdir(parents=True)
    (data / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"doc {i} about wings"}) + "\n" for i in range(6))
    )
    args = corpus.build_parser().parse_args(["--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "data"), "--max-length", "64"])
    run, _ = corpus.prepare_run("cranfield", corpus.DEFAULT_ARM, 0, args)
    write_jsonl(
        run / "corpus" / "shard-00000.jsonl",
        [{"id": f"q{i}", "query": f"wings {i}?", "positive": f"doc {i} about wings"} for i in range(4)],
    )
    atomic_write_json(run / "corpus" / "stats.json", {"complete": True})
    seen = {}

    def mine(ds, model, **kw):
        seen["mining"] = model.max_seq_length
        return Dataset.from_dict({"anchor": ds["anchor"], "positive": ds["positive"]})

    class Trainer:
        batch_rows = [2]

        class state:
            log_history = [{"loss": 1.0}]
            global_step = 1

    def train(model, ds, dest, **kw):
        seen["trainer"] = model.max_seq_length
        return Trainer()

    monkeypatch.setattr(sentence_transformers.util, "mine_hard_negatives", mine)
    monkeypatch.setattr(corpus.harness, "train_stock_recipe", train)
    corpus.train_stock("cranfield", 0, args)
    assert seen == {"mining": 256, "trainer": 256}

    rows = [
        {"dataset": "cranfield", "arm": a, "seed": 0, "scores": {"Cranfield": 0.4}, "eval_max_length": n}
        for a, n in ((corpus.DEFAULT_ARM, 256), (corpus.STOCK_ARM, 256))
    ]
    corpus.check_eval_length(rows, "cranfield")
    rows[1]["eval_max_length"] = 128
    with pytest.raises(SystemExit, match=r"different token lengths \(256: mined/0; 128: st-stock/0\)"):
        corpus.check_eval_length(rows, "cranfield")
    # results from before the length was recorded: read from the saved model
    saved = tmp_path / "old-model"
    saved.mkdir()
    (saved / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    del rows[1]["eval_max_length"]
    rows[1]["model_dir"] = str(saved)
    with pytest.raises(SystemExit, match=r"128: st-stock/0"):
        corpus.check_eval_length(rows, "cranfield")


def test_fresh_redoes_every_planned_run_not_only_the_first(tmp_path, monkeypatch):
    """--fresh redoes each planned (arm, seed) once, though the results file, read back after every
    save, still holds the earlier figures (before, only the first planned run was redone)."""
    corpus = load_benchmark("corpus_recipe")
    (tmp_path / "data" / "cranfield").mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    old = [{"dataset": "cranfield", "arm": "st-stock", "seed": s, "scores": {"Cranfield": 0.3}} for s in (0, 1, 2)]
    (out / "results.json").write_text(json.dumps(old))
    ran = []

    def run_one(d, a, s, args, tasks, prior=None):
        ran.append((a, s, prior))
        return {"dataset": d, "arm": a, "seed": s, "scores": {"Cranfield": 0.4}, "train_s": 0, "eval_s": 0}

    monkeypatch.setattr(corpus, "run_one", run_one)
    monkeypatch.setattr(corpus, "print_table", lambda *a: None)
    # main() points NEGSYNTH_DATA_DIR at --data-dir for the stages: restored after this test
    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "data"))
    argv = ["--out", str(out), "--data-dir", str(tmp_path / "data"), "--datasets", "cranfield", "--tasks", "Cranfield"]
    assert corpus.main([*argv, "--arms", "st-stock", "--seeds", "0,1,2", "--fresh"]) == 0
    assert ran == [("st-stock", 0, None), ("st-stock", 1, None), ("st-stock", 2, None)]
    assert [r["scores"]["Cranfield"] for r in json.loads((out / "results.json").read_text())["results"]] == [0.4, 0.4, 0.4]
    ran.clear()
    assert corpus.main([*argv, "--arms", "st-stock", "--seeds", "0,1,2"]) == 0
    assert ran == []  # without --fresh, done runs are kept


def test_the_tuple_arm_takes_the_earlier_window_for_the_split():
    """The default before the stock schedule looked at 10 x 4 negatives + 4 x the most positives of
    one query; the arm's range_max is that for the fit split it runs on."""
    from types import SimpleNamespace

    mod = load_script()
    pairs = [SimpleNamespace(query=q) for q in ["a", "a", "a", "b", "c", "c"]]
    got = mod.pipeline_extra("ns-pipeline-tuple", SimpleNamespace(pairs=pairs))
    assert got == '[curriculum]\nschedule = "tuple"\n[regenerate.mining]\nrange_max = 52\n'
    assert mod.pipeline_extra("ns-pipeline", SimpleNamespace(pairs=pairs)) == ""


def test_the_stock_recipes_batches_are_counted_as_its_sampler_makes_them():
    """NO_DUPLICATES never puts a text twice in a batch and does not refill one: rows sharing an
    anchor (a query with several positives) come out in short batches, and the counts say so."""
    from datasets import Dataset

    mod = load_script()
    distinct = Dataset.from_dict({"anchor": [f"q{i}" for i in range(8)], "positive": [f"d{i}" for i in range(8)]})
    assert mod.stock_batch_sizes(distinct, 4, 5, seed=0) == [4, 4, 4, 4, 4]  # 8 distinct rows: whole batches, a second pass
    shared = Dataset.from_dict({"anchor": ["q0"] * 4 + ["q1"] * 4, "positive": [f"d{i}" for i in range(8)]})
    # two queries: at most two rows a batch, and the trainer takes ceil(8 / 4) = 2 batches an epoch,
    # so each epoch trains 4 of the 8 rows: 12 rows in 6 steps instead of 24
    assert mod.stock_batch_sizes(shared, 4, 6, seed=0) == [2, 2, 2, 2, 2, 2]


def test_dev_only_stops_before_the_test_split_and_a_later_run_adds_it(tmp_path, monkeypatch):
    """Choose on dev first: --dev-only trains and scores every arm on dev and leaves the test split
    alone; the same command without it reuses those runs and adds the test split for the arms the
    table reports."""
    mod = load_script()
    root = _beir(tmp_path / "data" / "mydomain", "project")
    trained, tested = [], []

    def run_arm(arm, seed, src, args):
        trained.append((arm, seed))
        return {"arm": arm, "seed": seed, "scores": {args.dev_name: 0.5}, "seconds": 0, "split": args.split_id}

    def run_test(r, args):
        tested.append((r["arm"], r["seed"]))
        return {**r, "scores": {**r["scores"], args.test_name: 0.4}}

    monkeypatch.setattr(mod, "run_arm", run_arm)
    monkeypatch.setattr(mod, "run_test", run_test)
    for quiet in ("print_table", "print_flow", "check_same_input"):
        monkeypatch.setattr(mod, quiet, lambda *a, **k: None)
    monkeypatch.setattr(mod, "data_flow", lambda *a, **k: {})
    argv = ["--dataset", str(root), "--out", str(tmp_path / "out"), "--arms", "base,st-mined-4", "--eval-tasks", "none"]
    assert mod.main([*argv, "--dev-only"]) == 0
    assert trained == [("base", 0), ("st-mined-4", 0)] and tested == []
    assert mod.main(argv) == 0
    assert trained == [("base", 0), ("st-mined-4", 0)] and sorted(tested) == [("base", 0), ("st-mined-4", 0)]


def test_the_default_arm_must_train_the_stock_recipes_rows_tuple_for_tuple(tmp_path, monkeypatch, capsys):
    """The digest ignores row order and sees one changed negative; the benchmark refuses a table
    whose default arm trains other rows than the stock recipe (a drift in selection), and says so
    when they match."""
    import pytest
    from datasets import Dataset

    mod = load_script()
    rows = {"anchor": ["q1", "q2"], "positive": ["p1", "p2"], **{f"negative_{i}": [f"n{i}a", f"n{i}b"] for i in range(1, 5)}}
    stock = Dataset.from_dict(rows)
    shuffled = Dataset.from_dict({k: v[::-1] for k, v in rows.items()})
    assert mod.rows_digest(stock) == mod.rows_digest(shuffled.add_column("phase", [1, 1]))
    cur = tmp_path / "out" / mod.DEFAULT_ARM / "seed0" / "run" / "curriculum"
    shuffled.save_to_disk(str(cur / "dataset"))
    monkeypatch.setattr(mod, "stock_rows", lambda src, arm, args: stock)
    args = argparse.Namespace(out=tmp_path / "out")
    mod.check_same_rows([mod.STOCK_ARM, mod.DEFAULT_ARM], 0, None, args)
    assert "ns-pipeline trains the stock recipe's 2 rows, tuple for tuple" in capsys.readouterr().out
    mod.check_same_rows([mod.STOCK_ARM], 0, None, args)  # nothing to compare: no check
    other = Dataset.from_dict({**rows, "negative_4": ["n4a", "other"]})
    monkeypatch.setattr(mod, "stock_rows", lambda src, arm, args: other)
    assert mod.rows_digest(other) != mod.rows_digest(stock)
    with pytest.raises(SystemExit, match="ns-pipeline does not train the stock recipe's rows"):
        mod.check_same_rows([mod.STOCK_ARM, mod.DEFAULT_ARM], 0, None, args)
