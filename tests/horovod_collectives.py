"""A plain Horovod script that records what process sets, reduce-scatter, all-to-all and the timeline do, for
tests/test_native_collectives.py. Written for three processes (a set of two of them, and one of one).

Each rank writes OUT/rankR.json: per check, its result, or the exception's type and the start of its message.
Under real Horovod and under dpcompare's native layer the records must agree (but the messages' wording); the
test also holds them against hand-computed values.

    mpirun -np 3 python -m dpcompare.native --as native tests/horovod_collectives.py OUT [TIMELINE2]
"""

import json
import os
import sys
from pathlib import Path

os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # before init, as Horovod reads it there

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

pair = hvd.ProcessSet([2, 0])
hvd.init(process_sets=[pair])
rank = hvd.rank()
results = {}


def check(fn):
    try:
        results[fn.__name__] = fn()
    except Exception as e:  # noqa: BLE001  (the exception is what is recorded)
        results[fn.__name__] = f"{type(e).__name__}: {str(e)[:70]}"
    return fn


def flat(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


# first, while every rank has issued the same collectives: Horovod names the ones autograd issues by a
# per-process counter
@check
def reducescatter_grads():
    out = []
    for op in (hvd.Sum, hvd.Average):
        x = torch.ones(4, 2, requires_grad=True)
        y = hvd.reducescatter(x, name=f"rs.grad{op}", op=op, prescale_factor=3.0)
        (y * torch.ones_like(y)).sum().backward()  # a gradient of its own (Horovod scales it in place)
        out.append(flat(x.grad))
    return out


@check
def alltoall_grad():
    x = torch.arange(6, dtype=torch.float32, requires_grad=True)
    y = hvd.alltoall(x, splits=[1, 2, 3], name="a.grad")[0]
    (y * (rank + 1)).sum().backward()
    return flat(x.grad)


@check
def set_facts():
    facts = [pair.process_set_id, pair.ranks, pair.size(), pair.included(), hvd.global_process_set.size()]
    try:
        facts.append(pair.rank())
    except ValueError as e:
        facts.append(f"ValueError: {e}")
    return facts


@check
def set_collectives():
    if not pair.included():
        return "outside"
    mine = torch.tensor([rank + 1.0])
    h = hvd.allreduce_async_(mine.clone(), name="s.async", op=hvd.Sum, process_set=pair)
    rows = torch.full((1 + rank // 2, 2), float(rank))
    return {"sum": flat(hvd.allreduce(mine, name="s.sum", op=hvd.Sum, process_set=pair)),
            "average": flat(hvd.allreduce(mine, name="s.avg", process_set=pair)),
            "grouped": [flat(t) for t in hvd.grouped_allreduce([mine, mine * 2], name="s.g", op=hvd.Sum,
                                                                 process_set=pair)],
            "async_inplace": flat(hvd.synchronize(h)),
            "allgather": flat(hvd.allgather(rows, name="s.ag", process_set=pair)),
            "broadcast_from_2": flat(hvd.broadcast(mine, root_rank=2, name="s.b", process_set=pair)),
            "object_from_2": hvd.broadcast_object({"from": rank}, root_rank=2, name="s.o", process_set=pair),
            "barrier": hvd.barrier(process_set=pair)}


@check
def outside_the_set():
    if pair.included():
        return "inside"
    return hvd.allreduce(torch.ones(1), name="outside", process_set=pair)


@check
def dynamic_sets():
    single = hvd.add_process_set([1])
    first_id = single.process_set_id
    alone = (
        flat(hvd.allreduce(torch.tensor([5.0]), name="alone", op=hvd.Sum, process_set=single)) if rank == 1 else None
    )
    try:
        hvd.add_process_set([0, 2])
        duplicate = "added"
    except ValueError as e:
        duplicate = f"ValueError: {str(e)[:40]}"
    removed = [hvd.remove_process_set(single), hvd.remove_process_set(single),
               hvd.remove_process_set(hvd.global_process_set), single.process_set_id]
    again = hvd.add_process_set(hvd.ProcessSet([1]))
    out = [first_id, alone, duplicate, removed, again.process_set_id]
    hvd.remove_process_set(again)
    return out


@check
def optimizer_in_a_set():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), process_set=pair)
    (model(torch.tensor([[float(rank + 1) ** 2]])).sum()).backward()  # gradient (rank + 1)^2
    opt.step()
    return flat(model.weight)


@check
def reducescatter():
    t = torch.arange(14, dtype=torch.float32).view(7, 2) * (rank + 1)
    ints = torch.tensor([rank + 1] * 4, dtype=torch.int32)
    h = hvd.reducescatter_async(t, name="rs.async", op=hvd.Sum)
    g = hvd.grouped_reducescatter([torch.ones(5) * rank, torch.ones(4, 1) * rank], name="rs.g", op=hvd.Sum)
    summed = hvd.synchronize(h)
    return {"sum": [list(summed.shape), flat(summed)],
            "average": flat(hvd.reducescatter(t, name="rs.avg")),
            "scaled": flat(hvd.reducescatter(t, name="rs.sc", op=hvd.Sum, prescale_factor=2.0,
                                              postscale_factor=0.25)),
            "int_prescale": flat(hvd.reducescatter(ints, name="rs.ip", op=hvd.Sum, prescale_factor=1.5)),
            "int_average": flat(hvd.reducescatter(ints, name="rs.ia")),
            "grouped": [list(x.shape) for x in g] + [flat(x) for x in g],
            "in_pair": flat(hvd.reducescatter(t, name="rs.pair", op=hvd.Sum,
                                              process_set=pair)) if pair.included() else None}


@check
def reducescatter_errors():
    out = []
    for call in (lambda: hvd.reducescatter(torch.ones(3), name="rs.max", op=hvd.Max),
                 lambda: hvd.reducescatter(torch.tensor(1.0), name="rs.scalar"),
                 lambda: hvd.reducescatter(torch.ones(3, dtype=torch.int16), name="rs.i16"),
                 lambda: hvd.reducescatter(torch.ones(3, 2).t(), name="rs.t"),
                 lambda: hvd.reducescatter(torch.ones(3, dtype=torch.int32 if rank == 1 else torch.float32),
                                           name="rs.types"),
                 lambda: hvd.reducescatter(torch.ones(3, 1 + rank // 2), name="rs.shapes")):
        try:
            call()
            out.append("no error")
        except Exception as e:  # noqa: BLE001
            out.append(type(e).__name__ if not isinstance(e, RuntimeError) else "RuntimeError")
    return out


@check
def alltoall():
    to_each = torch.cat([torch.full((j + 1, 2), 10.0 * rank + j) for j in range(3)])
    out, got = hvd.alltoall(to_each, splits=[1, 2, 3], name="a.splits")
    own = torch.full((3 * (rank + 1),), float(rank))
    out2, got2 = hvd.alltoall(own, splits=torch.tensor([rank + 1] * 3, dtype=torch.int32), name="a.uneven")
    equal = hvd.alltoall(torch.tensor([10.0 * rank + j for j in range(3)]), name="a.equal")
    h = hvd.alltoall_async(torch.tensor([rank] * 3, dtype=torch.int16), name="a.async")
    a_out, a_got = hvd.synchronize(h)
    return {"splits": [flat(out), got.tolist(), str(got.dtype)], "uneven": [flat(out2), got2.tolist()],
            "equal": flat(equal), "async_int16": [a_out.tolist(), str(a_out.dtype), a_got.tolist()],
            "in_pair": flat(hvd.alltoall(torch.tensor([rank * 1.0, rank + 0.5]), name="a.pair", process_set=pair))
            if pair.included() else None}


@check
def alltoall_errors():
    out = []
    for call in (lambda: hvd.alltoall(torch.ones(3), splits=torch.ones(3), name="a.e1"),
                 lambda: hvd.alltoall(torch.ones(2), splits=[1, 1, 1], name="a.e2"),
                 lambda: hvd.alltoall(torch.ones(4), name="a.e3"),
                 lambda: hvd.alltoall(torch.ones(3, dtype=torch.int32 if rank == 1 else torch.float32), name="a.e4")):
        try:
            call()
            out.append("no error")
        except Exception as e:  # noqa: BLE001
            out.append("RuntimeError" if isinstance(e, RuntimeError) else type(e).__name__)
    return out


@check
def timeline_api():
    if len(sys.argv) < 3:
        return None
    hvd.start_timeline(sys.argv[2], mark_cycles=True)
    hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name="test_allreduce")
    hvd.reducescatter(torch.ones(6, 2), name="rs")
    hvd.synchronize(hvd.alltoall_async(torch.ones(3), name="a2a"))
    hvd.stop_timeline()
    return "written"


Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
(Path(sys.argv[1]) / f"rank{rank}.json").write_text(json.dumps(results, indent=1, sort_keys=True))
