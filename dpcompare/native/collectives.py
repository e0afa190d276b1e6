"""Horovod's collectives on torch.distributed, with Horovod's arithmetic and handles.

All-reduce as Horovod's C++ core does it: the tensor is multiplied by ``prescale_factor`` before the sum and by
``postscale_factor`` after it (divided by the world size for ``Average``); the factors are cast to the tensor's
precision (float for fp16 and fp32), integers are scaled in double and truncated, and a factor of exactly 1 is
skipped. At two ranks a sum has one order, so the results are bit-equal to Horovod's; with more ranks gloo's
order of summation may differ from MPI's in the last bit.

Asynchronous calls return an integer handle, as Horovod's do, for :func:`poll` and :func:`synchronize`. The ranks
agree on each call by name before it runs (:mod:`.negotiation`): the calls may come in different orders on
different ranks, a mismatch raises Horovod's error on every rank, and ``join()`` answers the others' all-reduces
with zeros. Every dtype Horovod takes on CPU runs: int16, which gloo lacks, travels as int32 in an all-reduce and
as its bytes (viewed as float16) in an all-gather or a broadcast.
"""

from __future__ import annotations

import collections
import itertools
import pickle
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dpcompare.native.adasum import adasum, check
from dpcompare.native.compression import Compression
from dpcompare.native.negotiation import HorovodInternalError, Request, dtype_of, first_dim, negotiator
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


#: dtypes gloo and NCCL lack: what an all-reduce sums them in, what an all-gather or a broadcast moves their bytes as
_WIDER = {torch.int16: torch.int32}
_SAME_BYTES = {torch.int16: torch.float16}


def as_wire(t: torch.Tensor) -> torch.Tensor:
    """``t``'s storage as a dtype gloo and NCCL move (``t`` itself when they have its dtype)."""
    return t.view(_SAME_BYTES[t.dtype]) if t.dtype in _SAME_BYTES else t


def one_device(tensors: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
    """``tensors``, refused as Horovod refuses a grouped call whose tensors are on more than one device."""
    if len({t.device for t in tensors}) > 1:
        raise RuntimeError("Tensors in list must be on same device.")
    return tensors


def scale_(t: torch.Tensor, factor: float) -> torch.Tensor:
    """``t *= factor`` as Horovod's ScaleBuffer does it: in the tensor's precision, integers in double then
    truncated toward zero; on a GPU, fp16 times the factor rounded to fp16 (its CUDA kernel's ``__hmul``)."""
    if t.is_floating_point() or t.is_complex():
        if t.is_cuda and t.dtype is torch.float16:
            factor = torch.tensor(factor, dtype=torch.float16).item()
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


@dataclass(eq=False)
class Deferred:
    """Requests queued for the ranks' agreement (:mod:`.negotiation`): started in a round, then waited for;
    ``finish`` turns their results into the handle's output."""

    requests: list[Request]
    finish: Callable[[list[Any]], Any] = field(default=lambda outs: outs[0])

    def done(self) -> bool:
        return all(r.done and (r.error is not None or r.started is None or r.started.done()) for r in self.requests)

    def started(self) -> bool:
        return all(r.done for r in self.requests)

    def result(self) -> Any:
        try:
            started = [negotiator(r.process_set).wait(r) for r in self.requests]
            return self.finish([p.result() if p is not None else None for p in started])
        finally:
            for r in self.requests:
                negotiator(r.process_set).release(r)


#: the tensors of the last collectives, kept a little longer: gloo's worker thread lets go of a finished work
#: just after wait() returns, and if its reference were the last one it would need the GIL to free a tensor made
#: in Python, which aborts the process when that happens while the interpreter exits
_recent: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=64)
_handles: dict[int, Pending | Deferred] = {}
_counter = itertools.count(1)


def register(p: Pending | Deferred) -> int:
    h = next(_counter)
    _handles[h] = p
    return h


def poll(handle: int) -> bool:
    """True when :func:`synchronize` on ``handle`` will not block (a request not agreed on yet runs one round)."""
    if handle not in _handles:
        raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
    p = _handles[handle]
    if isinstance(p, Deferred) and not p.started():
        negotiator(p.requests[0].process_set).poll()
    return p.done()


def synchronize(handle: int) -> Any:
    """Wait for ``handle``'s collective and return its output (None for an unknown handle, as Horovod does)."""
    p = _handles.pop(handle, None)
    return None if p is None else p.result()


def submit(kind: str, tensor: torch.Tensor | None, name: str | None, start: Callable[[list[Any]], Any],
           **facts: Any) -> Request:
    """Queue one call for the ranks' agreement; ``start(rows)`` issues its collective once they agree (an unnamed
    one is matched with the others' by position, :mod:`.negotiation`)."""
    neg = negotiator(facts.get("process_set", 0))
    return neg.submit(Request(neg.auto_name(kind, name), kind, tensor, start, unnamed=name is None, **facts))


def unnamed(requests: list[Request], name: str | None) -> list[Request]:
    """A grouped call's requests (``BASE.i``), matched by position when the call had no name."""
    for r in requests:
        r.unnamed = name is None
    return requests


def run(requests: list[Request], finish: Callable[[list[Any]], Any] = lambda outs: outs[0]) -> Any:
    """Agree on ``requests``, run them, return ``finish`` of their outputs (a blocking call)."""
    return Deferred(requests, finish).result()


# -- all-reduce ---------------------------------------------------------------------------------------------
def start_allreduce(tensor: torch.Tensor, output: torch.Tensor, op: int, prescale: float,
                    postscale: float, ps: ProcessSet = global_process_set,
                    counts: Sequence[int] | None = None) -> Pending:
    """Sum (min, max, product) ``tensor`` into ``output`` across ranks with Horovod's scaling; not waited for."""
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    if output is not tensor:
        output.copy_(tensor)
    wire = output.to(_WIDER[output.dtype]) if output.dtype in _WIDER else output
    if prescale != 1.0:
        scale_(wire, prescale)
    if op == Adasum:  # Horovod's CPU Adasum, per tensor of a fused buffer (``counts``)
        return _adasum(output, counts or [output.numel()], postscale, ps, (tensor, output))
    work = dist.all_reduce(wire, op=_TORCH_OPS[op], group=ps.group, async_op=True)
    n = ps.size() or 1
    # integers averaged by an exact division toward zero (1/3 in double would make 6/3 come out 1)
    exact = op == Average and not (wire.is_floating_point() or wire.is_complex()) and n > 1
    post = postscale if op != Average or exact else postscale / n

    def finish() -> torch.Tensor:
        if post != 1.0:
            scale_(wire, post)
        if exact:
            wire.copy_(torch.div(wire, n, rounding_mode="trunc"))
        if wire is not output:
            output.copy_(wire)
        return output
    return Pending([work], finish, (tensor, output, wire))


def _adasum(buf: torch.Tensor, counts: Sequence[int], postscale: float, ps: ProcessSet,
            keep: tuple[Any, ...]) -> Pending:
    """``buf`` replaced by every rank's Adasum (:mod:`.adasum`), then post-scaled; done when it returns."""
    check(size(), ps is global_process_set)
    buf.view(-1).copy_(adasum(buf.view(-1), counts))
    if postscale != 1.0:
        scale_(buf, postscale)
    return Pending([], lambda: buf, keep)


def _answer_joined(row: list[int]) -> None:
    """A rank that joined answers an all-reduce it did not submit with zeros of the same size and dtype."""
    zeros = torch.zeros(row[5], dtype=dtype_of(row))
    _recent.append((zeros, start_allreduce(zeros, zeros, row[9], 1.0, 1.0)))


def allreduce_request(tensor: torch.Tensor, output: torch.Tensor, op: int, prescale: float, postscale: float,
                      name: str | None, ps: ProcessSet = global_process_set) -> Request:
    """One all-reduce queued for agreement (``output`` may be ``tensor``: in place)."""
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    negotiator().answer_joined = _answer_joined
    return submit("allreduce", tensor, name,
                  lambda rows: start_allreduce(tensor, output, op, prescale, postscale, ps),
                  op=op, prescale=prescale, postscale=postscale, process_set=ps.process_set_id)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.allreduce_async")
    op = resolve_op(op, average, "hvd.allreduce_async")
    req = allreduce_request(tensor, torch.empty_like(tensor), op, prescale_factor, postscale_factor, name, ps)
    return register(Deferred([req]))


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.allreduce_async_")
    op = resolve_op(op, average, "hvd.allreduce_async_")
    return register(Deferred([allreduce_request(tensor, tensor, op, prescale_factor, postscale_factor, name, ps)]))


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


class _Allreduce(torch.autograd.Function):
    """All-reduce with a gradient: the gradient is all-reduced with the same op and factors (as Horovod's)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: int, prescale: float, postscale: float, name: str | None,
                ps: ProcessSet = global_process_set) -> torch.Tensor:
        ctx.args = (op, prescale, postscale, ps)
        return run([allreduce_request(tensor, torch.empty_like(tensor), op, prescale, postscale, name, ps)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, ps = ctx.args
        grad = grad.contiguous()
        out = run([allreduce_request(grad, torch.empty_like(grad), op, prescale, postscale, None, ps)])
        return out, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, compression: Any = None,
              op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """The reduced copy of ``tensor`` (Average by default); ``tensor`` is left as it was."""
    ps = check_process_set(process_set, "hvd.allreduce")
    op = resolve_op(op, average)
    compression = compression or Compression.none
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, op, prescale_factor, postscale_factor, name, ps)
    return compression.decompress(reduced, ctx)


# -- fused (grouped) all-reduce ----------------------------------------------------------------------------
def start_fused_allreduce(tensors: Sequence[torch.Tensor], op: int, prescale: float, postscale: float,
                          outputs: Sequence[torch.Tensor] | None = None,
                          buffer: torch.Tensor | None = None, ps: ProcessSet = global_process_set) -> Pending:
    """One all-reduce of ``tensors`` (one dtype, one device) copied into one buffer (``buffer`` when given: kept
    between steps, as Horovod keeps its fusion buffer); the results go to ``outputs`` (default: back into
    ``tensors``). A single contiguous tensor is reduced in place. ``Pending.keep[0]`` is the buffer.
    Issued at once, without the ranks' agreement: :mod:`.fusion`'s gradients, in the same order on every rank."""
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
             outputs: Sequence[torch.Tensor], name: str | None, ps: ProcessSet = global_process_set) -> Deferred:
    """Horovod's grouped all-reduce: one request per tensor (``NAME.i``), agreed on and waited for together."""
    one_device(tensors)
    base = name if name is not None else negotiator().auto_name("grouped_allreduce", None)
    reqs = [allreduce_request(t, o, op, prescale, postscale, f"{base}.{i}", ps)
            for i, (t, o) in enumerate(zip(tensors, outputs, strict=True))]
    return Deferred(unnamed(reqs, name), list)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.grouped_allreduce_async")
    op = resolve_op(op, average, "hvd.grouped_allreduce_async")
    outs = [torch.empty_like(t) for t in tensors]
    return register(_grouped(tensors, op, prescale_factor, postscale_factor, outs, name, ps))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: int | None = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.grouped_allreduce_async_")
    op = resolve_op(op, average, "hvd.grouped_allreduce_async_")
    return register(_grouped(tensors, op, prescale_factor, postscale_factor, tensors, name, ps))


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = None, op: int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    if any(t.requires_grad for t in one_device(tensors)):  # with gradients: one autograd all-reduce each (same numbers)
        base = name if name is not None else negotiator().auto_name("grouped_allreduce", None)
        return [allreduce(t, average, f"{base}.{i}", compression, op, prescale_factor, postscale_factor,
                          process_set) for i, t in enumerate(tensors)]

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
def gather_rows(tensor: torch.Tensor, counts: Sequence[int], ps: ProcessSet = global_process_set) -> Pending:
    """Concatenate every rank's ``tensor`` along the first dimension, rank ``r`` giving ``counts[r]`` rows."""
    t = tensor.contiguous()
    t = t.reshape(1) if t.dim() == 0 else t
    longest = max(counts)
    padded = t if t.shape[0] == longest else torch.cat([t, t.new_zeros((longest - t.shape[0], *t.shape[1:]))])
    parts = [torch.empty_like(padded) for _ in counts]
    work = dist.all_gather([as_wire(p) for p in parts], as_wire(padded), group=ps.group, async_op=True)

    def finish() -> torch.Tensor:
        return torch.cat([p[:k] for p, k in zip(parts, counts, strict=True)])
    return Pending([work], finish, (tensor, padded, *parts))


def start_allgather(tensor: torch.Tensor, ps: ProcessSet = global_process_set) -> Pending:
    """An all-gather issued at once, without the ranks' agreement (the first dimensions exchanged first)."""
    first = torch.tensor([tensor.shape[0] if tensor.dim() else 1], dtype=torch.int64)
    firsts = [torch.zeros_like(first) for _ in range(ps.size() or 1)]
    dist.all_gather(firsts, first, group=ps.group)
    _recent.append((first, *firsts))
    return gather_rows(tensor, [int(f) for f in firsts], ps)


def allgather_request(tensor: torch.Tensor, name: str | None, counts: list[int] | None = None,
                      ps: ProcessSet = global_process_set) -> Request:
    """One all-gather queued for agreement; ``counts`` (when given) receives the set's ranks' row counts."""
    def start(rows: list[Any]) -> Pending:
        got = [first_dim(r) for r in rows if r is not None]   # the set's members, in rank order
        if counts is not None:
            counts[:] = got
        return gather_rows(tensor, got, ps)
    return submit("allgather", tensor, name, start, process_set=ps.process_set_id)


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.allgather_async")
    return register(Deferred([allgather_request(tensor, name, None, ps)]))


class _Allgather(torch.autograd.Function):
    """All-gather with a gradient: the averaged gradient's rows that belong to this rank (as Horovod's)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None,
                ps: ProcessSet = global_process_set) -> torch.Tensor:
        ctx.counts, ctx.ps = [], ps
        return run([allgather_request(tensor, name, ctx.counts, ps)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        grad = grad.contiguous()
        reduced = run([allreduce_request(grad, torch.empty_like(grad), Average, 1.0, 1.0, None, ctx.ps)])
        me = ctx.ps.rank()
        return reduced.narrow(0, sum(ctx.counts[:me]), ctx.counts[me]), None, None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    ps = check_process_set(process_set, "hvd.allgather")
    return _Allgather.apply(tensor, name, ps)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.grouped_allgather_async")
    one_device(tensors)
    base = name if name is not None else negotiator().auto_name("grouped_allgather", None)
    reqs = [allgather_request(t, f"{base}.{i}", None, ps) for i, t in enumerate(tensors)]
    return register(Deferred(unnamed(reqs, name), list))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    check_process_set(process_set, "hvd.grouped_allgather")
    if not any(t.requires_grad for t in one_device(tensors)):
        return synchronize(grouped_allgather_async(tensors, name, process_set))
    base = name if name is not None else negotiator().auto_name("grouped_allgather", None)
    return [allgather(t, f"{base}.{i}", process_set) for i, t in enumerate(tensors)]


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
    work = dist.broadcast(as_wire(output), src=root_rank, group=ps.group, async_op=True)
    return Pending([work], lambda: output, (tensor, output))


def broadcast_request(tensor: torch.Tensor, output: torch.Tensor, root_rank: int, name: str | None,
                      ps: ProcessSet = global_process_set) -> Request:
    """One broadcast queued for agreement; a root rank outside the job raises here (Horovod's ranks would wait)."""
    if not 0 <= int(root_rank) < size():
        raise HorovodInternalError(f"hvd.broadcast of tensor '{name or 'broadcast'}': root rank {root_rank} is "
                                   f"not a rank of this job (ranks 0 to {size() - 1})")
    return submit("broadcast", tensor, name, lambda rows: start_broadcast(tensor, output, root_rank, ps),
                  root=int(root_rank), process_set=ps.process_set_id)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.broadcast_async")
    return register(Deferred([broadcast_request(tensor, torch.empty_like(tensor), root_rank, name, ps)]))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    ps = check_process_set(process_set, "hvd.broadcast_async_")
    return register(Deferred([broadcast_request(tensor, tensor, root_rank, name, ps)]))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    """Broadcast with a gradient: the averaged gradient on the root, zero elsewhere (as Horovod's)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                ps: ProcessSet = global_process_set) -> torch.Tensor:
        ctx.root, ctx.ps = root_rank, ps
        return run([broadcast_request(tensor, torch.empty_like(tensor), root_rank, name, ps)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        grad = grad.contiguous()
        reduced = run([allreduce_request(grad, torch.empty_like(grad), Average, 1.0, 1.0, None, ctx.ps)])
        if dist.get_rank() != ctx.root:
            reduced *= 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    ps = check_process_set(process_set, "hvd.broadcast")
    return _Broadcast.apply(tensor, root_rank, name, ps)


# -- the rest -----------------------------------------------------------------------------------------------
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Every rank (that has not joined) reaches it: the ranks' agreement on it is the barrier."""
    ps = check_process_set(process_set, "hvd.barrier")
    name = "barrier" if ps is global_process_set else f"barrier.set{ps.process_set_id}"
    run([submit("barrier", None, name, lambda rows: None, process_set=ps.process_set_id)])


def join(device: int = -1) -> int:
    """Horovod's join: until every rank has joined, this rank answers the others' all-reduces with zeros (their
    all-gathers and broadcasts fail, as in Horovod); returns the last rank to join, the same on every rank."""
    negotiator().answer_joined = _answer_joined
    return negotiator().join()



# -- Python objects -----------------------------------------------------------------------------------------
def _dumps(obj: Any) -> torch.Tensor:
    try:
        import cloudpickle as pickler  # what Horovod pickles with: lambdas and local classes travel too
    except ImportError:
        # lazy: an optional dependency, tried where it is used
        import pickle as pickler
    return torch.frombuffer(bytearray(pickler.dumps(obj)), dtype=torch.uint8)


def _loads(t: torch.Tensor) -> Any:
    return pickle.loads(t.numpy().tobytes())


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """``obj`` pickled on ``root_rank`` and unpickled everywhere (its size, then its bytes, named as Horovod
    names them: ``NAME.sz`` and ``NAME.t``, NAME the object's type by default)."""
    ps = check_process_set(process_set, "hvd.broadcast_object")
    name = name or type(obj).__name__
    payload = _dumps(obj) if dist.get_rank() == root_rank else torch.empty(0, dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    run([broadcast_request(length, length, root_rank, f"{name}.sz", ps)])
    if dist.get_rank() != root_rank:
        payload = torch.empty(int(length), dtype=torch.uint8)
    run([broadcast_request(payload, payload, root_rank, f"{name}.t", ps)])
    _recent.append((length, payload))
    return obj if dist.get_rank() == root_rank else _loads(payload)


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    name = name or type(obj).__name__
    payload = _dumps(obj)
    counts: list[int] = []
    gathered = run([allgather_request(payload, f"{name}.t", counts)])
    return [_loads(part) for part in gathered.split(counts)]
