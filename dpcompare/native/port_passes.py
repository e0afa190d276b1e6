"""The port's passes for plain (non-elastic) Horovod scripts, in the order :data:`.port.PASSES` runs them.

- :func:`flag_guards`: a branch taken only under a flag that uses what DDP lacks (``op=hvd.Adasum if
  args.use_adasum else hvd.Average``; ``if args.num_proc: horovod.run(...)``) keeps the default path, and the
  flag stops the port at start with one line (right after the top-level ``parse_args()`` when there is one);
- :func:`accumulation`: ``backward_passes_per_step=N`` puts each forward and its backward() under
  ``accumulate(model)``: ``model.no_sync()`` but on every N-th pass since the last step (DDP decides at the
  forward whether the backward all-reduces), so the gradients are all-reduced once per N passes, summed over
  the passes and averaged over the ranks, as Horovod does (a step after fewer passes averages what accumulated,
  as Horovod's ``step()`` does);
- :func:`calls`: every other call with a direct translation (torch.distributed, torchrun's variables, small
  helpers for the collectives a script runs on its metrics), and the statements DDP makes needless;
- :func:`unported`: what no pass translated, named (no port is written);
- :func:`distributed_optimizer`: the DistributedOptimizer becomes the plain optimizer and ``model = DDP(model)``
  (the parameter broadcast dropped), with DDP's fp16 communication hook for ``Compression.fp16``.
"""

from __future__ import annotations

import ast

import libcst as cst

from dpcompare.native.port_tools import Edits, Located, NoPort, add_helpers, locate
from dpcompare.native.record import PORT_METRIC_EVENT

#: whole calls replaced by an expression (their arguments do not matter)
CALL_TEXT = {
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
#: Horovod names no DDP port can keep: a branch that takes them only under a flag is guarded (:func:`flag_guards`)
NO_DDP = {"Adasum": "Horovod's Adasum has no DDP equivalent (DDP averages)",
          "DistributedOptimizer(op=Adasum)": "Horovod's Adasum has no DDP equivalent (DDP averages)"}
#: statements the port drops (a comment says what was there)
DROPPED = {"broadcast_parameters": "DDP broadcasts rank 0's parameters and buffers when it wraps the model",
           "broadcast_optimizer_state": "every rank builds the same optimizer (Horovod's zero-gradient step is "
                                        "not reproduced: see dpcompare migrate's warnings)",
           "optimizer.synchronize": "DDP has averaged the gradients when backward() returns"}

HELPERS = {
    "init": '''def init(*_, **__):
    """Horovod's init(): join torchrun's process group, and leave it at exit as Horovod shuts down at exit (a gloo
    group still up while the interpreter ends can abort the process, exit -6, and torchrun would start it again)."""
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
''',
    "allreduce": f'''def allreduce(tensor, average=None, name=None, op=None, **_):
    """hvd.allreduce: a copy of ``tensor`` summed over the ranks, averaged unless op says otherwise.
    A runner may record it by its name: the audit event "{PORT_METRIC_EVENT}" (PEP 578; nothing when none listens)."""
    out = tensor.detach().clone()
    average = op in (None, "average") if average is None else average
    dist.all_reduce(out, op=dist.ReduceOp.SUM if average or op is None else op)
    out = out / dist.get_world_size() if average else out
    sys.audit("{PORT_METRIC_EVENT}", name, out)
    return out
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
HELPERS_TITLE = "Horovod's collectives on torch.distributed (written by dpcompare migrate)"

ACCUMULATE = '''BACKWARD_PASSES = {"per_step": 1, "since_step": 0}


def set_backward_passes(per_step):
    """Horovod's backward_passes_per_step: DDP all-reduces on every ``per_step``-th backward() since a step."""
    BACKWARD_PASSES.update(per_step=per_step, since_step=0)


def accumulate(model):
    """Around a forward and its backward(): ``model.no_sync()`` (the gradient accumulates) but on every N-th."""
    BACKWARD_PASSES["since_step"] += 1
    if BACKWARD_PASSES["since_step"] % BACKWARD_PASSES["per_step"] == 0:
        return contextlib.nullcontext()
    return model.no_sync()


def finish_passes(model):
    """Before a step after fewer than N backward() calls: average what accumulated, as Horovod's step() does."""
    if BACKWARD_PASSES["since_step"] % BACKWARD_PASSES["per_step"]:
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(dist.get_world_size())
    BACKWARD_PASSES["since_step"] = 0
'''


def _flag(loc: Located, test: cst.BaseExpression) -> str:
    """How a user sets the condition ``test``: ``args.use_adasum`` → ``--use-adasum``, else its code."""
    if isinstance(test, cst.Attribute) and isinstance(test.value, cst.Name) and test.value.value in ("args", "opts",
                                                                                                      "options"):
        return "--" + test.attr.value.replace("_", "-")
    return loc.code(test)


def _guard(condition: str, message: str) -> str:
    return f"if {condition}:  # dpcompare migrate\n    raise SystemExit({message!r})\n"


def _flagged_branch(loc: Located, node: cst.CSTNode) -> tuple[cst.IfExp, bool] | None:
    """The ``A if TEST else B`` whose branch holds ``node``, and whether that branch is A (taken when TEST)."""
    child = node
    for a in loc.ancestors(node):
        if isinstance(a, cst.IfExp) and child is not a.test:
            return a, child is a.body
        if isinstance(a, cst.BaseStatement):
            return None
        child = a
    return None


def _guard_idioms(loc: Located, edits: Edits, notes: list[str]) -> None:
    """``X if FLAG else Y`` where X has no DDP equivalent: Y kept, FLAG stops the port at start."""
    guarded: set[str] = set()
    for key, why in NO_DDP.items():
        for use, node in loc.uses(key):
            found = _flagged_branch(loc, node)
            if found is None:
                continue
            ifexp, when_true = found
            kept = ifexp.orelse if when_true else ifexp.body
            edits.replace[ifexp] = lambda updated, when_true=when_true: \
                updated.orelse if when_true else updated.body  # type: ignore[attr-defined]
            test = loc.code(ifexp.test)
            condition = test if when_true else f"not ({test})"
            if condition in guarded:
                continue
            guarded.add(condition)
            flag = _flag(loc, ifexp.test) if when_true else f"not {test}"
            guard = _guard(condition, f"{flag}: {why}; run the port without it")
            parsed = _parsed_at(loc, ifexp.test)
            if parsed is not None:
                edits.insert_after(parsed, guard)
            else:
                edits.insert_before(loc.statement(ifexp), guard)
            notes.append(f"{flag} ({use.text.splitlines()[0]}): {why}; the port keeps the default path "
                         f"(`{loc.code(kept)}`) and stops at start with one line when {flag} is given")


def _root_name(expr: cst.CSTNode) -> str | None:
    while isinstance(expr, (cst.Attribute, cst.UnaryOperation)):
        expr = expr.value if isinstance(expr, cst.Attribute) else expr.expression
    return expr.value if isinstance(expr, cst.Name) else None


def _parsed_at(loc: Located, test: cst.BaseExpression) -> cst.CSTNode | None:
    """The top-level ``args = parser.parse_args()`` that binds the name the flag's test reads (the guard goes
    right after it, before anything starts), if there is one."""
    name = _root_name(test)
    for stmt in loc.positions:
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign) \
                and [loc.code(t.target) for t in stmt.body[0].targets] == [name] \
                and isinstance(call := stmt.body[0].value, cst.Call) and isinstance(call.func, cst.Attribute) \
                and call.func.attr.value == "parse_args" \
                and not any(isinstance(a, cst.FunctionDef) for a in loc.ancestors(stmt)):
            return stmt
    return None


def flag_guards(tree: cst.Module) -> tuple[cst.Module, list[str]]:
    """Branches under a flag that use what DDP lacks: the default path kept, the flag refused at start."""
    loc = locate(tree)
    edits = Edits(loc)
    notes: list[str] = []
    _guard_idioms(loc, edits, notes)
    for _use, node in loc.uses("run"):  # horovod.run(...) under `if args.num_proc:`
        stmt = loc.statement(node)
        block = loc.parents.get(stmt)
        branch = loc.parents.get(block) if block is not None else None
        if not (isinstance(branch, cst.If) and branch.body is block):
            continue
        flag = _flag(loc, branch.test)
        message = (f"{flag}: horovod.run starts Horovod's own workers; start the port with torchrun instead "
                   f"(torchrun --nproc-per-node N SCRIPT ARGS)")
        body = cst.parse_statement(_guard("True", message)).body  # type: ignore[attr-defined]
        edits.replace[branch] = lambda updated, body=body: updated.with_changes(body=body)  # type: ignore[attr-defined]
        notes.append(f"{flag}: horovod.run has no DDP equivalent; the port stops at start with one line when "
                     f"{flag} is given (start it with torchrun)")
    return edits.apply(), notes


# -- the DistributedOptimizer ----------------------------------------------------------------------------------
def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _model_of(loc: Located, call: ast.Call, wrapped: str) -> str | None:
    """The model whose parameters the optimizer holds: ``named_parameters=M.named_parameters()``, else the
    ``M.parameters()`` the wrapped optimizer was built from."""
    named = _keyword(call, "named_parameters") or (call.args[1] if len(call.args) > 1 else None)
    if isinstance(named, ast.Call) and isinstance(named.func, ast.Attribute) and named.func.attr == "named_parameters":
        return ast.unparse(named.func.value)
    for node in ast.walk(loc.scan.tree):
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [wrapped] \
                and isinstance(node.value, ast.Call) and node.value.args:
            first = node.value.args[0]
            if (
                isinstance(first, ast.Call)
                and isinstance(first.func, ast.Attribute)
                and first.func.attr == "parameters"
            ):
                return ast.unparse(first.func.value)
    return None


def optimizer_call(loc: Located) -> tuple[ast.Call, ast.Assign, str] | None:
    """The one ``NAME = hvd.DistributedOptimizer(OPTIMIZER, ...)``: its call, statement and model (None: none)."""
    uses = loc.scan.named("DistributedOptimizer")
    if not uses:
        return None
    if len(uses) != 1:
        raise NoPort(f"the port needs exactly one hvd.DistributedOptimizer (found {len(uses)})")
    call = loc.scan.parents.get(uses[0].node)
    stmt = loc.scan.parents.get(call) if isinstance(call, ast.Call) else None
    if not (isinstance(call, ast.Call) and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and call.args):
        raise NoPort(f"line {uses[0].line}: write it as `optimizer = hvd.DistributedOptimizer(optimizer, ...)`")
    model = _model_of(loc, call, ast.unparse(call.args[0]))
    if model is None:
        raise NoPort("cannot tell which model the optimizer trains: pass named_parameters=model.named_parameters()")
    return call, stmt, model


def _method_call(stmt: cst.CSTNode) -> cst.Call | None:
    """The call when ``stmt`` is a line holding only ``X.METHOD(...)``."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr):
        value = stmt.body[0].value
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            return value
    return None


def _after_synchronize(loc: Located, stmt: cst.CSTNode) -> bool:
    """``stmt`` is inside ``with optimizer.skip_synchronize():`` (its ``synchronize()`` came first)."""
    return any(isinstance(a, cst.With) and "skip_synchronize" in loc.code(a.items[0]) for a in loc.ancestors(stmt))


def _forward_to_backward(tree: cst.Module, model: str) -> cst.Module:
    """Each ``X.backward()`` and the statements from ``model``'s forward up to it under ``with accumulate(model):``
    (DDP decides at the forward whether the backward all-reduces)."""
    loc = locate(tree)
    edits = Edits(loc)
    for stmt in list(loc.positions):
        call = _method_call(stmt)
        block = loc.parents.get(stmt)
        if call is None or call.func.attr.value != "backward" or block in edits.replace \
                or not isinstance(block, (cst.IndentedBlock, cst.Module)):  # type: ignore[attr-defined]
            continue
        end = list(block.body).index(stmt)
        start = next((i for i in range(end + 1) if f"{model}(" in loc.code(block.body[i])), None)
        if start is None:
            raise NoPort(f"backward_passes_per_step: `{loc.code(stmt)}` is not in the block that runs {model}'s "
                         f"forward; put both under `with {model}.no_sync():` (all but every N-th pass) by hand")
        edits.replace[block] = lambda u, a=start, b=end: u.with_changes(body=[*u.body[:a], cst.With(
            items=[cst.WithItem(cst.parse_expression(f"accumulate({model})"))], leading_lines=u.body[a].leading_lines,
            body=cst.IndentedBlock([u.body[a].with_changes(leading_lines=[]), *u.body[a + 1:b + 1]])),
            *u.body[b + 1:]])
    return edits.apply()


def _accumulation_edits(loc: Located, edits: Edits, target: str, model: str) -> None:
    """``finish_passes(model)`` before each step and in place of ``optimizer.synchronize()``."""
    for stmt in list(loc.positions):
        call = _method_call(stmt)
        if call is None:
            continue
        method, owner = call.func.attr.value, loc.code(call.func.value)  # type: ignore[attr-defined]
        if method == "step" and (owner == target or (call.args and loc.code(call.args[0].value) == target)) \
                and not _after_synchronize(loc, stmt):
            edits.insert_before(stmt, f"finish_passes({model})\n")
        elif method == "synchronize" and owner == target:
            edits.replace[stmt] = lambda u: cst.parse_statement(f"finish_passes({model})\n").with_changes(
                leading_lines=u.leading_lines)


def accumulation(tree: cst.Module) -> tuple[cst.Module, list[str]]:
    """``backward_passes_per_step=N``: ``model.no_sync()`` around all but every N-th backward() since a step."""
    loc = locate(tree)
    try:
        found = optimizer_call(loc)
    except NoPort:  # said by distributed_optimizer(), after what the other passes refuse
        return tree, []
    passes = None if found is None else _keyword(found[0], "backward_passes_per_step")
    if found is None or passes is None or (isinstance(passes, ast.Constant) and passes.value == 1):
        return tree, []
    _call, assign, model = found
    [(_use, node)] = loc.uses("DistributedOptimizer")
    edits = Edits(loc)
    edits.replace[loc.call_of(node)] = lambda u: u.with_changes(args=[  # type: ignore[index]
        a for a in u.args if not (a.keyword and a.keyword.value == "backward_passes_per_step")])
    edits.insert_after(loc.statement(node), f"set_backward_passes({ast.unparse(passes)})\n")
    _accumulation_edits(loc, edits, ast.unparse(assign.targets[0]), model)
    tree = add_helpers(_forward_to_backward(edits.apply(), model), ACCUMULATE, "Horovod's backward_passes_per_step on "
                                                                               "DDP (written by dpcompare "
                       "migrate): the gradients are all-reduced once per N backward() calls, summed over them")
    return tree, [f"backward_passes_per_step={ast.unparse(passes)}: the port runs all but every N-th forward and "
                  f"backward() under {model}.no_sync(), so DDP all-reduces once per N passes (summed over the passes, "
                  "averaged over the ranks) as Horovod does; a step after fewer passes averages what accumulated in "
                  "full precision"]


# -- every other call ----------------------------------------------------------------------------------------
def _use_edit(loc: Located, edits: Edits, key: str, node: cst.CSTNode, helpers: set[str]) -> None:
    call = loc.call_of(node)
    if key in DROPPED and key != "broadcast_parameters":  # that one: distributed_optimizer()
        stmt = loc.alone(call or node)
        if stmt is not None:
            edits.remove(stmt, DROPPED[key])
    elif key in CALL_TEXT and call is not None:
        edits.replace[call] = lambda u, text=CALL_TEXT[key]: cst.parse_expression(text)
    elif key in HELPERS:
        helpers |= {key, "allreduce"} if key == "allreduce_" else {key}
        edits.replace[node] = lambda u, name=key: cst.Name(name)
    elif key in NAME_TEXT:
        edits.replace[node] = lambda u, text=NAME_TEXT[key]: cst.parse_expression(text)
    elif key == "Compression" and isinstance(node, cst.Attribute) and node.attr.value in COMPRESSION_TEXT:
        edits.replace[node] = lambda u, text=COMPRESSION_TEXT[node.attr.value]: cst.parse_expression(text)
    elif key == "optimizer.skip_synchronize":
        stmt = loc.statement(node)
        if isinstance(stmt, cst.With) and len(stmt.items) == 1 and stmt.items[0].item is node \
                and isinstance(stmt.body, cst.IndentedBlock):
            edits.replace[stmt] = lambda u: cst.FlattenSentinel([
                s.with_changes(leading_lines=[*u.leading_lines, *s.leading_lines]) if i == 0 else s
                for i, s in enumerate(u.body.body)])


def calls(tree: cst.Module) -> tuple[cst.Module, list[str]]:
    """Every call with a direct translation, and the statements DDP makes needless (a comment says what was
    there); the DistributedOptimizer is left to :func:`distributed_optimizer`."""
    loc = locate(tree)
    edits = Edits(loc)
    helpers: set[str] = set()
    for use in loc.scan.uses:
        node = loc.node(use)
        if node is not None and not use.key.startswith("import "):
            _use_edit(loc, edits, use.key, node, helpers)
    tree = edits.apply()
    if helpers:
        tree = add_helpers(tree, "\n\n".join(HELPERS[h] for h in HELPERS if h in helpers), HELPERS_TITLE)
    return tree, []


def unported(tree: cst.Module) -> tuple[cst.Module, list[str]]:
    """Refuse what no pass translated (every Horovod use left but the imports and the DistributedOptimizer)."""
    loc = locate(tree)
    left = []
    for u in loc.scan.uses:
        if (u.key.startswith("import ") and u.supported) or u.key == "DistributedOptimizer":
            continue
        node = loc.node(u)
        if u.key == "broadcast_parameters" and node is not None and loc.alone(loc.call_of(node) or node):
            continue
        source = u.text.splitlines()[0] if u.text else u.key
        left.append(f"`{source}`: " + ("not supported" if not u.supported else "no automatic translation")
                    + f" ({u.call.native})")
    if left:
        raise NoPort("; ".join(left))
    return tree, []


# -- the DistributedOptimizer ----------------------------------------------------------------------------------
def _ddp_wrap(call: ast.Call, model: str) -> str:
    """``model = DDP(model)`` and the communication hook the compression asked for (already translated)."""
    lines = [f"{model} = DDP({model})  # was: hvd.DistributedOptimizer(...)"]
    comp = _keyword(call, "compression")
    hook = None if comp is None else ast.unparse(comp)
    if hook == COMPRESSION_TEXT["fp16"]:
        lines.append(f"{model}.register_comm_hook(None, {hook})")
    elif hook not in (None, "None"):
        lines += [f"if {hook} is not None:", f"    {model}.register_comm_hook(None, {hook})"]
    return "\n".join(lines) + "\n"


def distributed_optimizer(tree: cst.Module) -> tuple[cst.Module, list[str]]:
    """The DistributedOptimizer becomes the plain optimizer; ``model = DDP(model)`` goes after it, or after the
    parameter broadcast (dropped: DDP broadcasts) when that comes later in the same block."""
    loc = locate(tree)
    found = optimizer_call(loc)
    edits = Edits(loc)
    broadcasts = [s for _u, n in loc.uses("broadcast_parameters") if (s := loc.alone(loc.call_of(n) or n))]
    for stmt in broadcasts:
        edits.remove(stmt, DROPPED["broadcast_parameters"])
    if found is None:
        return edits.apply(), []
    call, assign, model = found
    op = _keyword(call, "op")
    if op is not None and ast.unparse(op) != repr("average"):
        shown = next((f"hvd.{k}" for k, v in NAME_TEXT.items() if v == ast.unparse(op)), ast.unparse(op))
        raise NoPort(f"op={shown}: DDP averages the gradients; a port keeps Horovod's default (hvd.Average) only")
    [(_use, node)] = loc.uses("DistributedOptimizer")
    stmt = loc.statement(node)
    target, wrapped = ast.unparse(assign.targets[0]), ast.unparse(call.args[0])
    if target == wrapped:
        edits.remove(stmt, "the plain optimizer: DDP averages the gradients during backward()")
    else:
        edits.replace[stmt] = lambda u: cst.parse_statement(
            f"{target} = {wrapped}  # was: hvd.DistributedOptimizer(...)\n").with_changes(leading_lines=u.leading_lines)
    anchor = stmt
    for later in broadcasts:
        if loc.parents.get(later) is loc.parents.get(stmt) and loc.line(later) > loc.line(anchor):
            anchor = later
    edits.insert_after(anchor, _ddp_wrap(call, model))
    notes = []
    if _keyword(call, "gradient_predivide_factor") is not None:
        notes.append("gradient_predivide_factor: Horovod divides by it before the sum and multiplies after; DDP "
                     "divides by the world size before the sum (the same average, rounded otherwise)")
    return edits.apply(), notes
