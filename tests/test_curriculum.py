"""Curriculum dataset builder: phase order, schedules, determinism, batch hygiene, saving."""

from __future__ import annotations

from collections import Counter

import pytest

from negsynth.data.curriculum import (
    CurriculumError,
    build_curriculum,
    load_curriculum,
    save_curriculum,
)
from negsynth.data.text import text_key

TASK_TYPES = ("short-long", "long-short", "sts")


def make_examples(n: int, *, task_types=TASK_TYPES, n_negs: int = 4) -> list[dict]:
    """Distinct texts everywhere; the negative of level L of example i is ``neg L of i``."""
    return [
        {
            "id": f"ex{i}",
            "task": f"Task {i % 7}",
            "task_type": task_types[i % len(task_types)],
            "query": f"query {i}",
            "positive": f"positive {i}",
            "negatives": [f"neg {lvl} of {i}" for lvl in range(1, n_negs + 1)],
            "source": "synthetic" if i % 2 else "public",
        }
        for i in range(n)
    ]


def batches(rows, bs):
    """The rows grouped by their ``batch`` number: consecutive, numbered 0.., none larger than
    ``bs``, phase-pure; in each phase every full batch comes before its short (last) ones."""
    out: list[list[dict]] = []
    for r in rows:
        if out and out[-1][0]["batch"] == r["batch"]:
            out[-1].append(r)
        else:
            assert r["batch"] == len(out), "batches must come numbered in order"
            out.append([r])
    for b in out:
        assert len(b) <= bs and len({r["phase"] for r in b}) == 1
    for b, nxt in zip(out, out[1:]):
        if len(b) < bs and nxt[0]["phase"] == b[0]["phase"]:
            assert len(nxt) < bs, "a full batch after a short one of the same phase"
    return out


def test_curriculum_phase_order_levels_and_quarter_split():
    rows = build_curriculum(make_examples(400), batch_size=8, total_steps=40, seed=1, homogeneous_batches=False)
    assert len(rows) == 40 * 8
    phases = [r["phase"] for r in rows]
    assert phases == sorted(phases), "phases must come in order 1,2,3,4"
    per_phase = Counter(phases)
    assert per_phase == {1: 80, 2: 80, 3: 80, 4: 80}  # 25% of the steps each
    assert {r["phase"]: r["level"] for r in rows} == {1: 4, 2: 3, 3: 2, 4: 1}  # easy -> hard
    for r in rows:  # the negative is the example's negative at that level
        i = r["example_id"][2:]
        assert r["negative"] == f"neg {r['level']} of {i}"
    # each example visited at most once (400 examples, 320 rows) -> disjoint phase groups
    assert len({r["example_id"] for r in rows}) == len(rows)


def test_uneven_total_steps_gives_remainder_to_last_phase():
    rows = build_curriculum(make_examples(200), batch_size=4, total_steps=10, homogeneous_batches=False)
    assert Counter(r["phase"] for r in rows) == {1: 8, 2: 8, 3: 8, 4: 16}  # 10 // 4 = 2 steps, last gets 4


def test_epochs_one_uses_every_example_once_in_four_groups():
    ex = make_examples(64)
    rows = build_curriculum(ex, batch_size=4, seed=3, homogeneous_batches=False)  # default epochs=1
    assert len(rows) == 64 and rows.stats["examples_used"] == 64
    assert sorted(r["example_id"] for r in rows) == sorted(e["id"] for e in ex)
    assert Counter(r["phase"] for r in rows) == {1: 16, 2: 16, 3: 16, 4: 16}


@pytest.mark.parametrize("schedule", ["reverse", "random", "fixed:2", "fixed:5"])
def test_a_schedule_not_offered_is_refused(schedule):
    with pytest.raises(CurriculumError, match="is not one of curriculum, tuple, tuple:K, stock"):
        build_curriculum(make_examples(20), schedule=schedule, batch_size=5)


def test_shuffle_is_seed_deterministic_and_seed_sensitive():
    ex = make_examples(120)
    a = build_curriculum(ex, batch_size=6, seed=7)
    b = build_curriculum(ex, batch_size=6, seed=7)
    c = build_curriculum(ex, batch_size=6, seed=8)
    assert list(a) == list(b)
    assert [r["example_id"] for r in a] != [r["example_id"] for r in c]
    ids = [int(r["example_id"][2:]) for r in a if r["phase"] == 1]
    assert ids != sorted(ids), "rows within a phase must be shuffled"


def test_few_negatives_skipped_unless_a_tuple_of_as_many_exists():
    ex = make_examples(40)
    short = [
        dict(e, id=f"short{i}", query=f"sq {i}", positive=f"sp {i}", negatives=[f"sn1 {i}", f"sn2 {i}"])
        for i, e in enumerate(make_examples(20))
    ]
    rows = build_curriculum(ex + short, batch_size=4, homogeneous_batches=False)
    assert rows.stats["skipped_few_negatives"] == 20
    assert not any(r["example_id"].startswith("short") for r in rows)
    rows2 = build_curriculum(ex + short, schedule="tuple:2", batch_size=4, homogeneous_batches=False)
    assert rows2.stats["skipped_few_negatives"] == 0
    assert any(r["example_id"].startswith("short") for r in rows2)


def test_no_duplicate_text_in_a_batch_with_adversarial_duplicates():
    ex = make_examples(60, task_types=("sts",))
    # adversarial: many examples share a positive, one's negative is another's query,
    # one differs only by case/whitespace, one repeats its own positive as a negative
    for i in range(0, 60, 3):
        ex[i]["positive"] = "The SAME positive"
    ex[1]["negatives"] = ["query 2"] * 4
    ex[4]["query"] = "  the same   POSITIVE "
    ex[5]["negatives"] = ["positive 5"] * 4
    rows = build_curriculum(ex, batch_size=4, seed=0, homogeneous_batches=False)  # epochs=1: all visited
    for batch in batches(rows, 4):
        keys = []
        for r in batch:
            query = r["anchor"].split("\nQuery: ", 1)[1]
            keys += [text_key(query), text_key(r["positive"]), text_key(r["negative"])]
        assert len(keys) == len(set(keys)), batch
        assert len({r["phase"] for r in batch}) == 1
    assert rows.stats["moved_to_later_batch"] > 0
    assert rows.stats["dropped_self_duplicate"] >= 1  # ex5: negative == positive
    assert all(r["example_id"] != "ex5" for r in rows)


def test_impossible_batch_raises_clear_error():
    ex = make_examples(10)
    for e in ex:
        e["positive"] = "one positive for all"
    with pytest.raises(CurriculumError, match="distinct texts"):
        build_curriculum(ex, batch_size=2, total_steps=4, homogeneous_batches=False)


def test_homogeneous_batches_hold_one_task_type():
    ex = make_examples(300)
    rows = build_curriculum(ex, batch_size=8, total_steps=12, homogeneous_batches=True)
    bs = batches(rows, 8)
    assert len(bs) == 12
    assert all(len({r["task_type"] for r in b}) == 1 for b in bs)
    assert len({b[0]["task_type"] for b in bs}) > 1
    mixed = build_curriculum(ex, batch_size=8, total_steps=12, homogeneous_batches=False)
    assert any(len({r["task_type"] for r in b}) > 1 for b in batches(mixed, 8))


def test_instruction_template_and_bad_record():
    rows = build_curriculum(make_examples(8), batch_size=2, homogeneous_batches=False)
    r = rows[0]
    assert r["anchor"].startswith("Instruct: Task ") and "\nQuery: query " in r["anchor"]
    bare = build_curriculum(make_examples(8), batch_size=2, homogeneous_batches=False, instruction_template=None)
    assert bare[0]["anchor"].startswith("query ")
    bad = make_examples(3)
    del bad[1]["positive"]
    with pytest.raises(CurriculumError, match=r"example #1 \(id='ex1'\) field 'positive'"):
        build_curriculum(bad, batch_size=1)


def test_use_mined_takes_mined_negatives():
    ex = make_examples(16)
    for e in ex[:12]:
        e["mined_negatives"] = [f"mined {k} {e['id']}" for k in range(4)]
    rows = build_curriculum(ex, batch_size=2, use_mined=True, schedule="tuple:1", homogeneous_batches=False)
    assert rows.stats["skipped_few_negatives"] == 4
    assert all(r["negative_1"].startswith("mined 0 ") for r in rows)


def test_save_and_reload_same_rows_same_order(tmp_path):
    rows = build_curriculum(make_examples(90), batch_size=4, seed=2)
    out = save_curriculum(rows, tmp_path / "cur")
    ds = load_curriculum(out)
    assert ds.to_list() == [{k: r[k] for k in ds.column_names} for r in rows]
    import json

    import polars as pl

    assert pl.read_parquet(out / "train.parquet")["example_id"].to_list() == [r["example_id"] for r in rows]
    card = json.loads((out / "card.json").read_text())
    assert card["rows"] == len(rows) and card["build"]["schedule"] == "curriculum"
    assert sum(card["per_phase"].values()) == len(rows)
    assert "| phase | rows |" in (out / "card.md").read_text()
    # overwrite atomically: the second save replaces the first, no temp dirs left behind
    save_curriculum(rows[:8], out)
    assert len(load_curriculum(out)) == 8
    assert [p.name for p in tmp_path.iterdir()] == ["cur"]


def test_tuple_rows_carry_every_negative_hardest_first_without_duplicates():
    ex = make_examples(61, task_types=("sts",))
    ex[3]["negatives"][2] = "positive 3"  # a row whose own texts repeat cannot be placed
    ex[7]["negatives"] = ["neg 1 of 7"]  # too few for a 4-tuple
    for i in range(10, 20):  # shared texts across examples: rows must move, never share a batch
        ex[i]["negatives"][3] = "the shared easy negative"
    rows = build_curriculum(ex, schedule="tuple", batch_size=4, seed=0, homogeneous_batches=False)
    assert rows.stats["schedule"] == "tuple" and rows.stats["levels"] == [0]
    assert rows.stats["dropped_self_duplicate"] == 1 and rows.stats["skipped_few_negatives"] == 1
    assert rows.stats["moved_to_later_batch"] > 0
    for r in rows:
        i = r["example_id"][2:]
        assert "negative" not in r and r["level"] == 0 and r["phase"] == 1
        negs = [r[f"negative_{k}"] for k in range(1, 5)]
        assert negs[:3] == [f"neg {lvl} of {i}" for lvl in (1, 2, 3)]  # the example's order: hardest first
    for batch in batches(rows, 4):
        keys = [text_key(r[c]) for r in batch for c in ("positive", "negative_1", "negative_2", "negative_3", "negative_4")]
        assert len(keys) == len(set(keys)), batch
    assert len({r["example_id"] for r in rows}) == len(rows)  # one pass: each example at most once
    # the order is the seed's: another seed, another order, the same examples' rows
    other = build_curriculum(ex, schedule="tuple", batch_size=4, seed=1, homogeneous_batches=False)
    assert [r["example_id"] for r in other] != [r["example_id"] for r in rows]
    two = build_curriculum(ex, schedule="tuple:2", batch_size=4, seed=0, homogeneous_batches=False)
    assert two.stats["schedule"] == "tuple:2" and "negative_3" not in two[0] and two.stats["skipped_few_negatives"] == 1
    with pytest.raises(CurriculumError, match="tuple:K"):
        build_curriculum(ex, schedule="tuple:0", batch_size=4)


def test_tuple_rows_save_reload_and_train_columns(tmp_path):
    from negsynth.data.stock import text_columns

    rows = build_curriculum(make_examples(40), schedule="tuple", batch_size=4, seed=0, homogeneous_batches=False)
    out = save_curriculum(rows, tmp_path / "cur")
    ds = load_curriculum(out)
    assert ds.column_names[:6] == ["anchor", "positive", "negative_1", "negative_2", "negative_3", "negative_4"]
    assert ds.to_list() == [{k: r[k] for k in ds.column_names} for r in rows]
    assert text_columns(ds.column_names) == ["anchor", "positive", "negative_1", "negative_2", "negative_3", "negative_4"]
    import json

    assert json.loads((out / "card.json").read_text())["per_level"] == {"0": len(rows)}


def test_a_phases_leftover_rows_train_in_short_batches_not_dropped():
    """Homogeneous batches over 3 task types leave each phase with rows that fill no whole batch:
    they train as short batches (every example once), packed across task types with no text twice."""
    ex = make_examples(103, task_types=("short-long", "long-short", "sts"))
    kept = build_curriculum(ex, batch_size=8, seed=3)
    assert len(kept) == 103 and sorted(r["example_id"] for r in kept) == sorted(e["id"] for e in ex)
    assert kept.stats["dropped_incomplete"] == 0 and kept.stats["short_batches"] >= 1
    assert kept.stats["rows_in_short_batches"] == sum(len(b) for b in batches(kept, 8) if len(b) < 8)
    for b in batches(kept, 8):
        texts = [text_key(r[c]) for r in b for c in ("anchor", "positive", "negative")]
        assert len(texts) == len(set(texts))


def test_total_steps_fill_whole_batches_so_nothing_is_short():
    rows = build_curriculum(make_examples(90), batch_size=8, total_steps=12, seed=0)
    assert len(rows) == 12 * 8 and rows.stats["short_batches"] == 0


def test_the_trainers_sampler_trains_exactly_the_curriculums_batches():
    """The sampler follows the ``batch`` column, so a short batch is trained as planned, not
    merged with the next leftover (which packing by phase alone could do)."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("sentence_transformers")
    from negsynth.train.sampler import CurriculumBatchSampler, batch_segments

    rows = build_curriculum(make_examples(103, task_types=("short-long", "long-short", "sts")), batch_size=8, seed=3)
    ds = datasets.Dataset.from_list([dict(r) for r in rows])
    planned = CurriculumBatchSampler(
        ds.select_columns(["anchor", "positive", "negative"]), batch_size=8, phases=batch_segments(ds), num_replicas=1
    )
    assert [[rows[i]["batch"] for i in b] for b in planned] == [[n] * len(b) for n, b in enumerate(batches(rows, 8))]
    assert batch_segments({"phase": [1, 1, 2]}) == [1, 1, 2] and batch_segments({"batch": [-1, -1], "phase": [1, 2]}) == [1, 2]
    assert batch_segments({"anchor": ["a"]}) is None


def with_teacher(examples: list[dict]) -> list[dict]:
    """Each example with the teacher's scores [positive, neg 1..4] as the corpus stage writes them
    (``meta["teacher_label"]``), distinct per example and per negative."""
    for i, e in enumerate(examples):
        e["meta"] = {"teacher_label": [1.9 - i / 1000, *(1.5 - lvl / 10 - i / 1000 for lvl in range(1, len(e["negatives"]) + 1))]}
    return examples


def score_record(**kw) -> dict:
    base = {"embedder": "fake", "cos_pos": 0.9, "cos_neg": [0.8, 0.7, 0.6, 0.5], "kendall_tau": 1.0, "monotonic": True}
    return {**base, "false_negative": [False] * 4, "too_easy": [False] * 4, **kw}


def want_label(i: int, levels) -> list[float]:
    return [1.9 - i / 1000, *(1.5 - lvl / 10 - i / 1000 for lvl in levels)]


def test_tuple_rows_carry_the_teachers_scores_in_the_order_of_their_texts(tmp_path):
    """With teacher scores on every example, each n-tuple row's ``label`` is [positive, negative_1..K]
    for its own texts (sentence-transformers' distillation layout), saved after the texts; graded
    rows get [positive, negative]; score's reorder (``llm_order``) is followed."""
    from pytest import approx

    ex = with_teacher(make_examples(24))
    rows = build_curriculum(ex, schedule="tuple", batch_size=4, seed=0, homogeneous_batches=False)
    assert rows.stats["label"] is True and rows.stats["teacher_labels"] == 24
    for r in rows:
        i = int(r["example_id"][2:])
        assert r["label"] == approx(want_label(i, (1, 2, 3, 4)))
    two = build_curriculum(ex, schedule="tuple:2", batch_size=4, seed=0, homogeneous_batches=False)
    assert all(r["label"] == approx(want_label(int(r["example_id"][2:]), (1, 2))) for r in two)
    graded = build_curriculum(ex, schedule="curriculum", batch_size=2, seed=0, homogeneous_batches=False)
    assert all(r["label"] == approx(want_label(int(r["example_id"][2:]), (r["level"],))) for r in graded)
    # score reordered the negatives (hardest by its own measure first): the scores follow their texts
    ex[5]["negatives"] = ex[5]["negatives"][::-1]
    ex[5]["score"] = score_record(policy="reorder", llm_order=[3, 2, 1, 0])
    rows = build_curriculum(ex, schedule="tuple", batch_size=4, seed=0, homogeneous_batches=False)
    (r5,) = [r for r in rows if r["example_id"] == "ex5"]
    assert r5["negative_1"] == "neg 4 of 5" and r5["label"] == approx(want_label(5, (4, 3, 2, 1)))
    out = save_curriculum(rows, tmp_path / "cur", stats=rows.stats)
    ds = load_curriculum(out)
    assert ds.column_names[:7] == ["anchor", "positive", "negative_1", "negative_2", "negative_3", "negative_4", "label"]
    assert ds["label"] == [approx(r["label"]) for r in rows]


def test_no_label_column_unless_every_example_has_teacher_scores():
    """An example with no teacher scores (an older run dir, whose ``teacher_scores`` are RRF ranks,
    or use_mined) leaves the label out of every row: a column has no gaps."""
    ex = with_teacher(make_examples(24))
    ex[3]["meta"] = {"teacher_scores": [0.03, 0.02, 0.01, 0.01], "teacher_pos_score": 0.033}  # an older corpus run: RRF only
    rows = build_curriculum(ex, schedule="tuple", batch_size=4, seed=0, homogeneous_batches=False)
    assert "label" not in rows[0] and rows.stats["label"] is False and rows.stats["teacher_labels"] == 23
    ex = with_teacher(make_examples(24))
    for e in ex:
        e["mined_negatives"] = [f"mined {k} {e['id']}" for k in range(4)]
    rows = build_curriculum(ex, schedule="tuple", batch_size=4, seed=0, use_mined=True, homogeneous_batches=False)
    assert "label" not in rows[0]
    plain = build_curriculum(make_examples(24), schedule="tuple", batch_size=4, seed=0, homogeneous_batches=False)
    assert "label" not in plain[0] and plain.stats["teacher_labels"] == 0


def test_ntuple_rows_carry_the_teachers_scores_and_drop_a_false_negatives_score_with_it():
    from pytest import approx

    from negsynth.data.stock import ntuple_rows

    ex = with_teacher(make_examples(6))
    ex[2]["score"] = score_record(false_negative=[True, False, False, False])
    rows = ntuple_rows(ex, 3, instruction_template=None, drop_false_negatives=True)
    assert rows[0]["label"] == approx(want_label(0, (1, 2, 3)))
    assert rows[2]["negative_1"] == "neg 2 of 2" and rows[2]["label"] == approx(want_label(2, (2, 3, 4)))
    assert "label" not in ntuple_rows(make_examples(6), 3)[0]


def test_the_stock_schedule_writes_each_example_once_in_input_order_with_every_negative():
    """``stock``: the n-tuple rows in input order, once, nothing packed or moved (the trainer's
    shuffled sampler makes the batches), ``total_steps`` kept as the trainer's step count; the
    epochs a pass-drawing schedule takes are refused in one line."""
    from negsynth.data.stock import stock_curriculum

    ex = make_examples(10)
    rows = stock_curriculum(ex, batch_size=4, total_steps=7, instruction_template=None)
    assert [r["example_id"] for r in rows] == [e["id"] for e in ex]
    assert [r["negative_4"] for r in rows] == [f"neg 4 of {i}" for i in range(10)] and {r["phase"] for r in rows} == {1}
    assert rows.stats["total_steps"] == 7 and rows.stats["batches_planned"] is False and rows.stats["rows"] == 10
    assert {r["batch"] for r in rows} == {-1}  # not built as batches
    assert stock_curriculum(ex, batch_size=4, seed=5, instruction_template=None) == stock_curriculum(
        ex, batch_size=4, seed=1, instruction_template=None
    )  # no draw: the seed is the trainer's
    with pytest.raises(CurriculumError, match="schedule 'stock' writes the rows once"):
        stock_curriculum(ex, batch_size=4, epochs=2, instruction_template=None)
    with pytest.raises(CurriculumError, match="build it with negsynth.data.stock.stock_curriculum"):
        build_curriculum(ex, schedule="stock", batch_size=4, instruction_template=None)


def test_auto_takes_the_stock_schedule_for_labelled_pairs_and_the_corpus_stages_queries():
    """``auto``: labelled pairs whose 4 hardest negatives regenerate mined, and the corpus stage's
    queries (mined again the library's way) -> ``stock``; corpus negatives the stock recipe cannot
    remake (hybrid candidates, a teacher's scores) and graded mining -> ``tuple``; LLM-written
    negatives -> ``curriculum``."""
    from negsynth.schemas.config import CurriculumConfig
    from negsynth.stages.curriculum import resolve_schedule

    cc = CurriculumConfig()
    labelled = [{"model": "mined:default:top"}] * 3
    corpus = [{"model": "mined:default:corpus", "meta": {"corpus": "docs"}}] * 3
    taught = [{"model": "mined:default:corpus", "meta": {"corpus": "docs", "teacher_label": [1.0, 0.5, 0.4, 0.3, 0.2]}}]
    assert resolve_schedule(cc, labelled) == "stock"
    assert resolve_schedule(cc, corpus) == "stock" and resolve_schedule(cc, labelled + corpus) == "stock"
    assert resolve_schedule(cc, corpus, "hybrid") == "tuple" and resolve_schedule(cc, corpus + taught) == "tuple"
    assert resolve_schedule(CurriculumConfig(schedule="tuple"), corpus) == "tuple"  # negsynth's own path
    assert resolve_schedule(cc, [{"model": "smollm2"}]) == "curriculum"
    assert resolve_schedule(cc, [{"model": "mined:default:graded"}] * 2) == "tuple"  # one per rank band: not the stock rows
    assert resolve_schedule(CurriculumConfig(schedule="tuple"), labelled) == "tuple"
    assert resolve_schedule(CurriculumConfig(negatives="mined"), labelled) == "tuple"
