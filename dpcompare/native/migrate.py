"""What ``dpcompare migrate SCRIPT`` reads: every Horovod call of a script, whether the native layer runs it, its
native equivalent, and where a DDP port will compute different numbers (the port itself: :mod:`.port`).

The script is read, never run: its syntax tree gives every ``import horovod...`` and every use of the module
(``hvd.X``, ``horovod.torch.X``, names imported with ``from horovod.torch import X``) and of the
DistributedOptimizer's methods (``optimizer.synchronize()``, ``optimizer.skip_synchronize()``). Torch-free.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcompare.errors import ConfigError
from dpcompare.native.calls import CALLS, MODULES, RUN, Call

TORCH_MODULE = "horovod.torch"
OPTIMIZER_METHODS = ("synchronize", "skip_synchronize", "set_backward_passes_per_step")


@dataclass
class Use:
    """One place the script touches Horovod."""

    line: int
    key: str             # a key of CALLS, "optimizer.METHOD", "import MODULE" or "run"
    text: str            # the source it was read from
    call: Call
    node: ast.AST = field(repr=False)

    @property
    def supported(self) -> bool:
        return self.call.supported


@dataclass
class Scan:
    path: Path
    source: str
    tree: ast.Module = field(repr=False)
    modules: dict[str, str] = field(default_factory=dict)   # local name → the horovod module it is bound to
    direct: dict[str, str] = field(default_factory=dict)    # local name → horovod.torch's name it stands for
    optimizers: set[str] = field(default_factory=set)       # expressions a DistributedOptimizer was assigned to
    uses: list[Use] = field(default_factory=list)
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict, repr=False)

    def named(self, name: str) -> list[Use]:
        return [u for u in self.uses if u.key == name]


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _read_imports(scan: Scan) -> None:
    for node in ast.walk(scan.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "horovod":
                    local = a.asname or a.name.split(".")[0]
                    scan.modules[local] = a.name if a.asname else "horovod"
                    _add_import(scan, node, a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "horovod":
            _add_import(scan, node, node.module)
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full.startswith(TORCH_MODULE + ".") and full.count(".") == 2 and a.name not in CALLS:
                    scan.modules[a.asname or a.name] = full  # from horovod.torch import mpi_ops
                elif node.module.startswith(TORCH_MODULE) or node.module == "horovod.common.exceptions":
                    scan.direct[a.asname or a.name] = a.name
                elif (node.module, a.name) == ("horovod", "torch"):
                    scan.modules[a.asname or a.name] = TORCH_MODULE  # from horovod import torch as hvd
                elif node.module == "horovod":
                    scan.direct[a.asname or a.name] = a.name


def _add_import(scan: Scan, node: ast.AST, module: str) -> None:
    top = next(m for m in sorted(MODULES, key=len, reverse=True) if module == m or module.startswith(m + "."))
    scan.uses.append(Use(node.lineno, f"import {module}", ast.get_source_segment(scan.source, node) or module,
                         MODULES[top], node))


def resolve(scan: Scan, node: ast.AST) -> str | None:
    """The Horovod name ``node`` (an attribute chain or a name) stands for, if any."""
    if isinstance(node, ast.Name):
        return scan.direct.get(node.id)
    dotted = _dotted(node)
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    if head not in scan.modules or not rest:
        return None
    full = f"{scan.modules[head]}.{rest}"
    if full == "horovod.run":
        return "run"
    if full.startswith(TORCH_MODULE + "."):
        parts = full[len(TORCH_MODULE) + 1:].split(".")
        if parts[0].startswith("__"):
            return None  # hvd.__name__, hvd.__file__: the module's own attributes
        return parts[1] if parts[0] in ("mpi_ops", "optimizer", "functions", "compression") and len(parts) > 1 \
            else parts[0]
    return None


def _adasum_optimizer(scan: Scan, node: ast.AST) -> bool:
    """``node`` (``hvd.Adasum``) is the ``op=`` of a DistributedOptimizer call (refused, unlike Adasum elsewhere)."""
    keyword = scan.parents.get(node)
    call = scan.parents.get(keyword) if isinstance(keyword, ast.keyword) and keyword.arg == "op" else None
    return isinstance(call, ast.Call) and resolve(scan, call.func) == "DistributedOptimizer"


def _record(scan: Scan, node: ast.AST, name: str) -> None:
    if name == "Adasum" and _adasum_optimizer(scan, node):
        name = "DistributedOptimizer(op=Adasum)"
    call = RUN if name == "run" else CALLS.get(name, Call("torch.distributed", supported=False,
                                                          note="not a horovod.torch name the layer knows"))
    target = scan.parents.get(node)
    shown = target if isinstance(target, ast.Call) and target.func is node else node
    scan.uses.append(Use(node.lineno, name, ast.get_source_segment(scan.source, shown) or name, call, node))
    if name == "DistributedOptimizer" and isinstance(target, ast.Call):
        assign = scan.parents.get(target)
        if isinstance(assign, ast.Assign) and len(assign.targets) == 1:
            scan.optimizers.add(ast.unparse(assign.targets[0]))


def _walk_uses(scan: Scan, node: ast.AST) -> None:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return
    if isinstance(node, (ast.Attribute, ast.Name)) and isinstance(getattr(node, "ctx", None), ast.Load):
        name = resolve(scan, node)
        if name is not None:
            _record(scan, node, name)
            return
    for child in ast.iter_child_nodes(node):
        _walk_uses(scan, child)


def _optimizer_methods(scan: Scan) -> None:
    for node in ast.walk(scan.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in OPTIMIZER_METHODS and ast.unparse(node.func.value) in scan.optimizers:
            name = f"optimizer.{node.func.attr}"
            scan.uses.append(Use(node.lineno, name, ast.get_source_segment(scan.source, node) or name,
                                 CALLS[name], node))


def scan_script(path: Path) -> Scan:
    """Every Horovod import and use in ``path``, in line order."""
    try:
        source = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    return scan_source(path, source)


def scan_source(path: Path, source: str) -> Scan:
    """Every Horovod import and use in ``source`` (read from ``path``, or a port being written)."""
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: not valid Python ({e.msg})") from None
    scan = Scan(path, source, tree)
    scan.parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    _read_imports(scan)
    _walk_uses(scan, tree)
    _optimizer_methods(scan)
    scan.uses.sort(key=lambda u: (u.line, getattr(u.node, "col_offset", 0)))
    return scan


# -- what differs numerically in a DDP port ---------------------------------------------------------------
def _mentions_lr(scan: Scan, use: Use) -> bool:
    node: ast.AST | None = use.node
    while node is not None and not isinstance(node, ast.stmt):
        if isinstance(node, ast.keyword) and node.arg == "lr":
            return True
        node = scan.parents.get(node)
    text = ast.get_source_segment(scan.source, node) if node is not None else ""
    return "lr" in (text or "").lower()


def port_warnings(scan: Scan) -> list[str]:
    """Where an idiomatic DDP port of this script computes different numbers than Horovod (and the layer)."""
    out = []
    if scan.named("broadcast_optimizer_state"):
        out.append("broadcast_optimizer_state on a fresh optimizer runs one step() with zero gradients first: with "
                   "weight decay it moves the weights once, with Adam/AdamW it starts the step count at 1 (bias "
                   "correction shifts for the whole run). The port drops the call; to keep Horovod's numbers, give "
                   "every parameter a zero gradient and call optimizer.step() once before training")
    if scan.named("DistributedOptimizer"):
        out.append("parameters unused in a step: Horovod all-reduces zero gradients for them and the optimizer "
                   "still applies weight decay, momentum and Adam's moments; DDP needs "
                   "find_unused_parameters=True for them and leaves their gradients None, so the optimizer skips them")
        out.append("averaging: DDP divides each gradient by the world size before the sum, Horovod after it "
                   "(bit-equal at 2, 4, 8... ranks barring subnormals; last-bit differences otherwise)")
    if any("fp16" in u.text for u in scan.named("Compression")):
        out.append("Compression.fp16: Horovod sums in float16 and then divides; DDP's fp16_compress_hook divides "
                   "first (different rounding, different overflow)")
    if any(_mentions_lr(scan, u) for u in scan.named("size")):
        out.append("the learning rate is scaled by hvd.size() (Horovod's convention): the port keeps it as "
                   "dist.get_world_size(); DDP's own examples do not scale it")
    if "BatchNorm" in scan.source or "torchvision" in scan.source:
        out.append("BatchNorm buffers: DDP copies rank 0's buffers to every rank before each forward, Horovod "
                   "leaves each rank its own (rank 0's and the weights agree; other ranks' running statistics do not)")
    if scan.named("elastic"):
        # lazy: it loads libcst
        from dpcompare.native.port_elastic import DIFFERENCES

        out += DIFFERENCES
    if scan.named("DistributedOptimizer"):
        out.append("checkpoints: the DDP model's state_dict() keys start with 'module.' (save "
                   "model.module.state_dict() to keep Horovod's keys)")
    return out


# -- the command ------------------------------------------------------------------------------------------
def report(scan: Scan) -> dict[str, Any]:
    return {"script": str(scan.path),
            "calls": [{"line": u.line, "call": u.key, "source": u.text.splitlines()[0] if u.text else u.key,
                       "supported": u.supported, "native": u.call.native, "note": u.call.note} for u in scan.uses],
            "unsupported": sum(not u.supported for u in scan.uses),
            "warnings": port_warnings(scan)}
