"""What every strategy on ``torch.distributed`` shares: the process group and its collectives.

:class:`TorchDistributedStrategy` joins the other processes through the launcher's rendezvous (gloo on CPU,
nccl on CUDA), leaves them, broadcasts from rank 0 and reduces metrics. It wraps nothing and exchanges no
gradients itself: ``ddp`` and ``zero`` add DDP's model hooks (:class:`~dpcompare.backends.ddp.DDPModelHooks`),
``fsdp`` shards the model, and a strategy of one's own may all-reduce the gradients in
:meth:`~dpcompare.backends.base.Strategy.synchronize` (tests/test_fifth_strategy.py does).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from dpcompare.backends.base import ReduceOp, Strategy, require_gpu_for_sync_bn
from dpcompare.launch.rendezvous import ensure_rendezvous

_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN}


class TorchDistributedStrategy(Strategy):
    """A torch.distributed process group (gloo on CPU, nccl on CUDA) and the collectives on it; replicas by
    default (every rank holds the whole model and optimizer state)."""

    @classmethod
    def version(cls) -> str | None:
        return str(torch.__version__)

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def library(self) -> str:
        return self.backend

    def connect(self) -> None:
        if dist.is_initialized():
            return
        ensure_rendezvous(self.env, self.iface)
        dist.init_process_group(self.backend, init_method="env://", rank=self.rank,
                                world_size=self.world_size, timeout=timedelta(seconds=self.timeout_s))

    def disconnect(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def convert_sync_batchnorm(self, model: nn.Module) -> nn.Module:
        require_gpu_for_sync_bn(self.device, "torch.nn.SyncBatchNorm")
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Rank 0's parameters, buffers and (after a resume) optimizer state, on every rank."""
        self.broadcast_module(model)
        for state in optimizer.state.values():  # empty unless resumed
            for key in sorted(state):
                if isinstance(state[key], torch.Tensor):
                    self._broadcast_(state[key])

    def broadcast_module(self, model: nn.Module) -> None:
        """Rank 0's parameters and buffers, on every rank."""
        module = self.unwrap_model(model)
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                self._broadcast_(t)

    def _broadcast_(self, t: torch.Tensor, src: int = 0) -> None:
        if t.device.type == self.device.type:
            dist.broadcast(t, src)
        else:  # e.g. a CPU step counter while the model is on CUDA under nccl
            tmp = t.to(self.device)
            dist.broadcast(tmp, src)
            t.copy_(tmp)

    def _do_all_reduce(self, t: torch.Tensor, op: ReduceOp) -> torch.Tensor:
        if self.backend == "nccl":  # NCCL reduces device tensors only
            t = t.to(self.device)
        dist.all_reduce(t, _OPS[op])
        if op == "mean":
            t /= self.world_size
        return t

    def broadcast_buffers(self, model: nn.Module) -> None:
        with torch.no_grad():
            for b in self.unwrap_model(model).buffers():
                self._broadcast_(b)

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()
