"""Shard IO: atomic writes."""


def test_atomic_writes_get_umask_permissions(tmp_path):
    import os
    import stat

    from negsynth.data.shards import write_jsonl

    p = tmp_path / "shard-00000.jsonl"
    write_jsonl(p, [{"a": 1}])
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask
