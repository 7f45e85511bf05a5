"""The paired per-query significance tests (negsynth/evaluate/own_corpus.py) and the benchmarks' ``align``."""

import numpy as np
import pytest
from helpers import load_benchmark

from negsynth.evaluate.own_corpus import paired_bootstrap_ci, paired_permutation_p, paired_test

align = load_benchmark("harness").align


def _scores(n=300, seed=0):
    return np.random.default_rng(seed).uniform(0.0, 1.0, size=n)


def test_identical_arms_give_p_one_and_zero_ci():
    a = _scores()
    r = paired_test(a, a.copy(), n_resamples=2000, seed=1)
    assert r["p_value"] == pytest.approx(1.0)
    assert r["mean_diff"] == 0.0 and r["ci_low"] == 0.0 and r["ci_high"] == 0.0
    assert r["wins"] == r["losses"] == 0


def test_clear_shift_gives_small_p_and_ci_away_from_zero():
    rng = np.random.default_rng(3)
    b = _scores()
    a = b + 0.05 + rng.normal(0, 0.05, size=b.size)  # +0.05 per query, noisy
    r = paired_test(a, b, n_resamples=2000, seed=0)
    assert r["p_value"] < 0.01
    assert 0.03 < r["ci_low"] < r["mean_diff"] < r["ci_high"] < 0.07
    assert r["mean_diff"] == pytest.approx(float(np.mean(a - b)))


def test_no_shift_noise_only_is_not_significant():
    rng = np.random.default_rng(4)
    b = _scores()
    a = b + rng.normal(0, 0.05, size=b.size) - 0.0  # differences centred on zero
    a = a - np.mean(a - b)  # exactly zero mean difference
    r = paired_test(a, b, n_resamples=2000, seed=0)
    assert r["p_value"] > 0.5
    assert r["ci_low"] < 0 < r["ci_high"]


def test_deterministic_given_seed():
    a, b = _scores(seed=1), _scores(seed=2)
    assert paired_test(a, b, n_resamples=500, seed=7) == paired_test(a, b, n_resamples=500, seed=7)
    assert paired_permutation_p(a - b, 500, seed=7) == paired_permutation_p(a - b, 500, seed=7)


def test_seeds_are_pooled_per_query_and_widen_the_ci():
    rng = np.random.default_rng(5)
    base = _scores()
    b = np.stack([base + rng.normal(0, 0.01, base.size) for _ in range(3)])
    shift = np.array([0.0, 0.04, 0.08])[:, None]  # seeds disagree a lot
    a = np.stack([base] * 3) + shift
    r = paired_test(a, b, n_resamples=2000, seed=0)
    assert r["seeds_a"] == r["seeds_b"] == 3
    assert r["mean_diff"] == pytest.approx(float(a.mean() - b.mean()))
    lo1, hi1 = paired_bootstrap_ci(a, b, 2000, seed=0, resample_seeds=False)
    lo2, hi2 = paired_bootstrap_ci(a, b, 2000, seed=0, resample_seeds=True)
    assert hi2 - lo2 > hi1 - lo1  # the seed spread is in the interval


def test_mismatched_queries_and_bad_input_fail_clearly():
    with pytest.raises(ValueError, match="different numbers of queries"):
        paired_test(np.zeros(5), np.zeros(6))
    with pytest.raises(ValueError, match="NaN"):
        paired_test(np.array([0.1, np.nan]), np.zeros(2))
    with pytest.raises(ValueError, match="query '2'"):
        align([{"1": 0.5, "2": 0.1}, {"1": 0.4}])


def test_align_orders_queries_and_stacks_seeds():
    ids, m = align([{"b": 0.2, "a": 0.1}, {"a": 0.3, "b": 0.4}])
    assert ids == ["a", "b"]
    assert m.tolist() == [[0.1, 0.2], [0.3, 0.4]]
    ids, m = align([{"b": 0.2, "a": 0.1}], qids=["b", "a"])
    assert m.tolist() == [[0.2, 0.1]]
