"""``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``, with Horovod's side effects.

``broadcast_optimizer_state`` on an optimizer with no state yet does what Horovod does before broadcasting: it
gives every parameter that requires a gradient a zero gradient and runs the optimizer's own ``step()`` once, to
create the state. With weight decay that step moves the weights; with Adam it sets the step count to 1. Scripts'
numbers under Horovod include that step, so they do here too (a DDP port that drops the call does not).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch

from dpcompare.native.traced import broadcast_async_, broadcast_object, synchronize


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Copy ``root_rank``'s tensors into everyone's, in place: a ``state_dict()`` (in sorted key order), or a list
    of parameters or of ``(name, parameter)`` pairs."""
    if isinstance(params, dict):
        pairs = sorted(params.items())
    elif isinstance(params, list):
        pairs = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = [broadcast_async_(p, root_rank, name) for name, p in pairs]
    for h in handles:
        synchronize(h)


def _create_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> None:
    """Horovod's state initialisation: zero gradients, then one local ``step()`` (no all-reduce)."""
    sparse = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse.update(id(p) for p in m.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
    local_step = getattr(optimizer, "_local_step", None)  # a DistributedOptimizer: its wrapped optimizer's step
    (local_step or optimizer.step)()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None) -> None:
    """Make every rank's optimizer state (tensors, step counts, hyper-parameters) ``root_rank``'s."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        _create_state(optimizer, model)
        state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        return  # a stateless optimizer (plain SGD): nothing to share
    tensors: list[tuple[str, torch.Tensor]] = []
    scalars: dict[str, Any] = {}
    setters: dict[str, Callable[[Any], None]] = {}
    seen: collections.Counter[str] = collections.Counter()

    def set_option(index: int, key: str) -> Callable[[Any], None]:
        return lambda v: optimizer.param_groups[index].__setitem__(key, v)

    def set_state(pid: Any, key: str) -> Callable[[Any], None]:
        return lambda v: state_dict["state"][pid].__setitem__(key, v)

    for index, group in enumerate(state_dict["param_groups"]):
        for key, value in group.items():
            if key != "params":
                scalars[f"{key}.{index}"] = value
                setters[f"{key}.{index}"] = set_option(index, key)
        for pid in group["params"]:
            for key, value in state_dict["state"].get(pid, {}).items():
                seen[key] += 1
                name = f"{key}.{seen[key]}"
                if torch.is_tensor(value):
                    tensors.append((name, value))
                else:
                    scalars[name] = value
                    setters[name] = set_state(pid, key)
    broadcast_parameters(tensors, root_rank)
    for name, value in broadcast_object(scalars, root_rank, name="optimizer.state").items():
        setters[name](value)
