"""The embedded LLM on a multi-node Ray cluster (docs/scale.md §4): one
:class:`~negsynth.llm.server.EmbeddedFleet` per alive node, all their URLs given to every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from negsynth.errors import UserError


class NodeFleet:
    """A Ray actor holding one node's :class:`~negsynth.llm.server.EmbeddedFleet`."""

    def __init__(self, serve: dict, model: str, log_dir: str, threads: int | None):
        import ray

        from negsynth.llm.server import EmbeddedFleet
        from negsynth.schemas.config import ServeConfig

        self.node = ray.get_runtime_context().get_node_id()
        # the address the node joined the cluster with (what the other nodes reach it by)
        host = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == self.node), None) or ray.util.get_node_ip_address()
        cfg = ServeConfig.model_validate({**serve, "host": host})
        self.fleet = EmbeddedFleet(cfg, model, log_dir=Path(log_dir) / f"node-{self.node[:8]}", threads=threads)

    def start(self) -> dict:
        self.fleet.start()
        return {"node": self.node, "urls": self.fleet.urls, "describe": self.fleet.describe()}

    def stop(self) -> None:
        self.fleet.stop()


def alive_nodes(ray) -> list[str]:
    """The ids of the cluster's alive nodes that have CPUs."""
    return [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]


def wanted(stage, ctx) -> bool:
    """Whether the stage needs the embedded LLM and has no endpoint yet."""
    return ctx.cfg.llm.base_url == "embedded" and ctx.base_url is None and stage.uses_llm(ctx.cfg)


@contextlib.contextmanager
def node_fleets(stage, ctx, ray, *, nodes: list[str] | None = None) -> Iterator[str | None]:
    """One embedded fleet per node (``nodes``, default every alive one with CPUs) for the block;
    yields their URLs joined by spaces, or None (no embedded LLM wanted, or a single node)."""
    if not wanted(stage, ctx):
        yield None
        return
    nodes = alive_nodes(ray) if nodes is None else nodes
    if len(nodes) < 2:
        yield None
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from negsynth.llm.server import llama_server_binary
    from negsynth.pipeline.embedded import keep_record, kept_threads

    cfg = ctx.cfg
    llama_server_binary(cfg.serve)  # none built here: one line naming the build script, before any node starts
    threads = None if cfg.serve.n_threads is not None else kept_threads(ctx.run_dir)
    actor = ray.remote(num_cpus=0, max_restarts=0)(NodeFleet)
    fleets = [
        actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            cfg.serve.model_dump(mode="json"), cfg.llm.model, str(Path(ctx.run_dir).resolve() / "logs"), threads
        )
        for node in nodes
    ]
    try:
        ctx.reporter.info(f"starting the embedded LLM ({cfg.llm.model}) on each of {len(nodes)} Ray nodes ...")
        try:
            started = ray.get([f.start.remote() for f in fleets])
        except ray.exceptions.RayError as e:
            first = (str(getattr(e, "cause", None) or e).strip().splitlines() or [type(e).__name__])[-1]
            raise UserError(f"{stage.name}: the embedded LLM did not start on every Ray node ({first}); see RUN_DIR/logs/node-*/") from None
        urls = [u for s in started for u in s["urls"]]
        for s in started:
            ctx.reporter.info(f"node {s['node'][:8]}: {s['describe']} at {', '.join(s['urls'])}")
        keep_record(ctx.run_dir, threads=threads or (cfg.serve.n_threads or 1), servers=len(urls))
        yield " ".join(urls)
    finally:
        for f in fleets:
            with contextlib.suppress(Exception):
                ray.get(f.stop.remote(), timeout=60)
            with contextlib.suppress(Exception):
                ray.kill(f)
