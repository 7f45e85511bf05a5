"""``--executor ray``'s embedding workers (docs/scale.md §2–3): Ray actors holding one embedder
(:class:`RayEmbedder`) or the model mining loads (:class:`RaySentenceModel`). The driver deals out
parts (contiguous runs of length-sorted texts), each whole to the next free actor, so every batch
holds what it holds in one process; a lost actor's part goes to another.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from negsynth.embed.base import Embedder, Part, encode_part, shares_query_pool
from negsynth.errors import UserError
from negsynth.pipeline.context import StageContext
from negsynth.pipeline.ray_connect import connect, first_line, import_ray, raise_cause, ray_get

#: how often Ray restarts one embedding actor that died
MAX_RESTARTS = 3
#: how many times one part is given to an actor before the stage stops
PART_TRIES = 4
#: how long (s) the stage waits for a restarted actor when no actor is left
RESTART_WAIT = 300.0


class _EmbedWorker:
    """A Ray actor holding one embedder (``[embedder]``, or the one given); ``raw``: the
    ``SentenceTransformer`` mining loads, for :class:`RaySentenceModel`."""

    def __init__(self, embedder_cfg: dict, embedder: Any = None, raw: bool = False):
        self.raw = raw
        if embedder is None:
            from negsynth.schemas.config import EmbedderConfig

            cfg = EmbedderConfig.model_validate(embedder_cfg)
            if raw:
                from negsynth.embed.mining import load_mining_model

                embedder = load_mining_model(cfg)
            else:
                from negsynth.embed import load_embedder

                embedder = load_embedder(cfg)
        self.embedder = embedder

    def describe(self) -> dict:
        e = self.embedder
        node = import_ray().get_runtime_context().get_node_id()
        if self.raw:
            card = getattr(e, "model_card_data", None)
            get_dim = getattr(e, "get_embedding_dimension", None) or e.get_sentence_embedding_dimension
            return {
                "name": f"st:{getattr(card, 'base_model', None) or 'model'}",
                "dim": int(get_dim()),
                "device": str(e.device),
                "query_template": Embedder.query_template,
                "instruct_queries": False,
                "shares_query_pool": False,
                "node": node,
                "flatten": bool(callable(getattr(e, "_can_flatten_inputs", None)) and e._can_flatten_inputs()),
                "base_model": getattr(card, "base_model", None),
                "similarity_fn_name": getattr(e, "similarity_fn_name", None) or "cosine",
            }
        return {
            "name": e.name,
            "dim": int(e.dim),
            "device": str(getattr(e, "device", "?")),
            "query_template": e.query_template,
            "instruct_queries": e.instruct_queries,
            "shares_query_pool": shares_query_pool(e),
            "node": node,
        }

    def encode_part(self, part: Part, batch_size: int) -> np.ndarray:
        if self.raw:
            return encode_batches_part(self.embedder, part, batch_size)
        return encode_part(self.embedder, part, batch_size=batch_size)


#: what a :class:`RaySentenceModel` part asks of a ``SentenceTransformer`` (``+raw``: not normalised)
_ST_CALLS = {"encode": "encode", "document": "encode_document", "query": "encode_query"}


def encode_batches_part(model, part: Part, batch_size: int) -> np.ndarray:
    """The vectors of one :class:`RaySentenceModel` part: whole batches of ``batch_size``, each
    embedded by its own call of the model."""
    how, texts, _ = part
    kind, _, plain = how.partition("+")
    fn = getattr(model, _ST_CALLS[kind])
    out = [
        np.asarray(
            fn(
                texts[a : a + batch_size],
                batch_size=batch_size,
                normalize_embeddings=plain != "raw",
                convert_to_numpy=True,
                show_progress_bar=False,
            ),
            dtype=np.float32,
        )
        for a in range(0, len(texts), batch_size)
    ]
    return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)


class RayEmbedder(Embedder):
    """The score stage's ``[embedder]`` on Ray actors, answering for the embedder it stands for
    (its name, dimension, query format): it encodes through :meth:`encode_parts` alone, as
    :func:`~negsynth.embed.base.encode_parts` calls it."""

    def __init__(self, ray, actors: list, info: dict):
        self._ray, self.actors = ray, actors
        self.name = info["name"]
        self._dim = info["dim"]
        self.query_template = info["query_template"]
        self.instruct_queries = info["instruct_queries"]
        self.shares_query_pool = info["shares_query_pool"]
        self.devices = [info["device"], *info.get("other_devices", [])]
        self.nodes = info.get("nodes", [])  # the Ray node id of each actor (where it last answered)
        self._shipped = None  # a caller's embedder in Ray's object store: a restarted actor loads it again

    @classmethod
    def start(cls, embedder_cfg, *, workers: int, address: str | None = None, embedder: Any = None, raw: bool = False) -> RayEmbedder:
        """``workers`` actors, each loading ``embedder_cfg`` (or a copy of ``embedder``), each with
        one CPU and a share of the cluster's GPUs."""
        ray = connect(address)
        cpus = float(ray.cluster_resources().get("CPU", 0))
        if cpus < workers:  # the actors beyond it would wait for a CPU forever
            raise UserError(
                f"--workers {workers}: the Ray cluster has {cpus:.0f} CPU(s) and each embedding worker takes one; use --workers {max(1, int(cpus))}"
            )
        gpus = float(ray.cluster_resources().get("GPU", 0))
        per_gpu = min(1.0, gpus / workers) if gpus else 0
        actor = ray.remote(num_cpus=1, num_gpus=per_gpu, max_restarts=MAX_RESTARTS)(_EmbedWorker)
        cfg_json = embedder_cfg.model_dump(mode="json")
        shipped = ray.put(embedder) if embedder is not None else None
        actors = [actor.remote(cfg_json, shipped, raw) for _ in range(workers)]
        try:
            infos = ray_get(ray, [a.describe.remote() for a in actors])
        except BaseException as e:
            for a in actors:
                ray.kill(a)
            if isinstance(e, ray.exceptions.RayError):  # an actor died while loading its embedder
                lines = [x.strip() for x in str(e).splitlines() if x.strip()]
                last = (lines[-1] if lines else type(e).__name__).removeprefix("negsynth.errors.UserError: ")  # the worker's own line
                raise UserError(f"--executor ray: the embedding workers could not start ({last})") from None
            raise
        emb = cls(ray, actors, {**infos[0], "other_devices": [i["device"] for i in infos[1:]], "nodes": [i["node"] for i in infos]})
        emb.info = infos[0]
        emb._shipped = shipped
        return emb

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def device(self) -> str:
        """``ray:`` and each worker's device, e.g. ``ray:cpu,cpu``."""
        return "ray:" + ",".join(self.devices)

    def close(self) -> None:
        for a in self.actors:
            self._ray.kill(a)
        self.actors, self._shipped = [], None

    def encode_parts(self, parts: Sequence[Part], *, batch_size: int) -> Iterator[np.ndarray]:
        """Each part to the next free actor (a lost actor's to another); the vectors in order. The
        stage stops after :data:`PART_TRIES` tries of a part, or when no actor comes back within
        :data:`RESTART_WAIT` s."""
        ray = self._ray
        try:
            yield from self._deal(list(parts), batch_size)
        except ray.exceptions.RayTaskError as e:
            raise_cause(e)
        except ray.exceptions.RayError as e:  # the cluster went away
            raise self._failed(e) from None

    @staticmethod
    def _failed(e: BaseException | None, why: str = "") -> UserError:
        first = first_line(e) if e is not None else "lost"
        return UserError(
            f"--executor ray: an embedding worker failed ({first}){why}; finished shards are kept, rerun the same command to resume"
        )

    def _deal(self, parts: list[Part], batch_size: int) -> Iterator[np.ndarray]:
        ray = self._ray
        lost_errors = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)
        todo = deque(range(len(parts)))  # parts waiting for an actor, in order
        tries = [0] * len(parts)
        done: dict[int, np.ndarray] = {}
        free = deque(range(len(self.actors)))  # actors that answered and hold no part
        busy: dict[Any, tuple[int, int]] = {}  # ref -> (actor, part)
        asking: dict[Any, int] = {}  # a lost actor's describe() -> actor: it is back when it answers
        last: BaseException | None = None
        alone_since: float | None = None  # when the last actor was lost
        nxt = 0
        while nxt < len(parts):
            while todo and free:
                a, p = free.popleft(), todo.popleft()
                tries[p] += 1
                busy[self.actors[a].encode_part.remote(parts[p], batch_size)] = (a, p)
            if not busy and not asking:
                raise self._failed(last, ", and no embedding worker is left")
            timeout = None
            if not busy:  # every actor lost: wait a while for one to come back
                alone_since = alone_since or time.monotonic()
                timeout = alone_since + RESTART_WAIT - time.monotonic()
                if timeout <= 0:
                    raise self._failed(last, f", and none came back within {RESTART_WAIT:.0f} s")
            # Ray's driver prints its notes (a worker died, ...) on stdout: while waiting, to stderr
            with contextlib.redirect_stdout(sys.stderr):
                ready, _ = ray.wait([*busy, *asking], num_returns=1, timeout=timeout)
            for ref in ready:
                if ref in asking:
                    a = asking.pop(ref)
                    try:
                        info = ray.get(ref)
                    except ray.exceptions.ActorUnavailableError:  # not reachable yet: ask again
                        time.sleep(0.2)
                        asking[self.actors[a].describe.remote()] = a
                        continue
                    except ray.exceptions.RayError as e:  # its restarts used up: gone for good
                        last = e
                        continue
                    self.nodes[a], self.devices[a] = info["node"], info["device"]
                    free.append(a)
                    alone_since = None
                    continue
                a, p = busy.pop(ref)
                try:
                    done[p] = ray.get(ref)
                except lost_errors as e:  # its process or its node died: the part to another actor
                    last = e
                    if tries[p] >= PART_TRIES:
                        raise self._failed(e, f", on each of {tries[p]} tries of one part") from None
                    todo.appendleft(p)
                    asking[self.actors[a].describe.remote()] = a
                    continue
                free.append(a)
            while nxt in done:
                yield done.pop(nxt)
                nxt += 1

    def _encode(self, texts, *, batch_size, show_progress):
        raise NotImplementedError("RayEmbedder encodes through encode_parts (negsynth.embed.base.encode_parts)")


def _similarity_function():
    """sentence-transformers' ``SimilarityFunction`` (moved to ``util.similarity`` in version 6)."""
    try:
        from sentence_transformers.util.similarity import SimilarityFunction
    except ImportError:
        from sentence_transformers.similarity_functions import SimilarityFunction
    return SimilarityFunction


#: parts per worker a :class:`RaySentenceModel` call is cut into: a slow worker holds back one small part
PARTS_PER_WORKER = 4


class RaySentenceModel:
    """A stand-in for the ``SentenceTransformer`` mining uses, whose encoding runs on the actors of
    ``dealer`` (a :class:`RayEmbedder` started with ``raw=True``). ``encode*`` sort and batch the
    texts as the model's own ``encode`` does and deal runs of whole batches to the actors; the
    similarity search stays here, on the CPU. ``prompt``, ``prompt_name`` and ``pool`` are refused."""

    def __init__(self, dealer: Any, info: dict):
        from types import SimpleNamespace

        self.dealer = dealer
        self.info = info
        self.model_card_data = SimpleNamespace(base_model=info.get("base_model"))
        self.similarity_fn_name = info.get("similarity_fn_name") or "cosine"

    @property
    def device(self):
        import torch

        return torch.device("cpu")

    def get_embedding_dimension(self) -> int:
        return int(self.dealer.dim)

    get_sentence_embedding_dimension = get_embedding_dimension

    def similarity(self, a, b):
        return _similarity_function().to_similarity_fn(self.similarity_fn_name)(a, b)

    def similarity_pairwise(self, a, b):
        return _similarity_function().to_similarity_pairwise_fn(self.similarity_fn_name)(a, b)

    def _can_flatten_inputs(self) -> bool:
        return bool(self.info.get("flatten"))

    @staticmethod
    def _interleave_sorted_indices(order):
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer._interleave_sorted_indices(order)

    def encode_batches(
        self, batches: Sequence[list[str]], *, kind: str = "encode", batch_size: int, normalize: bool = True
    ) -> Iterator[np.ndarray]:
        """The vectors of ``batches``, in order: runs of whole batches dealt to the actors."""
        if not batches:
            return
        per = max(1, math.ceil(len(batches) / (PARTS_PER_WORKER * max(1, len(self.dealer.actors)))))
        how = kind if normalize else f"{kind}+raw"
        parts = [(how, [t for b in batches[i : i + per] for t in b], None) for i in range(0, len(batches), per)]
        yield from self.dealer.encode_parts(parts, batch_size=batch_size)

    def _encode(
        self,
        kind: str,
        inputs,
        *,
        batch_size: int = 32,
        normalize_embeddings: bool = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        prompt_name=None,
        prompt=None,
        pool=None,
        show_progress_bar=None,
        **kw,
    ):
        from negsynth.embed.mining import encode_order

        if prompt_name is not None or prompt is not None or pool is not None or kw:
            raise ValueError(f"RaySentenceModel.{_ST_CALLS[kind]}: prompt, prompt_name, pool and {sorted(kw)} are not supported")
        single = isinstance(inputs, str)
        texts = [inputs] if single else list(inputs)
        out = np.zeros((len(texts), self.get_embedding_dimension()), dtype=np.float32)
        if texts:
            order = encode_order([len(t) for t in texts], self)
            batches = [[texts[int(i)] for i in order[a : a + batch_size]] for a in range(0, len(texts), batch_size)]
            out[order] = np.concatenate(
                list(self.encode_batches(batches, kind=kind, batch_size=batch_size, normalize=normalize_embeddings))
            )
        if single:
            out = out[0]
        if convert_to_tensor:
            import torch

            return torch.from_numpy(out)
        return out

    def encode(self, inputs, **kw):
        return self._encode("encode", inputs, **kw)

    def encode_document(self, inputs, **kw):
        return self._encode("document", inputs, **kw)

    def encode_query(self, inputs, **kw):
        return self._encode("query", inputs, **kw)


class RayEmbedding:
    """``ctx.embedding`` under ``--executor ray``: a stage's ``[embedder]`` (:class:`RayEmbedder`)
    and mining model (:class:`RaySentenceModel`) on ``workers`` actors each, started when asked,
    stopped by :meth:`close`; ``given``: a caller's embedder, copied to the actors."""

    def __init__(self, reporter, *, workers: int, address: str | None, given: Any = None):
        self.reporter, self.workers, self.address, self.given = reporter, workers, address, given
        self.made: list[RayEmbedder] = []

    def embedder(self, embedder_cfg, *, raw: bool = False) -> RayEmbedder:
        """The actors of ``embedder_cfg`` (``raw``: the mining model's, for :meth:`mining_model`)."""
        emb = RayEmbedder.start(embedder_cfg, workers=self.workers, address=self.address, embedder=None if raw else self.given, raw=raw)
        self.made.append(emb)
        self.reporter.info(f"{'mining: ' if raw else ''}embedding on {self.workers} Ray worker(s) ({', '.join(emb.devices)})")
        return emb

    def mining_model(self, embedder_cfg) -> RaySentenceModel:
        from negsynth.embed.mining import check_mining_embedder

        check_mining_embedder(embedder_cfg)  # before any actor starts
        emb = self.embedder(embedder_cfg, raw=True)
        return RaySentenceModel(emb, emb.info)

    def close(self, nodes: list | None = None) -> None:
        for emb in self.made:
            if nodes is not None:  # where each actor last answered (a restarted one: its new node)
                nodes.extend(emb.nodes)
            emb.close()


@contextlib.contextmanager
def ray_embedding(ctx: StageContext, *, workers: int, address: str | None = None, nodes: list | None = None) -> Iterator[StageContext]:
    """``ctx`` with its embedding on ``workers`` Ray actors for the block; ``nodes`` gets each
    actor's Ray node id."""
    embedding = RayEmbedding(ctx.reporter, workers=workers, address=address, given=ctx.embedder)
    try:
        yield replace(ctx, embedder=None, embedding=embedding)
    finally:
        embedding.close(nodes)
