"""One executor object, chosen once: ``--executor`` names it, and the stages never see which."""

from __future__ import annotations

import pytest

from negsynth.errors import UserError
from negsynth.pipeline.executor import LocalExecutor, RayExecutor, executor_for
from negsynth.schemas.config import RunConfig
from negsynth.stages import METHOD, get


def test_the_executor_is_chosen_by_name_and_an_unknown_one_is_refused_in_one_line():
    assert isinstance(executor_for("local"), LocalExecutor) and not isinstance(executor_for("local"), RayExecutor)
    ray = executor_for("ray", workers=3, address="auto", method=METHOD)
    assert isinstance(ray, RayExecutor) and (ray.workers, ray.address) == (3, "auto")
    with pytest.raises(UserError, match="--executor 'slurm': choose local or ray"):
        executor_for("slurm")


def test_ray_refuses_a_stage_that_does_not_split_and_names_those_that_do():
    """Under the config at hand: an LLM stage that splits runs as ranks, one that embeds has its
    embedding on the workers; brainstorm (one shard) and the derived stages are refused."""
    cfg = RunConfig()
    ray = executor_for("ray", workers=2, method=METHOD)
    with pytest.raises(UserError) as e:
        ray.check(get("curriculum"), cfg)
    msg = str(e.value)
    assert "curriculum does not split into Ray workers" in msg and "\n" not in msg
    splits = msg.split("it splits: ")[1].rstrip(")").split(", ")
    assert splits == ["generate", "regenerate", "corpus", "score"]
    for name in splits:
        ray.check(get(name), cfg)  # these pass
    for name in ("brainstorm", "train", "evaluate"):
        with pytest.raises(UserError):
            ray.check(get(name), cfg)
    mined = RunConfig.model_validate({"regenerate": {"negatives": "mined"}})
    assert (ray.world_size(get("regenerate"), cfg), ray.world_size(get("regenerate"), mined)) == (2, 1)  # mined: no LLM, no ranks
    LocalExecutor().check(get("curriculum"), cfg)  # locally every stage runs
