"""The ``negsynth`` command: one subcommand per stage, plus ``run``, ``serve``, ``inspect`` and more.

:mod:`~negsynth.cli.options`: the app, the shared options and the decorators that declare a
command; :mod:`~negsynth.cli.overrides`: options as ``--set`` overrides; :mod:`~negsynth.cli.guard`:
exit codes, one-line errors, signals; :mod:`~negsynth.cli.stages`: the stage commands and ``run``;
:mod:`~negsynth.cli.tools`: ``estimate``, ``serve``, ``config``, ``inspect``, ``export``. Importing
the package registers every command on :data:`app`, in that order.
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
