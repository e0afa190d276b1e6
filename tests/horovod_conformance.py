"""A Horovod script that records how the native layer meets Horovod's contract on bad input, for
tests/test_native_conformance.py: every dtype through every collective, ranks that disagree on a call (each
difference Horovod's negotiation catches, all-to-all's too), calls issued in different orders, one name twice in
flight, ``join()`` with uneven work (each rank in turn joining first while the others call unnamed collectives it
skips), a root rank outside the job, what is "built", the stall inspector (tiny limits, set read at each wait)
stopping ranks 0 and 1 of a process set waiting for different tensors (rank 1 first, rank 0 with it), and last
rank 0 joining after the others left the job.

    mpirun -np 3 python -m dpcompare.native tests/horovod_conformance.py OUT.json
"""

import json
import os
import sys

import horovod.torch as hvd
import torch

PAIR = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[PAIR])
rank, size = hvd.rank(), hvd.size()
results = {}


def outcome(fn):
    """``ok``/the value fn returns, or the exception's type and message."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  (the exception is what is recorded)
        return {"error": type(e).__name__, "runtime": isinstance(e, RuntimeError), "message": str(e)}


# -- every dtype through every collective ----------------------------------------------------------------
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
          torch.float64]


def dtype_checks(dtype):
    mine = torch.full((3, 2), rank + 1).to(dtype)
    summed = hvd.allreduce(mine, op=hvd.Sum, name=f"sum.{dtype}")
    gathered = hvd.allgather(torch.full((rank + 1, 2), rank + 1).to(dtype), name=f"gather.{dtype}")
    sent = hvd.broadcast(mine, 1, name=f"bcast.{dtype}")
    grouped = hvd.grouped_allreduce([mine, mine + 1], op=hvd.Sum, name=f"group.{dtype}")
    expect_sum = sum(range(1, size + 1))
    rows = torch.cat([torch.full((r + 1, 2), r + 1) for r in range(size)])
    return {"allreduce": bool((summed.double() == expect_sum).all()) and summed.dtype == dtype,
            "allgather": bool((gathered.double() == rows.double()).all()) and gathered.dtype == dtype,
            "broadcast": bool((sent.double() == 2).all()) and sent.dtype == dtype,
            "grouped_allreduce": bool((grouped[1].double() == expect_sum + size).all())}


for dtype in DTYPES:
    results[f"dtype.{str(dtype).replace('torch.', '')}"] = outcome(lambda dtype=dtype: dtype_checks(dtype))
results["dtype.bool"] = outcome(lambda: bool(hvd.broadcast(torch.tensor([rank == 1]), 1).all())
                                and hvd.allgather(torch.tensor([True])).tolist() == [True] * size)

# -- ranks that disagree ----------------------------------------------------------------------------------
MISMATCHES = {
    "allreduce_dtype": lambda: hvd.allreduce(torch.ones(4, dtype=torch.int32 if rank else torch.float32),
                                             name="m.dtype"),
    "allreduce_shape": lambda: hvd.allreduce(torch.ones(4 + rank, 3), name="m.shape"),
    "allreduce_rank_of_shape": lambda: hvd.allreduce(torch.ones(12) if rank else torch.ones(3, 4), name="m.dims"),
    "allreduce_op": lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum if rank else hvd.Max, name="m.op"),
    "allreduce_factors": lambda: hvd.allreduce(torch.ones(4), prescale_factor=1.0 + rank, name="m.scale"),
    "allgather_shape": lambda: hvd.allgather(torch.ones(2, 3 + rank), name="m.gather"),
    "allgather_dtype": lambda: hvd.allgather(torch.ones(2, dtype=torch.int64 if rank else torch.float64),
                                             name="m.gtype"),
    "broadcast_root": lambda: hvd.broadcast(torch.ones(4), rank, name="m.root"),
    "broadcast_shape": lambda: hvd.broadcast(torch.ones(2, 2 + rank), 0, name="m.bshape"),
    "operation": lambda: (hvd.allgather if rank else hvd.allreduce)(torch.ones(4), name="m.kind"),
    "alltoall_dtype": lambda: hvd.alltoall(torch.ones(2 * size, dtype=torch.int32 if rank else torch.float32),
                                           name="m.a2a"),
    "alltoall_shape": lambda: hvd.alltoall(torch.ones(size, 2 + rank), name="m.a2ashape"),
}
for key, fn in MISMATCHES.items():
    results[f"mismatch.{key}"] = outcome(fn)
results["after_mismatches"] = outcome(lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist())
# rank r sends r + 1 rows to each rank (values: the receiver's rank), unnamed, asynchronously
results["alltoall"] = outcome(lambda: [t.tolist() for t in hvd.synchronize(hvd.alltoall_async(
    torch.arange(size).repeat_interleave(rank + 1).float(), torch.full((size,), rank + 1, dtype=torch.int32)))])

# -- order, names, join, roots ------------------------------------------------------------------------------


def out_of_order():
    a, b = torch.full((3,), 1.0 + rank), torch.full((5,), 10.0 * (rank + 1))
    first, second = ("a", "b") if rank == 0 else ("b", "a")
    handles = {n: hvd.allreduce_async(a if n == "a" else b, name=n, op=hvd.Sum) for n in (first, second)}
    return [hvd.synchronize(handles["a"]).tolist(), hvd.synchronize(handles["b"]).tolist()]


def duplicate_name():
    got = {}
    handle = None
    if rank == 0:
        handle = hvd.allreduce_async(torch.ones(3), name="twice", op=hvd.Sum)
        got["second"] = outcome(lambda: hvd.allreduce_async(torch.ones(3), name="twice"))
    hvd.barrier()  # rank 0's "twice" waits for rank 1, which submits it only after this barrier
    if rank > 0:
        handle = hvd.allreduce_async(torch.ones(3), name="twice", op=hvd.Sum)
        got["second"] = outcome(lambda: hvd.allreduce_async(torch.ones(3), name="twice"))
    got["first"] = hvd.synchronize(handle).tolist()
    got["reused_after_synchronize"] = hvd.allreduce(torch.ones(1), name="twice", op=hvd.Sum).tolist()
    return got


def join_uneven():
    got = {}
    if rank == 1:
        got["join"] = hvd.join()
    else:
        got["average"] = hvd.allreduce(torch.full((4,), 6.0), name="uneven").tolist()
        got["summed"] = synchronize_two()
        got["allgather"] = outcome(lambda: hvd.allgather(torch.ones(2), name="joined.gather"))
        got["join"] = hvd.join()
    got["everyone"] = hvd.allgather_object(got["join"])
    return got


def synchronize_two():
    h1 = hvd.allreduce_async(torch.ones(2, dtype=torch.int16), name="j1", op=hvd.Sum)
    h2 = hvd.allreduce_async(torch.ones(3), name="j2", op=hvd.Sum)
    return [hvd.synchronize(h1).tolist(), hvd.synchronize(h2).tolist()]


def join_skipping_unnamed():
    """Each rank in turn joins first; the others call unnamed collectives it skips (a Sum all-reduce, answered
    with its zeros; an all-gather and an all-to-all, which fail with Join), then join."""
    got = []
    for first in range(size):
        step = {}
        if rank != first:
            step["sum"] = hvd.allreduce(torch.full((2,), rank + 1.0), op=hvd.Sum).tolist()
            step["allgather"] = outcome(lambda: hvd.allgather(torch.ones(1)))
            step["alltoall"] = outcome(lambda: hvd.alltoall(torch.ones(size)))
        step["join"] = hvd.join()
        got.append(step)
    return hvd.allgather_object(got)


results["out_of_order"] = outcome(out_of_order)
results["duplicate_name"] = outcome(duplicate_name)
results["join_uneven"] = outcome(join_uneven)
results["join_even"] = outcome(lambda: hvd.join())
results["join_skipping_unnamed"] = outcome(join_skipping_unnamed)
results["broadcast_root_out_of_range"] = outcome(lambda: hvd.broadcast(torch.ones(2), size + 3, name="far"))
results["objects"] = outcome(lambda: [hvd.broadcast_object({"r": rank}, 1), hvd.allgather_object(rank)])
results["built"] = {"nccl": hvd.nccl_built(), "mpi": hvd.mpi_built(), "gloo": hvd.gloo_built(),
                    "cuda": hvd.cuda_built(), "rocm": hvd.rocm_built(), "gpu": torch.cuda.is_available()}

# -- the stall inspector: ranks 0 and 1 waiting for different tensors; rank 1 reaches its shutdown time first
#    and leaves the job, and rank 0 (a longer limit) stops with it, as Horovod's coordinator stops every rank --
os.environ.update(HOROVOD_STALL_CHECK_TIME_SECONDS="1", HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="2" if rank else "60")
if rank in PAIR.ranks:
    results["stall"] = outcome(lambda: hvd.allreduce(torch.ones(2), name=f"only_rank{rank}", process_set=PAIR))
# -- the others leave the job (their script ends): rank 0's join fails instead of waiting forever ------------
if rank == 0:
    os.environ.update(HOROVOD_STALL_CHECK_TIME_SECONDS="60", HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="0")
    results["join_after_others_left"] = outcome(hvd.join)
    with open(sys.argv[1], "w") as f:  # not atomic: a test's scratch file, read once the job has ended
        json.dump(results, f, indent=1)
