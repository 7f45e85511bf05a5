"""Prompt rendering is tested as exact strings: a prompt change must be a deliberate diff here."""

import json

import pytest

from negsynth.prompts import load_example, load_examples, render, templates_fingerprint
from negsynth.stages import brainstorm, generate

SL_ATTRS = {
    "query_type": "long-tail",
    "query_length": "5 to 15 words",
    "clarity": "clear",
    "num_words": 100,
    "language": "English",
    "difficulty": "college",
}


def test_short_long_prompt_exact():
    got = generate.render_prompt("short-long", "Find recipes for a diet.", SL_ATTRS)
    assert got == (
        "You have been given a retrieval task: Find recipes for a diet.\n"
        "Produce ONE training example for it as a JSON object with exactly these keys:\n"
        ' "user_query": a search query that this task would receive.\n'
        ' "positive_document": a document that fully satisfies the query.\n'
        ' "hard_negative_documents": a list of exactly 4 documents that look relevant but do NOT satisfy the query, '
        "sorted from MOST similar to the query (item 1: same topic, entities and wording, almost answers it but misses "
        "or contradicts the key point) to LEAST similar (item 4: same broad domain, clearly not an answer). Each item must "
        "be strictly less relevant than the one before it; none may be an acceptable answer.\n"
        "Guidelines:\n"
        " - The query is long-tail, 5 to 15 words, clear, and topically diverse.\n"
        " - Write every document independently of the query; do not copy the query verbatim. Some parts of the positive may be off-topic.\n"
        " - Every document has about 100 words. Negatives match the positive in length and style.\n"
        " - All text is in English and needs college-level education to understand.\n"
        " - Never state inside a document why it is or is not relevant.\n"
        "Return only the JSON object, with no explanation. Be creative!"
    )


def test_sts_prompt_exact():
    got = generate.render_prompt("sts", "ignored", {"unit": "phrase", "high_score": 4, "language": "French", "difficulty": "high school"})
    assert got == (
        'Write a group of phrases as JSON with keys "S1", "S2", "negatives" (a list of exactly 4 strings).\n'
        "Similarity to S1 is scored from 1 (least) to 5 (most):\n"
        " S2 scores 4; negatives[0..3] score about 3.5, 3.0, 2.0 and 1.0 respectively (strictly decreasing).\n"
        "All phrases share some words with S1, are in French, need high school-level education, and vary in topic and length.\n"
        "Return only the JSON object, with no explanation."
    )


def test_long_short_and_matching_prompts_name_their_keys():
    ls = generate.render_prompt(
        "long-short", "Classify reviews.", {"clarity": "clear", "num_words": 50, "language": "English", "difficulty": "PhD"}
    )
    assert ls.startswith("You have been given a text-classification task: Classify reviews.\n")
    assert '"misleading_labels": a list of exactly 4 labels' in ls and "has about 50 words" in ls
    ss = generate.render_prompt("short-short", "Match words.", {"language": "German"})
    assert ss.startswith("You have been given a text-matching task: Match words.\n") and "All text is in German." in ss
    ll = generate.render_prompt("long-long", "Match essays.", {"num_words": 300, "language": "English", "difficulty": "PhD"})
    assert "long documents of about 300 words" in ll


def test_missing_variable_is_an_error():
    with pytest.raises(KeyError):
        render("generate_short-long", task="x")


def test_messages_have_worked_example_turn():
    msgs = generate.build_messages("short-long", "Find recipes.", SL_ATTRS)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    ex = load_example("generate_short-long")
    assert json.loads(msgs[2]["content"]) == ex["output"]
    assert msgs[1]["content"].startswith(f"You have been given a retrieval task: {ex['task']}\n")
    assert msgs[3]["content"] == generate.render_prompt("short-long", "Find recipes.", SL_ATTRS)
    assert [
        m["role"]
        for m in generate.build_messages(
            "sts", "t", {"unit": "sentence", "high_score": 5, "language": "English", "difficulty": "college"}, few_shot=False
        )
    ] == ["system", "user"]


def test_brainstorm_prompt_exact_tail_and_example():
    msgs = brainstorm.build_messages("long-long", 12)
    assert msgs[-1]["content"].endswith(
        'Return a JSON object {"tasks": [...]} with a list of 12 distinct tasks, and nothing else. Be creative!'
    )
    assert msgs[-1]["content"].startswith("Brainstorm a list of text matching tasks where the queries are long documents.\n")
    assert json.loads(msgs[2]["content"])["tasks"] == load_example("brainstorm_long-long")["output"]["tasks"]


def test_worked_examples_pass_their_own_validators():
    cfg = generate.GenerateConfig()
    for tt in ("short-long", "long-short", "short-short", "long-long", "sts"):
        pool = load_examples(f"generate_{tt}")
        assert len(pool) == 4 and pool[0] == load_example(f"generate_{tt}")
        assert len({json.dumps(ex["output"]) for ex in pool}) == 4
        for ex in pool:
            # valid in shape and content (the copy check is off when few_shot is off), and fits the prompt
            q, p, negs = generate.make_validator(tt, cfg.model_copy(update={"few_shot": False}))(ex["output"])
            assert len(negs) == 4 and q and p
            generate.render_prompt(tt, ex["task"], ex["attributes"])
            # with few_shot on, answering with any example of the pool is a copy, whichever was shown
            with pytest.raises(generate.ValidationFailure) as e:
                generate.make_validator(tt, cfg)(ex["output"])
            assert e.value.reason == "copied_example"


def test_worked_examples_rotate_per_item(tmp_path):
    from negsynth.pipeline.context import StageContext
    from negsynth.schemas.config import RunConfig
    from negsynth.schemas.records import Task

    tasks = {"short-long": [Task(id=f"t{i}", task_type="short-long", task=f"Find recipes {i}.") for i in range(3)]}

    def shots(**gen):
        cfg = RunConfig.model_validate({"generate": {"examples": 40, "ratio": {"short-long": 1.0}, **gen}})
        ctx = StageContext(cfg=cfg, run_dir=tmp_path)
        return [it.payload.get("shot") for it in generate.plan_items(ctx, tasks)]

    rot = shots()
    assert rot == shots() and len(set(rot)) == 4  # deterministic, and every example is used
    assert rot != shots(seed=1)
    assert set(shots(few_shot=False)) == {None}
    pool = load_examples("generate_short-long")
    for shot in range(4):
        msgs = generate.build_messages("short-long", "Find recipes.", SL_ATTRS, shot=shot)
        assert json.loads(msgs[2]["content"]) == pool[shot]["output"]


def test_fingerprint_is_stable():
    assert templates_fingerprint() == templates_fingerprint() and len(templates_fingerprint()) == 16


def test_stage_fingerprint_covers_only_its_own_templates():
    from negsynth.prompts import resources

    gen = templates_fingerprint("generate_", "system")
    names = [f.name for f in resources.files("negsynth.prompts").joinpath("templates").iterdir()]
    assert any(n.startswith("regenerate") for n in names)  # a template generate must not depend on
    assert gen != templates_fingerprint()  # the all-templates hash includes it ...
    assert gen == templates_fingerprint("system", "generate_")  # ... the stage hash does not, in any order
