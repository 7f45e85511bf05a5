"""Every list of stages outside ``METHOD`` is derived from it or checked against it here, so that
adding a stage (a module, one ``METHOD`` line, a config section) cannot leave a list behind."""

from __future__ import annotations

import ast
from pathlib import Path

import typer.main

from negsynth.cli import app
from negsynth.schemas.config import PipelineConfig
from negsynth.schemas.records import Example
from negsynth.stages import METHOD

NAMES = [s.name for s in METHOD]
CLI = Path(__file__).resolve().parent.parent / "negsynth" / "cli"
#: the module of the stage commands
STAGE_COMMANDS = CLI / "stages.py"


def _stage_commands() -> list[tuple[str, set[str]]]:
    """(command, the stage names it passes to ``_run``/``_execute``) for each ``@stage_command``
    in cli/stages.py whose name is a stage, in source order."""
    out = []
    for node in ast.parse(STAGE_COMMANDS.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.FunctionDef) or node.name not in NAMES:
            continue
        deco = {d.func.id for d in node.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Name)}
        assert "stage_command" in deco, node.name
        called = {
            c.args[0].value
            for c in ast.walk(node)
            if isinstance(c, ast.Call)
            and isinstance(c.func, ast.Name)
            and c.func.id in ("_run", "_execute")
            and c.args
            and isinstance(c.args[0], ast.Constant)
        }
        out.append((node.name, called))
    return out


def test_every_stage_has_its_command_in_the_method_order():
    # the stage commands live in one module: no other module of the command declares one
    elsewhere = [
        f"{path.name}: {node.name}"
        for path in sorted(CLI.glob("*.py"))
        if path != STAGE_COMMANDS
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.FunctionDef) and node.name in NAMES
    ]
    assert not elsewhere, elsewhere
    cmds = _stage_commands()  # a stage needing options of its own declares its command there
    assert [name for name, _ in cmds] == [n for n in NAMES if n in dict(cmds)]
    for name, called in cmds:
        assert called == {name}, (name, called)
    registered = list(typer.main.get_command(app).commands)  # any other stage gets the generic command
    assert set(NAMES) <= set(registered)
    assert [c for c in registered if c in dict(cmds)] == [name for name, _ in cmds]


def test_every_stage_section_is_a_section_of_the_run_file():
    """A stage's ``config`` class validates its ``[name]`` table: RunConfig's own field, or the
    section the method brings (``run_config_class(sections())``)."""
    from negsynth.schemas.config import RunConfig, run_config_class
    from negsynth.stages import sections

    fields = run_config_class(sections()).model_fields
    for s in METHOD:
        if s.config is not None and s.name in RunConfig.model_fields:
            assert fields[s.name].annotation is s.config, s.name
        elif s.config is not None:
            assert fields[s.name].annotation is s.config and fields[s.name].default_factory is s.config, s.name


def test_inspect_order_and_example_stages_follow_the_method(tmp_path):
    """inspect and export read the run's latest examples from the same stage: score's, else the
    last stage of the method that made some."""
    from negsynth.export.common import examples_stage
    from negsynth.inspect import stage_order
    from negsynth.inspect.report import example_stage

    assert list(stage_order()) == NAMES
    makers = [s.name for s in METHOD if s.records is Example and s.name != "score"]
    for present in (makers[:1], makers, [*makers, "score"]):
        for st in present:
            (tmp_path / st).mkdir(exist_ok=True)
            (tmp_path / st / "shard-00000.jsonl").write_text("{}\n")
        assert examples_stage(tmp_path) == tmp_path / present[-1]
        assert example_stage({st: [tmp_path / st / "shard-00000.jsonl"] for st in ["brainstorm", *present]}) == present[-1]


def test_which_stages_call_the_llm_and_split_is_read_from_each_stage_under_the_config():
    from negsynth.pipeline.executor import split_stages
    from negsynth.schemas.config import RunConfig

    cfg = RunConfig()
    assert [s.name for s in METHOD if s.uses_llm(cfg)] == ["brainstorm", "generate", "regenerate", "corpus", "heldout"]
    mined = RunConfig.model_validate({"regenerate": {"negatives": "mined"}})
    assert [s.name for s in METHOD if s.uses_llm(mined)] == ["brainstorm", "generate", "corpus", "heldout"]
    assert split_stages(METHOD, cfg) == ("generate", "regenerate", "corpus", "score")


def test_default_pipeline_is_the_method_in_order():
    """``pipeline.stages`` (a config default, below the stages' layer) names stages of the method,
    in its order: the method without regenerate, corpus and heldout, which start from other data."""
    default = PipelineConfig().stages
    assert set(default) <= set(NAMES)
    assert default == [n for n in NAMES if n in default]
    assert default == [n for n in NAMES if n not in ("regenerate", "corpus", "heldout")]
