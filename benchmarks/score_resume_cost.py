"""What a resumed score costs: 6 shards x 100 examples in one block, scored, then the last output shard
deleted and scored again (the whole block is embedded again: docs/reliability.md).

    python benchmarks/score_resume_cost.py /tmp/rc LABEL
"""

import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from negsynth.data.shards import write_jsonl
from negsynth.embed import load_embedder
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.progress import Reporter
from negsynth.schemas.config import EmbedderConfig, RunConfig, ScoreConfig
from negsynth.schemas.records import Example
from negsynth.stages import get, run_stage

rng = random.Random(0)
words = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango".split()
)


def txt(n):
    return " ".join(rng.choice(words) for _ in range(n))


rd = Path(sys.argv[1])
label = sys.argv[2] if len(sys.argv) > 2 else "score"
shutil.rmtree(rd, ignore_errors=True)
for k in range(6):
    rows = [
        Example(
            id=f"ex-{k}-{i}", task="find it", task_type="short-long", query=txt(10), positive=txt(60), negatives=[txt(60) for _ in range(4)]
        ).model_dump(mode="json", exclude={"score"})
        for i in range(100)
    ]
    write_jsonl(rd / "generate" / f"shard-{k:05d}.jsonl", rows)
emb = load_embedder(EmbedderConfig(batch_size=64))


def go():
    cfg = RunConfig()
    cfg.score = ScoreConfig(block_examples=600, decontam_sets=[])
    t = time.perf_counter()
    st = run_stage(get("score"), StageContext(cfg=cfg, run_dir=rd, reporter=Reporter(quiet=True), embedder=emb))
    return time.perf_counter() - t, st


full, st = go()
(rd / "score" / "shard-00005.jsonl").unlink()
(rd / "score" / "stats.json").unlink()
res, st2 = go()
print(
    f"{label}: full run {full:.1f} s ({st['throughput']['examples_per_s']} ex/s); resume of the last of 6 shards {res:.1f} s (examples embedded {st2['throughput']['examples']})"
)
