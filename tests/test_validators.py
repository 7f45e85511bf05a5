"""Every validator reject reason, and the ones that must keep."""

import pytest
from pydantic import ValidationError

from negsynth.data.text import text_key
from negsynth.llm.errors import ValidationFailure
from negsynth.schemas.config import GenerateConfig
from negsynth.stages.generate import make_validator
from negsynth.validators import REASONS, check_example, check_text

Q = "how do vaccines train the immune system"
P = "Vaccines expose the immune system to a harmless piece of a germ so it learns to recognise it."
N = [
    "Vaccines are stored at low temperatures to keep them effective during transport.",
    "The immune system includes white blood cells that fight infections in the body.",
    "Antibiotics kill bacteria but have no effect on viruses such as the flu.",
    "Hand washing with soap removes many germs from the skin.",
]


def reason(q=Q, p=P, n=N, **kw):
    return check_example(q, p, n, **kw).reason


def test_valid_example_is_kept():
    v = check_example(Q, P, N)
    assert v.keep and v.reason is None


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"n": N[:3]}, "wrong_negative_count"),
        ({"n": N + ["Extra negative text here."]}, "wrong_negative_count"),
        ({"n": N[:3] + ["   "]}, "empty_text"),
        ({"q": ""}, "empty_text"),
        ({"n": N[:3] + ["..."]}, "placeholder_text"),
        ({"n": N[:3] + ["Document 4"]}, "placeholder_text"),
        ({"n": N[:3] + ["ok"], "min_chars": 5}, "too_short"),
        ({"p": "x" * 50, "max_chars": 40}, "too_long"),
        ({"n": [N[0], N[1], N[2], " " + N[0].upper() + "!"]}, "duplicate_negatives"),
        ({"n": [P.lower(), N[1], N[2], N[3]]}, "negative_equals_positive"),
        ({"n": [N[0], Q + "?", N[2], N[3]]}, "negative_equals_query"),
        ({"p": "How do vaccines train the immune system?"}, "positive_equals_query"),
        ({"n": [N[0], N[1], N[2], "This document is not relevant to the query about vaccines."]}, "meta_commentary"),
        ({"n": [N[0], N[1], "Hard negative: antibiotics and viruses.", N[3]]}, "meta_commentary"),
    ],
)
def test_each_reject_reason(kwargs, expected):
    assert reason(**kwargs) == expected
    assert expected in REASONS


def test_text_key():
    assert text_key("  Hello,\tWORLD!! ") == "hello, world"
    assert text_key("Ｆｕｌｌ width") == "full width"


def test_task_checks():
    assert check_text("task", "Retrieve news about sports events for a query.", min_chars=15, max_chars=300).keep
    assert check_text("task", "", min_chars=15, max_chars=300).reason == "empty_text"
    assert check_text("task", "N/A", min_chars=1, max_chars=300).reason == "placeholder_text"
    assert check_text("task", "short", min_chars=15, max_chars=300).reason == "too_short"
    assert check_text("task", "x" * 301, min_chars=15, max_chars=300).reason == "too_long"


def test_generate_validator_maps_keys_and_reports_schema_errors():
    v = make_validator("short-long", GenerateConfig())
    q, p, negs = v({"user_query": Q, "positive_document": P, "hard_negative_documents": N})
    assert (q, p, negs) == (Q, P, N)
    with pytest.raises(ValidationFailure) as e:
        v({"user_query": Q, "positive_document": P})
    assert e.value.reason == "schema" and "hard_negative_documents" in e.value.detail
    with pytest.raises(ValidationFailure) as e:
        v({"user_query": Q, "positive_document": P, "hard_negative_documents": [1, 2, 3, 4]})
    assert e.value.reason == "schema"
    with pytest.raises(ValidationFailure) as e:
        v(["not", "an", "object"])
    assert e.value.reason == "schema"
    with pytest.raises(ValidationFailure) as e:
        v({"user_query": Q, "positive_document": P, "hard_negative_documents": N[:3]})
    assert e.value.reason == "wrong_negative_count" and "hard_negative_documents" in e.value.detail


def test_copied_worked_example_is_rejected():
    from negsynth.prompts import load_example

    ex = load_example("generate_sts")["output"]
    with pytest.raises(ValidationFailure) as e:
        make_validator("sts", GenerateConfig())({**ex, "negatives": N})
    assert e.value.reason == "copied_example"


def test_example_record_rejects_unknown_fields():
    from negsynth.schemas.records import Example

    with pytest.raises(ValidationError):
        Example(id="a", task="t", task_type="sts", query="q", positive="p", negatives=N, bogus=1)


def test_validation_dedup_and_the_sampler_share_one_text_identity():
    """ "The cat." and "the  cat" are one text for validation, pair dedup / cleaning and the
    trainer's no-text-twice-per-batch sampler alike (they used to disagree on edge punctuation)."""
    import negsynth.validators as validators
    from negsynth.data import clean, curriculum
    from negsynth.data.text import text_key
    from negsynth.embed import mining
    from negsynth.train import sampler

    a, b = "The cat sat on the mat.", "  the cat sat ON the mat"
    assert text_key(a) == text_key(b)
    users = (validators, curriculum, clean, sampler, mining)
    assert all(m.text_key is text_key for m in users)
    assert not any(hasattr(m, other) for m in users for other in ("normalize", "normalise"))  # one name


def test_text_key_equals_its_regular_expression_definition():
    """The fast key is the documented one: whitespace runs collapsed (``\\s+``) and ``[\\W_]``
    stripped at both ends after NFKC + casefold — on random strings of letters, digits, marks,
    underscores, unicode spaces and punctuation."""
    import random
    import re
    import unicodedata

    from negsynth.data.text import text_key

    def by_regex(text: str) -> str:
        t = re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()
        return re.sub(r"^[\W_]+|[\W_]+$", "", t)

    rng = random.Random(0)
    alphabet = "aZ09_ .,;!?-—\t\n\u00a0\u2009\u3000éÉß\u0301\uff21\u0660()[]\"'…*·"
    for _ in range(20_000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        assert text_key(s) == by_regex(s), repr(s)


def test_meta_prefilter_never_changes_the_verdict():
    """check_meta skips its regex for ASCII text without a word the regex needs: on every phrase
    the pattern matches (each alternative spelled out, in random case, inside other text) and on
    random text, the verdict equals a plain regex search."""
    import itertools
    import random

    from negsynth.validators import _META, check_meta

    phrases = [
        f"{a} {b} {c} not {d}"
        for a, b, c, d in itertools.product(
            ["this", "the"],
            ["document", "passage", "text", "answer", "label", "sentence"],
            ["is", "does"],
            ["relevant", "answer", "address", "satisfy", "match"],
        )
    ]
    phrases += [f"not relevant to the {w}" for w in ("query", "question", "task")]
    phrases += ["hard negative", "hard-negative", "as an ai"]
    phrases += [f"{a} {b}" for a in ("irrelevant", "negative") for b in ("document", "passage", "example")]
    phrases += [
        f"{a} {b} {c}" for a in ("less", "least", "most") for b in ("relevant", "similar") for c in ("document", "passage", "negative")
    ]
    rng = random.Random(0)
    words = "the cat sat on a mat vaccines reduce measles cases notably hardly negatives relevance ai".split()
    texts = []
    for p in phrases:
        cased = "".join(ch.upper() if rng.random() < 0.3 else ch for ch in p)
        texts += [cased, f"{rng.choice(words)} {cased}.", f"Intro text. {cased} and more"]
    texts += [" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))) for _ in range(2000)]
    texts += ["ſimilar passage", "MOST ſIMILAR DOCUMENT", "Ⅰ not relevant to the query"]  # non-ASCII: always searched
    for t in texts:
        assert check_meta({"query": t}).keep == (_META.search(t) is None), t
    assert sum(_META.search(t) is not None for t in texts) >= 3 * len(phrases)  # the phrases do match
