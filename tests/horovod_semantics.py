"""A plain Horovod script that records what Horovod's less obvious semantics do, for tests/test_native.py.

Run under real Horovod and under dpcompare's native layer at two processes, each writes the same JSON (rank 0)
when the layer reproduces Horovod: zero gradients for unused parameters, backward_passes_per_step and its error,
synchronize/skip_synchronize, zero_grad's error, gradient_predivide_factor, the reduction ops on floats and
integers, fp16 compression, broadcast_optimizer_state's zero step, sparse gradients, explicit groups, the
collectives and their gradients. Floats are kept as Python floats (JSON round-trips them exactly).

    mpirun -np 2 python -m dpcompare.native --as native tests/horovod_semantics.py OUT.json
"""

import json
import sys
import warnings

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

hvd.init()
results = {}


def check(fn):
    """Record fn's result, or its exception's type and message start, under its name."""
    try:
        results[fn.__name__] = fn()
    except Exception as e:  # noqa: BLE001  (the exception is what is recorded)
        results[fn.__name__] = f"{type(e).__name__}: {str(e)[:60]}"
    return fn


def flat(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


def model_and_data(seed=0, width=6):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3))
    gen = torch.Generator().manual_seed(100 + hvd.rank())
    return model, torch.randn(5, 4, generator=gen), torch.randint(0, 3, (5,), generator=gen)


@check
def facts():
    return [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
            hvd.is_initialized()]


@check
def unused_parameters_get_zero_gradients():
    torch.manual_seed(1)
    used, unused = nn.Linear(3, 3), nn.Linear(3, 3)
    params = [*used.named_parameters(prefix="used"), *unused.named_parameters(prefix="unused")]
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1, momentum=0.9, weight_decay=0.1),
                                   named_parameters=params)
    hvd.broadcast_parameters(dict(params), root_rank=0)
    before = flat(unused.weight)
    for _ in range(4):  # past the steps whose timings decide the fusion groups
        opt.zero_grad()
        used(torch.full((2, 3), 1.0 + hvd.rank())).sum().backward()
        opt.step()
    return {"grad_is_none": unused.weight.grad is None, "grad": flat(unused.weight.grad),
            "moved": flat(unused.weight) != before, "weights": flat(unused.weight) + flat(used.weight)}


@check
def accumulation_and_its_limit():
    model, x, y = model_and_data(2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    out = {}
    for step in range(3):
        opt.zero_grad()
        for half in (x[:3], x[3:]):
            F.cross_entropy(model(half), y[: len(half)]).backward()
        opt.step()
        out[f"step{step}"] = flat(model[0].weight)
    opt.zero_grad()
    for _ in range(3):
        try:
            F.cross_entropy(model(x), y).backward()
        except Exception as e:  # noqa: BLE001
            out["third_pass"] = f"{type(e).__name__}: {str(e)[:40]}"
            break
    opt.synchronize()  # wait for what the second pass started: Horovod names must not be in flight twice
    return out


@check
def zero_grad_between_backward_and_step():
    model, x, y = model_and_data(3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    F.cross_entropy(model(x), y).backward()
    try:
        opt.zero_grad()
        return "no error"
    except AssertionError as e:
        return f"AssertionError: {str(e)[:50]}"
    finally:
        opt.synchronize()


@check
def synchronize_then_skip():
    model, x, y = model_and_data(4)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    averaged = flat(model[2].weight.grad)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()  # after synchronize() without skip_synchronize(): Horovod warns and reduces again
    return {"averaged": averaged, "weights": flat(model[2].weight), "warned": len(caught) > 0}


@check
def predivide_factor():
    model, x, y = model_and_data(5)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.3),
                                   named_parameters=model.named_parameters(), gradient_predivide_factor=3.0)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return flat(model[0].weight.grad) + flat(model[2].weight)


@check
def predivide_arithmetic():
    x = torch.tensor([0.1, 0.7, 1e-3, 3.3]) * (1 + 2 * hvd.rank())  # what DistributedOptimizer does for factor 3:
    return flat(hvd.allreduce(x, prescale_factor=1 / 3.0, postscale_factor=3.0))  # x/3 summed, then times 3/size


@check
def explicit_groups_and_sum():
    model, x, y = model_and_data(6)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), groups=2, op=hvd.Sum)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return flat(model[0].weight)


@check
def fp16_compression():
    model, x, y = model_and_data(7)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=hvd.Compression.fp16)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    t = torch.tensor([1.0 / 3, 1e-4, 65504.0, 0.1 * (hvd.rank() + 1)])
    return {"weights": flat(model[0].weight),
            "allreduce": flat(hvd.allreduce(t, compression=hvd.Compression.fp16))}


@check
def optimizer_state_zero_step():
    model, _, _ = model_and_data(8)
    if hvd.rank() == 1:
        with torch.no_grad():
            model[0].weight.add_(1.0)
    adam = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    state = adam.state[model[0].weight]
    return {"weights": flat(model[0].weight), "step": float(state["step"]),
            "grad_after": flat(model[0].weight.grad)}


@check
def reductions():
    r = hvd.rank()
    f = torch.tensor([1.5 + r, -2.0 * r, 1e-3])
    i = torch.tensor([3 + r, -3 - 2 * r, 7], dtype=torch.int32)
    return {"avg": flat(hvd.allreduce(f)), "sum": flat(hvd.allreduce(f, op=hvd.Sum)),
            "min": flat(hvd.allreduce(f, op=hvd.Min)), "max": flat(hvd.allreduce(f, op=hvd.Max)),
            "scaled": flat(hvd.allreduce(f, prescale_factor=0.3, postscale_factor=1.7)),
            "int_avg": hvd.allreduce(i).tolist(), "int_sum": hvd.allreduce(i, op=hvd.Sum).tolist(),
            "average_flag": flat(hvd.allreduce(f, average=False)), "inplace": flat(hvd.allreduce_(f.clone()))}


@check
def gathers_and_broadcasts():
    r = hvd.rank()
    uneven = torch.arange(2 + r, dtype=torch.float32).view(-1, 1) * (r + 1)
    handle = hvd.allreduce_async(torch.tensor([float(r)]), name="async")
    while not hvd.poll(handle):
        pass
    grouped = hvd.grouped_allreduce([torch.tensor([1.0 + r]), torch.tensor([[2.0 * r]]), torch.tensor([3 + r])])
    return {"allgather": hvd.allgather(uneven).tolist(), "async": flat(hvd.synchronize(handle)),
            "broadcast": flat(hvd.broadcast(torch.tensor([r + 0.5]), root_rank=1)),
            "broadcast_": flat(hvd.broadcast_(torch.tensor([r + 0.25]), root_rank=0)),
            "object": hvd.broadcast_object({"from": r, "list": [r, "x"]}, root_rank=1),
            "objects": hvd.allgather_object((r, f"rank{r}")),
            "grouped": [flat(t) for t in grouped]}


@check
def gradients_through_collectives():
    x = torch.tensor([1.0, 2.0 + hvd.rank()], requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * torch.tensor([3.0, 5.0])).sum().backward()
    y = torch.tensor([[1.0, 2.0]] * (1 + hvd.rank()), requires_grad=True)
    (hvd.allgather(y) ** 2).sum().backward()
    return {"allreduce": flat(x.grad), "allgather": flat(y.grad)}


@check
def sparse_gradients():
    torch.manual_seed(9)
    emb = nn.Embedding(10, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                   named_parameters=emb.named_parameters())
    hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
    for step in range(3):
        opt.zero_grad()
        emb(torch.tensor([hvd.rank(), 4, step])).pow(2).sum().backward()
        opt.step()
    return flat(emb.weight)


@check
def deeper_model_many_steps():
    torch.manual_seed(11)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(16, 16), nn.ReLU())], nn.Linear(16, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(50 + hvd.rank())
    for _ in range(6):
        opt.zero_grad()
        F.cross_entropy(model(torch.randn(8, 16, generator=gen)), torch.randint(0, 2, (8,), generator=gen)).backward()
        opt.step()
    fusion = getattr(opt, "_fusion", None)  # the native layer's own account (absent under Horovod)
    if fusion is not None:
        results["layer_fusion"] = {"groups": len(fusion.plan), "started": fusion.started}
    return [flat(p) for p in model.parameters()]


@check
def elastic_state():
    """hvd.elastic without a failure: the first sync makes rank 0's state everyone's, a commit is what restore()
    goes back to, the ElasticSampler splits the rest of the epoch, run() returns what the function returns."""
    from horovod.common.elastic import ObjectState

    torch.manual_seed(hvd.rank())
    model = nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(23)), shuffle=True, seed=3)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=hvd.rank(), seen=[hvd.rank()])
    plain = ObjectState(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, x=hvd.rank() + 10)
    out = {}

    @hvd.elastic.run
    def train(state, steps):
        out["synced"] = [flat(model.weight), state.epoch, state.seen, list(sampler)]
        for _ in range(steps):
            opt.zero_grad()
            model(torch.ones(4, 3) * (hvd.rank() + 1)).sum().backward()
            opt.step()
            sampler.record_batch(0, 4)
        state.epoch += 1
        state.commit()
        with torch.no_grad():
            model.weight.add_(1.0)
        state.epoch, state.seen = 99, [7]
        sampler.record_batch(1, 4)
        state.restore()
        return "done"

    out["returned"] = train(state, 2)
    out["restored"] = [flat(model.weight), state.epoch, state.seen, sampler.state_dict(), list(sampler), len(sampler)]
    plain.sync()
    out["object_state"] = plain.x
    return out


@check
def refusals():
    out = []
    for call in (lambda: hvd.DistributedOptimizer(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1),
                                                  backward_passes_per_step=0),
                 lambda: hvd.allreduce(torch.ones(1), op=hvd.Sum, average=True),
                 lambda: hvd.broadcast_optimizer_state(torch.optim.LBFGS(nn.Linear(1, 1).parameters()), 0)):
        try:
            call()
            out.append("no error")
        except Exception as e:  # noqa: BLE001
            out.append(f"{type(e).__name__}: {str(e)[:50]}")
    return out


if hvd.rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
