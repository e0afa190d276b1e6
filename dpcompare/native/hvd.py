"""The module a script gets for ``import horovod.torch as hvd`` under the native layer (also importable as
``dpcompare.native.hvd``): Horovod 0.28.1's PyTorch API on torch.distributed.

``hvd.elastic`` is :mod:`.elastic` (Horovod Elastic on torchrun's agent). What the layer does not run (Adasum,
process sets, alltoall, reducescatter, the timeline) raises :class:`Unsupported` at the call: one line naming the call and its native equivalent.
"""

from __future__ import annotations

from dpcompare.native import elastic
from dpcompare.native.calls import HOROVOD_VERSION, Unsupported
from dpcompare.native.collectives import (
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    global_process_set,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    remove_process_set,
    sparse_allreduce_async,
    synchronize,
)
from dpcompare.native.compression import Compression, Compressor, FP16Compressor, NoneCompressor
from dpcompare.native.elastic import HostsUpdatedInterrupt
from dpcompare.native.functions import broadcast_optimizer_state, broadcast_parameters
from dpcompare.native.optimizer import DistributedOptimizer
from dpcompare.native.state import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from dpcompare.native.syncbn import SyncBatchNorm

__version__ = f"{HOROVOD_VERSION}+dpcompare.native"
#: a package path, so that ``import horovod.torch.mpi_ops`` (and the other submodules) reach the import hook,
#: which answers them with this same module
__path__: list[str] = []


__all__ = [
    "Adasum", "Average", "Compression", "Compressor", "DistributedOptimizer", "FP16Compressor",
    "HorovodInternalError", "HostsUpdatedInterrupt", "Max", "Min", "NoneCompressor", "ProcessSet", "Product",
    "Sum", "SyncBatchNorm", "Unsupported", "add_process_set", "allgather", "allgather_async", "allgather_object",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "ccl_built", "cross_rank", "cross_size", "cuda_built",
    "ddl_built", "elastic", "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather",
    "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async", "init", "is_homogeneous",
    "is_initialized", "join", "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "poll", "rank", "reducescatter", "reducescatter_async", "remove_process_set", "rocm_built",
    "shutdown", "size", "sparse_allreduce_async", "start_timeline", "stop_timeline", "synchronize",
]
