"""The roofline benchmark's counting: batches as sentence-transformers cuts them, and the forward's FLOPs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from eval_roofline import batch_shapes, forward_flops  # noqa: E402


def words(texts, truncation=True, max_length=512):
    """A stand-in tokenizer: one id per word plus two specials, cut at ``max_length``."""
    return {"input_ids": [list(range(min(len(t.split()) + 2, max_length))) for t in texts]}


def test_batches_sorted_by_length_deduplicated_and_cut():
    texts = ["a b c d e", "a", "a b", "a b", "a b c"]  # one repeat, dropped
    shapes = batch_shapes(words, [texts], batch_size=2, max_len=6)
    # longest first by characters: "a b c d e" (7 ids, cut to 6), "a b c" (5) | "a b" (4), "a" (3)
    assert shapes == [(2, 6, 11), (2, 4, 7)]


def test_flops_of_one_batch():
    h, ffn, layers = 4, 8, 2
    fl = forward_flops([(3, 5, 12)], h, ffn, layers)
    tokens = 3 * 5  # padded tokens are computed too
    assert fl["linear"] == 2 * tokens * layers * (4 * h * h + 2 * h * ffn)
    assert fl["attention"] == 2 * tokens * layers * 2 * 5 * h
    assert fl["total"] == fl["linear"] + fl["attention"]
