"""The module a script gets for ``import horovod.torch as hvd`` under the native layer (also importable as
``dpcompare.native.hvd``): Horovod 0.28.1's PyTorch API on torch.distributed.

``hvd.elastic`` is :mod:`.elastic` (Horovod Elastic on torchrun's agent). What the layer does not run (see
:mod:`.calls`) raises :class:`Unsupported` at the call: one line naming the call and its native equivalent.
Process sets are :mod:`.process_sets`, reduce-scatter and all-to-all :mod:`.scatter`, the timeline
:mod:`.timeline`; the collectives a script gets are :mod:`.traced`'s. The build queries answer in Horovod's types:
``nccl_built()`` an int (the NCCL version, 0 where the layer uses none), the others bools.
"""

from __future__ import annotations

from typing import Any

from dpcompare.native import elastic
from dpcompare.native import negotiation as _negotiation
from dpcompare.native import process_sets as _process_sets
from dpcompare.native import state as _state
from dpcompare.native import timeline as _timeline
from dpcompare.native.calls import HOROVOD_VERSION, Unsupported
from dpcompare.native.collectives import (
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
    allgather_object,
    barrier,
    join,
    poll,
    sparse_allreduce_async,
)
from dpcompare.native.compression import Compression, Compressor, FP16Compressor, NoneCompressor
from dpcompare.native.elastic import HostsUpdatedInterrupt
from dpcompare.native.functions import broadcast_optimizer_state, broadcast_parameters
from dpcompare.native.optimizer import DistributedOptimizer
from dpcompare.native.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from dpcompare.native.state import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
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
    size,
)
from dpcompare.native.syncbn import SyncBatchNorm
from dpcompare.native.timeline import start_timeline, stop_timeline
from dpcompare.native.traced import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
    synchronize,
)

__version__ = f"{HOROVOD_VERSION}+dpcompare.native"
#: a package path, so that ``import horovod.torch.mpi_ops`` (and the other submodules) reach the import hook,
#: which answers them with this same module
__path__: list[str] = []


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (:func:`.state.init`), register the static process sets (or ``"dynamic"``), start the timeline
    ``HOROVOD_TIMELINE`` names."""
    _state.init(comm)
    _process_sets.setup(process_sets)
    _timeline.from_env()


def shutdown() -> None:
    """Leave the job: the timeline file closed, the others told (a round waiting for this rank fails with
    Horovod's shutdown error), the process sets unregistered, the process group ended."""
    if _timeline.active():
        _timeline.stop_timeline()
    _negotiation.leave()
    _process_sets.reset()
    _state.shutdown()


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
