"""One executor object, chosen once: ``--executor`` names it, and the stages never see which."""

from __future__ import annotations

import pytest

from negsynth.errors import UserError
from negsynth.pipeline.executor import LocalExecutor, RayExecutor, executor_for
from negsynth.stages import METHOD, get


def test_the_executor_is_chosen_by_name_and_an_unknown_one_is_refused_in_one_line():
    assert isinstance(executor_for("local"), LocalExecutor) and not isinstance(executor_for("local"), RayExecutor)
    ray = executor_for("ray", workers=3, address="auto", method=METHOD)
    assert isinstance(ray, RayExecutor) and (ray.workers, ray.address) == (3, "auto")
    with pytest.raises(UserError, match="--executor 'slurm': choose local or ray"):
        executor_for("slurm")


def test_ray_refuses_a_stage_that_does_not_split_and_names_those_that_do():
    ray = executor_for("ray", workers=2, method=METHOD)
    with pytest.raises(UserError) as e:
        ray.check(get("curriculum"))
    msg = str(e.value)
    assert "curriculum does not split into Ray workers" in msg and "\n" not in msg
    splits = msg.split("it splits: ")[1].rstrip(")").split(", ")
    assert splits == list(dict.fromkeys([s.name for s in METHOD if s.shardable] + [s.name for s in METHOD if s.embeds]))
    for name in splits:
        ray.check(get(name))  # these pass
    LocalExecutor().check(get("curriculum"))  # locally every stage runs
