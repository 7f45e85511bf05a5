"""score: cosines, tau, flags, policies, dedupe, resume and the CLI — with a fake embedder.

The fake maps hand-set texts to 2-D unit vectors at chosen angles from the query, so every
cosine is known in advance; other texts get a hashed bag-of-words vector.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from helpers import RecordingEmbedder
from scipy.stats import kendalltau

from negsynth.data.shards import read_stage, write_jsonl
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.progress import Reporter
from negsynth.schemas.config import RunConfig, ScoreConfig
from negsynth.schemas.records import Example, ExampleScore, Reject
from negsynth.stages import get, run_stage
from negsynth.stages import score as S

SCORE = get("score")


def with_embedder(ctx: StageContext, embedder, judge=None) -> StageContext:
    """``ctx`` holding a fake embedder (and judge) instead of loading the configured ones."""
    return replace(ctx, embedder=embedder, judge=judge)


def run_score(ctx: StageContext, embedder, judge=None) -> dict:
    return run_stage(SCORE, with_embedder(ctx, embedder, judge))


def unit(cos: float) -> np.ndarray:
    """A 3-D unit vector whose cosine with the query (1, 0, 0) is ``cos``."""
    return np.array([cos, math.sqrt(max(0.0, 1 - cos * cos)), 0.0])


class FakeEmbedder(RecordingEmbedder):
    """Hand-set vectors (text -> cosine with the query 'Q*') plus hashed bag-of-words; counts every text encoded."""

    name = "fake:hand"

    def __init__(self, cosines: dict[str, float] | None = None):
        super().__init__(3)
        self.table = {t: unit(c) for t, c in (cosines or {}).items()}

    def vectors(self, texts):
        out = []
        for t in texts:
            if t.startswith("Q"):
                out.append(np.array([1.0, 0.0, 0.0]))
            elif t in self.table:
                out.append(self.table[t])
            else:
                v = np.zeros(3)
                for w in t.split():
                    v[hash(w) % 3] += 1.0
                out.append(v + 1e-3)
        return np.stack(out)


# the hand-made example: claimed order n1 > n2 > n3 > n4, measured n2 > n1 > n3 > n4
HAND = {"pos": 0.9, "n1": 0.8, "n2": 0.86, "n3": 0.5, "n4": 0.05}


def example(i: int = 0, *, tt: str = "short-long", q: str = "Q", negs=("n1", "n2", "n3", "n4"), pos: str = "pos") -> dict:
    return Example(id=f"ex-{i}", task="find it", task_type=tt, query=q, positive=pos, negatives=list(negs)).model_dump(
        mode="json", exclude={"score"}
    )


@pytest.fixture(autouse=True)
def _no_eval_data(tmp_path, monkeypatch):
    # decontamination (tests/test_clean.py) would compare the fake 3-D vectors with the shared eval sets
    monkeypatch.setenv("NEGSYNTH_DATA_DIR", str(tmp_path / "no-eval-data"))


def make_ctx(tmp_path, **score_kw) -> StageContext:
    cfg = RunConfig()
    # these fixtures repeat one (query, positive) on purpose; near-duplicate removal is tested in test_clean.py
    # and check the LLM's own order, so they pin the policy that keeps it (measured is tested in test_quality.py)
    cfg.score = ScoreConfig(**{"dedup": False, "policy": "annotate", **score_kw})
    return StageContext(cfg=cfg, run_dir=tmp_path, reporter=Reporter(quiet=True))


def write_generate(tmp_path, shards: list[list[dict]], stage: str = "generate") -> None:
    for k, rows in enumerate(shards):
        write_jsonl(tmp_path / stage / f"shard-{k:05d}.jsonl", rows)


# ---------------------------------------------------------------- measurement


def test_hand_made_example_cosines_tau_and_flags(tmp_path):
    write_generate(tmp_path, [[example()]])
    stats = run_score(make_ctx(tmp_path), FakeEmbedder(HAND))
    (rec,) = list(read_stage(tmp_path / "score"))
    sc = ExampleScore.model_validate(rec["score"])  # the record matches the schema
    assert sc.cos_pos == pytest.approx(0.9, abs=1e-6)
    assert sc.cos_neg == pytest.approx([0.8, 0.86, 0.5, 0.05], abs=1e-6)
    # 6 pairs, only (n1, n2) discordant: tau = (5 - 1) / 6
    assert sc.kendall_tau == pytest.approx(4 / 6, abs=1e-6)
    assert sc.kendall_tau == pytest.approx(kendalltau([4, 3, 2, 1], sc.cos_neg).statistic, abs=1e-6)
    assert sc.monotonic is False
    assert sc.false_negative == [False, True, False, False]  # 0.86 >= 0.95 * 0.9 = 0.855
    assert sc.too_easy == [False, False, False, True]  # 0.05 < 0.1
    assert sc.llm_order is None and rec["negatives"] == ["n1", "n2", "n3", "n4"]
    assert stats["levels"][1]["mean"] == pytest.approx(0.86, abs=1e-4)
    assert stats["levels"][1]["false_negative_rate"] == 1.0 and stats["levels"][0]["false_negative_rate"] == 0.0
    assert stats["monotonic_pct"] == 0.0 and stats["levels_decreasing"] is False
    Example.model_validate(rec)


def test_monotonic_and_perfect_tau():
    m = S.measure(np.array([0.9]), np.array([[0.8, 0.7, 0.6, 0.5]]), ScoreConfig())
    assert m["monotonic"].tolist() == [True] and m["kendall_tau"].tolist() == [1.0]
    m = S.measure(np.array([0.9]), np.array([[0.5, 0.6, 0.7, 0.8]]), ScoreConfig())
    assert m["monotonic"].tolist() == [False] and m["kendall_tau"].tolist() == [-1.0]
    # a tie is not strictly decreasing
    m = S.measure(np.array([0.9]), np.array([[0.8, 0.8, 0.6, 0.5]]), ScoreConfig())
    assert m["monotonic"].tolist() == [False]


def test_tau_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, size=(300, 4)).astype(float) / 3  # many ties
    x = np.vstack([x, rng.random((300, 4))])
    ours = S.kendall_tau_claimed(x)
    for row, t in zip(x, ours, strict=True):
        ref = kendalltau([4, 3, 2, 1], row).statistic
        if np.isnan(ref):
            assert np.isnan(t)
        else:
            assert t == pytest.approx(ref, abs=1e-12)
    assert np.isnan(S.kendall_tau_claimed(np.array([[0.3, 0.3, 0.3, 0.3]]))[0])


def test_fn_threshold_exactly_at_ratio_is_flagged():
    cfg = ScoreConfig(fn_ratio=0.5, too_easy_floor=None)
    m = S.measure(np.array([0.5]), np.array([[0.25, 0.249999, 0.5, 0.7]]), cfg)
    assert m["false_negative"].tolist() == [[True, False, True, True]]
    assert m["too_easy"].tolist() == [[False, False, False, False]]


def test_fn_threshold_with_negative_cos_pos_keeps_margin_below_positive():
    # cos_pos = -0.2: naive 0.5 * -0.2 = -0.1 would NOT flag -0.15, which is more similar than the positive
    cfg = ScoreConfig(fn_ratio=0.5)
    assert S.fn_threshold(-0.2, 0.5) == pytest.approx(-0.3)
    m = S.measure(np.array([-0.2]), np.array([[-0.15, -0.3, -0.31, 0.4]]), cfg)
    assert m["false_negative"].tolist() == [[True, True, False, True]]


def test_too_easy_floor_is_strict():
    m = S.measure(np.array([0.9]), np.array([[0.1, 0.099999, 0.5, -0.2]]), ScoreConfig(too_easy_floor=0.1))
    assert m["too_easy"].tolist() == [[False, True, False, True]]


def test_score_stats_and_inspect_share_one_definition(tmp_path):
    """score's stats.json and ``negsynth inspect`` compute the per-level statistics with the same
    function, so they agree key for key — also after ``reorder`` moved the negatives."""
    from negsynth.inspect import inspect_path

    rows = [example(0), example(1, tt="sts", negs=("n2", "n1", "n4", "n3")), example(2, q="Q2")]
    write_generate(tmp_path, [rows[:2], rows[2:]])
    stats = run_score(make_ctx(tmp_path, policy="reorder"), FakeEmbedder({**HAND, "Q2": 0.0}))
    seen = inspect_path(tmp_path)["score"]
    for key in (
        "examples",
        "cos_pos",
        "levels",
        "levels_decreasing",
        "monotonic_pct",
        "kendall_tau_mean",
        "false_negative_rate",
        "by_task_type",
        "false_negative_rate_by_task_type",
    ):
        assert seen[key] == stats[key], key
    assert [lv["n"] for lv in stats["levels"]] == [3, 3, 3, 3] and stats["by_task_type"]["sts"]["examples"] == 1


# ---------------------------------------------------------------- policies


def test_reorder_sorts_by_measured_similarity_and_keeps_llm_order(tmp_path):
    write_generate(tmp_path, [[example()]])
    stats = run_score(make_ctx(tmp_path, policy="reorder"), FakeEmbedder(HAND))
    (rec,) = list(read_stage(tmp_path / "score"))
    assert rec["negatives"] == ["n2", "n1", "n3", "n4"]
    assert rec["score"]["llm_order"] == [1, 0, 2, 3]
    assert rec["score"]["cos_neg"] == pytest.approx([0.86, 0.8, 0.5, 0.05], abs=1e-6)
    assert rec["score"]["false_negative"] == [True, False, False, False]  # flags follow their negative
    assert rec["score"]["monotonic"] is False  # judges the LLM's order, not the fixed one
    assert stats["reordered"] == 1
    # per-level statistics stay on the LLM's levels
    assert stats["levels"][0]["mean"] == pytest.approx(0.8, abs=1e-4)


def test_filter_drops_flagged_and_rejects_short_examples(tmp_path):
    good = example(1, negs=("g1", "g2", "g3", "g4"))
    cos = {**HAND, "g1": 0.7, "g2": 0.6, "g3": 0.5, "g4": 0.4}
    write_generate(tmp_path, [[example(0), good]])
    stats = run_score(make_ctx(tmp_path, policy="filter", min_negatives=4), FakeEmbedder(cos))
    kept = list(read_stage(tmp_path / "score"))
    assert [r["id"] for r in kept] == ["ex-1"] and kept[0]["score"]["llm_order"] == [0, 1, 2, 3]
    (rej,) = list(read_stage(tmp_path / "score" / "rejects"))
    Reject.model_validate(rej)
    assert rej["reason"] == "false_negative+too_easy"
    assert "2 of 4 negatives kept" in rej["detail"]
    assert rej["input"]["negatives"] == ["n1", "n3"] and rej["input"]["score"]["llm_order"] == [0, 2]
    assert stats["rejected"] == 1 and stats["kept"] == 1 and stats["negatives_dropped"] == 2
    assert stats["rejects_by_reason"] == {"false_negative+too_easy": 1}
    assert stats["examples"] == 2  # stats cover every scored example


def test_filter_with_lower_min_keeps_the_survivors(tmp_path):
    write_generate(tmp_path, [[example(0)]])
    run_score(make_ctx(tmp_path, policy="filter", min_negatives=2, filter_flags=["false_negative"]), FakeEmbedder(HAND))
    (rec,) = list(read_stage(tmp_path / "score"))
    assert rec["negatives"] == ["n1", "n3", "n4"]
    assert rec["score"]["too_easy"] == [False, False, True]  # not in filter_flags: kept, still flagged
    assert rec["score"]["llm_order"] == [0, 2, 3]


def test_annotate_changes_nothing_but_score(tmp_path):
    rows = [example(0), example(1, tt="sts")]
    write_generate(tmp_path, [rows])
    run_score(make_ctx(tmp_path), FakeEmbedder(HAND))
    out = list(read_stage(tmp_path / "score"))
    assert [{k: v for k, v in r.items() if k != "score"} for r in out] == rows


# ---------------------------------------------------------------- embedding, inputs, resume


def test_each_distinct_text_embedded_once(tmp_path):
    # 3 examples share the query, positive and two negatives
    rows = [example(0), example(1, negs=("n1", "n2", "x1", "x2")), example(2, negs=("n1", "n2", "n3", "n4"))]
    write_generate(tmp_path, [rows[:2], rows[2:]])
    emb = FakeEmbedder(HAND)
    stats = run_score(make_ctx(tmp_path), emb)
    assert sorted(emb.seen) == sorted({"Q", "pos", "n1", "n2", "n3", "n4", "x1", "x2"})
    assert stats["throughput"]["texts"] == 18 and stats["throughput"]["unique_texts"] == 8
    # the texts reached the embedder longest first
    assert [len(t) for t in emb.seen] == sorted((len(t) for t in emb.seen), reverse=True)


def test_instructed_queries_are_a_separate_pool(tmp_path):
    class Instructed(FakeEmbedder):
        instruct_queries = True
        query_template = "Q|{instruction}|{text}"

    rows = [example(0, q="pos")]  # the query text equals the positive text
    write_generate(tmp_path, [rows])
    emb = Instructed(HAND)
    run_score(make_ctx(tmp_path), emb)
    assert "Q|find it|pos" in emb.seen and "pos" in emb.seen


def test_inputs_mirror_shards_over_stages_and_skip_absent(tmp_path):
    write_generate(tmp_path, [[example(0)], [example(1)]])
    write_generate(tmp_path, [[example(2)]], stage="regenerate")
    stats = run_score(make_ctx(tmp_path), FakeEmbedder(HAND))
    assert [(i["stage"], i["shard"], i["out"]) for i in stats["inputs"]] == [
        ("generate", "shard-00000.jsonl", "shard-00000.jsonl"),
        ("generate", "shard-00001.jsonl", "shard-00001.jsonl"),
        ("regenerate", "shard-00000.jsonl", "shard-00002.jsonl"),
    ]
    assert [r["id"] for r in read_stage(tmp_path / "score")] == ["ex-0", "ex-1", "ex-2"]


def test_no_inputs_is_one_line_error(tmp_path):
    from negsynth.errors import UserError

    # run_stage checks a stage's inputs before it runs; the stage's own check says the same
    with pytest.raises(UserError, match=r"no finished outputs in .*generate or .*regenerate or .*corpus; run `negsynth generate` first"):
        run_score(make_ctx(tmp_path), FakeEmbedder(HAND))
    with pytest.raises(UserError, match=r"no finished shards in .*generate or .*regenerate or .*corpus; run `negsynth generate` first"):
        S.run(with_embedder(make_ctx(tmp_path), FakeEmbedder(HAND)))


def test_malformed_input_names_file_and_record(tmp_path):
    from negsynth.errors import UserError

    bad = example(1)
    del bad["positive"]
    write_generate(tmp_path, [[example(0), bad]])
    with pytest.raises(UserError, match=r"shard-00000.jsonl: record 2 is not an Example \(positive: Field required\)"):
        run_score(make_ctx(tmp_path), FakeEmbedder(HAND))


def test_rerun_skips_resumes_and_refuses_changed_config(tmp_path):
    from negsynth.errors import UserError

    write_generate(tmp_path, [[example(0)], [example(1)]])
    emb = FakeEmbedder(HAND)
    first = run_score(make_ctx(tmp_path), emb)
    n = len(emb.seen)
    again = run_score(make_ctx(tmp_path), emb)
    assert len(emb.seen) == n and again["levels"] == first["levels"]  # nothing re-embedded
    # a killed run: shard 1's output missing -> only it is redone, stats cover both
    (tmp_path / "score" / "shard-00001.jsonl").unlink()
    resumed = run_score(make_ctx(tmp_path), emb)
    assert resumed["shards_scored_this_run"] == 1 and resumed["examples"] == 2
    with pytest.raises(UserError, match="--overwrite"):
        run_score(make_ctx(tmp_path, fn_ratio=0.9), emb)
    assert run_score(replace(make_ctx(tmp_path, fn_ratio=0.9), overwrite=True), emb)["fn_ratio"] == 0.9


def test_stats_per_task_type_and_json_shape(tmp_path):
    rows = [example(0), example(1, tt="sts", negs=("g1", "g2", "g3", "g4"))]
    write_generate(tmp_path, [rows])
    run_score(make_ctx(tmp_path), FakeEmbedder({**HAND, "g1": 0.7, "g2": 0.6, "g3": 0.5, "g4": 0.4}))
    stats = json.loads((tmp_path / "score" / "stats.json").read_text())
    assert stats["by_task_type"]["sts"]["monotonic_pct"] == 100.0
    assert stats["by_task_type"]["short-long"]["false_negative_rate"] == 0.25
    assert stats["by_task_type"]["sts"]["kendall_tau_mean"] == 1.0
    assert stats["kendall_tau_mean"] == pytest.approx((1 + 4 / 6) / 2, abs=1e-4)
    assert stats["embedder"] == "fake:hand" and stats["paper_table4"] == [0.881, 0.857, 0.845, 0.793]
    assert [lv["level"] for lv in stats["levels"]] == [1, 2, 3, 4]


# ---------------------------------------------------------------- CLI


def test_cli_score_prints_table_and_json(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import negsynth.embed
    from negsynth.cli import app

    monkeypatch.setattr(negsynth.embed, "load_embedder", lambda cfg: FakeEmbedder(HAND))
    write_generate(tmp_path, [[example(0)]])
    r = CliRunner().invoke(app, ["score", "--run-dir", str(tmp_path), "--json", "--policy", "reorder"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["policy"] == "reorder" and stats["examples"] == 1
    r = CliRunner().invoke(app, ["score", "--run-dir", str(tmp_path), "--overwrite"])
    assert r.exit_code == 0 and "MGH T4" in r.output and "level 1" in r.output
    r = CliRunner().invoke(app, ["score", "--run-dir", str(tmp_path), "--policy", "sort"])
    assert r.exit_code == 2 and "policy" in r.output and "annotate" in r.output


# ---------------------------------------------------------------- false-negative judge


class FakeJudge:
    """A cross-encoder stand-in: hand-set relevance per text, counts the pairs it scores."""

    name = "fake:judge"

    def __init__(self, scores: dict[str, float]):
        self.scores = scores
        self.pairs: list[tuple[str, str]] = []

    def score_examples(self, examples):
        from negsynth.embed.cross_encoder import CrossEncoderJudge

        judge = CrossEncoderJudge(model=None, name=self.name)
        judge.score = lambda pairs: (self.pairs.extend(pairs), np.array([self.scores[t] for _, t in pairs]))[1]
        return judge.score_examples(examples)


def test_judge_flags_a_false_negative_the_cosine_rule_let_through(tmp_path):
    # cosines: only n2 (0.86 >= 0.855) is a false negative by the embedder; the judge says n3 answers the query too
    write_generate(tmp_path, [[example(0), example(1, q="Q again")]])
    judge = FakeJudge({"pos": 0.9, "n1": 0.2, "n2": 0.3, "n3": 0.88, "n4": 0.01})
    stats = run_score(make_ctx(tmp_path, policy="measured", min_negatives=2, judge_model="fake-ce"), FakeEmbedder(HAND), judge=judge)
    recs = list(read_stage(tmp_path / "score"))
    assert len(recs) == 2 and len(judge.pairs) == 10  # each distinct (query, text) pair scored once
    sc = ExampleScore.model_validate(recs[0]["score"])
    # n2 (cosine rule) and n3 (judge: 0.88 >= 0.95 * 0.9) are dropped; the rest ordered by cosine
    assert recs[0]["negatives"] == ["n1", "n4"]
    assert sc.judge == "fake:judge" and sc.judge_pos == pytest.approx(0.9) and sc.judge_neg == pytest.approx([0.2, 0.01])
    assert sc.judged_false_negative == [False, False]
    assert stats["judge"] == {"model": "fake-ce", "ratio": 0.95, "negatives": 8, "false_negatives": 2, "only_by_judge": 2}
    assert stats["negatives_dropped"] == 4
    lines = "\n".join(" ".join(map(str, r)) for s in S.report(stats) for r in s.rows)
    assert "false-negative judge fake-ce: 2 of 8 negatives >= 0.95 x the positive (2 the cosine rule let through)" in lines


def test_judge_off_keeps_records_and_hash_as_before(tmp_path):
    write_generate(tmp_path, [[example()]])
    ctx = make_ctx(tmp_path)
    stats = run_score(ctx, FakeEmbedder(HAND))
    (rec,) = list(read_stage(tmp_path / "score"))
    assert "judge" not in rec["score"] and stats["judge"] is None
    from negsynth.stages.score.inputs import input_shards, scores_hash

    shards = input_shards(ctx)
    on = make_ctx(tmp_path, judge_model="some-ce")
    assert scores_hash(ctx, shards) == scores_hash(make_ctx(tmp_path, judge_ratio=0.5), shards)  # unused judge settings do not count
    assert scores_hash(ctx, shards) != scores_hash(on, shards)


def test_judge_refuses_an_embedding_model_and_loads_a_reranker(tmp_path):
    from negsynth.embed.cross_encoder import CrossEncoderJudge
    from negsynth.errors import UserError
    from negsynth.resources import minilm_path

    with pytest.raises(UserError, match="is not a cross-encoder .*BertModel.*not at an embedding model"):
        CrossEncoderJudge.load(str(minilm_path()), device="cpu")
    with pytest.raises(UserError, match="judge_model = .*: not a sentence-transformers CrossEncoder name or folder"):
        CrossEncoderJudge.load(str(tmp_path / "missing"), device="cpu")
    # a one-label reranker (MiniLM's encoder with a fixed head) loads and scores pairs in [0, 1]
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    CrossEncoder(str(minilm_path()), num_labels=1, device="cpu").save(str(tmp_path / "ce"))
    judge = CrossEncoderJudge.load(str(tmp_path / "ce"), device="cpu")
    pos, negs = judge.score_examples([{"query": "a cat", "positive": "a cat sleeping", "negatives": ["a dog", "a car"]}])
    assert pos.shape == (1,) and len(negs[0]) == 2 and all(0.0 <= x <= 1.0 for x in [pos[0], *negs[0]])


def test_measurements_carry_the_records_spelling_everywhere():
    """One name per measurement: the measure, the sidecar and both frames use ExampleScore's field
    names; a sidecar written before the rename (``tau``) still reads the same."""
    from negsynth.schemas.records import ExampleScore
    from negsynth.stages.score.measure import measure
    from negsynth.stages.score.stats import negatives_frame

    flags = {"false_negative", "too_easy", "kendall_tau", "monotonic"}
    assert flags <= set(ExampleScore.model_fields)
    m = measure(np.array([0.9]), np.array([[0.95, 0.5, 0.4, 0.1]]), ScoreConfig())
    assert flags <= set(m)
    new = {"task_type": ["sts"], "cos_pos": [0.9], "cos_neg": [[0.95, 0.5]], "false_negative": [[True, False]], "too_easy": [[False, True]]}
    new |= {"monotonic": [True], "kendall_tau": [1.0]}
    old = {k: v for k, v in new.items() if k != "kendall_tau"} | {"tau": [1.0]}
    frame = negatives_frame([new])
    assert flags <= set(frame.columns) and frame.equals(negatives_frame([old]))
    assert frame.get_column("false_negative").to_list() == [True, False] and frame.get_column("kendall_tau").to_list() == [1.0, 1.0]


def test_the_summary_calls_mined_levels_rank_bands_and_checks_no_llm_order(tmp_path):
    """Mined negatives' levels are a retriever's rank bands: score's own table says so and shows
    no Kendall tau or monotonic share; an LLM's graded negatives keep both."""
    for mined in (False, True):
        d = tmp_path / str(mined)
        rows = [{**example(i), "model": "mined:default:corpus" if mined else "gpt-test"} for i in range(2)]
        write_generate(d, [rows])
        stats = run_score(make_ctx(d), FakeEmbedder(HAND))
        assert stats["negatives_mined"] is mined
        table, summary = S.report(stats)
        words = " ".join([table.title, *(str(c) for r in table.rows for c in r), *(str(c) for r in summary.rows for c in r)])
        if mined:
            assert "rank band" in table.title and "band 1" in words
            assert "LLM level" not in words and "Kendall" not in words and "monotonic" not in words
        else:
            assert "LLM level" in table.title and "level 1" in words and "Kendall tau" in words
    # one LLM-written example among mined ones: the run's levels are the LLM's
    d = tmp_path / "mixed"
    write_generate(d, [[{**example(0), "model": "mined:default:corpus"}, {**example(1), "model": "gpt-test"}]])
    assert run_score(make_ctx(d), FakeEmbedder(HAND))["negatives_mined"] is False
