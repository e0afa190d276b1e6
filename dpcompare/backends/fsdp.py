"""FSDP2: ``fully_shard`` shards parameters, gradients and optimizer state over the processes.

Every module that owns parameters (each Linear, Conv, BatchNorm) and the root are wrapped by
``torch.distributed.fsdp.fully_shard`` (a module sharing a parameter with another, as a tied output layer does,
stays in the root's group) on a 1-D device mesh (gloo on CPU, nccl on CUDA). Each rank
stores 1/N of every parameter (a DTensor shard); the optimizer, built on those shards, holds 1/N of
the state. Per step each layer's parameters are all-gathered before its forward (and again before its
backward), and its gradients are reduce-scattered after backward, so every rank receives the averaged
gradient of its own shard only. Checkpoints gather the full model and optimizer state on rank 0 with
``torch.distributed.checkpoint.state_dict`` and are written in the plain format every strategy reads.
Gradient clipping needs no code here: :meth:`~dpcompare.backends.base.Strategy.global_grad_norm` sums each
rank's squares of its gradient shards in float64 and all-reduces the sum once, so the norm is the global one and
equal to DDP's (tests/test_strategy_hooks.py checks it against a hand-made one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dpcompare.backends.base import listed, patch
from dpcompare.backends.parts import FullState, Tracer
from dpcompare.backends.torchdist import TorchDistributedStrategy
from dpcompare.errors import ConfigError
from dpcompare.trace import ALL_GATHER, CAT_COMM, LANE_BUCKETS, REDUCE_SCATTER, TraceRecorder

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig
    from dpcompare.data.workload import ModelTraits


def _full_options(**kw: bool) -> Any:
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


class FSDPTracer(Tracer):
    """FSDP's collectives per parameter group."""

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, recorder: TraceRecorder) -> None:
        """Each parameter group's all-gather (from ``unshard`` issuing it to ``wait_for_unshard`` returning) and
        reduce-scatter (``post_backward``, which issues it after the group's gradients are ready), patched on the
        groups for the traced steps only. Bytes: the all-gather's output, the same size as the reduce-scatter's
        input (reduce dtype aside)."""
        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        from torch.distributed.fsdp import FSDPModule

        super().start(model, optimizer, recorder)
        groups = []
        for m in model.modules():
            state = m._get_fsdp_state() if isinstance(m, FSDPModule) else None
            mine = getattr(state, "_fsdp_param_groups", None)
            if mine is None:  # earlier torch: at most one group per module
                mine = [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
            groups += mine
        for i, group in enumerate(groups):
            for undo in _trace_group(group, recorder, LANE_BUCKETS + i):
                self.undo_at_stop(undo)
            recorder.lanes[LANE_BUCKETS + i] = f"FSDP {group._module_fqn or 'root'}"


class FSDPState(FullState):
    """FSDP's model and optimizer state are sharded: gathered to rank 0 (on the CPU) for a checkpoint, and a
    plain optimizer state is scattered back into the shards on resume."""

    def dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer
              ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        opts = _full_options(cpu_offload=True)  # only rank 0 receives the gathered tensors
        model_sd = get_model_state_dict(model, options=opts)
        optim_sd = get_optimizer_state_dict(model, optimizer, options=opts)
        if not self.strategy.is_main:
            return {}, {}
        return model_sd, _fqn_to_ids(optim_sd)

    def load_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, _ids_to_fqn(model, optimizer, state), options=_full_options())


class FSDPStrategy(TorchDistributedStrategy):
    name = "fsdp"
    tracer_class = FSDPTracer
    full_state_class = FSDPState

    @classmethod
    def check_model(cls, traits: ModelTraits, cfg: TrainConfig) -> None:
        super().check_model(traits, cfg)
        if traits.sparse:
            raise ConfigError(f"--strategy fsdp: FSDP2 cannot reduce-scatter sparse gradients (it flattens every "
                              f"gradient), and {listed(traits.sparse)} get sparse ones (nn.Embedding(sparse=True)); "
                              "use ddp, zero or horovod, or make the embedding dense (sparse=False)")

    def accumulation_context(self, model: nn.Module, micro_step: int) -> contextlib.AbstractContextManager[Any]:
        """FSDP2's no_sync: keep unsharded gradients local until the last micro-batch, then reduce-scatter."""
        model.set_requires_gradient_sync(micro_step == self.cfg.accumulate - 1)  # type: ignore[operator]
        return contextlib.nullcontext()

    def wrap_model(self, model: nn.Module) -> nn.Module:
        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        from torch.distributed.device_mesh import init_device_mesh

        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        from torch.distributed.fsdp import fully_shard

        # fully_shard shards each rank's own tensors: start every rank from rank 0's (as DDP's constructor does).
        self.broadcast_module(model)
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        for m in _units(model):
            fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model  # fully_shard changes the module in place; its state_dict holds DTensor shards

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Parameters were made equal before sharding; on resume every rank loaded the same optimizer state."""
        self.broadcast_buffers(model)

    @contextmanager
    def evaluating(self, model: nn.Module) -> Iterator[nn.Module]:
        """Gather every layer once, so that ranks may run different numbers of forward passes."""
        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for m in units:
            m.unshard()
            m.set_reshard_after_forward(False, recurse=False)
        try:
            yield model
        finally:
            for m in units:
                m.set_reshard_after_forward(True, recurse=False)
                m.reshard()


def _units(model: nn.Module) -> list[nn.Module]:
    """The modules sharded as units of their own: each one below the root that owns parameters, except those
    sharing a parameter with another module (tied weights: an output layer holding the embedding's), which stay
    with the root's group, as FSDP2 requires of a shared parameter."""
    owners: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    return [m for m in model.modules() if m is not model and any(True for _ in m.parameters(recurse=False))
            and all(owners[id(p)] == 1 for p in m.parameters(recurse=False))]


def _trace_group(group: Any, recorder: TraceRecorder, lane: int) -> list[Callable[[], None]]:
    """Patch one FSDP parameter group's ``unshard``/``wait_for_unshard``/``post_backward`` to record spans."""
    started: list[tuple[float, int]] = []
    unshard, wait, post_backward = group.unshard, group.wait_for_unshard, group.post_backward
    name = group._module_fqn or "root"

    def traced_unshard(*args: Any, **kwargs: Any) -> Any:
        t0, before = recorder.now(), group._all_gather_result
        out = unshard(*args, **kwargs)
        result = group._all_gather_result
        if before is None and result is not None and result.param_all_gather_input_numels:  # one was issued
            started.append((t0, result.all_gather_output.numel() * result.all_gather_output.element_size()))
        return out

    def traced_wait(*args: Any, **kwargs: Any) -> Any:
        out = wait(*args, **kwargs)
        if started:
            t0, nbytes = started.pop()
            group._dpcompare_bytes = nbytes
            recorder.span(f"all-gather {name}", CAT_COMM, t0, recorder.now(), tid=lane,
                          bytes=nbytes, collective=ALL_GATHER)
        return out

    def traced_post_backward(*args: Any, **kwargs: Any) -> Any:
        t0 = recorder.now()
        out = post_backward(*args, **kwargs)
        nbytes = getattr(group, "_dpcompare_bytes", 0)
        if nbytes:
            recorder.span(f"reduce-scatter {name}", CAT_COMM, t0, recorder.now(), tid=lane,
                          bytes=nbytes, collective=REDUCE_SCATTER)
        return out

    return [patch(group, "unshard", traced_unshard), patch(group, "wait_for_unshard", traced_wait),
            patch(group, "post_backward", traced_post_backward)]


def _fqn_to_ids(sd: dict[str, Any]) -> dict[str, Any]:
    """torch.distributed.checkpoint's optimizer state (keyed by parameter name) → plain torch.optim ids."""
    ids: dict[str, int] = {}
    groups = []
    for g in sd["param_groups"]:
        groups.append({**g, "params": [ids.setdefault(n, len(ids)) for n in g["params"]]})
    return {"state": {ids[n]: s for n, s in sd["state"].items()}, "param_groups": groups}


def _ids_to_fqn(model: nn.Module, optimizer: torch.optim.Optimizer, sd: dict[str, Any]) -> dict[str, Any]:
    """Plain torch.optim ids (the order of the optimizer's parameters) → parameter names."""
    names = {p: n for n, p in model.named_parameters()}
    order = [names[p] for g in optimizer.param_groups for p in g["params"]]
    groups = [{**g, "params": [order[i] for i in g["params"]]} for g in sd["param_groups"]]
    return {"state": {order[int(i)]: s for i, s in sd["state"].items()}, "param_groups": groups}
