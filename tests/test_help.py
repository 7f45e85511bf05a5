"""Every command's --help renders, and every `pip install 'negsynth[X]'` hint (help texts and the
package's error messages) names an extra that pyproject.toml defines."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from typer.testing import CliRunner

from negsynth.cli import app

ROOT = Path(__file__).resolve().parent.parent
HINT = re.compile(r"negsynth\[([a-z0-9_,-]*)\]")


def extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def commands() -> list[str]:
    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.commands)


def test_every_help_renders_with_its_brackets():
    runner = CliRunner()
    known = extras()
    seen = []
    for name in commands():
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0, (name, r.output)
        assert "pip install 'negsynth'" not in r.output, name  # a swallowed [extra]
        for m in HINT.finditer(r.output):
            seen.append((name, m.group(1)))
            assert set(m.group(1).split(",")) <= known, (name, m.group(0))
    assert ("evaluate", "eval") in seen  # the hint that lost its brackets before


def test_every_install_hint_in_the_package_names_an_extra():
    known = extras()
    for path in (ROOT / "negsynth").rglob("*.py"):
        for m in HINT.finditer(path.read_text(encoding="utf-8")):
            assert set(m.group(1).split(",")) <= known, (path.name, m.group(0))


def test_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("negsynth ")
