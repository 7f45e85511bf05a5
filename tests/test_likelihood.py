"""Query likelihood from the embedded SmolLM2: a document that answers the query explains it better
than one that does not, and the score does not depend on how the documents are batched."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def lm():
    from negsynth.embed.likelihood import QueryLikelihood
    from negsynth.resources import MissingResource

    try:
        return QueryLikelihood.load(device="cpu", dtype="float32", batch_size=4)
    except MissingResource as exc:
        pytest.skip(str(exc))


DOCS = [
    "The boundary layer on a flat plate thickens downstream; at high Reynolds numbers it becomes turbulent.",
    "Paris is the capital of France and its largest city, on the river Seine.",
    "A recipe for bread: flour, water, salt and yeast, kneaded and left to rise overnight.",
]


def test_the_document_that_answers_explains_the_query_best(lm):
    scores = lm.scores("what is the capital of France", DOCS)
    assert len(scores) == 3
    assert max(range(3), key=scores.__getitem__) == 1, scores
    assert all(s < 0 for s in scores)  # mean log-probabilities


def test_scores_do_not_depend_on_batching_or_left_padding(lm):
    query = "when does a boundary layer become turbulent"
    together = lm.scores(query, DOCS)  # one padded batch of three lengths
    alone = [lm.scores(query, [d])[0] for d in DOCS]  # no padding
    assert together == pytest.approx(alone, abs=1e-4)


def test_long_documents_are_cut_to_max_doc_tokens(lm):
    from negsynth.embed.likelihood import QueryLikelihood

    short = QueryLikelihood(lm.model, lm.tok, max_doc_tokens=8)
    doc = DOCS[0] + " " + "filler words " * 200
    # only the first 8 tokens of the document are read: anything after them changes nothing
    assert short.scores("boundary layer", [doc]) == pytest.approx(short.scores("boundary layer", [DOCS[0]]), abs=1e-5)


def test_cached_scores_are_the_computed_ones_and_are_not_computed_again(lm, tmp_path):
    from negsynth.embed.likelihood import QueryLikelihood

    path = tmp_path / "likelihood.sqlite"
    first = QueryLikelihood(lm.model, lm.tok, cache=path, model_id="smol")
    query = "what is the capital of France"
    fresh = first.scores(query, DOCS)
    assert fresh == lm.scores(query, DOCS)  # the cache changes nothing about the numbers

    again = QueryLikelihood(lm.model, lm.tok, cache=path, model_id="smol")
    again._compute = lambda *a: pytest.fail("a cached score was computed again")
    assert again.scores(query, DOCS) == fresh  # bit for bit: a resumed run writes the same records
    # another prompt cut is another score: not served from the same entries
    other = QueryLikelihood(lm.model, lm.tok, cache=path, model_id="smol", max_doc_tokens=4)
    calls = []
    real = other._compute
    other._compute = lambda q, docs: calls.append(len(docs)) or real(q, docs)
    other.scores(query, DOCS[:2])
    assert calls == [2]
