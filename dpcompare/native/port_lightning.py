"""The Lightning part of a port: a Horovod Lightning 1.x script onto Lightning 2's DDP (a libcst pass).

Horovod's Lightning example trains with ``Trainer(accelerator='horovod')``, which Lightning 2 removed, and uses
hooks Lightning 2 refuses. :func:`port_lightning` rewrites, keeping the rest of the script as it is:

- ``pytorch_lightning`` imports → ``lightning.pytorch`` (the package the ``lightning`` extra installs);
- ``Trainer(accelerator='horovod', gpus=G, ...)`` → ``Trainer(strategy="ddp", accelerator="gpu" if G else
  "cpu", devices=..., num_nodes=...)``, the processes torchrun started (its ``LOCAL_WORLD_SIZE`` and
  ``WORLD_SIZE``); without ``gpus``, Lightning's own accelerator (``"auto"``);
- ``validation_epoch_end(self, outputs)`` (and the training and test ones) → ``on_validation_epoch_end(self)``,
  the step's outputs collected in ``self.validation_step_outputs`` as Lightning 2's migration guide does;
- a hook's ``return {..., 'log': LOGS}`` (Lightning 0.x/1.x's logging) → ``self.log_dict(LOGS, ...)`` before it,
  synced over the ranks (``sync_dist=True``: Lightning's own all-reduce, where Horovod's script averaged with
  ``hvd.allreduce``) at an epoch's end;
- a Callback's ``on_epoch_end`` (called at the end of every training and validation epoch) → both Lightning 2
  hooks calling it; ``on_init_start`` / ``on_init_end`` (no equivalent) kept under another name, never called.

The Horovod calls outside Lightning (``hvd.init``, ``hvd.rank``, ``hvd.allreduce`` in a plain function) are the
other passes' (:mod:`.port`). A pass is ``(tree) -> (tree, notes)``: the notes say what changed in meaning.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

#: Lightning 1.x's epoch-end hooks with outputs → Lightning 2's hook and the step whose outputs it read
EPOCH_END = {"training_epoch_end": ("on_train_epoch_end", "training_step"),
             "validation_epoch_end": ("on_validation_epoch_end", "validation_step"),
             "test_epoch_end": ("on_test_epoch_end", "test_step")}
#: callback hooks Lightning 2 refuses and that have no equivalent: renamed (never called)
NO_EQUIVALENT = ("on_init_start", "on_init_end")
DEVICES = 'int(os.environ.get("LOCAL_WORLD_SIZE", "1"))'
NUM_NODES = 'int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))'


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


def _renamed(name: str) -> str | None:
    if name == "pytorch_lightning" or name.startswith("pytorch_lightning."):
        return "lightning.pytorch" + name[len("pytorch_lightning"):]
    return None


def _is_horovod(arg: cst.Arg) -> bool:
    return m.matches(arg.value, m.SimpleString()) and arg.value.evaluated_value == "horovod"  # type: ignore[attr-defined]


class _Imports(cst.CSTTransformer):
    """``pytorch_lightning`` → ``lightning.pytorch`` in imports; is ``os`` imported?"""

    def __init__(self) -> None:
        self.changed = 0
        self.has_os = False

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        new = _renamed(_dotted(updated.module)) if updated.module is not None and not updated.relative else None
        if new is None:
            return updated
        self.changed += 1
        return updated.with_changes(module=cst.parse_expression(new))

    def leave_ImportAlias(self, original: cst.ImportAlias, updated: cst.ImportAlias) -> cst.ImportAlias:
        name = _dotted(updated.name)
        self.has_os = self.has_os or (name == "os" and updated.asname is None)
        new = _renamed(name)
        if new is None:
            return updated
        self.changed += 1
        asname = updated.asname or cst.AsName(name=cst.Name(name.split(".")[0]))  # the script's name kept
        return updated.with_changes(name=cst.parse_expression(new), asname=asname if "." not in name else None)


class _Trainer(cst.CSTTransformer):
    """``Trainer(accelerator='horovod', gpus=G, ...)`` → Lightning 2's DDP on torchrun's processes."""

    def __init__(self) -> None:
        self.ported = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if _dotted(updated.func).split(".")[-1] != "Trainer" or not any(
                a.keyword and a.keyword.value == "accelerator" and _is_horovod(a) for a in updated.args):
            return updated
        args: list[cst.Arg] = []
        gpus: cst.BaseExpression | None = None
        for a in updated.args:
            key = a.keyword.value if a.keyword else None
            if key == "accelerator":
                args.append(a.with_changes(keyword=cst.Name("strategy"), value=cst.SimpleString('"ddp"')))
            elif key == "gpus":
                gpus = a.value
            else:
                args.append(a)
        settings = [("devices", DEVICES), ("num_nodes", NUM_NODES)]
        if gpus is not None:  # else Lightning's own choice ("auto": a GPU when there is one)
            where = cst.Module([]).code_for_node(gpus)
            settings.insert(0, ("accelerator", f'"gpu" if {where if gpus.lpar else f"({where})"} else "cpu"'))
        comma = args[0].comma if args and args[0].comma is not cst.MaybeSentinel.DEFAULT else cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))
        extra = [cst.Arg(keyword=cst.Name(k), value=cst.parse_expression(v), comma=comma,
                         equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
                 for k, v in settings]
        self.ported += 1
        new = [args[0].with_changes(comma=comma), *extra, *args[1:]]
        new[-1] = new[-1].with_changes(comma=updated.args[-1].comma)  # the call's own end: a trailing comma or none
        return updated.with_changes(args=new)


def _log_line(logs: cst.BaseExpression, sync: bool) -> cst.SimpleStatementLine:
    code = cst.Module([]).code_for_node(logs)
    return cst.parse_statement(f"self.log_dict({code}{', sync_dist=True' if sync else ''})")  # type: ignore[return-value]


def _logged(ret: cst.Return) -> cst.BaseExpression | None:
    """``LOGS`` of ``return {..., 'log': LOGS}``."""
    if not isinstance(ret.value, cst.Dict):
        return None
    for el in ret.value.elements:
        if isinstance(el, cst.DictElement) and m.matches(el.key, m.SimpleString()) \
                and el.key.evaluated_value == "log":  # type: ignore[attr-defined]
            return el.value
    return None


class _Returns(cst.CSTTransformer):
    """In one method: ``return {'log': LOGS}`` logs LOGS first; ``collect``: the step's output kept for its
    epoch's end (Lightning 2 no longer hands them over)."""

    def __init__(self, sync: bool, collect: str | None) -> None:
        self.sync, self.collect, self.logged = sync, collect, 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # a nested function's returns are its own

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if len(updated.body) != 1 or not isinstance(updated.body[0], cst.Return) or updated.body[0].value is None:
            return updated
        ret = updated.body[0]
        lines: list[cst.BaseStatement] = []
        logs = _logged(ret)
        if logs is not None:
            self.logged += 1
            lines.append(_log_line(logs, self.sync))
        if self.collect:
            value = cst.Module([]).code_for_node(ret.value)
            lines += [cst.parse_statement(f"output = {value}"),
                      cst.parse_statement(f"self.{self.collect}.append(output)")]
            updated = updated.with_changes(body=[ret.with_changes(value=cst.Name("output"))])
        if not lines:
            return updated
        lines[0] = lines[0].with_changes(leading_lines=updated.leading_lines)
        return cst.FlattenSentinel([*lines, updated.with_changes(leading_lines=[])])


def _prepend(fn: cst.FunctionDef, *code: str) -> cst.FunctionDef:
    body = fn.body
    assert isinstance(body, cst.IndentedBlock)
    return fn.with_changes(body=body.with_changes(body=[*map(cst.parse_statement, code), *body.body]))


def _append(fn: cst.FunctionDef, *code: str) -> cst.FunctionDef:
    body = fn.body
    assert isinstance(body, cst.IndentedBlock)
    return fn.with_changes(body=body.with_changes(body=[*body.body, *map(cst.parse_statement, code)]))


def _methods(cls: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}  # type: ignore[union-attr]


def _module_hooks(cls: cst.ClassDef, notes: list[str]) -> cst.ClassDef:
    """A LightningModule's Lightning 1.x hooks as Lightning 2 takes them."""
    methods = _methods(cls)
    collects = {step: f"{step}_outputs" for old, (_, step) in EPOCH_END.items() if old in methods and step in methods}
    body: list[cst.BaseStatement] = []
    for stmt in cls.body.body:  # type: ignore[union-attr]
        if isinstance(stmt, cst.FunctionDef):
            name = stmt.name.value
            ret = _Returns(sync=name in EPOCH_END, collect=collects.get(name))
            stmt = stmt.with_changes(body=stmt.body.visit(ret))
            if ret.logged:
                notes.append(f"{cls.name.value}.{name}: the returned 'log' dict is logged with self.log_dict"
                             + (" (sync_dist=True: averaged over the ranks)" if name in EPOCH_END else ""))
            if name == "__init__" and collects:
                stmt = _append(stmt, *(f"self.{c} = []" for c in collects.values()))
            if name in EPOCH_END:
                new, step = EPOCH_END[name]
                outputs = stmt.params.params[1].name.value if len(stmt.params.params) > 1 else "outputs"
                stmt = stmt.with_changes(name=cst.Name(new), params=stmt.params.with_changes(
                    params=[p.with_changes(comma=cst.MaybeSentinel.DEFAULT) for p in stmt.params.params[:1]]))
                if step in collects:
                    stmt = _prepend(stmt, f"{outputs}, self.{collects[step]} = self.{collects[step]}, []")
                notes.append(f"{cls.name.value}.{name} → {new}: Lightning 2 hands the hook no outputs; "
                             f"{step}'s are collected in self.{collects.get(step, '(none: no ' + step + ')')}")
        body.append(stmt)
    if collects and "__init__" not in methods:
        notes.append(f"{cls.name.value}: no __init__ to create self.{', self.'.join(collects.values())} = [] in; "
                     "add it by hand")
    return cls.with_changes(body=cls.body.with_changes(body=body))


def _callback_hooks(cls: cst.ClassDef, notes: list[str]) -> cst.ClassDef:
    """A Callback's hooks Lightning 2 refuses: ``on_epoch_end`` (Lightning 1 called it at the end of every
    training and validation epoch) called from both epoch ends, the init hooks renamed."""
    methods = _methods(cls)
    ends = ("on_train_epoch_end", "on_validation_epoch_end") if "on_epoch_end" in methods else ()
    body: list[cst.BaseStatement] = []
    for stmt in cls.body.body:  # type: ignore[union-attr]
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value in (*NO_EQUIVALENT, "on_epoch_end"):
            old = stmt.name.value
            stmt = stmt.with_changes(name=cst.Name(f"lightning1_{old}"))
            notes.append(f"{cls.name.value}.{old}: removed in Lightning 2; " + (
                "kept as lightning1_on_epoch_end, called from on_train_epoch_end and on_validation_epoch_end"
                if old == "on_epoch_end" else f"kept as lightning1_{old}, never called"))
        elif isinstance(stmt, cst.FunctionDef) and stmt.name.value in ends and len(stmt.params.params) >= 3:
            trainer, module = (p.name.value for p in stmt.params.params[1:3])
            stmt = _prepend(stmt, f"self.lightning1_on_epoch_end({trainer}, {module})")
        body.append(stmt)
    for hook in ends:
        if hook not in methods:
            body.append(cst.parse_statement(
                f"def {hook}(self, trainer, pl_module):\n    self.lightning1_on_epoch_end(trainer, pl_module)\n"
            ).with_changes(leading_lines=[cst.EmptyLine(indent=False)]))
    return cls.with_changes(body=cls.body.with_changes(body=body))


class _Classes(cst.CSTTransformer):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        bases = {_dotted(b.value).split(".")[-1] for b in updated.bases}
        if "LightningModule" in bases:
            return _module_hooks(updated, self.notes)
        if "Callback" in bases:
            return _callback_hooks(updated, self.notes)
        return updated


def _with_os(tree: cst.Module) -> cst.Module:
    """``import os`` after the first imports, for the Trainer's torchrun variables."""
    body = list(tree.body)
    at = next((i for i, s in enumerate(body) if m.matches(s, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))
               and not m.matches(s, m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))]))), 0)
    body.insert(at, cst.parse_statement("import os"))
    return tree.with_changes(body=body)


def port_lightning(tree: cst.Module) -> tuple[cst.Module, list[str]]:
    """The pass: a Horovod Lightning 1.x script's Lightning calls and hooks as Lightning 2's DDP takes them
    (nothing changes in a script without ``Trainer(accelerator='horovod')`` or ``pytorch_lightning``)."""
    notes: list[str] = []
    imports, trainer, classes = _Imports(), _Trainer(), _Classes()
    tree = tree.visit(imports)
    if imports.changed:
        notes.append("pytorch_lightning → lightning.pytorch (Lightning 2's package: pip install lightning)")
    tree = tree.visit(trainer)
    if trainer.ported:
        notes.append("Trainer(accelerator='horovod') → Trainer(strategy=\"ddp\"): one process per device, as "
                     "torchrun starts them (devices: LOCAL_WORLD_SIZE, num_nodes: WORLD_SIZE / LOCAL_WORLD_SIZE)")
        if not imports.has_os:
            tree = _with_os(tree)
    if imports.changed or trainer.ported:
        tree = tree.visit(classes)
        notes += classes.notes
    return tree, notes


PASS = port_lightning
