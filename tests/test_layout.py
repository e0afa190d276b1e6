"""The house rules, checked: which room may import which, no import cycles, a handful of top-level modules,
no function much over 60 lines without a comment saying why.

Imports are read from the source (``ast``): module-level imports, imports inside functions, and the string
names given to ``importlib.import_module`` and the catalog look-ups; ``if TYPE_CHECKING:`` imports do not count.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "dpcompare"

#: top-level modules: small, shared, importing only each other
BASE = {"errors", "files", "argtypes", "config", "options", "knobs", "checkpoint", "trace", "progress",
        "versions"}
#: top-level modules that stand above every room (they assemble the command line)
ENTRY = {"cli", "__main__", "doctor", "api"}
#: room → the rooms it may import (every room may import BASE); the torch-free catalogs are readable by all
ROOMS: dict[str, set[str]] = {
    "launch": set(),
    "models": set(),
    "data": {"models"},
    "backends": {"launch"},
    "training": {"launch", "backends", "models", "data"},
    "report": set(),
    "lab": {"launch"},
    "prediction": {"report"},
    "compare": {"launch", "backends", "models", "data", "report", "training", "lab", "prediction", "native"},
    "native": {"launch"},
}
CATALOGS = {"dpcompare.backends.catalog", "dpcompare.data.catalog", "dpcompare.models"}
MAX_TOP_LEVEL = 12  # modules, not counting __init__ and __main__
MAX_FUNCTION_LINES = 80
DYNAMIC = {"import_module", "_described", "_names"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every dpcompare module ``name`` imports, resolved to a module that exists."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + [node.module])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call):
            fn = node.func
            called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if called in DYNAMIC:
                for arg in node.args[:1]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        found.add(arg.value)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    resolved = {m for m in found if m in known and m.startswith("dpcompare")}
    return {m for m in resolved if m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "dpcompare"
    if parts[1] in ROOMS:
        return parts[1]
    return parts[1]  # a top-level module: BASE or ENTRY


def test_no_import_cycles() -> None:
    graph = _graph()
    # a package's __init__ and its own modules are one place: ignore edges into a parent package
    edges = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_rooms_import_only_what_they_may() -> None:
    bad = []
    for module, deps in _graph().items():
        src = _room(module)
        if src in ENTRY or src == "dpcompare":
            continue
        allowed = BASE | ROOMS.get(src, set()) | {src, "dpcompare"}
        for dep in deps:
            if dep in CATALOGS or _room(dep) in allowed:
                continue
            bad.append(f"{module} imports {dep}")
    assert not bad, "imports that climb or cross rooms:\n" + "\n".join(sorted(bad))


def test_a_handful_of_top_level_modules() -> None:
    top = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__"))
    unknown = set(top) - BASE - ENTRY
    assert not unknown, f"top-level modules that belong in a room: {sorted(unknown)}"
    assert len(top) <= MAX_TOP_LEVEL, top


def _long_functions() -> list[str]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            above = lines[max(node.lineno - 4, 0): node.lineno - 1]
            says_why = any("long because" in line for line in above)
            if length > MAX_FUNCTION_LINES and not says_why:
                out.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_function_much_over_60_lines_without_a_reason() -> None:
    long = _long_functions()
    assert not long, "functions over 80 lines (split them, or say '# long because ...' just above):\n" + "\n".join(long)


def test_every_room_says_what_it_holds_and_may_import() -> None:
    missing = []
    for init in sorted(PKG.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if "May import" not in doc:
            missing.append(init.parent.name)
    assert not missing, f"package docstrings without a 'May import' line: {missing}"
