"""Shard and dataset IO (JSONL shards, atomic writes, dataset adapters)."""

from negsynth.data.shards import (
    PartialWriter,
    ShardError,
    atomic_write_json,
    atomic_write_text,
    iter_jsonl,
    list_shards,
    read_stage,
    shard_name,
    write_jsonl,
)

__all__ = [
    "PartialWriter",
    "ShardError",
    "atomic_write_json",
    "atomic_write_text",
    "iter_jsonl",
    "list_shards",
    "read_stage",
    "shard_name",
    "write_jsonl",
]
