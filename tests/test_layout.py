"""The house rules that docs/layout.md states, checked on the source (``ast``, nothing imported).

- **Imports.** Every import is an edge: module-level, inside functions, into a package's ``__init__`` (a module
  like any other) and ``importlib.import_module``: a constant name is followed; a variable is followed to the
  table it comes from (:data:`FOLLOWED`, or the constant arguments of the function whose parameter it is), or it
  loads the user's code where :data:`USER_CODE` says so and why; any other is refused. ``if TYPE_CHECKING:``
  imports do not count for the rooms. ``from P import x`` is an edge to the module ``P.x`` when there is one,
  else to ``P``.
- **No cycles** in that graph with the ``if TYPE_CHECKING:`` imports added: a circle a reader must follow is one
  even when only the type checker walks it.
- **Rooms.** Each room's ``__init__`` docstring has a line ``May import: the top-level modules, launch and
  backends.``; a room imports only what its line names (its own modules, the top-level modules, the named rooms
  and the catalogs), its line names only rooms :data:`ROOMS` allows, and docs/layout.md's table says the same.
  No room and no top-level module imports the root package (whose ``__getattr__`` reaches everything).
  Top-level modules import only each other and the catalogs; catalogs import nothing outside the standard
  library, the top-level modules and other catalogs at module level.
- At most :data:`MAX_TOP_LEVEL` top-level modules, each listed here.
- No function over :data:`MAX_FUNCTION_LINES` lines without ``# long because ...`` just above it.
- Every file is written through ``files.atomic_write*`` (the call sits inside its arguments), or the line says
  ``# not atomic: why``; docs/layout.md lists exactly the files that say so.
- ``subprocess.Popen`` is called only in the two files docs/layout.md names (``launch/jobs.py``,
  ``launch/submission.py``).
- Every ``torch.load`` passes ``weights_only=True``.
- Outside ``backends/`` (and the script arms' table, :data:`NAME_TABLES`) no comparison (``==``, ``!=``, ``in``,
  ``is``; on the AST) of what holds a strategy's or an arm's name (a name, attribute or subscript key called
  ``strategy``, ``arm``, ``name`` or their plurals), or of what a call returns, with a strategy's name
  (:func:`strategy_names`, read from the catalog) or a literal tuple, list or set holding one; no lookup keyed
  by a strategy's name and no dict literal keyed by one; the few that ask no strategy say why in
  :data:`NOT_STRATEGY_TESTS`.
- A knob is declared alike in its three files (``config.py``'s knobs group, ``knobs.TABLE``, the catalog's
  ``knobs``); docs/layout.md names the train settings an axis shadows; nothing imports ``api/`` but ``cli`` and
  the root package.
- docs/layout.md says how many methods a new strategy writes and may override: the counts of ``Strategy``'s
  abstract and overridable methods; no strategy overrides a final one; no ``getattr(self, ...)`` probes.

The same functions run on throwaway packages (the last tests) to show that each check fails when it should.
"""

from __future__ import annotations

import ast
import graphlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: top-level modules: small, shared, importing only each other and the catalogs
BASE = frozenset({"errors", "files", "argtypes", "config", "options", "knobs", "checkpoint", "trace", "progress",
                  "versions"})
#: top-level modules (and api/) that stand above every room: they assemble the command line
ENTRY = frozenset({"cli", "__main__", "doctor", "api"})
#: room → the rooms it may import at most (its ``May import`` line may name fewer)
ROOMS: dict[str, frozenset[str]] = {
    "launch": frozenset(),
    "models": frozenset(),
    "data": frozenset({"models"}),
    "backends": frozenset({"launch"}),
    "training": frozenset({"launch", "backends", "models", "data"}),
    "report": frozenset(),
    "lab": frozenset({"launch"}),
    "prediction": frozenset({"report"}),
    "compare": frozenset({"launch", "backends", "models", "data", "report", "training", "lab", "prediction",
                          "native"}),
    "native": frozenset({"launch"}),
}
#: torch-free tables any module may read (what keeps ``dpcompare --help`` light)
CATALOGS = frozenset(
    {
        "dpcompare.backends.catalog",
        "dpcompare.data.catalog",
        "dpcompare.models",
        "dpcompare.models.catalog",
        "dpcompare.launch.openmpi",
    }
)
#: ``import_module(variable)`` in ``module:function`` → the table (module, name) whose strings it imports
FOLLOWED: dict[str, tuple[str, str, str]] = {
    "dpcompare.cli:build_parser": ("dpcompare.cli", "COMMAND_MODULES", ""),
    "dpcompare.backends.registry:get": ("dpcompare.backends.catalog", "STRATEGIES", "dpcompare.backends."),
    "dpcompare.prediction.strategies:schedules": ("dpcompare.backends.catalog", "STRATEGIES", "dpcompare.prediction."),
    "dpcompare.training.trackers:require": ("dpcompare.argtypes", "TRACKERS", ""),
}
#: ``import_module(variable)`` that imports the user's code, not dpcompare's: ``module:function`` → why
USER_CODE: dict[str, str] = {
    "dpcompare.files:load_attr": "--strategy/--workload/--model/--dataset MODULE:ATTR: the user's plug-in module",
}
MAX_TOP_LEVEL = 12  # modules, not counting __init__ and __main__
MAX_FUNCTION_LINES = 60
NOT_ATOMIC = "# not atomic:"
#: what holds a strategy's or an arm's name: a variable, attribute or subscript key called so (``arm``,
#: ``spec.strategy``, ``r["strategy"]``, ``base_name``, ``arms``)
STRATEGY_HOLDER = re.compile(r"(^|_)(strateg(y|ies)|arms?|names?)$")
#: such comparisons, lookups and dict keys that ask no strategy: (file in the package, as reported) → why
NOT_STRATEGY_TESTS: dict[tuple[str, str], str] = {
    ("native/hook.py", "name == 'horovod'"): "the module being imported is the horovod package, not a strategy",
    ("native/runner.py", "arm == 'native'"): "the script runner's --as: what `import horovod` means in the script",
    ("native/runner.py", "arm == 'horovod'"): "the script runner's --as: what `import horovod` means in the script",
    ("versions.py", "{'horovod': ...}"): "the Horovod library's version, among the other libraries'",
    ("doctor.py", "v['horovod']"): "the Horovod library's version, among the other libraries'",
    ("native/migrate.py", "{'native': ...}"): "a Horovod call's native PyTorch equivalent (calls.Call.native)",
    ("native/command.py", "c['native']"): "a Horovod call's native PyTorch equivalent (calls.Call.native)",
}


#: files outside ``backends/`` that declare names :func:`strategy_names` reads, with their facts: file → why
NAME_TABLES: dict[str, str] = {
    "native/calls.py": "the script arms (SCRIPT_ARMS): the native layer's facts and each arm's elastic launcher",
}


@dataclass(frozen=True)
class Rules:
    """What the checks run on: a package folder and its layout (dpcompare's, or a throwaway one in a test)."""

    pkg: Path
    base: frozenset[str] = BASE
    entry: frozenset[str] = ENTRY
    rooms: dict[str, frozenset[str]] = field(default_factory=lambda: dict(ROOMS))
    catalogs: frozenset[str] = CATALOGS
    followed: dict[str, tuple[str, str, str]] = field(default_factory=lambda: dict(FOLLOWED))
    user_code: dict[str, str] = field(default_factory=lambda: dict(USER_CODE))
    max_lines: int = MAX_FUNCTION_LINES

    @property
    def root(self) -> str:
        return self.pkg.name

    def modules(self) -> dict[str, Path]:
        out = {}
        for path in sorted(self.pkg.rglob("*.py")):
            parts = path.relative_to(self.pkg.parent).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
        return out

    def room(self, module: str) -> str:
        """The room of ``module`` (``training``), its own name for a top-level one (``config``), or the root."""
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else module


DPCOMPARE = Rules(REPO / "dpcompare")


# -- the import graph --------------------------------------------------------------------------------------------

def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _known(name: str, known: set[str]) -> str | None:
    """``name``, or the longest of its prefixes that is a module of the package (None outside it)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in known:
            return ".".join(parts[:i])
    return None


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _table(rules: Rules, module: str, name: str) -> set[str]:
    """The strings in ``module``'s top-level assignment to ``name`` (a table of module names)."""
    tree = ast.parse(rules.modules()[module].read_text())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            return _strings(node.value)
    raise AssertionError(f"{module} has no table {name}")


class _Imports(ast.NodeVisitor):
    """The modules of the package that one module imports, and the dynamic imports it cannot follow."""

    def __init__(self, rules: Rules, name: str, path: Path, known: set[str], typing: bool = False) -> None:
        self.rules, self.name, self.path, self.known, self.typing = rules, name, path, known, typing
        self.tree = ast.parse(path.read_text())
        self.found: set[str] = set()
        self.unfollowed: list[str] = []
        self.functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []

    def run(self) -> _Imports:
        self.visit(self.tree)
        self.found.discard(self.name)
        return self

    def add(self, name: str) -> None:
        m = _known(name, self.known)
        if m:
            self.found.add(m)

    def visit_If(self, node: ast.If) -> None:
        skip = _is_type_checking(node) and not self.typing
        for child in (node.orelse if skip else [node.test, *node.body, *node.orelse]):
            self.visit(child)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.add(a.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            pkg = self.name.split(".") if self.path.name == "__init__.py" else self.name.split(".")[:-1]
            base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
        for a in node.names:  # a module of the package, else a name that ``base`` defines
            self.add(f"{base}.{a.name}" if f"{base}.{a.name}" in self.known else base)

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        if (fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")) == "import_module" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                self.add(arg.value)
            else:
                self.dynamic(node, arg)
        self.generic_visit(node)

    def dynamic(self, node: ast.Call, arg: ast.expr) -> None:
        """``import_module(variable)``: followed to its table or its callers' constants, or the user's code."""
        outer = self.functions[0].name if self.functions else "<module>"
        where = f"{self.name}:{outer}"
        if where in self.rules.followed:
            module, table, prefix = self.rules.followed[where]  # a table may hold several kinds of names
            if not any(isinstance(n, ast.Name) and n.id == table for n in ast.walk(self.functions[0])):
                self.unfollowed.append(f"{self.path}:{node.lineno}: {outer} does not read {table}")
            named = (s.partition(":")[0] for s in _table(self.rules, module, table))  # MODULE or MODULE:ATTR
            self.found.update(m for m in named if m in self.known and m.startswith(prefix))
        elif where in self.rules.user_code:
            pass
        elif isinstance(arg, ast.Name) and (callers := self.callers_constants(arg.id)) is not None:
            self.found.update(m for s in callers if (m := _known(s, self.known)))
        else:
            self.unfollowed.append(f"{self.path}:{node.lineno}: import_module({ast.unparse(arg)}) in {outer}")

    def callers_constants(self, param: str) -> set[str] | None:
        """The constants every call in this module passes as the enclosing function's parameter ``param``;
        None when it is no parameter or a call passes something else."""
        fn = next((f for f in reversed(self.functions) if param in [a.arg for a in f.args.args]), None)
        if fn is None:
            return None
        index = [a.arg for a in fn.args.args].index(param)
        values: set[str] = set()
        for call in ast.walk(self.tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == fn.name):
                continue
            given = ([k.value for k in call.keywords if k.arg == param]
                     or (call.args[index:index + 1] if len(call.args) > index else []))
            if not given or not (isinstance(given[0], ast.Constant) and isinstance(given[0].value, str)):
                return None
            values.add(given[0].value)
        return values or None


def graph(rules: Rules, typing: bool = False) -> tuple[dict[str, set[str]], list[str]]:
    """Module → the package's modules it imports (``typing``: the ``if TYPE_CHECKING:`` ones too); and every
    ``import_module`` that could not be followed."""
    mods = rules.modules()
    known = set(mods)
    edges, unfollowed = {}, []
    for name, path in mods.items():
        found = _Imports(rules, name, path, known, typing).run()
        edges[name] = found.found
        unfollowed += found.unfollowed
    return edges, unfollowed


def cycle(rules: Rules) -> list[str]:
    """An import cycle (``a -> b -> a``), imports inside functions and ``if TYPE_CHECKING:`` included, or nothing."""
    try:
        tuple(graphlib.TopologicalSorter(graph(rules, typing=True)[0]).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return []


# -- rooms ------------------------------------------------------------------------------------------------------

TOP_LEVEL = "the top-level modules"


def may_import(doc: str, rules: Rules) -> set[str] | None:
    """The rooms named by ``doc``'s ``May import: the top-level modules, launch and backends.`` sentence (with
    ``TOP_LEVEL`` for the top-level modules, every room for ``anything``); None when there is none. A word that
    is neither is a failure."""
    text = " ".join(doc.split())
    m = re.search(r"May import: (.*?)\.(?:\s|$)", text)
    if not m:
        return None
    items = [i.strip().strip("`").removesuffix("/") for i in re.split(r",|\band\b", m.group(1).removesuffix(" only"))]
    if items == ["anything"]:
        return {TOP_LEVEL, *rules.rooms}
    unknown = [i for i in items if i != TOP_LEVEL and i not in rules.rooms]
    assert not unknown, f"'May import: {m.group(1)}.' names {unknown}: neither a room nor {TOP_LEVEL!r}"
    return set(items)


def room_lines(rules: Rules) -> dict[str, set[str] | None]:
    """Every room's (and top-level package's) ``May import`` line, parsed."""
    return {init.parent.name: may_import(ast.get_docstring(ast.parse(init.read_text())) or "", rules)
            for init in sorted(rules.pkg.glob("*/__init__.py"))}


def room_violations(rules: Rules) -> list[str]:
    """Imports that climb or cross rooms, and ``May import`` lines that say more than :data:`ROOMS` allows."""
    lines = room_lines(rules)
    bad = [f"{room}/__init__.py says it may import {sorted(named - rules.rooms[room] - {TOP_LEVEL})}, which the "
           f"ROOMS table does not allow" for room, named in lines.items()
           if room in rules.rooms and named is not None and named - rules.rooms[room] - {TOP_LEVEL}]
    edges, _ = graph(rules)
    for module, deps in edges.items():
        src = rules.room(module)
        if module == rules.root or src in rules.entry:
            continue
        for dep in sorted(deps):
            if dep == rules.root:
                bad.append(f"{module} imports the root package {rules.root} (whose __getattr__ reaches everything)")
            elif dep not in rules.catalogs and not _allowed(rules, src, rules.room(dep), lines.get(src)):
                bad.append(f"{module} imports {dep}")
    return bad


def _allowed(rules: Rules, src: str, dst: str, line: set[str] | None) -> bool:
    if src in rules.base:  # a top-level module: the others only
        return dst in rules.base
    named = line or set()
    return dst == src or (dst in rules.base and TOP_LEVEL in named) or dst in named


def catalog_violations(rules: Rules) -> list[str]:
    """Module-level imports of a catalog outside the standard library, the top-level modules and the catalogs."""
    bad = []
    mods = rules.modules()
    for cat in sorted(rules.catalogs & set(mods)):
        for node in ast.parse(mods[cat].read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for n in names:
                top = n.split(".")[0]
                ok = (top in sys.stdlib_module_names or top == "__future__" or n in rules.catalogs
                      or (top == rules.root and rules.room(n) in rules.base))
                if not ok:
                    bad.append(f"catalog {cat} imports {n} at module level")
    return bad


# -- functions and writes ----------------------------------------------------------------------------------------

def long_functions(rules: Rules) -> list[str]:
    out = []
    for path in sorted(rules.pkg.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            says_why = any("long because" in line for line in lines[max(first - 4, 0): first - 1])
            if length > rules.max_lines and not says_why:
                out.append(f"{path.relative_to(rules.pkg.parent)}:{node.lineno} {node.name} ({length} lines)")
    return out


def _writes(node: ast.Call) -> bool:
    """Opens a file for writing, or writes one: open(..., "w"/"a"/"x"/"+"), write_text/write_bytes, savefig,
    torch.save."""
    fn = node.func
    name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
    if name == "open" and not (isinstance(fn, ast.Attribute) and getattr(fn.value, "id", "") == "os"):
        modes = [*node.args[1:2], *(k.value for k in node.keywords if k.arg == "mode")]
        return any(isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax+")
                   for m in modes)
    return name in ("write_text", "write_bytes", "savefig") or (
        name == "save" and isinstance(fn, ast.Attribute) and getattr(fn.value, "id", "") == "torch")


def unatomic_writes(rules: Rules) -> list[str]:
    """File writes outside ``files.py`` that no ``atomic_write*`` call wraps and no ``# not atomic:`` excuses."""
    out = []
    for path in sorted(rules.pkg.rglob("*.py")):
        if path == rules.pkg / "files.py":
            continue
        lines = path.read_text().splitlines()
        for node, atomic in _calls(ast.parse("\n".join(lines))):
            if atomic or not _writes(node):
                continue
            span = lines[max(node.lineno - 2, 0): node.end_lineno or node.lineno]
            if not any(NOT_ATOMIC in line for line in span):
                out.append(f"{path.relative_to(rules.pkg.parent)}:{node.lineno} {ast.unparse(node)[:80]}")
    return out


def _calls(node: ast.AST, atomic: bool = False) -> Iterator[tuple[ast.Call, bool]]:
    """Every call, and whether it sits inside the arguments of an ``atomic_write*`` call."""
    if isinstance(node, ast.Call):
        yield node, atomic
        fn = node.func
        atomic = atomic or (fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")).startswith(
            "atomic_write")
    for child in ast.iter_child_nodes(node):
        yield from _calls(child, atomic)


def unsafe_loads(rules: Rules) -> list[str]:
    """``torch.load`` calls without ``weights_only=True`` (which would unpickle anything a file holds)."""
    out = []
    for path in sorted(rules.pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                    and getattr(node.func.value, "id", "") == "torch"
                    and not any(k.arg == "weights_only" and getattr(k.value, "value", None) is True
                                for k in node.keywords)):
                out.append(f"{path.relative_to(rules.pkg.parent)}:{node.lineno} {ast.unparse(node)[:80]}")
    return out


def strategy_names(pkg: Path) -> frozenset[str]:
    """The strategies' and arms' names, read from the source: the keys of the catalog's table of ``Entry``
    lines (``backends/catalog.py``), their elastic modes (``ddp-elastic``), and a script comparison's arms
    (``native/calls.py``'s ``SCRIPT_ARMS``)."""
    names: set[str] = set()
    for rel in ("backends/catalog.py", "native/calls.py"):
        path = pkg / rel
        for node in ast.walk(ast.parse(path.read_text())) if path.exists() else ():
            if isinstance(node, ast.Dict) and node.values and all(
                    isinstance(v, ast.Call) and getattr(v.func, "id", "") == "Entry" for v in node.values):
                names |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SCRIPT_ARMS" for t in node.targets):
                names |= {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)}
    return frozenset(names | {f"{n}-elastic" for n in names})


def _holds_strategy(node: ast.expr) -> bool:
    """A name, attribute or subscript called like what holds a strategy's name (:data:`STRATEGY_HOLDER`)."""
    if isinstance(node, ast.Name):
        return bool(STRATEGY_HOLDER.search(node.id))
    if isinstance(node, ast.Attribute):
        return bool(STRATEGY_HOLDER.search(node.attr))
    if isinstance(node, ast.Subscript):
        key = node.slice
        return (isinstance(key, ast.Constant) and isinstance(key.value, str) and bool(STRATEGY_HOLDER.search(key.value))
                ) or _holds_strategy(node.value)
    return False


def _names_a_strategy(node: ast.expr, names: frozenset[str]) -> bool:
    """A string literal naming a strategy, or a literal tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in names
    return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(_names_a_strategy(e, names) for e in node.elts)


def _asks_a_strategy(node: ast.AST, names: frozenset[str]) -> bool:
    """``node`` asks which strategy runs: a comparison of what holds a strategy's name, or of what a call returns
    (``_flag(words, "--strategy") in ("horovod", None)``), with a strategy's name; a lookup keyed by a strategy's
    name (``CARDS["ddp"]``, ``table.get("horovod")``); a dict literal keyed by one (``{"ddp": ...}``)."""
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any((_holds_strategy(a) or isinstance(a, ast.Call)) and _names_a_strategy(b, names)
                   for a in sides for b in sides if a is not b)
    if isinstance(node, ast.Subscript):
        return _names_a_strategy(node.slice, names)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop"):
        return bool(node.args) and _names_a_strategy(node.args[0], names)
    return isinstance(node, ast.Dict) and any(k is not None and _names_a_strategy(k, names) for k in node.keys)


def strategy_tests(rules: Rules, names: frozenset[str] | None = None,
                   allowed: dict[tuple[str, str], str] | None = None) -> list[str]:
    """Outside ``backends/`` and the script arms' table (:data:`NAME_TABLES`), every place that asks which
    strategy runs (:func:`_asks_a_strategy`): ``strategy == "ddp"``, ``arm.name != "horovod"``, ``"ddp" in
    arms``, ``r["strategy"] in ("ddp", "zero")``, ``f(x) in ("horovod", None)``, ``CARDS["ddp"]``,
    ``{"ddp": ...}`` (on the AST)."""
    names = strategy_names(rules.pkg) if names is None else names
    allowed = NOT_STRATEGY_TESTS if allowed is None else allowed
    out = []
    for path in sorted(rules.pkg.rglob("*.py")):
        rel = path.relative_to(rules.pkg).as_posix()
        if "backends" in path.relative_to(rules.pkg).parts or rel in NAME_TABLES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _asks_a_strategy(node, names) and (rel, said := _said(node, names)) not in allowed:
                out.append(f"{path.relative_to(rules.pkg.parent)}:{node.lineno} {said[:80]}")
    return out


def _said(node: ast.AST, names: frozenset[str]) -> str:
    """How a finding reads: the expression, or a dict literal as the key that names a strategy (``{'ddp': ...}``)."""
    if isinstance(node, ast.Dict):
        return "{" + next(ast.unparse(k) for k in node.keys if k is not None and _names_a_strategy(k, names)) + ": ...}"
    return ast.unparse(node)


# -- dpcompare ---------------------------------------------------------------------------------------------------

def test_every_import_module_is_followed_or_loads_user_code() -> None:
    _, unfollowed = graph(DPCOMPARE)
    assert not unfollowed, ("import_module of a name the layout test cannot follow (import it by name, read it "
                            "from a table listed in FOLLOWED, or list a user-code loader in USER_CODE):\n"
                            + "\n".join(unfollowed))


def test_no_import_cycles() -> None:
    found = cycle(DPCOMPARE)
    assert not found, f"import cycle: {' -> '.join(found)}"


def test_rooms_import_only_what_their_may_import_line_names() -> None:
    bad = room_violations(DPCOMPARE)
    assert not bad, "imports that climb or cross rooms, or lines that allow too much:\n" + "\n".join(sorted(bad))


def test_catalogs_stay_light() -> None:
    bad = catalog_violations(DPCOMPARE)
    assert not bad, "\n".join(bad)


def test_every_room_says_what_it_may_import() -> None:
    lines = room_lines(DPCOMPARE)
    assert set(lines) == set(ROOMS) | {"api"}, f"packages in dpcompare/ and ROOMS differ: {sorted(lines)}"
    missing = [room for room, line in lines.items() if line is None]
    assert not missing, f"package docstrings without a 'May import: ...' line: {missing}"


def test_the_docs_room_table_matches_the_may_import_lines() -> None:
    lines = room_lines(DPCOMPARE)
    doc = (REPO / "docs" / "layout.md").read_text()
    table = {}
    for row in re.findall(r"^\| `(\w+)/` \|.*\| ([^|]+) \|$", doc, re.M):
        table[row[0]] = may_import(f"May import: {row[1].strip()}.", DPCOMPARE)
    assert table == {room: line for room, line in lines.items() if room in ROOMS}, (
        "docs/layout.md's room table and the rooms' 'May import' lines differ")


def test_a_handful_of_top_level_modules() -> None:
    top = sorted(p.stem for p in DPCOMPARE.pkg.glob("*.py") if p.stem not in ("__init__", "__main__"))
    unknown = set(top) - BASE - ENTRY
    assert not unknown, f"top-level modules that belong in a room: {sorted(unknown)}"
    assert len(top) <= MAX_TOP_LEVEL, top


def test_no_function_over_60_lines_without_a_reason() -> None:
    assert MAX_FUNCTION_LINES == 60  # the name of this test says so
    long = long_functions(DPCOMPARE)
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (split them, or say '# long because ...' just "
                      "above):\n" + "\n".join(long))


def test_every_file_is_written_atomically_or_says_why_not() -> None:
    bad = unatomic_writes(DPCOMPARE)
    assert not bad, (f"files written without files.atomic_write* (use it, or add '{NOT_ATOMIC} why' to the "
                     "line):\n" + "\n".join(bad))


def _layout_doc() -> str:
    return (REPO / "docs" / "layout.md").read_text()


def _files_in(text: str) -> set[str]:
    """The package's files a passage of the docs names (```room/module.py```, ```module.py```)."""
    return set(re.findall(r"`((?:[a-z_]+/)?[a-z_]+\.py)`", text))


def test_the_docs_list_every_file_that_writes_in_place() -> None:
    said = re.search(r"<!-- not-atomic:.*?-->(.*?)<!-- /not-atomic -->", _layout_doc(), re.S)
    assert said, "docs/layout.md no longer marks its list of the files that write in place"
    found = {p.relative_to(DPCOMPARE.pkg).as_posix() for p in DPCOMPARE.pkg.rglob("*.py")
             if NOT_ATOMIC in p.read_text()}
    assert _files_in(said.group(1)) == found


def starts_processes(rules: Rules) -> set[str]:
    """The files that call ``subprocess.Popen`` (or a bare ``Popen``)."""
    return {p.relative_to(rules.pkg).as_posix() for p in rules.pkg.rglob("*.py")
            if any(isinstance(n, ast.Call) and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) == "Popen"
                   for n in ast.walk(ast.parse(p.read_text())))}


def test_processes_start_only_where_the_docs_say() -> None:
    said = re.search(r"\*\*Processes are started in two places\*\*(.*?)\n- ", _layout_doc(), re.S)
    assert said, "docs/layout.md no longer says where processes are started"
    assert _files_in(said.group(1)) == starts_processes(DPCOMPARE) == {"launch/jobs.py", "launch/submission.py"}


def _strings_of(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def declared_knobs(pkg: Path) -> tuple[set[str], set[str], set[str]]:
    """The knobs as each of their three declarations names them: ``config.py``'s fields with ``group=KNOBS``,
    ``knobs.py``'s ``TABLE`` keys, and the strings in ``backends/catalog.py``'s ``*_KNOBS`` sets and ``knobs=``."""
    fields = {n.target.id for n in ast.walk(ast.parse((pkg / "config.py").read_text()))
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and isinstance(n.value, ast.Call)
              and any(k.arg == "group" and getattr(k.value, "id", "") == "KNOBS" for k in n.value.keywords)}
    table = {
        k.value
        for n in ast.walk(ast.parse((pkg / "knobs.py").read_text()))
        if isinstance(n, ast.AnnAssign | ast.Assign)
        and "TABLE" in {getattr(t, "id", "") for t in getattr(n, "targets", [getattr(n, "target", None)])}
        for k in getattr(n.value, "keys", [])
        if isinstance(k, ast.Constant)
    }
    honoured: set[str] = set()
    for n in ast.walk(ast.parse((pkg / "backends" / "catalog.py").read_text())):
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "").endswith("KNOBS") for t in n.targets):
            honoured |= _strings_of(n.value)
        if isinstance(n, ast.keyword) and n.arg == "knobs":
            honoured |= _strings_of(n.value)
    return fields, table, honoured


def test_a_knob_is_declared_alike_in_its_three_files() -> None:
    fields, table, honoured = declared_knobs(DPCOMPARE.pkg)
    assert fields and fields == table, "config.py's knobs group and knobs.TABLE differ"
    assert fields <= honoured, f"knobs no catalog entry honours: {sorted(fields - honoured)}"


def axis_names(pkg: Path) -> set[str]:
    """The names of ``compare/axes.py``'s axes: the first argument of each ``Axis(...)``, a constant or a name
    ``files.py`` defines."""
    constants = {t.id: n.value.value for n in ast.walk(ast.parse((pkg / "files.py").read_text()))
                 if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) for t in n.targets
                 if isinstance(t, ast.Name)}
    firsts = [n.args[0] for n in ast.walk(ast.parse((pkg / "compare" / "axes.py").read_text()))
              if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Axis" and n.args]
    return {a.value if isinstance(a, ast.Constant) else constants[getattr(a, "id", "")] for a in firsts}


def test_the_docs_name_the_train_settings_an_axis_shadows() -> None:
    fields = {n.target.id for n in ast.walk(ast.parse((DPCOMPARE.pkg / "config.py").read_text()))
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    said = re.search(r"declares under the\s+same name \(today: ([^)]*)\)", _layout_doc())
    assert said, "docs/layout.md no longer lists the train settings an axis shadows"
    assert set(re.findall(r"`(\w+)`", said.group(1))) == fields & axis_names(DPCOMPARE.pkg)


def test_nothing_imports_the_api_but_the_entry_points() -> None:
    """docs/layout.md: ``api/`` stands above every room; only ``cli`` and the root package import it."""
    edges, _ = graph(DPCOMPARE, typing=True)
    assert {m for m, to in edges.items() if "dpcompare.api" in to} <= {"dpcompare", "dpcompare.cli"}
    assert [p.name for p in (DPCOMPARE.pkg / "api").glob("*.py")] == ["__init__.py"]
    assert "nothing imports it but `cli` and the root package" in " ".join(_layout_doc().split())


def test_checkpoints_load_with_weights_only() -> None:
    bad = unsafe_loads(DPCOMPARE)
    assert not bad, "torch.load without weights_only=True:\n" + "\n".join(bad)


def test_only_backends_test_which_strategy_runs() -> None:
    bad = strategy_tests(DPCOMPARE)
    assert not bad, "strategy or name tests outside backends/ (ask the Strategy, or key a table):\n" + "\n".join(bad)


def strategy_interface(path: Path) -> dict[str, list[str]]:
    """The members of ``Strategy`` in ``path`` by kind: the methods a new strategy must write (abstract), those
    it may override, the final ones, the properties, and the part kinds it chooses (``*_class``)."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Strategy")
    kinds: dict[str, list[str]] = {"must": [], "may": [], "final": [], "property": [], "parts": []}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
            decorators = {ast.unparse(d).rpartition(".")[2] for d in node.decorator_list}
            kind = next((k for k, d in (("property", "property"), ("must", "abstractmethod"), ("final", "final"))
                         if d in decorators), "may")
            kinds[kind].append(node.name)
        elif (
            isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id.endswith("_class")
        ):
            kinds["parts"].append(node.target.id)
    return kinds


def test_docs_count_the_strategy_interface_and_no_strategy_overrides_a_final_method() -> None:
    kinds = strategy_interface(REPO / "dpcompare" / "backends" / "base.py")
    said = re.search(r"A new strategy writes (\d+) methods and may override (\d+)\*\*",
                     (REPO / "docs" / "layout.md").read_text())
    assert said, "docs/layout.md no longer says how many methods a new strategy writes and may override"
    assert (int(said[1]), int(said[2])) == (len(kinds["must"]), len(kinds["may"])), kinds
    overriding = []
    for path in [*sorted((REPO / "dpcompare" / "backends").glob("*.py")), REPO / "tests" / "test_fifth_strategy.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not (path.name == "base.py" and node.name == "Strategy"):
                overriding += [f"{path.name}: {node.name}.{f.name}" for f in node.body
                               if isinstance(f, ast.FunctionDef) and f.name in kinds["final"]]
    assert not overriding, f"final Strategy methods overridden: {overriding}"
    probes = [f"{path.name}:{node.lineno}" for path in sorted((REPO / "dpcompare" / "backends").glob("*.py"))
              for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
              and getattr(node.func, "id", "") == "getattr" and node.args and ast.unparse(node.args[0]) == "self"]
    assert not probes, f"attributes probed with getattr(self, ...) instead of set in __init__: {probes}"


# -- the checks fail when they should: a throwaway package ------------------------------------------------------

def _package(tmp_path: Path, files: dict[str, str]) -> Rules:
    """A package ``pkg`` in ``tmp_path`` of ``files`` (path → source), with a room ``low`` and a room ``high``
    that may import ``low``, and a top-level module ``base``."""
    pkg = tmp_path / "pkg"
    sources = {"__init__.py": '"""The root."""\n', "base.py": "", "low/__init__.py": '"""May import: the top-level '
               'modules."""\n', "high/__init__.py": '"""May import: the top-level modules and low."""\n', **files}
    for rel, text in sources.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return Rules(pkg, base=frozenset({"base"}), entry=frozenset(), catalogs=frozenset(), followed={}, user_code={},
                 rooms={"low": frozenset(), "high": frozenset({"low"})})


def test_a_cycle_through_a_package_init_is_found(tmp_path: Path) -> None:
    rules = _package(tmp_path, {"low/__init__.py": '"""May import: the top-level modules."""\nfrom pkg.low import a\n',
                                "low/a.py": "def f():\n    import pkg.low\n"})
    assert set(cycle(rules)) == {"pkg.low", "pkg.low.a"}
    rules = _package(tmp_path / "ok", {"low/a.py": "import pkg.base\n"})
    assert cycle(rules) == []


def test_a_cycle_through_a_lazy_or_a_type_checking_import_is_found(tmp_path: Path) -> None:
    """The two circles issue 39 found (argtypes → training.trackers → config → argtypes; horovod ↔
    horovod_elastic): a function's import one way, an ``if TYPE_CHECKING:`` import the other."""
    rules = _package(tmp_path, {"low/a.py": "def f():\n    from pkg.low import b\n",
                                "low/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            "    from pkg.low.a import X\n"})
    assert set(cycle(rules)) == {"pkg.low.a", "pkg.low.b"}
    assert graph(rules)[0]["pkg.low.b"] == set()  # the rooms' check leaves the type checker's import out
    rules = _package(tmp_path / "base", {"base.py": "def f():\n    import pkg.low.a\n",
                                         "low/a.py": "import pkg.base\n"})
    assert set(cycle(rules)) == {"pkg.base", "pkg.low.a"}


def test_a_room_importing_a_room_its_line_does_not_name_is_found(tmp_path: Path) -> None:
    rules = _package(tmp_path, {"low/a.py": "from pkg.high import b\n", "high/b.py": "from pkg.low import a\n",
                                "high/c.py": "from pkg import base\n"})
    assert room_violations(rules) == ["pkg.low.a imports pkg.high.b"]
    rules = _package(tmp_path / "line", {"high/__init__.py": '"""May import: the top-level modules."""\n',
                                         "high/b.py": "import pkg.low\n"})
    assert room_violations(rules) == ["pkg.high.b imports pkg.low"]  # ROOMS allows it, its line does not
    rules = _package(tmp_path / "table", {"low/__init__.py": '"""May import: the top-level modules and high."""\n'})
    assert room_violations(rules) == ["low/__init__.py says it may import ['high'], which the ROOMS table does "
                                      "not allow"]
    rules = _package(tmp_path / "root", {"high/b.py": "def f():\n    from pkg import thing\n"})
    assert room_violations(rules) == ["pkg.high.b imports the root package pkg (whose __getattr__ reaches everything)"]
    with pytest.raises(AssertionError, match="neither a room"):
        room_lines(_package(tmp_path / "bad", {"low/__init__.py": '"""May import: the lab."""\n'}))


def test_an_unfollowed_import_module_is_found(tmp_path: Path) -> None:
    rules = _package(tmp_path, {"low/a.py": "import importlib\ndef f(name):\n    return importlib.import_module(name)\n"
                                            "def g(x):\n    return f(x)\n"})
    assert [u.split(": ", 1)[1] for u in graph(rules)[1]] == ["import_module(name) in f"]
    rules = _package(tmp_path / "ok", {"low/a.py": "import importlib\ndef f(name):\n    return importlib.import_module"
                                                   "(name)\nf('pkg.high.b')\n", "high/b.py": ""})
    assert graph(rules) == ({**{m: set() for m in rules.modules()}, "pkg.low.a": {"pkg.high.b"}}, [])
    assert room_violations(rules) == ["pkg.low.a imports pkg.high.b"]


def test_a_function_over_the_limit_is_found(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # with its def: one line too many
    rules = _package(tmp_path, {"low/a.py": f"def long():\n{body}\n\n# long because a table\ndef why():\n{body}"})
    assert long_functions(rules) == [f"pkg/low/a.py:1 long ({MAX_FUNCTION_LINES + 1} lines)"]


def test_a_file_written_in_place_is_found(tmp_path: Path) -> None:
    rules = _package(tmp_path, {"low/a.py": "def f(p, fig):\n    p.write_text('x')\n    fig.savefig(p)\n"
                                            "    open(p, 'a').write('x')  # not atomic: a log\n"
                                            "    atomic_write(p, lambda f: fig.savefig(f))\n    open(p).read()\n"})
    assert unatomic_writes(rules) == ["pkg/low/a.py:2 p.write_text('x')", "pkg/low/a.py:3 fig.savefig(p)"]


def test_an_unsafe_load_and_a_strategy_test_are_found(tmp_path: Path) -> None:
    rules = _package(tmp_path, {"low/a.py": "import torch\ntorch.load('p', weights_only=True)\ntorch.load('p')\n"
                                            "if strategy == 'ddp':\n    pass\n"})
    assert unsafe_loads(rules) == ["pkg/low/a.py:3 torch.load('p')"]
    names = frozenset({"ddp", "horovod", "ddp-elastic"})
    assert strategy_tests(rules, names, {}) == ["pkg/low/a.py:4 strategy == 'ddp'"]
    tests = ["arm == 'ddp'", "'ddp' in arms", "spec.strategy != 'horovod'", "r['strategy'] in ('ddp', 'zero')",
             "a.name == 'ddp-elastic'", "base_strategy is 'ddp'", "names[0] == 'horovod'", "'horovod' == arm",
             "_flag(words, '--strategy') in ('horovod', None)", "CARDS['ddp']", "table.get('horovod')",
             "{'ddp': 1, 'x': 2}"]
    fine = ["strategy == other", "mode == 'ddp'", "name in TABLE", "arm == 'fsdp2'", "'x' in arms", "n == 2",
            "CARDS[name]", "f(x) == 'fsdp2'", "{'mode': 1}", "table.get(arm)", "mpi_started(name)"]
    rules = _package(tmp_path / "more", {"high/b.py": "".join(f"x{i} = {t}\n" for i, t in enumerate(tests + fine)),
                                         "backends/c.py": "ok = strategy == 'ddp'\nCARDS = {'ddp': 1}\n"})
    said = [t.replace(" 1, 'x': 2}", " ...}") for t in tests]
    assert strategy_tests(rules, names, {}) == [f"pkg/high/b.py:{i + 1} {t}" for i, t in enumerate(said)]
    assert strategy_names(REPO / "dpcompare") >= {"ddp", "horovod", "zero", "fsdp", "single", "native", "ddp-elastic"}
