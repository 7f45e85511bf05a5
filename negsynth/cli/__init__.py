"""The ``negsynth`` command: one subcommand per stage, plus ``run``, ``serve``, ``inspect`` and more.

Every stage command is a declaration: its own options, the shared ones (:class:`Options`, declared
once and added by :func:`stage_command`) and one call to
:func:`negsynth.pipeline.stage.run_stage`. ``--config FILE.toml`` (default: the built-in
embedded-LLM config), ``--run-dir DIR`` and ``--set section.key=value`` work everywhere. Errors
raised on purpose (:class:`negsynth.errors.NegsynthError`) end with one line on stderr and their
exit code, in one place (:func:`guarded`); ``--json`` prints machine-readable stats on stdout.

The package, by responsibility: :mod:`~negsynth.cli.options` (the app, the shared options and
the decorators that declare a command), :mod:`~negsynth.cli.overrides` (options as ``--set``
overrides of the config), :mod:`~negsynth.cli.guard` (exit codes, errors and signals as one
line), :mod:`~negsynth.cli.stages` (the stage commands and ``run``) and
:mod:`~negsynth.cli.tools` (``estimate``, ``serve``, ``config``, ``inspect``,
``export``). Importing it registers every command on :data:`app`, in that order; it exports
the app, the exit codes and the entry point.
"""

from __future__ import annotations

from negsynth.cli import stages, tools  # noqa: F401  (importing them registers their commands on app)
from negsynth.cli.guard import EXIT_BUDGET, EXIT_ENV, EXIT_PENDING, guarded, run_app
from negsynth.cli.options import app
from negsynth.cli.overrides import config_sets, embedder_overrides

__all__ = ["EXIT_BUDGET", "EXIT_ENV", "EXIT_PENDING", "app", "config_sets", "embedder_overrides", "guarded", "main"]


def main() -> None:
    """The ``negsynth`` console entry point (``[project.scripts]``): every command, registered."""
    run_app(app)
