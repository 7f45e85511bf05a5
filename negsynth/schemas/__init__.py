"""Shared vocabulary of negsynth: records and configs. Imports nothing else of the package."""

from negsynth.schemas.config import RunConfig
from negsynth.schemas.records import Example, ExampleScore, Reject, Task, Usage

__all__ = ["Example", "ExampleScore", "Reject", "RunConfig", "Task", "Usage"]
