"""The package's layers, as docs/architecture.md states them, checked on every import statement
(module level and inside functions alike, read with ``ast``): a module imports only its own layer
or the layers below it, and no two modules import each other, directly or in a loop."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "negsynth"

#: bottom to top; a module may import its own layer and those below it
LAYERS: list[set[str]] = [
    {"errors", "aio", "faults", "resources"},
    {"prompts"},
    {"schemas"},
    {"data"},
    {"validators", "llm", "embed"},
    {"train", "evaluate"},
    {"pipeline"},
    {"stages"},
    {"export", "inspect", "report_html", "estimate"},
    # the package root offers the API's names (resolved from api on first use): it sits with the API,
    # so a module below that reads ``negsynth.__version__`` or ``import negsynth`` is an upward import
    {"cli", "__main__", "api", "negsynth"},
]


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "negsynth"
    return next(i for i, names in enumerate(LAYERS) if top in names)


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_imports(mod: str, source: str, modules: set[str], *, is_pkg: bool = False) -> set[str]:
    """The package modules ``mod`` imports: ``import`` statements, ``from negsynth.x import y``
    (x.y when that is a module, else x) and ``importlib.import_module("negsynth.x")`` with a literal."""
    deps: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        deps |= {n for n in names if n == "negsynth" or n.startswith("negsynth.")}
    # a name imported from a package resolves to the package's __init__ or the submodule
    return {d if d in modules else d.rsplit(".", 1)[0] for d in deps} - {mod}


def imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports (:func:`module_imports`)."""
    modules = {module_name(p): p for p in PKG.rglob("*.py")}
    return {
        mod: module_imports(mod, path.read_text(encoding="utf-8"), set(modules), is_pkg=path.name == "__init__.py")
        for mod, path in modules.items()
    }


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{mod} -> {d}" for mod, deps in graph.items() for d in deps if layer_of(d) > layer_of(mod))


def test_no_module_imports_a_layer_above_its_own():
    bad = upward_imports(imports())
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_check_sees_the_imports_that_run_back_up():
    """The package root, an ``import_module`` literal and a function-level import each count: a
    pipeline module reading the root's version, or the data layer loading a stage, is refused."""
    modules = {"negsynth", "negsynth.api", "negsynth.stages", "negsynth.pipeline.manifest", "negsynth.data.shards"}
    graph = {
        "negsynth.pipeline.manifest": module_imports(
            "negsynth.pipeline.manifest", "from negsynth import __version__\nfrom negsynth.data.shards import x", modules
        ),
        "negsynth.data.shards": module_imports(
            "negsynth.data.shards", "def f():\n    import importlib\n    importlib.import_module('negsynth.stages')", modules
        ),
        "negsynth": module_imports("negsynth", "import importlib\nimportlib.import_module('negsynth.api')", modules, is_pkg=True),
    }
    assert upward_imports(graph) == ["negsynth.data.shards -> negsynth.stages", "negsynth.pipeline.manifest -> negsynth"]


def test_no_module_imports_another_modules_private_name():
    """A name another module needs is public: ``from negsynth.x import _y`` is refused."""
    bad = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("negsynth"):
                bad += [
                    f"{module_name(path)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not bad, "private names imported across modules:\n" + "\n".join(sorted(bad))


def test_no_import_cycle_between_modules():
    graph = imports()
    # a package's __init__ may re-export its own submodules; those edges are not a design cycle
    edges = {
        m: {d for d in ds if not (m == d.rsplit(".", 1)[0] and Path(PKG.parent, *m.split("."), "__init__.py").exists())}
        for m, ds in graph.items()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_stages_import_the_pipeline_through_its_surface():
    """A stage imports ``negsynth.pipeline`` (its ``__init__``), never one of its modules: what the
    stages may use of the pipeline is the package's ``__all__``."""
    deep = [
        f"{m} -> {d}" for m, ds in imports().items() if m.startswith("negsynth.stages") for d in ds if d.startswith("negsynth.pipeline.")
    ]
    assert not deep, "deep pipeline imports:\n" + "\n".join(sorted(deep))


def test_the_pipeline_surface_names_what_it_imports():
    """``__all__`` is exactly what the package imports from its modules (one name, one home)."""
    import negsynth.pipeline as surface

    tree = ast.parse((PKG / "pipeline" / "__init__.py").read_text(encoding="utf-8"))
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}
    assert sorted(surface.__all__) == sorted(imported)


def test_the_package_api_is_lazy_and_each_name_has_one_home():
    """``import negsynth`` loads none of its modules; ``negsynth.run`` / ``load_config`` /
    ``training_data`` / ``sample_corpus`` are :mod:`negsynth.api`'s objects (one import path each)."""
    import subprocess
    import sys

    import negsynth
    from negsynth import api

    probe = "import sys, negsynth; print(sorted(m for m in sys.modules if m.startswith('negsynth.')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert sorted(negsynth.__all__) == sorted(api.__all__)
    for name in negsynth.__all__:
        assert getattr(negsynth, name) is getattr(api, name)
    # the public load_config knows every stage's section (a stage's own table, as [heldout])
    cfg = negsynth.load_config(None, ["heldout.queries=7"])
    assert cfg.heldout.queries == 7
    try:
        negsynth.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("negsynth.no_such_name resolved")


def test_modules_and_functions_stay_a_size_a_reader_can_hold():
    """No module of the package over 600 lines, no function over 80: a change that grows one past
    that splits it (by responsibility) instead."""
    root = Path(__file__).resolve().parent.parent / "negsynth"
    too_long = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(root.parent)
        if len(text.splitlines()) > 600:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80:
                too_long.append(f"{name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long, too_long
