"""Make tests/data/old_run_dir: a run dir as this version of negsynth writes it, for
tests/test_old_run_dir.py to resume with later versions (nothing may be asked of the LLM again).

``python3 tests/data/make_old_run_dir.py`` replaces the folder with what the checked-out code
writes: run it only at the commit whose run dirs the test should keep resumable, never to make the
test pass. The LLM is the tests' fake server; the run file, documents and pairs are written beside
the run dir, the run file's paths relative to it (fingerprints hold them as written).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fake_openai import FakeOpenAI, Reply, valid_answer  # noqa: E402

import negsynth  # noqa: E402

OUT = HERE / "old_run_dir"
#: the stages the fixture holds, in order (the LLM stages, then what reads their examples)
STAGES = ["brainstorm", "generate", "regenerate", "corpus", "score", "curriculum"]

RUN_TOML = """\
[llm]
model = "fake"

[pipeline]
shard_size = 4

[brainstorm]
tasks_per_type = 2
tasks_per_request = 2

[generate]
examples = 5
min_per_type = 1

[[regenerate.inputs]]
path = "pairs.jsonl"

[[corpus.inputs]]
path = "docs"

[score]
decontam_sets = []

[curriculum]
batch_size = 2
homogeneous_batches = false
"""

DOCS = [
    ("Moon tides", "The moon's gravity raises ocean tides twice a day, and spring tides follow the new and full moon."),
    ("Vaccines", "Vaccines expose the immune system to a harmless antigen so that it remembers the pathogen."),
    ("Photosynthesis", "Plants turn light, water and carbon dioxide into sugar and oxygen in their chloroplasts."),
    ("Volcanoes", "Magma rising through the crust erupts as lava, ash and gas from a volcano's vent."),
    ("Glaciers", "Glaciers form where snow accumulates faster than it melts and slowly flows downhill as ice."),
    ("Antibiotics", "Antibiotics kill bacteria or stop their growth but have no effect on viruses such as influenza."),
]
PAIRS = [
    ("what causes tides", "Tides are caused by the gravitational pull of the moon and the sun on the oceans."),
    ("how do vaccines work", "Vaccines train the immune system to recognise a pathogen without causing the disease."),
]


def answer(req: dict, n: int) -> Reply:
    """A valid answer: corpus's queries (the document's first words), else the tests' canned ones."""
    fmt = req.get("response_format") or {}
    props = (fmt.get("json_schema") or fmt).get("schema", {}).get("properties", {})
    if "queries" not in props:
        return Reply(content=valid_answer(req, n, tasks=2))
    words = re.search(r"Document: (.*?)\n", req["messages"][-1]["content"]).group(1).lower().split()
    out: dict = {"queries": [f"what about {' '.join(words[: 4 + j])}?" for j in range(props["queries"]["minItems"])]}
    if "hard_negative_documents" in props:
        out["hard_negative_documents"] = [f"An unrelated note {i} about sharpening garden tools." for i in range(4)]
    return Reply(content=json.dumps(out))


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "docs").mkdir(parents=True)
    (OUT / "run.toml").write_text(RUN_TOML)
    (OUT / "docs" / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(DOCS))
    )
    (OUT / "pairs.jsonl").write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in PAIRS))
    os.chdir(OUT)  # the run file's paths are relative, as the fingerprints record them
    with FakeOpenAI(answer) as srv:
        stats = negsynth.run("run.toml", "run", stages=STAGES, overrides=[f"llm.base_url={srv.base_url}"], quiet=True)
    assert all(st.get("complete", True) and not st.get("failed") for st in stats.values()), stats
    # what only an unfinished stage reads (corpus's embedding index, score's dedup state): left out
    shutil.rmtree(OUT / "run" / "corpus" / "_index")
    for p in (OUT / "run" / "score" / "_shards").glob("*.kept.npy"):
        p.unlink()
    print(f"{OUT}: {len(srv.requests)} requests; {sum(p.stat().st_size for p in OUT.rglob('*') if p.is_file())} bytes")


if __name__ == "__main__":
    main()
