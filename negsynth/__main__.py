"""python -m negsynth == the negsynth command."""

from negsynth.cli import main

main()
