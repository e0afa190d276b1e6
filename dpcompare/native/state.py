"""Process facts of the native layer: ``hvd.init()`` on torch.distributed, rank and size, what is "built".

``init()`` reads the launcher (mpirun, srun, torchrun, horovodrun) through :mod:`dpcompare.launch.env`, meets the
other ranks through :mod:`dpcompare.launch.rendezvous` and starts one process group: gloo for CPU tensors, and NCCL
for CUDA tensors when this torch has CUDA and a GPU is visible, and a second gloo group of the layer's own for
the ranks' agreement on each collective (:mod:`.negotiation`). Local ranks are the launcher's; cross ranks (Horovod's:
the rank among the processes with the same local rank) come from one small all-gather at init.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dpcompare.launch.env import detect_launch_env
from dpcompare.launch.rendezvous import ensure_rendezvous
from dpcompare.native.calls import Unsupported, unsupported

#: seconds a collective may wait for a peer before torch gives up (Horovod has no such limit; 30 min is torch's);
#: Horovod's gloo controller's ``HOROVOD_GLOO_TIMEOUT_SECONDS`` sets it (an elastic job notices a lost peer then)
TIMEOUT_S = 1800.0
TIMEOUT_VAR = "HOROVOD_GLOO_TIMEOUT_SECONDS"
#: the job store's key where a rank that left says how many rounds of each set it took part in (:mod:`.negotiation`)
LEFT_KEY = "dpcompare.native.left/{}"


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    homogeneous: bool
    backend: str
    owns_group: bool            # False when the script (or torchrun code) had started the process group itself
    control: Any = None         # the gloo group the negotiation's rounds run on


_world: World | None = None


def _backend() -> str:
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def _layout(rank: int, size: int, local_rank: int, local_size: int) -> tuple[int, int, bool]:
    """(cross rank, cross size, homogeneous) from every rank's local rank and size as its launcher tells them.

    Horovod's cross rank is the rank among the processes with the same local rank, its cross size their count.
    """
    mine = torch.tensor([local_rank, local_size], dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(size)]
    dist.all_gather(every, mine)
    peers = [r for r in range(size) if int(every[r][0]) == local_rank]
    return peers.index(rank), len(peers), len({int(t[1]) for t in every}) == 1


def init(comm: object = None) -> None:
    """Join the job: rendezvous through the launcher, one process group (idempotent, as Horovod's is); ``hvd.init``
    adds the process sets and the timeline."""
    global _world
    if comm is not None:
        raise unsupported("hvd.init(comm=...)", "ProcessSet")
    if _world is not None and dist.is_initialized():
        return
    owns = not dist.is_initialized()
    env = detect_launch_env()
    if owns:
        ensure_rendezvous(env)
        dist.init_process_group(_backend(), init_method="env://", rank=env.rank, world_size=env.world_size,
                                timeout=timedelta(seconds=float(os.environ.get(TIMEOUT_VAR) or TIMEOUT_S)))
    rank, size = dist.get_rank(), dist.get_world_size()
    with contextlib.suppress(Exception):  # what this rank said when it left before (a store kept across inits)
        dist.distributed_c10d._get_default_store().delete_key(LEFT_KEY.format(rank))
    local_rank, local_size = (env.local_rank, env.local_size) if env.world_size == size else (0, 1)
    cross_rank, cross_size, homogeneous = _layout(rank, size, local_rank, local_size)
    control = dist.new_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT_S))
    _world = World(rank, size, local_rank, local_size, cross_rank, cross_size, homogeneous,
                   str(dist.get_backend()), owns, control)


def shutdown() -> None:
    global _world
    if _world is not None and dist.is_initialized():
        if _world.owns_group:
            dist.destroy_process_group()
        elif _world.control is not None:
            dist.destroy_process_group(_world.control)
    _world = None


def is_initialized() -> bool:
    return _world is not None


def world() -> World:
    """The job's facts; Horovod's own error when ``init()`` has not run."""
    if _world is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _world


def rank() -> int:
    return world().rank


def size() -> int:
    return world().size


def local_rank() -> int:
    return world().local_rank


def local_size() -> int:
    return world().local_size


def cross_rank() -> int:
    return world().cross_rank


def cross_size() -> int:
    return world().cross_size


def is_homogeneous() -> bool:
    return world().homogeneous


# What the layer is "built" with, in the types Horovod answers (bools; the NCCL version as an int): it talks gloo,
# and NCCL where a GPU is visible, through torch.distributed; never MPI, DDL or oneCCL.
def mpi_built(verbose: bool = False) -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    return False


def gloo_built(verbose: bool = False) -> bool:
    return dist.is_gloo_available()


def gloo_enabled() -> bool:
    return dist.is_gloo_available()


def nccl_built(verbose: bool = False) -> int:
    """The NCCL version as Horovod encodes it (2.18.3 → 21803) where the layer uses NCCL, else 0 (a CPU machine,
    even with a CUDA build of torch: the layer's collectives there are gloo's)."""
    if not (cuda_built() and dist.is_nccl_available()):
        return 0
    major, minor, patch = (tuple(torch.cuda.nccl.version()) + (0, 0, 0))[:3]
    return major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else major * 1000 + minor * 100 + patch


def cuda_built(verbose: bool = False) -> bool:
    """True where the layer runs collectives on CUDA tensors: a CUDA build of torch with a GPU visible."""
    return torch.version.cuda is not None and torch.cuda.is_available()


def rocm_built(verbose: bool = False) -> bool:
    return getattr(torch.version, "hip", None) is not None and torch.cuda.is_available()


def ddl_built(verbose: bool = False) -> bool:
    return False


def ccl_built(verbose: bool = False) -> bool:
    return False


__all__ = ["Unsupported", "World", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
           "gloo_built", "gloo_enabled", "init", "is_homogeneous", "is_initialized", "local_rank", "local_size",
           "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "rocm_built", "shutdown",
           "size", "world"]
