"""One rank of ``dpcompare lab bench``: times all-reduce and all-gather over gloo and/or MPI (mpirun starts it).

``python -m dpcompare.lab.worker --sizes 4096,8192 --backends gloo,mpi --out raw.json`` — rank 0 writes, per
backend, collective and size, the per-iteration times (the slowest rank's, as nccl-tests' bus figures assume).
Sizes follow nccl-tests: the all-reduce buffer, or the all-gather's whole output (each rank gives size/n).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable

from dpcompare.files import atomic_write_text
from dpcompare.launch.env import detect_launch_env
from dpcompare.launch.rendezvous import ensure_rendezvous
from dpcompare.trace import ALL_GATHER, ALL_REDUCE


def _elements(size: int, collective: str, n: int) -> int:
    """float32 elements each rank sends: the whole buffer for all-reduce, its 1/n share for all-gather."""
    per = size // 4
    return max(1, per // n) if collective == ALL_GATHER else max(1, per)


def _mpi_ops(comm: object, collective: str, count: int, n: int) -> Callable[[], None]:
    # lazy: numpy loads only where it is used (the command line stays light)
    import numpy as np
    from mpi4py import MPI  # optional: mpi4py may not be installed

    send = np.ones(count, dtype=np.float32)
    if collective == ALL_REDUCE:
        recv = np.empty_like(send)
        return lambda: comm.Allreduce(send, recv, op=MPI.SUM)  # type: ignore[attr-defined]
    recv = np.empty(count * n, dtype=np.float32)
    return lambda: comm.Allgather(send, recv)  # type: ignore[attr-defined]


def _gloo_ops(collective: str, count: int, n: int) -> Callable[[], None]:
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    import torch

    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    import torch.distributed as dist

    t = torch.ones(count, dtype=torch.float32)
    if collective == ALL_REDUCE:
        return lambda: dist.all_reduce(t)
    out = [torch.empty(count, dtype=torch.float32) for _ in range(n)]
    return lambda: dist.all_gather(out, t)


#: seconds of timed iterations per size beyond which fewer (down to MIN_ITERS) are run: keeps the sweep short
BUDGET_S, MIN_ITERS = 1.0, 3


def _time(op: Callable[[], None], barrier: Callable[[], None], comm: object, warmup: int,
          iters: int, gap_s: float = 0.0) -> list[float]:
    """Per-iteration times after ``warmup`` untimed ones; slow sizes run fewer (rank 0 decides for all). Each
    iteration starts after ``gap_s`` of idle link (a shaped link's token bucket refills, as between steps)."""
    def once() -> float:
        time.sleep(gap_s)
        barrier()
        t0 = time.perf_counter()
        op()
        return time.perf_counter() - t0

    first = max([once() for _ in range(warmup)], default=0.0)
    first = comm.bcast(first, root=0)  # type: ignore[attr-defined]
    if first > 0:
        iters = min(iters, max(MIN_ITERS, math.ceil(BUDGET_S / first)))
    return [once() for _ in range(iters)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dpcompare.lab.worker")
    p.add_argument("--sizes", required=True, help="bytes, comma-separated")
    p.add_argument("--backends", default="gloo,mpi", help="gloo and/or mpi")
    p.add_argument("--collectives", default=f"{ALL_REDUCE},{ALL_GATHER}")
    p.add_argument("--mpi-label", default="mpi", help="the name MPI's results are filed under")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--gap-ms", type=float, default=0.0, help="idle time before each iteration")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    backends, collectives = a.backends.split(","), a.collectives.split(",")

    env = detect_launch_env()
    from mpi4py import MPI  # optional: mpi4py may not be installed

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    if "gloo" in backends:
        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        import torch

        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        import torch.distributed as dist

        torch.set_num_threads(1)
        ensure_rendezvous(env)
        dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
    rows = []
    for backend in backends:
        barrier = dist.barrier if backend == "gloo" else comm.Barrier
        for collective in collectives:
            for size in sizes:
                count = _elements(size, collective, n)
                op = (_gloo_ops(collective, count, n) if backend == "gloo" else _mpi_ops(comm, collective, count, n))
                mine = _time(op, barrier, comm, a.warmup, a.iters, a.gap_ms / 1e3)
                every = comm.gather(mine, root=0)
                if comm.Get_rank() == 0:
                    slowest = [max(col) for col in zip(*every, strict=True)]
                    sent = count * 4 * (n if collective == ALL_GATHER else 1)
                    rows.append({"backend": a.mpi_label if backend == "mpi" else backend, "collective": collective,
                                 "bytes": sent, "times_s": slowest})
    if comm.Get_rank() == 0:
        atomic_write_text(a.out, json.dumps({"ranks": n, "rows": rows}) + "\n")
    if "gloo" in backends:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
