"""ZeRO-1: DDP for the gradients, ``ZeroRedundancyOptimizer`` to shard the optimizer state.

The model is replicated and wrapped in DistributedDataParallel exactly as under ``ddp`` (the same
:class:`~dpcompare.backends.ddp.DDPModelHooks`; gradients are
all-reduced by model hooks during backward). The optimizer is split: each rank owns the optimizer state
of about 1/N of the parameters and updates only those; after its step every rank broadcasts the
parameters it owns, so all replicas agree again. Optimizer state per rank shrinks to about 1/N; the
extra cost is one broadcast of the parameters per step. (``overlap_with_ddp`` is not used: it is
reported to hang on gloo.)
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from dpcompare.backends.base import tensor_bytes, timed_collective
from dpcompare.backends.ddp import DDPModelHooks, DDPTracer
from dpcompare.backends.parts import FullState
from dpcompare.backends.torchdist import TorchDistributedStrategy
from dpcompare.trace import BROADCAST, LANE_BROADCAST, TraceRecorder


class ZeroTracer(DDPTracer):
    """DDP's all-reduces and buffer broadcast, and after ``step()`` each rank's broadcast of its updated shard
    (``_sync_params``: every parameter byte is broadcast once, from its owner)."""

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, recorder: TraceRecorder) -> None:
        super().start(model, optimizer, recorder)
        if hasattr(optimizer, "_sync_params"):
            nbytes = tensor_bytes(p for g in optimizer.param_groups for p in g["params"])
            timed = timed_collective(recorder, optimizer._sync_params, "broadcast parameter shards", BROADCAST,
                                     nbytes, LANE_BROADCAST)
            recorder.lanes[LANE_BROADCAST] = "broadcast"
            self.patch(optimizer, "_sync_params", timed)


class ZeroState(FullState):
    """ZeRO's optimizer state is sharded: rank 0 gathers it for a checkpoint; each rank holds its shard."""

    def dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer
              ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        from dpcompare.checkpoint import plain_state_dict  # here, not at the top: it loads numpy

        assert isinstance(optimizer, _zero_optimizer_class())
        optimizer.consolidate_state_dict(to=0)  # a collective: every rank sends its shard to rank 0
        model_sd = plain_state_dict(self.strategy.unwrap_model(model).state_dict())
        if not self.strategy.is_main:
            return model_sd, {}
        return model_sd, _plain_optimizer_state(optimizer.state_dict())

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Iterable[dict[str, Any]]:
        assert isinstance(optimizer, _zero_optimizer_class())
        return optimizer.optim.state.values()  # the local optimizer: this rank's shard


class ZeroStrategy(DDPModelHooks, TorchDistributedStrategy):
    name = "zero"
    tracer_class = ZeroTracer
    full_state_class = ZeroState

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        """The same optimizer class over the same parameter groups (each with its own settings, such as AdamW's
        no-decay group), sharded: each rank's local optimizer holds its part of every group."""
        groups = [dict(g) for g in optimizer.param_groups]
        return _zero_optimizer_class()(groups, optimizer_class=type(optimizer), **_constructor_defaults(optimizer))

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        # Each rank holds only its shard of the optimizer state (loaded from the same checkpoint on resume):
        # only parameters and buffers need rank 0's values.
        self.broadcast_module(model)


def _zero_optimizer_class() -> type[torch.optim.Optimizer]:
    # imported on use: torch.distributed.optim pulls in sympy (~1 s), which the other strategies' processes skip
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer


def _constructor_defaults(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's defaults its class's constructor takes (AdamW's include ``decoupled_weight_decay``, which
    its constructor does not take; every group carries all of them anyway)."""
    params = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in params}


def _plain_optimizer_state(sd: dict[str, Any]) -> dict[str, Any]:
    """ZeRO's consolidated state with only ``torch.optim``'s own keys (as a plain optimizer writes it)."""
    plain = {"state": {int(k): v for k, v in sd["state"].items() if v is not None},
             "param_groups": [dict(g) for g in sd["param_groups"]]}
    return plain
