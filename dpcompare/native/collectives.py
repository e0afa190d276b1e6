"""Horovod's collectives on torch.distributed, with Horovod's arithmetic and handles.

All-reduce as Horovod's C++ core does it: the tensor is multiplied by ``prescale_factor`` before the sum and by
``postscale_factor`` after it (divided by the world size for ``Average``); the factors are cast to the tensor's
precision (float for fp16 and fp32), integers are scaled in double and truncated, and a factor of exactly 1 is
skipped. At two ranks a sum has one order, so the results are bit-equal to Horovod's; with more ranks gloo's
order of summation may differ from MPI's in the last bit.

Asynchronous calls return an integer handle, as Horovod's do, for :func:`poll` and :func:`synchronize`. Unlike
Horovod, which negotiates by name, torch.distributed pairs collectives by order: every rank must issue them in
the same order (Horovod's own examples do).
"""

from __future__ import annotations

import collections
import itertools
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dpcompare.native.process_sets import (
    ProcessSet,
    check_process_set,
    global_process_set,
)
from dpcompare.native.state import size

# Horovod's reduction codes (horovod.common.basics), so that scripts comparing or printing them see the same.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_TORCH_OPS = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN, Max: dist.ReduceOp.MAX,
              Product: dist.ReduceOp.PRODUCT}


class HorovodInternalError(RuntimeError):
    """A collective failed (a peer died, the network broke): Horovod's exception, raised where Horovod raises it."""


def resolve_op(op: int | None, average: bool | None, call: str = "hvd.allreduce") -> int:
    """Horovod's handling of the deprecated ``average=`` and the default (Average)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        op = Average if average else Sum
    op = Average if op is None else op
    if op not in _TORCH_OPS and op != Adasum:
        raise ValueError(f"unknown reduction op {op!r}")
    return op


def scale_(t: torch.Tensor, factor: float) -> torch.Tensor:
    """``t *= factor`` as Horovod's ScaleBuffer does it: in the tensor's precision, integers in double then
    truncated toward zero."""
    if t.is_floating_point() or t.is_complex():
        return t.mul_(factor)
    return t.copy_(t.double().mul_(factor))


# -- handles ----------------------------------------------------------------------------------------------
@dataclass
class Pending:
    """One collective in flight: the torch works to wait for, and what turns their buffers into the result."""

    works: list[Any]
    finish: Callable[[], Any]
    keep: tuple[Any, ...] = field(default=())     # tensors that must live until the collective ends

    def done(self) -> bool:
        return all(w is None or w.is_completed() for w in self.works)

    def result(self) -> Any:
        try:
            for w in self.works:
                if w is not None:
                    w.wait()
        except RuntimeError as e:
            raise HorovodInternalError(str(e)) from e
        _recent.append(self.keep)
        return self.finish()


#: the tensors of the last collectives, kept a little longer: gloo's worker thread lets go of a finished work
#: just after wait() returns, and if its reference were the last one it would need the GIL to free a tensor made
#: in Python, which aborts the process when that happens while the interpreter exits
_recent: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=32)
_handles: dict[int, Pending] = {}
_counter = itertools.count(1)


def register(p: Pending) -> int:
    h = next(_counter)
    _handles[h] = p
    return h


def poll(handle: int) -> bool:
    """True when :func:`synchronize` on ``handle`` will not block."""
    if handle not in _handles:
        raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
    return _handles[handle].done()


def synchronize(handle: int) -> Any:
    """Wait for ``handle``'s collective and return its output (None for an unknown handle, as Horovod does)."""
    p = _handles.pop(handle, None)
    return None if p is None else p.result()


# -- all-reduce ---------------------------------------------------------------------------------------------
def start_allreduce(tensor: torch.Tensor, output: torch.Tensor, op: int, prescale: float,
                    postscale: float, ps: ProcessSet = global_process_set,
                    counts: Sequence[int] | None = None) -> Pending:
    """Sum (min, max, product) ``tensor`` into ``output`` across ranks with Horovod's scaling; not waited for."""
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    if output is not tensor:
        output.copy_(tensor)
    if prescale != 1.0:
        scale_(output, prescale)
    if op == Adasum:  # Horovod's CPU Adasum, per tensor of a fused buffer (``counts``)
        return _adasum(output, counts or [output.numel()], postscale, ps, (tensor, output))
    work = dist.all_reduce(output, op=_TORCH_OPS[op], group=ps.group, async_op=True)
    post = postscale / (ps.size() or 1) if op == Average else postscale

    def finish() -> torch.Tensor:
        if post != 1.0:
            scale_(output, post)
        return output
    return Pending([work], finish, (tensor, output))


def _adasum(buf: torch.Tensor, counts: Sequence[int], postscale: float, ps: ProcessSet,
            keep: tuple[Any, ...]) -> Pending:
    """``buf`` replaced by every rank's Adasum (:mod:`.adasum`), then post-scaled; done when it returns."""
    from dpcompare.native.adasum import adasum, check

    check(size(), ps is global_process_set)
    buf.view(-1).copy_(adasum(buf.view(-1), counts))
    if postscale != 1.0:
        scale_(buf, postscale)
    return Pending([], lambda: buf, keep)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.allreduce_async")
    op = resolve_op(op, average, "hvd.allreduce_async")
    return register(start_allreduce(tensor, torch.empty_like(tensor), op, prescale_factor, postscale_factor, ps))


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.allreduce_async_")
    op = resolve_op(op, average, "hvd.allreduce_async_")
    return register(start_allreduce(tensor, tensor, op, prescale_factor, postscale_factor, ps))


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


class _Allreduce(torch.autograd.Function):
    """All-reduce with a gradient: the gradient is all-reduced with the same op and factors (as Horovod's)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: int, prescale: float, postscale: float,
                ps: ProcessSet = global_process_set) -> torch.Tensor:
        ctx.args = (op, prescale, postscale, ps)
        return start_allreduce(tensor, torch.empty_like(tensor), op, prescale, postscale, ps).result()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, ps = ctx.args
        out = start_allreduce(grad.contiguous(), torch.empty_like(grad), op, prescale, postscale, ps).result()
        return out, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, compression: Any = None,
              op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """The reduced copy of ``tensor`` (Average by default); ``tensor`` is left as it was."""
    from dpcompare.native.compression import Compression

    ps = check_process_set(process_set, "hvd.allreduce")
    op = resolve_op(op, average)
    compression = compression or Compression.none
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, op, prescale_factor, postscale_factor, ps)
    return compression.decompress(reduced, ctx)


# -- fused (grouped) all-reduce ----------------------------------------------------------------------------
def start_fused_allreduce(tensors: Sequence[torch.Tensor], op: int, prescale: float, postscale: float,
                          outputs: Sequence[torch.Tensor] | None = None,
                          buffer: torch.Tensor | None = None, ps: ProcessSet = global_process_set) -> Pending:
    """One all-reduce of ``tensors`` (one dtype, one device) copied into one buffer (``buffer`` when given: kept
    between steps, as Horovod keeps its fusion buffer); the results go to ``outputs`` (default: back into
    ``tensors``). A single contiguous tensor is reduced in place. ``Pending.keep[0]`` is the buffer."""
    outputs = list(tensors) if outputs is None else list(outputs)
    if len(tensors) == 1 and outputs[0] is tensors[0] and tensors[0].is_contiguous():
        return start_allreduce(tensors[0], tensors[0], op, prescale, postscale, ps)
    flat = [t.reshape(-1) for t in tensors]
    total = sum(t.numel() for t in flat)
    fits = buffer is not None and buffer.numel() == total and buffer.dtype == flat[0].dtype
    buf = torch.cat(flat, out=buffer) if fits else torch.cat(flat)
    inner = start_allreduce(buf, buf, op, prescale, postscale, ps, [t.numel() for t in tensors])

    def finish() -> list[torch.Tensor]:
        flat = inner.finish()
        for out, part in zip(outputs, flat.split([t.numel() for t in tensors]), strict=True):
            out.copy_(part.view_as(out))
        return outputs
    return Pending(inner.works, finish, (buf, *tensors))


def _grouped(tensors: Sequence[torch.Tensor], op: int, prescale: float, postscale: float,
             outputs: Sequence[torch.Tensor], ps: ProcessSet = global_process_set) -> Pending:
    """Fused all-reduces of ``tensors``, one per dtype and device, waited for together."""
    by_kind: dict[tuple[Any, Any], list[int]] = {}
    for i, t in enumerate(tensors):
        by_kind.setdefault((t.dtype, t.device), []).append(i)
    parts = [start_fused_allreduce([tensors[i] for i in idx], op, prescale, postscale, [outputs[i] for i in idx],
                                   ps=ps) for idx in by_kind.values()]

    def finish() -> list[torch.Tensor]:
        for p in parts:
            p.finish()
        return list(outputs)
    return Pending([w for p in parts for w in p.works], finish, tuple(tensors))


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.grouped_allreduce_async")
    op = resolve_op(op, average, "hvd.grouped_allreduce_async")
    outs = [torch.empty_like(t) for t in tensors]
    return register(_grouped(tensors, op, prescale_factor, postscale_factor, outs, ps))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: int | None = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.grouped_allreduce_async_")
    op = resolve_op(op, average, "hvd.grouped_allreduce_async_")
    return register(_grouped(tensors, op, prescale_factor, postscale_factor, tensors, ps))


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = None, op: int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    if any(t.requires_grad for t in tensors):  # with gradients: one autograd all-reduce each (same numbers)
        return [allreduce(t, average, name, compression, op, prescale_factor, postscale_factor, process_set)
                for t in tensors]
    from dpcompare.native.compression import Compression

    compression = compression or Compression.none
    packed = [compression.compress(t) for t in tensors]
    out = synchronize(grouped_allreduce_async([c for c, _ in packed], average, name, op, prescale_factor,
                                              postscale_factor, process_set))
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, packed, strict=True)]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


# -- all-gather ---------------------------------------------------------------------------------------------
def start_allgather(tensor: torch.Tensor, ps: ProcessSet = global_process_set) -> Pending:
    """Concatenate every rank's ``tensor`` along the first dimension, which may differ between ranks."""
    t = tensor.contiguous()
    n = ps.size() or 1
    first = torch.tensor([t.shape[0] if t.dim() else 1], dtype=torch.int64)
    firsts = [torch.zeros_like(first) for _ in range(n)]
    dist.all_gather(firsts, first, group=ps.group)
    _recent.append((first, *firsts))
    counts = [int(f) for f in firsts]
    longest = max(counts)
    t = t.reshape(1) if t.dim() == 0 else t
    padded = t if t.shape[0] == longest else torch.cat([t, t.new_zeros((longest - t.shape[0], *t.shape[1:]))])
    parts = [torch.empty_like(padded) for _ in range(n)]
    work = dist.all_gather(parts, padded, group=ps.group, async_op=True)

    def finish() -> torch.Tensor:
        return torch.cat([p[:k] for p, k in zip(parts, counts, strict=True)])
    return Pending([work], finish, (tensor, padded))


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.allgather_async")
    return register(start_allgather(tensor, ps))


class _Allgather(torch.autograd.Function):
    """All-gather with a gradient: the averaged gradient's rows that belong to this rank (as Horovod's)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, ps: ProcessSet = global_process_set) -> torch.Tensor:
        ctx.rows, ctx.ps = tensor.shape[0], ps
        return start_allgather(tensor, ps).result()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        reduced = start_allreduce(grad.contiguous(), torch.empty_like(grad), Average, 1.0, 1.0, ctx.ps).result()
        rows = start_allgather(torch.tensor([ctx.rows], dtype=torch.int64), ctx.ps).result()
        offset = int(rows[: ctx.ps.rank()].sum())
        return reduced.narrow(0, offset, ctx.rows), None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    ps = check_process_set(process_set, "hvd.allgather")
    return _Allgather.apply(tensor, ps)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.grouped_allgather_async")
    parts = [start_allgather(t, ps) for t in tensors]
    return register(Pending([w for p in parts for w in p.works], lambda: [p.finish() for p in parts]))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    check_process_set(process_set, "hvd.grouped_allgather")
    return [allgather(t, process_set=process_set) for t in tensors]


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None, op: int,
                           process_set: ProcessSet = global_process_set) -> Callable[[], torch.Tensor]:
    """A sparse gradient "all-reduced" as Horovod does it: indices and values all-gathered, values divided by the
    world size for Average; returns a callable that waits and gives the aggregated sparse tensor."""
    ps = check_process_set(process_set, "hvd.sparse_allreduce_async")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices = start_allgather(t.indices().t().contiguous(), ps)
    values = start_allgather(t.values(), ps)

    def handle() -> torch.Tensor:
        v, i = values.result(), indices.result()
        v = v / (ps.size() or 1) if op == Average else v
        return torch.sparse_coo_tensor(i.t(), v, t.size())
    return handle


# -- broadcast ----------------------------------------------------------------------------------------------
def start_broadcast(tensor: torch.Tensor, output: torch.Tensor, root_rank: int,
                    ps: ProcessSet = global_process_set) -> Pending:
    if output is not tensor:
        output.copy_(tensor)
    work = dist.broadcast(output, src=root_rank, group=ps.group, async_op=True)
    return Pending([work], lambda: output, (tensor, output))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.broadcast_async")
    return register(start_broadcast(tensor, torch.empty_like(tensor), root_rank, ps))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.broadcast_async_")
    return register(start_broadcast(tensor, tensor, root_rank, ps))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    """Broadcast with a gradient: the averaged gradient on the root, zero elsewhere (as Horovod's)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, ps: ProcessSet = global_process_set) -> torch.Tensor:
        ctx.root, ctx.ps = root_rank, ps
        return start_broadcast(tensor, torch.empty_like(tensor), root_rank, ps).result()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        reduced = start_allreduce(grad.contiguous(), torch.empty_like(grad), Average, 1.0, 1.0, ctx.ps).result()
        if dist.get_rank() != ctx.root:
            reduced *= 0
        return reduced, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    ps = check_process_set(process_set, "hvd.broadcast")
    return _Broadcast.apply(tensor, root_rank, ps)


# -- the rest -----------------------------------------------------------------------------------------------
def barrier(process_set: ProcessSet = global_process_set) -> None:
    ps = check_process_set(process_set, "hvd.barrier")
    dist.barrier(group=ps.group)


def join(device: int = -1) -> int:
    """Every rank waits for the others; returns the rank that arrived last.

    Horovod's join also lets ranks that ran out of data keep answering the others' all-reduces with zeros; here
    every rank must have issued as many collectives before it (even data). Uneven data: torch's ``Join``.
    """
    mine = torch.tensor([time.time()], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(size())]
    dist.all_gather(every, mine)
    _recent.append((mine, *every))
    return int(torch.cat(every).argmax())


# -- Python objects -----------------------------------------------------------------------------------------
def _dumps(obj: Any) -> torch.Tensor:
    try:
        import cloudpickle as pickler  # what Horovod pickles with: lambdas and local classes travel too
    except ImportError:
        import pickle as pickler
    return torch.frombuffer(bytearray(pickler.dumps(obj)), dtype=torch.uint8)


def _loads(t: torch.Tensor) -> Any:
    import pickle

    return pickle.loads(t.numpy().tobytes())


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """``obj`` pickled on ``root_rank`` and unpickled everywhere (sizes, then bytes, on CPU tensors)."""
    ps = check_process_set(process_set, "hvd.broadcast_object")
    payload = _dumps(obj) if dist.get_rank() == root_rank else torch.empty(0, dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    dist.broadcast(length, src=root_rank, group=ps.group)
    if dist.get_rank() != root_rank:
        payload = torch.empty(int(length), dtype=torch.uint8)
    dist.broadcast(payload, src=root_rank, group=ps.group)
    _recent.append((length, payload))
    return obj if dist.get_rank() == root_rank else _loads(payload)


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    payload = _dumps(obj)
    gathered = start_allgather(payload).result()
    lengths = start_allgather(torch.tensor([payload.numel()], dtype=torch.int64)).result().tolist()
    return [_loads(part) for part in gathered.split(lengths)]
