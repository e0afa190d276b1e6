"""The DDP port ``dpcompare migrate`` writes beside a Horovod script, for the user to review.

The port is a concrete-syntax-tree codemod (libcst): the script's comments, layout and structure are kept and
only what must change does. It runs :data:`PASSES` in order, each ``(tree) -> (tree, notes)`` (see
:mod:`.port_tools`); the notes say where the port computes other numbers than Horovod, or what the user should
know. A pass that meets what it cannot port raises :class:`~.port_tools.NoPort`, and no port is written. Then
the Horovod imports become those the port needs, and a header says how to run it. It never overwrites a file.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import libcst as cst

from dpcompare.files import atomic_write_text
from dpcompare.native.migrate import Scan
from dpcompare.native.port_elastic import elastic_pass
from dpcompare.native.port_lightning import port_lightning
from dpcompare.native.port_passes import accumulation, calls, distributed_optimizer, flag_guards, unported
from dpcompare.native.port_tools import Edits, NoPort, Pass, after_imports, comment, locate, module_names, statements

#: the passes, in order: idioms first (a pass for an idiom goes before ``calls``), then every other call, then
#: the refusal of what is left, then the DistributedOptimizer
PASSES: tuple[Pass, ...] = (elastic_pass, port_lightning, flag_guards, accumulation, calls, unported,
                            distributed_optimizer)

#: the imports a port may need, by the name it uses, added when the port uses the name and does not bind it
IMPORTS = {"atexit": "import atexit", "os": "import os", "sys": "import sys", "contextlib": "import contextlib",
           "torch": "import torch",
           "dist": "import torch.distributed as dist",
           "default_hooks": "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks",
           "DDP": "from torch.nn.parallel import DistributedDataParallel as DDP"}


class _Names(cst.CSTVisitor):
    """The names an expression reads (``a`` of ``a.b.c``), imports left out."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False


def imports(tree: cst.Module) -> tuple[cst.Module, list[str]]:
    """The first top-level Horovod import becomes the imports the port needs; the other Horovod imports go."""
    visitor = _Names()
    tree.visit(visitor)
    bound = module_names(tree)
    needed = "".join(code + "\n" for name, code in IMPORTS.items() if name in visitor.names and name not in bound)
    loc = locate(tree)
    edits = Edits(loc)
    first = True
    for use in loc.scan.uses:
        node = loc.node(use)
        if not use.key.startswith("import ") or node is None:
            continue
        stmt = loc.statement(node)
        if first and needed and loc.parents.get(stmt) is tree:
            edits.replace[stmt] = lambda u: cst.FlattenSentinel(
                [
                    s.with_changes(leading_lines=u.leading_lines) if i == 0 else s
                    for i, s in enumerate(statements(needed))
                ]
            )
            first = False
        elif stmt not in edits.replace:
            edits.remove(stmt)  # its comments stay
    tree = edits.apply()
    if first and needed:
        at = after_imports(tree)
        tree = tree.with_changes(body=[*tree.body[:at], *statements(needed), *tree.body[at:]])
    return tree, []


def _with_header(tree: cst.Module, source_name: str, port_name: str) -> cst.Module:
    lines = [comment(f"DDP port of {source_name}, written by `dpcompare migrate`: review it before use."),
             comment(f"Run: torchrun --nproc-per-node N {port_name} ARGS  "
                     f"(or: dpcompare script --np N --as ddp -- python {port_name} ARGS)")]
    header = list(tree.header)
    at = 1 if header and header[0].comment and header[0].comment.value.startswith("#!") else 0
    return tree.with_changes(header=[*header[:at], *lines, *header[at:]])


def port_source(source: str, source_name: str, port_name: str) -> tuple[str, list[str]]:
    """The DDP port's text and the passes' notes (:class:`NoPort` when a pass cannot port the script)."""
    tree = cst.parse_module(source)
    notes: list[str] = []
    for one in (*PASSES, imports):
        tree, more = one(tree)
        notes += more
    return _with_header(tree, source_name, port_name).code, notes


def unified_diff(before: str, after: str, source: Path, dest: Path) -> str:
    """The change as a unified diff (as code-rewriting tools print it)."""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=str(source), tofile=str(dest)))


def _refused(reasons: list[str]) -> dict[str, Any]:
    return {"written": None, "reasons": reasons, "notes": [], "diff": None,
            "message": "No DDP port written: " + "; ".join(reasons) + "."}


def write_port(scan: Scan, dest: Path | None, dry_run: bool = False) -> dict[str, Any]:
    """Write the DDP port when every pass can port the script; what happened: a message, its reasons (why no
    port), the passes' notes and the change as a unified diff."""
    dest = dest or scan.path.with_name(f"{scan.path.stem}_ddp.py")
    try:
        text, notes = port_source(scan.source, scan.path.name, dest.name)
    except NoPort as e:
        return _refused([str(e)])
    try:
        compile(text, str(dest), "exec")
    except SyntaxError as e:  # a translation this module got wrong: say so rather than write it
        return {**_refused([f"the port does not parse ({e.msg}, line {e.lineno})"]),
                "message": f"No DDP port written: dpcompare migrate produced invalid Python at line {e.lineno} "
                           "(please report it)."}
    out = {"written": None, "reasons": [], "notes": notes, "diff": unified_diff(scan.source, text, scan.path, dest)}
    if dry_run:
        return {**out, "message": f"A DDP port can be written ({dest}); --no-port kept it."}
    if dest.exists():
        return {**out, "reasons": [f"{dest} exists"],
                "message": f"{dest} exists and is left as it is (remove it, or pass --port FILE)."}
    atomic_write_text(dest, text)
    return {**out, "written": str(dest),
            "message": f"Wrote the DDP port {dest}: review it, then run it with `torchrun --nproc-per-node 2 "
                       f"{dest} ARGS` or `dpcompare script --np 2 --as ddp -- python {dest} ARGS`."}
