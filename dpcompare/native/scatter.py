"""``hvd.reducescatter``, ``hvd.grouped_reducescatter`` and ``hvd.alltoall`` (and their ``_async`` forms) on
torch.distributed, as Horovod 0.28.1 computes them.

Reduce-scatter: the tensors are summed across the process set and each rank keeps its rows of dimension 0, split
as evenly as possible with the first ``rows % size`` ranks getting one row more (Horovod's
``ComputeOutputShapeForRank``). ``Average`` divides through the post-scale factor (``postscale / size``); the
pre-scale factor multiplies before the sum, the post-scale factor after it, in the tensor's precision (integers in
double, truncated), as Horovod's ``ScaleBuffer``. Only ``Sum`` and ``Average`` (Horovod's own limit). The gradient
is the all-gather of the output's gradient, times the set size for ``Sum`` and times the factors.

All-to-all: rank ``i`` sends ``splits[j]`` rows (dimension 0) to rank ``j`` (equal parts when ``splits`` is None,
which needs dimension 0 to divide evenly); the rows received are concatenated in rank order. With ``splits`` the
result is ``(tensor, received_splits)``; ``alltoall_async``'s handle always gives the pair, as Horovod's does.
It goes through the ranks' agreement by name as the other collectives do (:mod:`.negotiation`): a dtype, device or
trailing shape that differs raises Horovod's error on every rank, naming the tensor and what each rank sent, and a
rank that joined makes it fail as in Horovod; once agreed, the ranks exchange the rows each sends the others.

The dtypes are Horovod's: reduce-scatter takes int32, int64, float16, float32 and float64, all-to-all also uint8,
int8 and int16 (which gloo cannot move: it travels as float16, the same bytes); any other, or a tensor that is not
contiguous, is Horovod's ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from dpcompare.native.collectives import (
    Average,
    Deferred,
    HorovodInternalError,
    Pending,
    Sum,
    as_wire,
    grouped_allgather,
    one_device,
    register,
    run,
    scale_,
    submit,
)
from dpcompare.native.compression import Compression
from dpcompare.native.negotiation import Request
from dpcompare.native.process_sets import ProcessSet, check_process_set, global_process_set

_REDUCESCATTER_DTYPES = (torch.int32, torch.int64, torch.float16, torch.float32, torch.float64)
_ALLTOALL_DTYPES = (torch.uint8, torch.int8, torch.int16, *_REDUCESCATTER_DTYPES)


def _check_tensor(t: torch.Tensor, dtypes: Sequence[torch.dtype]) -> None:
    """Horovod's checks before a collective starts: a dtype its binding takes, contiguous memory."""
    if t.dtype not in dtypes:
        raise ValueError(f"Tensor type {t.type()} is not supported.")
    if not t.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")


def _rows(n: int, size: int) -> list[int]:
    """Horovod's split of ``n`` rows over ``size`` ranks: the first ``n % size`` ranks get one more."""
    return [n // size + (1 if r < n % size else 0) for r in range(size)]


# -- reduce-scatter -----------------------------------------------------------------------------------------
def _check_op(op: int) -> None:
    if op not in (Sum, Average):
        raise HorovodInternalError("Reducescatter currently only supports AVERAGE and SUM.")


def _check_reducescatter(tensors: Sequence[torch.Tensor], op: int) -> None:
    for t in tensors:
        _check_tensor(t, _REDUCESCATTER_DTYPES)
    _check_op(op)
    if any(t.dim() == 0 for t in tensors):
        raise ValueError("Reducescatter does not support scalar inputs")


def _negotiated(tensors: Sequence[torch.Tensor], op: int, prescale: float, postscale: float, ps: ProcessSet,
                name: str | None) -> Deferred:
    """The reduce-scatter of ``tensors`` queued for the ranks' agreement by name (:mod:`.negotiation`), checked
    here first; started in a round, where every rank of the set reaches it together."""
    _check_reducescatter(tensors, op)
    request = submit("reducescatter", tensors[0], name,
                     lambda rows: _start_reducescatter(tensors, op, prescale, postscale, ps),
                     op=op, prescale=prescale, postscale=postscale, process_set=ps.process_set_id)
    return Deferred([request])


def _start_reducescatter(tensors: Sequence[torch.Tensor], op: int, prescale: float, postscale: float,
                         ps: ProcessSet) -> Pending:
    """Reduce-scatter ``tensors``: one fused buffer (one torch call) per dtype; not waited for."""
    _check_reducescatter(tensors, op)
    agree("reducescatter", tensors, ps, first_dim=True)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    if len(by_dtype) == 1:
        return _start_fused(tensors, op, prescale, postscale, ps)
    parts = [(idx, _start_fused([tensors[i] for i in idx], op, prescale, postscale, ps)) for idx in by_dtype.values()]

    def finish() -> list[torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        for idx, p in parts:
            out.update(zip(idx, p.finish(), strict=True))
        return [out[i] for i in range(len(tensors))]
    return Pending([w for _, p in parts for w in p.works], finish, tuple(k for _, p in parts for k in p.keep))


def _start_fused(tensors: Sequence[torch.Tensor], op: int, prescale: float, postscale: float,
                 ps: ProcessSet) -> Pending:
    size, me = ps.size() or 1, ps.rank() or 0
    post = postscale / size if op == Average else postscale
    wires = list(tensors)
    splits = [_rows(t.shape[0], size) for t in tensors]
    # rank r's part of the buffer: its rows of every tensor, in order (Horovod's fusion buffer layout)
    chunks = [torch.cat([w.narrow(0, sum(s[:r]), s[r]).reshape(-1) for w, s in zip(wires, splits, strict=True)])
              for r in range(size)]
    if prescale != 1.0:
        for c in chunks:
            scale_(c, prescale)
    out = torch.empty_like(chunks[me])
    work = dist.reduce_scatter(out, chunks, group=ps.group, async_op=True)

    def finish() -> list[torch.Tensor]:
        if post != 1.0:
            scale_(out, post)
        shapes = [(s[me], *t.shape[1:]) for t, s in zip(tensors, splits, strict=True)]
        parts = out.split([int(torch.Size(sh).numel()) for sh in shapes])
        return [p.reshape(sh).clone() for p, sh in zip(parts, shapes, strict=True)]
    return Pending([work], finish, (out, *chunks))


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: int = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    ps = check_process_set(process_set, "hvd.reducescatter_async")
    deferred = _negotiated([tensor], op, prescale_factor, postscale_factor, ps, name)
    return register(Deferred(deferred.requests, lambda outs: outs[0][0]))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None, op: int = Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    ps = check_process_set(process_set, "hvd.grouped_reducescatter_async")
    return register(_negotiated(list(one_device(tensors)), op, prescale_factor, postscale_factor, ps, name))


def _grad_scale(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    """Horovod's reduce-scatter gradient before its all-gather: times the set size for Sum, times the factors."""
    if ctx.op == Sum:
        grad = grad * (ctx.ps.size() or 1)
    if ctx.prescale != 1.0:
        grad = grad * ctx.prescale
    if ctx.postscale != 1.0:
        grad = grad * ctx.postscale
    return grad


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: int, ps: ProcessSet, prescale: float, postscale: float, name: str | None,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.op, ctx.ps, ctx.prescale, ctx.postscale = op, ps, prescale, postscale
        return tuple(_negotiated(tensors, op, prescale, postscale, ps, name).result())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        gathered = grouped_allgather([_grad_scale(ctx, g).contiguous() for g in grads], process_set=ctx.ps)
        return (None, None, None, None, None, *gathered)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None, compression: Any = None,
                          op: int = Average, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Each rank's rows of the reduction of each tensor (Average by default); the tensors are left as they were."""
    ps = check_process_set(process_set, "hvd.grouped_reducescatter")
    one_device(tensors)
    compression = compression or Compression.none
    packed = [compression.compress(t) for t in tensors]
    out = _Reducescatter.apply(op, ps, prescale_factor, postscale_factor, name, *[c for c, _ in packed])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, packed, strict=True)]


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = None, op: int = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """This rank's rows of the reduction of ``tensor`` across the set (Average by default)."""
    check_process_set(process_set, "hvd.reducescatter")
    return grouped_reducescatter([tensor], name, compression, op, process_set, prescale_factor,
                                 postscale_factor)[0]


# -- all-to-all -----------------------------------------------------------------------------------------------
_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
           torch.float32, torch.float64, torch.bool]


def _send_splits(tensor: torch.Tensor, splits: Any, size: int) -> list[int]:
    """The rows this rank sends to each rank, checked as Horovod checks them."""
    if tensor.dim() == 0:
        raise ValueError("alltoall does not support scalar inputs")
    if splits is None or (isinstance(splits, torch.Tensor) and splits.numel() == 0):  # Horovod: no splits
        if tensor.shape[0] % size:
            raise ValueError("splits not provided, but first dimension of tensor is not an even multiple of the "
                             "number of workers.")
        return [tensor.shape[0] // size] * size
    s = splits if isinstance(splits, torch.Tensor) else torch.tensor(splits, dtype=torch.int32)
    if s.dim() > 1:
        raise ValueError("alltoall expects a 1D splits tensor")
    if s.dtype != torch.int32:
        raise ValueError("alltoall expects splits to contain 32-bit integer elements.")
    if s.numel() != size:
        raise ValueError("Number of entries in splits does not equal number of workers.")
    out = [int(v) for v in s.cpu().tolist()]
    if sum(out) > tensor.shape[0]:
        raise ValueError("Sum of splits entries is greater than the first dimension of tensor.")
    return out


def _describe(t: torch.Tensor, first_dim: bool) -> list[int]:
    """dtype, rank and shape (8 dimensions; dimension 0 as -2 where it may differ) as integers."""
    dims = ([t.shape[0]] if first_dim else [-2]) + list(t.shape[1:]) if t.dim() else []
    return [_DTYPES.index(t.dtype) if t.dtype in _DTYPES else 99, t.dim(), *dims[:8], *[-1] * (8 - len(dims[:8]))]


def agree(op: str, tensors: Sequence[torch.Tensor], ps: ProcessSet, first_dim: bool,
          extra: Sequence[int] = ()) -> list[torch.Tensor]:
    """Every rank's dtypes and shapes compared (Horovod's negotiation: the same error on every rank), with each
    rank's ``extra`` integers gathered alongside; returns every rank's description."""
    mine = torch.tensor([v for t in tensors for v in _describe(t, first_dim)] + list(extra), dtype=torch.int64)
    size = ps.size() or 1
    lengths = [torch.empty(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(lengths, torch.tensor([mine.numel()]), group=ps.group)
    ranks = ps.ranks or list(range(size))
    if len({int(n) for n in lengths}) > 1:
        raise HorovodInternalError(f"Mismatched {op} tensor counts across ranks {ranks}")
    every = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(every, mine, group=ps.group)
    described = 10 * len(tensors)
    for i in range(len(tensors)):
        kinds = {int(e[10 * i]) for e in every}
        if len(kinds) > 1:
            names = {ranks[r]: str(_DTYPES[int(e[10 * i])]) if int(e[10 * i]) < len(_DTYPES) else "?"
                     for r, e in enumerate(every)}
            raise HorovodInternalError(f"Mismatched {op} tensor types: {names}")
    if len({tuple(e[:described].tolist()) for e in every}) > 1:
        which = "every dimension but the first" if not first_dim else "the shapes"
        raise HorovodInternalError(f"Mismatched {op} tensor shapes: {which} must agree (ranks {ranks})")
    return every


def _alltoall_request(tensor: torch.Tensor, splits: Any, name: str | None, ps: ProcessSet) -> Request:
    """One all-to-all queued for the ranks' agreement (dtype, device, every dimension but the first, by name, as
    the other collectives); its handle gives ``(output, received splits)``."""
    _check_tensor(tensor, _ALLTOALL_DTYPES)
    send = _send_splits(tensor, splits, ps.size() or 1)
    return submit("alltoall", tensor, name, lambda rows: _start_alltoall(tensor, send, ps),
                  process_set=ps.process_set_id)


def _start_alltoall(tensor: torch.Tensor, send: list[int], ps: ProcessSet) -> Pending:
    """The rows each rank sends here first (one small all-to-all), then the rows; not waited for."""
    mine = torch.tensor(send, dtype=torch.int64)
    got = torch.empty_like(mine)
    dist.all_to_all_single(got, mine, group=ps.group)
    received = [int(v) for v in got.tolist()]
    src = tensor.narrow(0, 0, sum(send)).contiguous()
    src = as_wire(src)  # gloo and NCCL move int16's bytes as fp16's
    out = src.new_empty((sum(received), *tensor.shape[1:]))
    work = dist.all_to_all_single(out, src, received, send, group=ps.group, async_op=True)
    return Pending([work], lambda: (out.view(tensor.dtype), received), (src, out, mine, got))


def _received_like(splits: Any, received: list[int]) -> torch.Tensor:
    if isinstance(splits, torch.Tensor):
        return torch.tensor(received, dtype=splits.dtype).to(splits.device)
    return torch.tensor(received, dtype=torch.int32)


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """A handle whose :func:`synchronize` gives ``(output, received_splits)``."""
    ps = check_process_set(process_set, "hvd.alltoall_async")
    request = _alltoall_request(tensor, splits, name, ps)
    return register(Deferred([request], lambda outs: (outs[0][0], _received_like(splits, outs[0][1]))))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None,
                ps: ProcessSet) -> tuple[torch.Tensor, torch.Tensor]:
        out, received = run([_alltoall_request(tensor, splits, name, ps)])
        ctx.ps, ctx.received = ps, received
        got = _received_like(splits, received)
        ctx.mark_non_differentiable(got)
        return out, got

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple[Any, ...]:
        splits = torch.tensor(ctx.received, dtype=torch.int32)
        back, _received = run([_alltoall_request(grad.contiguous(), splits, None, ctx.ps)])
        return back, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """The rows every rank sent this one, in rank order; with ``splits``, also how many came from each rank."""
    ps = check_process_set(process_set, "hvd.alltoall")
    output, received = _Alltoall.apply(tensor, splits, name, ps)
    return output if splits is None else (output, received)


__all__ = ["alltoall", "alltoall_async", "grouped_reducescatter", "grouped_reducescatter_async", "reducescatter",
           "reducescatter_async"]
