"""What the port's passes share: a libcst tree with its Horovod uses found (:func:`locate`), and edits keyed by
the tree's nodes (:class:`Edits`: replace a node, put statements before or after one, drop one leaving a comment).

A pass (see :data:`dpcompare.native.port.PASSES`) is ``(tree) -> (tree, notes)``: it calls :func:`locate` on the
tree it is given (the scan of :mod:`.migrate` says which nodes are Horovod's), collects its edits, applies them
with :meth:`Edits.apply`, and returns the new tree and its notes (where the port computes other numbers than
Horovod, or what it changed that the user should know). A pass that meets an idiom it cannot port raises
:class:`NoPort` with one line saying why.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
import libcst.helpers
from libcst.metadata import CodeRange, MetadataWrapper, ParentNodeProvider, PositionProvider

from dpcompare.native.migrate import Scan, Use, scan_source

Pass = Callable[[cst.Module], "tuple[cst.Module, list[str]]"]
Replacement = cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel
Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement
STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement)

_KINDS: dict[type, type] = {ast.Attribute: cst.Attribute, ast.Name: cst.Name, ast.Call: cst.Call,
                            ast.Import: cst.Import, ast.ImportFrom: cst.ImportFrom}


class NoPort(Exception):
    """An idiom the port cannot translate; the message is one line saying why (and what to do)."""


@dataclass
class Located:
    """A tree, the scan of its code, and the libcst node each Horovod use was read from."""

    tree: cst.Module
    scan: Scan
    nodes: dict[int, cst.CSTNode]                 # id(use) → node
    parents: Mapping[cst.CSTNode, cst.CSTNode]
    positions: Mapping[cst.CSTNode, CodeRange]

    def node(self, use: Use) -> cst.CSTNode | None:
        return self.nodes.get(id(use))

    def uses(self, key: str) -> list[tuple[Use, cst.CSTNode]]:
        return [(u, n) for u in self.scan.named(key) if (n := self.node(u)) is not None]

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def statement(self, node: cst.CSTNode) -> Statement:
        """The statement (a whole line, or a compound statement) ``node`` is part of."""
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return node
        return next(
            a for a in self.ancestors(node) if isinstance(a, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
        )

    def code(self, node: cst.CSTNode) -> str:
        return self.tree.code_for_node(node).strip()  # any node, of this tree or not

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def call_of(self, node: cst.CSTNode) -> cst.Call | None:
        """The call ``node`` is the function of (``hvd.rank`` in ``hvd.rank()``), if it is one."""
        parent = self.parents.get(node)
        return parent if isinstance(parent, cst.Call) and parent.func is node else None

    def alone(self, node: cst.CSTNode) -> Statement | None:
        """The statement when ``node`` is all of it (``hvd.broadcast_parameters(...)`` on a line of its own)."""
        stmt = self.statement(node)
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
                and isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is node:
            return stmt
        return None


def _char_column(lines: list[str], line: int, byte_col: int) -> int:
    return len(lines[line - 1].encode()[:byte_col].decode(errors="ignore"))


def locate(tree: cst.Module) -> Located:
    """``tree`` with its Horovod uses (as :func:`.migrate.scan_source` finds them in its code) tied to nodes."""
    wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    source = tree.code
    scan = scan_source(Path("port.py"), source)
    lines = source.splitlines()
    by_span: dict[tuple, cst.CSTNode] = {}
    for node, r in positions.items():
        by_span.setdefault((type(node), r.start.line, r.start.column, r.end.line, r.end.column), node)
    nodes = {}
    for u in scan.uses:
        a = u.node
        if type(a) not in _KINDS or not hasattr(a, "lineno"):
            continue
        end_line = a.end_lineno or a.lineno  # type: ignore[attr-defined]
        key = (_KINDS[type(a)], a.lineno, _char_column(lines, a.lineno, a.col_offset),  # type: ignore[attr-defined]
               end_line, _char_column(lines, end_line, a.end_col_offset or 0))  # type: ignore[attr-defined]
        if key in by_span:
            nodes[id(u)] = by_span[key]
    return Located(tree, scan, nodes, parents, positions)


def comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment("# " + text.replace("\n", " ")))


def statements(code: str) -> list[cst.BaseStatement]:
    """The statements of ``code`` (comments and blank lines above each kept as its leading lines)."""
    return list(cst.parse_module(code).body)


@dataclass
class Edits(cst.CSTTransformer):
    """Edits of one tree, keyed by its nodes, applied in one visit (:meth:`apply`)."""

    located: Located
    replace: dict[cst.CSTNode, Callable[[cst.CSTNode], Replacement]] = field(default_factory=dict)
    before: dict[cst.CSTNode, list[cst.BaseStatement]] = field(default_factory=dict)
    after: dict[cst.CSTNode, list[cst.BaseStatement]] = field(default_factory=dict)
    drop: dict[cst.CSTNode, str] = field(default_factory=dict)
    _pending: dict[cst.CSTNode, list[cst.EmptyLine]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__()

    def insert_before(self, stmt: cst.CSTNode, code: str) -> None:
        self.before.setdefault(stmt, []).extend(statements(code))

    def insert_after(self, stmt: cst.CSTNode, code: str) -> None:
        self.after.setdefault(stmt, []).extend(statements(code))

    def remove(self, stmt: cst.CSTNode, why: str = "") -> None:
        """Drop ``stmt``, leaving its comments and ``# why (was: FIRST LINE)`` (when there is a why) in its place."""
        self.drop[stmt] = why

    def apply(self) -> cst.Module:
        return self.located.tree.visit(self)

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> Replacement:  # type: ignore[override]
        out = super().on_leave(original, updated)
        if original in self.drop:
            removed = self._dropped(original)
            return self._around(original, removed) if original in self.before or original in self.after else removed
        if original in self.replace and isinstance(out, cst.CSTNode):
            out = self.replace[original](out)
        if isinstance(original, (cst.IndentedBlock, cst.Module)) and isinstance(out, (cst.IndentedBlock, cst.Module)):
            return self._close_block(original, out)
        if original in self.before or original in self.after or (
                isinstance(original, STATEMENTS) and self._pending.get(self.parents_of(original))):
            return self._around(original, out)
        return out

    def parents_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.located.parents.get(node)

    def _dropped(self, original: cst.CSTNode) -> cst.RemovalSentinel:
        was = self.located.code(original.with_changes(leading_lines=[])).splitlines()  # type: ignore[attr-defined]
        lines = list(getattr(original, "leading_lines", []))
        if self.drop[original]:
            lines.append(comment(f"{self.drop[original]} (was: {was[0].strip()}{' ...' if len(was) > 1 else ''})"))
        self._pending.setdefault(self.parents_of(original), []).extend(lines)  # type: ignore[arg-type]
        return cst.RemovalSentinel.REMOVE

    def _around(self, original: cst.CSTNode, out: Replacement) -> Replacement:
        body = _as_list(out)
        carried = self._pending.pop(self.parents_of(original), [])  # type: ignore[arg-type]
        lines: list[cst.EmptyLine] = []
        if original in self.before and body:  # the original's comments go above what is put before it
            lines = list(body[0].leading_lines)  # type: ignore[attr-defined]
            body[0] = body[0].with_changes(leading_lines=[])
        new = [*self.before.get(original, []), *body, *self.after.get(original, [])]
        if not new:
            self._pending.setdefault(self.parents_of(original), []).extend(carried)  # type: ignore[arg-type]
            return cst.RemovalSentinel.REMOVE
        new[0] = new[0].with_changes(leading_lines=[*carried, *lines, *new[0].leading_lines])  # type: ignore[attr-defined]
        return new[0] if len(new) == 1 else cst.FlattenSentinel(new)

    def _close_block(self, original: cst.CSTNode, out: cst.IndentedBlock | cst.Module) -> cst.CSTNode:
        """Comments of statements dropped last in a block go to its footer (a ``pass`` when nothing is left)."""
        carried = self._pending.pop(original, [])
        if not carried:
            return out
        if not out.body:
            return out.with_changes(body=[cst.SimpleStatementLine([cst.Pass()], leading_lines=carried)])
        return out.with_changes(footer=[*carried, *out.footer])


def _as_list(out: Replacement) -> list[cst.BaseStatement]:
    if isinstance(out, cst.FlattenSentinel):
        return list(out.nodes)  # type: ignore[arg-type]
    if isinstance(out, cst.RemovalSentinel):
        return []
    return [out]  # type: ignore[list-item]


def module_names(tree: cst.Module) -> set[str]:
    """The names bound at the top level of ``tree`` (imports, definitions, assignments)."""
    bound: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            bound.add(stmt.name.value)
        for node in _small(stmt):
            if isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(node.names, cst.ImportStar):
                for a in node.names:
                    name = a.asname.name if a.asname else a.name  # type: ignore[union-attr]
                    bound.add(libcst.helpers.get_full_name_for_node(name).split(".")[0])  # type: ignore[arg-type]
            elif isinstance(node, cst.Assign):
                bound |= {t.target.value for t in node.targets if isinstance(t.target, cst.Name)}
    return bound


def _small(stmt: cst.CSTNode) -> list[cst.CSTNode]:
    return list(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else []


def after_imports(tree: cst.Module) -> int:
    """The index in ``tree.body`` just after its last top-level import (after the docstring when none)."""
    last = 0
    for i, stmt in enumerate(tree.body):
        if any(isinstance(n, (cst.Import, cst.ImportFrom)) for n in _small(stmt)):
            last = i + 1
        elif i == 0 and _small(stmt) and isinstance(stmt.body[0], cst.Expr):  # type: ignore[attr-defined]
            last = 1
    return last


def add_helpers(tree: cst.Module, code: str, title: str) -> cst.Module:
    """``code``'s top-level definitions put after the imports, under the comment ``title``, those not there yet."""
    bound = module_names(tree)
    new = [s for s in statements(code) if not (_defines(s) & bound)]
    if not new:
        return tree
    blank = [cst.EmptyLine(indent=False)] * 2
    new[0] = new[0].with_changes(leading_lines=[*blank, comment(title)])
    at = after_imports(tree)
    rest = list(tree.body[at:])
    if rest and len(rest[0].leading_lines) < 2:  # two blank lines after the last definition
        rest[0] = rest[0].with_changes(leading_lines=[*blank, *rest[0].leading_lines])
    return tree.with_changes(body=[*tree.body[:at], *new, *rest])


def _defines(stmt: cst.CSTNode) -> set[str]:
    probe = cst.Module(body=[stmt])  # type: ignore[list-item]
    return module_names(probe)
