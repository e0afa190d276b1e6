"""The DDP port ``dpcompare migrate`` writes beside a simple Horovod script, for the user to review.

Simple means: one ``NAME = hvd.DistributedOptimizer(OPTIMIZER, ...)`` over one model, nothing the layer refuses,
no accumulation (``backward_passes_per_step``), and only calls with a direct translation. The port is the script
with edits at the places the syntax tree gives (comments and layout kept): torch.distributed in place of the
Horovod calls, ``model = DDP(model)`` where the DistributedOptimizer was (after the parameter broadcast when that
comes later), small helpers for the collectives a script runs on its metrics, and torchrun's variables for the
local rank. It never overwrites a file.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpcompare.files import atomic_write_text
from dpcompare.native.migrate import Scan, Use, scan_source

#: whole calls replaced by an expression (their arguments do not matter)
CALL_TEXT = {
    "init": 'dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")',
    "rank": "dist.get_rank()", "size": "dist.get_world_size()",
    "local_rank": 'int(os.environ["LOCAL_RANK"])', "local_size": 'int(os.environ["LOCAL_WORLD_SIZE"])',
    "cross_rank": 'dist.get_rank() // int(os.environ["LOCAL_WORLD_SIZE"])',
    "cross_size": 'dist.get_world_size() // int(os.environ["LOCAL_WORLD_SIZE"])',
    "is_initialized": "dist.is_initialized()", "shutdown": "dist.destroy_process_group()",
    "barrier": "dist.barrier()", "join": "dist.barrier()", "is_homogeneous": "True",
    "mpi_built": "dist.is_mpi_available()", "mpi_enabled": "dist.is_mpi_available()",
    "gloo_built": "dist.is_gloo_available()", "gloo_enabled": "dist.is_gloo_available()",
    "nccl_built": "dist.is_nccl_available()", "cuda_built": "(torch.version.cuda is not None)",
    "rocm_built": "(torch.version.hip is not None)", "ddl_built": "False", "ccl_built": "False",
    "mpi_threads_supported": "False",
}
#: names replaced by another expression wherever they appear
NAME_TEXT = {"Average": '"average"', "Sum": "dist.ReduceOp.SUM", "Min": "dist.ReduceOp.MIN",
             "Max": "dist.ReduceOp.MAX", "Product": "dist.ReduceOp.PRODUCT", "SyncBatchNorm": "torch.nn.SyncBatchNorm",
             "HorovodInternalError": "torch.distributed.DistBackendError"}
COMPRESSION_TEXT = {"fp16": "default_hooks.fp16_compress_hook", "none": "None"}

HELPERS = {
    "allreduce": '''def allreduce(tensor, average=None, name=None, op=None, **_):
    """hvd.allreduce: a copy of ``tensor`` summed over the ranks, averaged unless op says otherwise."""
    out = tensor.detach().clone()
    average = op in (None, "average") if average is None else average
    dist.all_reduce(out, op=dist.ReduceOp.SUM if average or op is None else op)
    return out / dist.get_world_size() if average else out
''',
    "allreduce_": '''def allreduce_(tensor, average=None, name=None, op=None, **_):
    """hvd.allreduce_: ``tensor`` summed over the ranks in place, averaged unless op says otherwise."""
    tensor.copy_(allreduce(tensor, average, name, op))
    return tensor
''',
    "allgather": '''def allgather(tensor, name=None, **_):
    """hvd.allgather: every rank's ``tensor`` concatenated along dim 0 (first dimensions may differ)."""
    rows = torch.tensor([tensor.shape[0]], device=tensor.device)
    every = [torch.zeros_like(rows) for _ in range(dist.get_world_size())]
    dist.all_gather(every, rows)
    longest = int(max(every))
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in every]
    dist.all_gather(parts, padded)
    return torch.cat([part[: int(n)] for part, n in zip(parts, every)])
''',
    "broadcast": '''def broadcast(tensor, root_rank, name=None, **_):
    """hvd.broadcast: a copy of ``root_rank``'s ``tensor``."""
    out = tensor.detach().clone()
    dist.broadcast(out, src=root_rank)
    return out
''',
    "broadcast_": '''def broadcast_(tensor, root_rank, name=None, **_):
    """hvd.broadcast_: ``root_rank``'s ``tensor`` copied into everyone's, in place."""
    dist.broadcast(tensor, src=root_rank)
    return tensor
''',
    "broadcast_object": '''def broadcast_object(obj, root_rank=0, name=None, **_):
    """hvd.broadcast_object: ``root_rank``'s object."""
    box = [obj]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]
''',
    "allgather_object": '''def allgather_object(obj, name=None, **_):
    """hvd.allgather_object: every rank's object, in rank order."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
''',
}
#: optimizer methods and statements the port drops (a comment says what was there)
DROPPED = {"broadcast_parameters": "DDP broadcasts rank 0's parameters and buffers when it wraps the model",
           "broadcast_optimizer_state": "every rank builds the same optimizer (Horovod's zero-gradient step is "
                                        "not reproduced: see dpcompare migrate's warnings)",
           "optimizer.synchronize": "DDP has averaged the gradients when backward() returns"}
PORTABLE = {*CALL_TEXT, *NAME_TEXT, *HELPERS, *DROPPED, "Compression", "DistributedOptimizer",
            "optimizer.skip_synchronize", "global_process_set"}


@dataclass
class Edit:
    start: tuple[int, int]   # (line, column) as ast gives them: 1-based line, UTF-8 byte column
    end: tuple[int, int]
    text: str


def _span(node: ast.AST) -> tuple[tuple[int, int], tuple[int, int]]:
    return (node.lineno, node.col_offset), (node.end_lineno or node.lineno, node.end_col_offset or 0)  # type: ignore[attr-defined]


def _offset(lines: list[str], pos: tuple[int, int]) -> int:
    line, col = pos
    return sum(len(x) for x in lines[: line - 1]) + len(lines[line - 1].encode()[:col].decode())


def apply_edits(source: str, edits: list[Edit]) -> str:
    lines = source.splitlines(keepends=True) + [""]
    spans = sorted(((_offset(lines, e.start), _offset(lines, e.end), e.text) for e in edits), reverse=True)
    for a, b, text in spans:
        source = source[:a] + text + source[b:]
    return source


def _statement(scan: Scan, node: ast.AST) -> ast.stmt:
    while not isinstance(node, ast.stmt):
        node = scan.parents[node]
    return node


def _indent(scan: Scan, stmt: ast.stmt) -> str:
    return " " * stmt.col_offset


def _drop(scan: Scan, stmt: ast.stmt, why: str) -> Edit:
    """Replace ``stmt`` by a comment (by ``pass`` and the comment when it is its block's only statement)."""
    parent = scan.parents.get(stmt)
    alone = any(getattr(parent, f, None) == [stmt] for f in ("body", "orelse", "finalbody"))
    lines = (ast.get_source_segment(scan.source, stmt) or "").splitlines()
    was = lines[0].strip() + (" ..." if len(lines) > 1 else "")
    return Edit(*_span(stmt), f"{'pass  ' if alone else ''}# {why} (was: {was})")


@dataclass
class _Optimizer:
    stmt: ast.Assign
    target: str
    wrapped: str
    model: str
    compression: str | None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _model_of(scan: Scan, call: ast.Call, wrapped: str) -> str | None:
    """The model whose parameters the optimizer holds: ``named_parameters=M.named_parameters()``, else the
    ``M.parameters()`` the wrapped optimizer was built from."""
    named = _keyword(call, "named_parameters") or (call.args[1] if len(call.args) > 1 else None)
    if isinstance(named, ast.Call) and isinstance(named.func, ast.Attribute) and named.func.attr == "named_parameters":
        return ast.unparse(named.func.value)
    for node in ast.walk(scan.tree):
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [wrapped] \
                and isinstance(node.value, ast.Call) and node.value.args:
            first = node.value.args[0]
            if isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "parameters":
                return ast.unparse(first.func.value)
    return None


def _find_optimizer(scan: Scan, reasons: list[str]) -> _Optimizer | None:
    uses = scan.named("DistributedOptimizer")
    if len(uses) != 1:
        reasons.append(f"the port needs exactly one hvd.DistributedOptimizer (found {len(uses)})")
        return None
    call = scan.parents.get(uses[0].node)
    stmt = scan.parents.get(call) if isinstance(call, ast.Call) else None
    if not (isinstance(call, ast.Call) and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and call.args):
        reasons.append(f"line {uses[0].line}: write it as `optimizer = hvd.DistributedOptimizer(optimizer, ...)`")
        return None
    passes = _keyword(call, "backward_passes_per_step")
    if passes is not None and not (isinstance(passes, ast.Constant) and passes.value == 1):
        reasons.append("backward_passes_per_step: wrap all but the last backward() of a step in "
                       "`with model.no_sync():` by hand")
    wrapped = ast.unparse(call.args[0])
    model = _model_of(scan, call, wrapped)
    if model is None:
        reasons.append("cannot tell which model the optimizer trains: pass named_parameters=model.named_parameters()")
        return None
    comp = _keyword(call, "compression")
    return _Optimizer(stmt, ast.unparse(stmt.targets[0]), wrapped, model,
                      None if comp is None else ast.get_source_segment(scan.source, comp))


def reasons_not_simple(scan: Scan, opt: _Optimizer | None) -> list[str]:
    """Why no port is written (empty: a port is written)."""
    reasons = []
    for u in scan.uses:
        if u.key.startswith("import ") or u.key == "DistributedOptimizer(op=Adasum)":
            if not u.supported:
                reasons.append(f"line {u.line}: {u.text.splitlines()[0]} is not supported")
            continue
        if not u.supported:
            reasons.append(f"line {u.line}: {u.key} is not supported ({u.call.native})")
        elif u.key not in PORTABLE:
            reasons.append(f"line {u.line}: no automatic translation of {u.key} ({u.call.native})")
        elif u.key in DROPPED and not isinstance(scan.parents.get(_call_of(scan, u)), ast.Expr):
            reasons.append(f"line {u.line}: {u.key} is used inside an expression")
        elif u.key == "optimizer.skip_synchronize" and not isinstance(scan.parents.get(u.node), ast.withitem):
            reasons.append(f"line {u.line}: skip_synchronize() outside a `with` statement")
    return reasons


def _call_of(scan: Scan, use: Use) -> ast.AST:
    parent = scan.parents.get(use.node)
    return parent if isinstance(parent, ast.Call) and parent.func is use.node else use.node


def _use_edit(scan: Scan, u: Use, helpers: set[str]) -> Edit | None:
    """The edit for one use of Horovod (None: handled elsewhere or nothing to do)."""
    call = _call_of(scan, u)
    if u.key in DROPPED:
        return _drop(scan, _statement(scan, call), DROPPED[u.key])
    if u.key in CALL_TEXT and call is not u.node:
        return Edit(*_span(call), CALL_TEXT[u.key])
    if u.key in HELPERS:
        helpers.add(u.key)
        if u.key == "allreduce_":
            helpers.add("allreduce")
        return Edit(*_span(u.node), u.key)
    if u.key in NAME_TEXT:
        return Edit(*_span(u.node), NAME_TEXT[u.key])
    if u.key == "Compression" and isinstance(u.node, ast.Attribute) and u.node.attr in COMPRESSION_TEXT:
        return Edit(*_span(u.node), COMPRESSION_TEXT[u.node.attr])
    return None


class _Translate(ast.NodeTransformer):
    """An expression of the script with its Horovod names translated (for the compression argument)."""

    def __init__(self, scan: Scan) -> None:
        self.scan = scan

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        from dpcompare.native.migrate import resolve

        name = resolve(self.scan, node)
        if name == "Compression" and node.attr in COMPRESSION_TEXT:
            return ast.parse(COMPRESSION_TEXT[node.attr], mode="eval").body
        if name in NAME_TEXT and node.attr == name:
            return ast.parse(NAME_TEXT[name], mode="eval").body
        return self.generic_visit(node)


def _ddp_wrap(scan: Scan, opt: _Optimizer, indent: str) -> str:
    """``model = DDP(model)`` and the communication hook the compression asked for."""
    lines = [f"{opt.model} = DDP({opt.model})  # was: hvd.DistributedOptimizer(...)"]
    if opt.compression is not None:
        expr = ast.parse(opt.compression.strip(), mode="eval")
        hook = ast.unparse(_Translate(scan).visit(expr))
        if hook == COMPRESSION_TEXT["fp16"]:
            lines.append(f"{opt.model}.register_comm_hook(None, {hook})")
        elif hook != "None":
            lines += [f"if {hook} is not None:", f"    {opt.model}.register_comm_hook(None, {hook})"]
    return "\n".join(indent + line for line in lines)


def _optimizer_edits(scan: Scan, opt: _Optimizer) -> list[Edit]:
    """The DistributedOptimizer statement becomes the plain optimizer; the DDP wrap goes after it, or after the
    parameter broadcast when that comes later in the same block."""
    anchor: ast.stmt = opt.stmt
    block = scan.parents.get(opt.stmt)
    for u in scan.named("broadcast_parameters"):
        stmt = _statement(scan, u.node)
        if scan.parents.get(stmt) is block and stmt.lineno > anchor.lineno:
            anchor = stmt
    if opt.target == opt.wrapped:
        first = _drop(scan, opt.stmt, "the plain optimizer: DDP averages the gradients during backward()")
    else:
        first = Edit(*_span(opt.stmt), f"{opt.target} = {opt.wrapped}  # was: hvd.DistributedOptimizer(...)")
    end = _span(anchor)[1]
    return [first, Edit(end, end, "\n" + _ddp_wrap(scan, opt, _indent(scan, anchor)))]


def _unwrap_skip(scan: Scan, u: Use) -> Edit:
    """``with optimizer.skip_synchronize(): BODY`` → BODY, dedented."""
    stmt = _statement(scan, u.node)
    assert isinstance(stmt, ast.With)
    lines = scan.source.splitlines()
    shift = stmt.body[0].col_offset - stmt.col_offset
    body = [ln[shift:] if ln[:shift].strip() == "" else ln for ln in lines[stmt.body[0].lineno - 1: stmt.end_lineno]]
    body[0] = body[0].lstrip()
    return Edit(_span(stmt)[0], (stmt.end_lineno or stmt.lineno, len(lines[(stmt.end_lineno or stmt.lineno) - 1].encode())),
                "\n".join(body))


def _binds_torch(scan: Scan) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name.split(".")[0] == "torch" and (a.asname is None or a.asname == "torch")
                                                 for a in n.names) for n in scan.tree.body)


def _import_edits(scan: Scan, helpers: set[str]) -> list[Edit]:
    """The first Horovod import becomes torch.distributed's; the others go; the helpers follow the imports."""
    imports = [u for u in scan.uses if u.key.startswith("import ")]
    names = {u.key for u in scan.uses}
    block = (["import os"] if names & {"local_rank", "local_size", "cross_rank", "cross_size"} else []) + \
        ([] if _binds_torch(scan) else ["import torch"]) + ["import torch.distributed as dist"] + \
        (["from torch.distributed.algorithms.ddp_comm_hooks import default_hooks"] if "Compression" in names else []) + \
        ["from torch.nn.parallel import DistributedDataParallel as DDP"]
    first = imports[0].node
    assert isinstance(first, ast.stmt)
    edits = [Edit(*_span(first), ("\n" + _indent(scan, first)).join(block))]
    edits += [_drop(scan, u.node, "Horovod import") for u in imports[1:] if isinstance(u.node, ast.stmt)]
    if helpers:
        last = [n for n in scan.tree.body if isinstance(n, (ast.Import, ast.ImportFrom))][-1]
        end = _span(last)[1]
        text = "\n\n\n# Horovod's collectives on torch.distributed (written by dpcompare migrate)\n"
        edits.append(Edit(end, end, text + "\n\n".join(HELPERS[h] for h in HELPERS if h in helpers).rstrip("\n")))
    return edits


def port_source(scan: Scan, opt: _Optimizer, port_name: str, elastic: bool = False) -> str:
    """The DDP port's text (``elastic``: the elastic pass has rewritten the script; it runs under torchrun's
    elastic agent)."""
    helpers: set[str] = set()
    inside = {id(n) for n in ast.walk(opt.stmt)}
    edits = _optimizer_edits(scan, opt)
    for u in scan.uses:
        if u.key.startswith("import ") or id(u.node) in inside:
            continue
        if u.key == "optimizer.skip_synchronize":
            edits.append(_unwrap_skip(scan, u))
        elif (edit := _use_edit(scan, u, helpers)) is not None:
            edits.append(edit)
    edits += _import_edits(scan, helpers)
    header = (f"# DDP port of {scan.path.name}, written by `dpcompare migrate`: review it before use.\n"
              f"# Run: torchrun --nproc-per-node N {port_name} ARGS  "
              f"(or: dpcompare script --np N --as ddp -- python {port_name} ARGS)\n")
    if elastic:
        header += (f"# Elastic: torchrun --nnodes MIN:MAX --nproc-per-node N --max-restarts R --rdzv-backend c10d "
                   f"--rdzv-endpoint HOST:PORT --rdzv-id ID {port_name} ARGS\n")
    first_line = 2 if scan.source.startswith("#!") else 1
    edits.append(Edit((first_line, 0), (first_line, 0), header))
    return apply_edits(scan.source, edits)


def _overlapping(scan: Scan, opt: _Optimizer) -> list[str]:
    """Horovod uses inside a skip_synchronize() body, which the unwrapping would overwrite."""
    out = []
    for u in scan.named("optimizer.skip_synchronize"):
        stmt = _statement(scan, u.node)
        body = {id(n) for s in getattr(stmt, "body", []) for n in ast.walk(s)}
        out += [f"line {v.line}: {v.key} inside `with ...skip_synchronize():`" for v in scan.uses if id(v.node) in body]
    return out


def _elastic_first(scan: Scan) -> Scan:
    """The scan of the script as the elastic pass rewrites it (:mod:`.port_elastic`)."""
    from dpcompare.native.port_elastic import port_elastic_source

    return scan_source(scan.path, port_elastic_source(scan.source)[0])


def _script_lines(reasons: list[str], script: str, rewritten: str) -> list[str]:
    """``reasons`` with their ``line N`` of ``rewritten`` given as the line of ``script`` it was."""
    where: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(None, script.splitlines(), rewritten.splitlines(), autojunk=False)
    for block in matcher.get_matching_blocks():
        where.update({block.b + i + 1: block.a + i + 1 for i in range(block.size)})
    return [re.sub(r"\bline (\d+)", lambda m: f"line {where.get(int(m[1]), m[1])}", r) for r in reasons]


def write_port(scan: Scan, dest: Path | None, dry_run: bool = False) -> dict[str, Any]:
    """Write the DDP port when the script is simple enough; what happened, as a message and its reasons."""
    reasons: list[str] = []
    script, elastic = scan.source, bool(scan.named("elastic"))
    if elastic:  # issue 65 part B: the elastic pass (libcst) rewrites the script first; the rest ports its output
        scan = _elastic_first(scan)
    opt = _find_optimizer(scan, reasons)
    reasons += reasons_not_simple(scan, opt)
    if opt is not None:
        reasons += _overlapping(scan, opt)
    reasons = _script_lines(reasons, script, scan.source) if elastic else reasons
    dest = dest or scan.path.with_name(f"{scan.path.stem}_ddp.py")
    if reasons or opt is None:
        return {"written": None, "reasons": reasons,
                "message": "No DDP port written: " + "; ".join(reasons) + "."}
    text = port_source(scan, opt, dest.name, elastic)
    try:
        ast.parse(text)
    except SyntaxError as e:  # a translation this module got wrong: say so rather than write it
        return {"written": None, "reasons": [f"the port does not parse ({e.msg}, line {e.lineno})"],
                "message": f"No DDP port written: dpcompare migrate produced invalid Python at line {e.lineno} "
                           "(please report it)."}
    if dry_run:
        return {"written": None, "reasons": [], "message": f"A DDP port can be written ({dest}); --no-port kept it."}
    if dest.exists():
        return {"written": None, "reasons": [f"{dest} exists"],
                "message": f"{dest} exists and is left as it is (remove it, or pass --port FILE)."}
    atomic_write_text(dest, text)
    return {"written": str(dest), "reasons": [],
            "message": f"Wrote the DDP port {dest}: review it, then run it with `torchrun --nproc-per-node 2 "
                       f"{dest} ARGS` or `dpcompare script --np 2 --as ddp -- python {dest} ARGS`."}
