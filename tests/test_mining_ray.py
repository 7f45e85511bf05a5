"""Mining on Ray (``--executor ray``): regenerate with mined negatives and the corpus stage's index
encode through :class:`RaySentenceModel` (the model mining loads, one per Ray worker); the search
and everything that decides what is written stay in the driver.

The fast tests need no Ray: the stand-in's own code (the sort, the batches, the parts, the vectors
put back in input order) runs over an in-process dealer holding MiniLM, and the dispatch
(``embeds_in_driver``, the CLI, ``negsynth run``) over that dealer in place of the Ray actors.
The slow ones start a local 2-CPU Ray node whose workers load MiniLM by name."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from fake_openai import FakeOpenAI, always_valid
from helpers import streamed_index, write_run_config
from test_corpus import answer, write_big_corpus
from typer.testing import CliRunner

from negsynth.cli import app
from negsynth.data.shards import read_stage
from negsynth.pipeline import ray_executor
from negsynth.pipeline.ray_embed import RaySentenceModel, encode_batches_part
from negsynth.pipeline.ray_executor import embeds_in_driver
from negsynth.schemas.config import RunConfig
from negsynth.stages import get

runner = CliRunner()
TOPICS = ["ocean tides and the moon", "vaccines and the immune system", "volcanoes and lava", "bees and pollination", "black holes"]
WORDS = "the of a shows study effect data rate high low new model cell energy water light heat plant animal".split()
QUERIES = [
    ("1", "what causes ocean tides", "d0"),
    ("2", "how do vaccines train immunity", "d1"),
    ("3", "why do volcanoes erupt lava", "d2"),
    ("4", "how do bees pollinate flowers", "d3"),
    ("5", "what is inside a black hole", "d4"),
]


def write_beir(root: Path, n: int = 150) -> Path:
    """``n`` documents of varied length over 5 topics, 5 queries with one relevant document each."""
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    docs = [
        {
            "_id": f"d{i}",
            "title": "",
            "text": f"{TOPICS[i % 5]}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 40))) + f" ({i})",
        }
        for i in range(n)
    ]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t, _ in QUERIES))
    (root / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, _, d in QUERIES))
    return root


MINED = '[regenerate]\nnegatives = "mined"\n'


def config(tmp: Path, body: str = MINED, batch_size: int = 8) -> Path:
    """A run file whose LLM listens nowhere (mined negatives make no request); small batches, so
    the corpus is cut into many batches and parts."""
    p = tmp / "run.toml"
    p.write_text(f'[llm]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "fake"\n[embedder]\nbatch_size = {batch_size}\n{body}')
    return p


def outputs(rd: Path, stage: str = "regenerate") -> dict[str, bytes]:
    d = rd / stage
    files = [*d.glob("shard-*.jsonl"), *(d / "rejects").glob("*.jsonl"), *(d / "_mined").glob("*.json")]
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(files)}


class LocalDealer:
    """What :class:`RaySentenceModel` needs of its :class:`RayEmbedder`, in this process: each part
    encoded by the worker's own function over one model (``workers`` only sets how many parts)."""

    def __init__(self, model, workers: int = 3):
        self.model, self.actors, self.devices = model, [None] * workers, ["cpu"] * workers
        self.dim = model.get_embedding_dimension()
        self.parts: list[int] = []  # texts per part handed out

    def encode_parts(self, parts, *, batch_size):
        for p in parts:
            self.parts.append(len(p[1]))
            yield encode_batches_part(self.model, p, batch_size)


def close(a, b, tol: float = 1e-5) -> bool:
    """Equal JSON values, floats within ``tol`` (the tolerance docs/reliability.md promises for
    stored scores across processes: another thread count or batch shape rounds differently)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    return a == b


def same_outputs(mine: dict[str, bytes], theirs: dict[str, bytes]) -> bool:
    """The same files, the same records in the same order, every float within the tolerance."""
    if mine.keys() != theirs.keys():
        return False

    def rows(b: bytes):
        try:
            return [json.loads(x) for x in b.decode().splitlines() if x.strip()]
        except ValueError:  # not JSON lines: one JSON document (mining's cache), else the bytes
            try:
                return json.loads(b)
            except ValueError:
                return b

    return all(close(rows(mine[k]), rows(theirs[k])) for k in mine)


def stand_in(model, workers: int = 3) -> RaySentenceModel:
    info = {"base_model": model.model_card_data.base_model, "similarity_fn_name": model.similarity_fn_name, "flatten": False}
    return RaySentenceModel(LocalDealer(model, workers), info)


@pytest.fixture(scope="module")
def st_model(minilm):
    from negsynth.embed.models import load_sentence_transformer

    return load_sentence_transformer(minilm, device="cpu")


def test_the_stand_in_gives_the_vectors_and_negatives_of_the_model(st_model, tmp_path):
    """Sorted as the model sorts, cut into its batches, dealt as runs of whole batches and put back
    in input order: the same vectors as one ``encode_document`` call, bit for bit, and the same
    mined negatives and corpus index."""
    from negsynth.embed.mining import CorpusIndex, mine_negatives

    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 50))) for _ in range(101)]
    proxy = stand_in(st_model, workers=3)
    want = st_model.encode_document(texts, batch_size=8, normalize_embeddings=True, convert_to_numpy=True)
    got = proxy.encode_document(texts, batch_size=8, normalize_embeddings=True, convert_to_numpy=True)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert len(proxy.dealer.parts) > 3 and sum(proxy.dealer.parts) == len(texts)  # several parts, every text once
    assert all(n % 8 == 0 for n in proxy.dealer.parts[:-1])  # each part whole batches
    alone = st_model.encode(texts[3], batch_size=8, normalize_embeddings=True)
    assert np.array_equal(proxy.encode(texts[3], batch_size=8, normalize_embeddings=True), alone)  # one text: one vector
    queries = {q: t for q, t, _ in QUERIES}
    known = {q: [texts[i]] for i, (q, _, _) in enumerate(QUERIES)}
    assert mine_negatives(proxy, queries, known, texts, 6, batch_size=8) == mine_negatives(st_model, queries, known, texts, 6, batch_size=8)
    one = CorpusIndex(st_model, texts, batch_size=8)
    streamed = streamed_index(proxy, texts, tmp_path, chunk=10, batch_size=8)
    assert np.array_equal(np.asarray(streamed.emb), one.emb)
    assert streamed.search("violin energy", 4, 4) == one.search("violin energy", 4, 4)
    with pytest.raises(ValueError, match="prompt"):
        proxy.encode_query(texts, prompt="query: ")


def test_which_stages_embed_in_the_driver():
    """score always; regenerate only with mined negatives (with the LLM: shard workers); corpus
    always (its index: mined negatives and the round trip)."""
    mined = RunConfig.model_validate({"regenerate": {"negatives": "mined"}})
    assert embeds_in_driver(get("score"), RunConfig())
    assert embeds_in_driver(get("regenerate"), mined) and not embeds_in_driver(get("regenerate"), RunConfig())
    llm_mine = RunConfig.model_validate({"regenerate": {"mine": 4}})  # mines first (prepare), then shard workers
    assert not embeds_in_driver(get("regenerate"), llm_mine) and get("regenerate").embeds(llm_mine)
    assert not get("regenerate").embeds(RunConfig())
    assert embeds_in_driver(get("corpus"), RunConfig()) and embeds_in_driver(
        get("corpus"), RunConfig.model_validate({"corpus": {"round_trip_k": 3}})
    )
    assert not embeds_in_driver(get("generate"), mined)


@pytest.fixture
def local_ray_embedding(monkeypatch, st_model):
    """``ray_embedding`` with the in-process dealer in place of Ray actors; no shard worker may start.
    Yields the stand-ins it made."""
    import contextlib

    made: list[RaySentenceModel] = []

    class StandIns:
        def __init__(self, workers):
            self.workers = workers

        def mining_model(self, cfg):
            made.append(stand_in(st_model, self.workers))
            return made[-1]

    @contextlib.contextmanager
    def fake(ctx, *, workers, address=None, nodes=None):
        yield replace(ctx, embedding=StandIns(workers))

    def no_shard_workers(*a, **k):
        raise AssertionError("mined regenerate must not start shard workers")

    monkeypatch.setattr(ray_executor, "ray_embedding", fake)
    monkeypatch.setattr(ray_executor, "_rank", no_shard_workers)
    monkeypatch.setattr(ray_executor, "import_ray", no_shard_workers)
    monkeypatch.setattr(ray_executor, "connect", no_shard_workers)
    return made


def test_mined_regenerate_under_ray_mines_through_the_workers_and_writes_the_same_bytes(tmp_path, local_ray_embedding):
    """``regenerate --executor ray`` and ``run --executor ray`` with mined negatives: the stage runs
    here (no shard worker), its mining encodes through the workers' stand-in, and every shard, reject
    and mining cache equals the one-process run's."""
    root = write_beir(tmp_path / "beir")
    cfg = config(tmp_path)
    r = runner.invoke(app, ["regenerate", "-c", str(cfg), "-d", str(tmp_path / "one"), "-i", str(root), "--json"])
    assert r.exit_code == 0, r.output
    one = json.loads(r.stdout)
    assert one["valid"] == 5 and not local_ray_embedding
    r = runner.invoke(
        app, ["regenerate", "-c", str(cfg), "-d", str(tmp_path / "ray"), "-i", str(root), "--executor", "ray", "--workers", "2", "--json"]
    )
    assert r.exit_code == 0, r.output
    ray = json.loads(r.stdout)
    assert len(local_ray_embedding) == 1 and sum(local_ray_embedding[0].dealer.parts) > len(QUERIES)  # corpus and queries went through it
    assert ray["executor"] == "ray" and ray["workers"] == 2 and ray["valid"] == one["valid"]
    assert same_outputs(outputs(tmp_path / "ray"), outputs(tmp_path / "one")) and outputs(tmp_path / "one")
    body = MINED.replace("[regenerate]\n", f'[regenerate]\ninputs = [{{path = "{root}"}}]\n') + '[pipeline]\nstages = ["regenerate"]\n'
    r = runner.invoke(
        app, ["run", "-c", str(config(tmp_path, body)), "-d", str(tmp_path / "run"), "--executor", "ray", "--workers", "2", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["regenerate"]["executor"] == "ray" and len(local_ray_embedding) == 2
    assert same_outputs(outputs(tmp_path / "run"), outputs(tmp_path / "one"))


# ---------------------------------------------------------------------------- on a Ray node
@pytest.mark.slow
def test_minilm_mining_on_two_ray_workers_equals_one_process(tmp_path, ray_node, minilm):
    """``negsynth regenerate --executor ray --workers 2`` with mined negatives: MiniLM
    loaded by name in each worker, the corpus and queries encoded there in parts, the search here;
    the shards, rejects and mining cache equal the one-process run's (floats within 1e-5; small batches:
    many parts, both workers busy)."""
    root = write_beir(tmp_path / "beir")
    cfg = config(tmp_path, batch_size=4)
    for name, extra in (("one", []), ("ray", ["--executor", "ray", "--workers", "2"])):
        r = runner.invoke(app, ["regenerate", "-c", str(cfg), "-d", str(tmp_path / name), "-i", str(root), "--json", *extra])
        assert r.exit_code == 0, r.output
    stats = json.loads((tmp_path / "ray" / "regenerate" / "stats.json").read_text())
    assert stats["valid"] == 5
    out = json.loads(r.stdout)
    assert out["executor"] == "ray" and len(out["ray_nodes"]) == 2
    assert same_outputs(outputs(tmp_path / "ray"), outputs(tmp_path / "one")) and outputs(tmp_path / "one")


@pytest.mark.slow
def test_llm_regenerate_with_mining_mines_once_on_the_workers_then_runs_shard_workers(tmp_path, ray_node, minilm):
    """``regenerate --mine 3 --executor ray --workers 2`` (LLM negatives, mined ones beside them):
    the driver mines once, its encoding on 2 embedding workers, then 2 shard workers run the LLM
    and read the mined negatives from ``_mined/``; shards, rejects and the mining cache equal the
    one-process run's."""
    root = write_beir(tmp_path / "beir")
    with FakeOpenAI(always_valid) as srv:
        p = tmp_path / "llm.toml"
        p.write_text(f'[llm]\nbase_url = "{srv.base_url}"\nmodel = "fake"\n[embedder]\nbatch_size = 4\n[pipeline]\nshard_size = 2\n')
        for name, extra in (("one", []), ("ray", ["--executor", "ray", "--workers", "2"])):
            r = runner.invoke(
                app, ["regenerate", "-c", str(p), "-d", str(tmp_path / name), "-i", str(root), "--mine", "3", "--json", *extra]
            )
            assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["executor"] == "ray" and out["num_shards"] == 2 and len(out["embedding_nodes"]) == 2 and out["valid"] == 5
    one = outputs(tmp_path / "one")
    assert same_outputs(outputs(tmp_path / "ray"), one) and any(k.startswith("_mined") for k in one)
    # at most 3 each, as many as mine_hard_negatives' own window holds under the margin (the same in both runs)
    counts = [len(x["mined_negatives"]) for x in read_stage(tmp_path / "ray" / "regenerate")]
    assert max(counts) == 3 and all(c <= 3 for c in counts), counts


@pytest.mark.slow
def test_corpus_index_on_two_ray_workers_equals_one_process(tmp_path, ray_node, minilm):
    """``negsynth corpus --executor ray --workers 2`` with mined negatives and the round trip: the
    LLM in the driver as in one process, the corpus's index encoded on the workers; the same
    shards, rejects and round-trip ranks."""
    folder = write_big_corpus(tmp_path, n=60)
    with FakeOpenAI(lambda req, n: answer(req, n)) as srv:
        cfg = write_run_config(
            tmp_path,
            srv.base_url,
            embedder={"batch_size": 4},
            corpus={"queries_per_doc": 2, "max_docs": 6, "round_trip_k": 20, "mining": {"relative_margin": 0.0}},
        )
        for name, extra in (("one", []), ("ray", ["--executor", "ray", "--workers", "2"])):
            r = runner.invoke(app, ["corpus", "-c", str(cfg), "-d", str(tmp_path / name), "-i", str(folder), "--json", *extra])
            assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["executor"] == "ray" and len(out["ray_nodes"]) == 2 and out["round_trip"]["queries"] == 12
    one, ray = outputs(tmp_path / "one", "corpus"), outputs(tmp_path / "ray", "corpus")
    assert same_outputs(ray, one) and one
    vecs = [
        np.load(p) for d in ("one", "ray") for p in sorted((tmp_path / d / "corpus" / "_index").glob("*.npy")) if ".texts" not in p.name
    ]
    assert len(vecs) == 2 and np.allclose(vecs[0], vecs[1], atol=1e-5)


@pytest.mark.slow
def test_a_mining_worker_killed_mid_corpus_is_restarted_and_the_stage_finishes(tmp_path, ray_node, minilm):
    """SIGKILL one mining worker while it encodes a run of batches: the run goes to the other
    worker, Ray restarts the dead one, and regenerate finishes with the one-process bytes."""
    import threading

    from test_score_ray import _kill_loop

    root = write_beir(tmp_path / "beir")
    cfg = config(tmp_path, batch_size=4)
    r = runner.invoke(app, ["regenerate", "-c", str(cfg), "-d", str(tmp_path / "one"), "-i", str(root), "-q"])
    assert r.exit_code == 0, r.output
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_loop, args=(stop, killed, True), daemon=True)
    killer.start()
    try:
        r = runner.invoke(
            app,
            ["regenerate", "-c", str(cfg), "-d", str(tmp_path / "ray"), "-i", str(root), "--json", "--executor", "ray", "--workers", "2"],
        )
    finally:
        stop.set()
        killer.join()
    assert killed, "no worker was seen encoding"
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["complete"]
    assert same_outputs(outputs(tmp_path / "ray"), outputs(tmp_path / "one"))
