"""``op=hvd.Adasum`` for ``hvd.allreduce`` and ``hvd.grouped_allreduce``, as Horovod 0.28.1 computes it on CPU.

Horovod's CPU Adasum (horovod/common/ops/adasum/adasum.h) combines the ranks' vectors pairwise, level by level of a
vector-halving distance-doubling exchange: at level ``k`` the result of ranks ``[i, i + 2^k)`` (``a``) meets that
of ``[i + 2^k, i + 2^(k+1))`` (``b``) and becomes

    a * (1 - a·b / (2 |a|²)) + b * (1 - a·b / (2 |b|²))

with the dot product and the squared norms in double, per tensor (a fused buffer's tensors each get their own
coefficients), a coefficient left at 1 when a norm is below sqrt(DBL_MIN), and the sum rounded once to the tensor's
precision (float16: coefficients in float). Only a power-of-two number of ranks, only the global process set
(Horovod's own limits, with its ``NotImplementedError``). Here every rank all-gathers the vectors and computes the
same tree; the results equal Horovod's up to the order in which the dot products are summed (Horovod splits each
vector across the ranks of a level and adds their partial sums), i.e. in the last bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

_TINY = math.sqrt(2.2250738585072014e-308)  # sqrt(DBL_MIN)
ADASUM_DTYPES = (torch.float16, torch.float32, torch.float64)


def check(size: int, global_set: bool) -> None:
    """Horovod's refusals before an Adasum all-reduce starts."""
    if not global_set:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    if size & (size - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")


def _coefficients(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    da, db = a.double(), b.double()
    dot, anorm, bnorm = float(da @ db), float(da @ da), float(db @ db)
    ac = 1.0 - dot / anorm * 0.5 if anorm >= _TINY else 1.0
    bc = 1.0 - dot / bnorm * 0.5 if bnorm >= _TINY else 1.0
    return ac, bc


def combine(a: torch.Tensor, b: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """Adasum of two flat buffers holding tensors of ``counts`` elements each."""
    out = torch.empty_like(a)
    for pa, pb, po in zip(a.split(list(counts)), b.split(list(counts)), out.split(list(counts)), strict=True):
        ac, bc = _coefficients(pa, pb)
        if a.dtype == torch.float16:  # Horovod's AVX path: float coefficients, float arithmetic
            po.copy_(pa.float() * float(torch.tensor(ac, dtype=torch.float32)) +
                     pb.float() * float(torch.tensor(bc, dtype=torch.float32)))
        else:
            po.copy_(pa.double() * ac + pb.double() * bc)
    return out


def adasum(buffer: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """Every rank's ``buffer`` (flat, contiguous) combined by Horovod's Adasum tree; the same result on every rank."""
    if buffer.dtype not in ADASUM_DTYPES:
        raise ValueError(f"Adasum reduces floating-point tensors only (got {buffer.dtype})")
    parts = [torch.empty_like(buffer) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, buffer.contiguous())
    while len(parts) > 1:
        parts = [combine(parts[i], parts[i + 1], counts) for i in range(0, len(parts), 2)]
    return parts[0]
