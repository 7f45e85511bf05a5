"""``python -m negsynth.cli``: the ``negsynth`` command."""

from negsynth.cli import main

main()
