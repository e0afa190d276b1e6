"""Horovod: gradients are synchronised by hooks in the *optimizer*.

``hvd.DistributedOptimizer`` registers a hook per parameter that enqueues an asynchronous
all-reduce as soon as its gradient is ready; Horovod's background thread negotiates which tensors
every rank has ready and fuses them into one buffer (``HOROVOD_FUSION_THRESHOLD``) per cycle
(``HOROVOD_CYCLE_TIME``). ``optimizer.step()`` first calls ``synchronize()``, waiting for every
outstanding all-reduce, then applies the update. The model is not wrapped.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import torch
from torch import nn

from dpcompare.backends.base import ReduceOp, Strategy, StrategyUnavailable, require_gpu_for_sync_bn
from dpcompare.backends.registry import register
from dpcompare.errors import LaunchError

INSTALL_HINT = ("--strategy horovod needs Horovod, which is not installed in this Python: run `make setup` "
                "(builds horovod 0.28.1 with the C++17 fix) or `pip install 'dpcompare[horovod]'`")


def _hvd() -> Any:
    import horovod.torch as hvd

    return hvd


@register
class HorovodStrategy(Strategy):
    name = "horovod"
    summary = "Horovod DistributedOptimizer (MPI or gloo controller)"
    sync_mechanism = ("optimizer hooks: per-parameter hooks enqueue all-reduces that Horovod's background "
                      "thread fuses; optimizer.step() waits for them (synchronize) before updating")

    @classmethod
    def check_available(cls) -> None:
        try:
            _hvd()
        except ImportError as e:
            raise StrategyUnavailable(f"{INSTALL_HINT} ({e})") from None

    @classmethod
    def version(cls) -> str | None:
        try:
            return metadata.version("horovod")
        except metadata.PackageNotFoundError:
            return None

    @classmethod
    def build_info(cls) -> dict[str, object]:
        """Horovod's build, as ``horovodrun --check-build`` shows it."""
        info = super().build_info()
        if not info["installed"]:
            return info
        hvd = _hvd()
        info["controllers"] = {"MPI": bool(hvd.mpi_built()), "Gloo": bool(hvd.gloo_built())}
        info["tensor_operations"] = {name: bool(fn()) for name, fn in (
            ("NCCL", hvd.nccl_built), ("DDL", hvd.ddl_built), ("CCL", hvd.ccl_built), ("MPI", hvd.mpi_built),
            ("Gloo", hvd.gloo_built))}
        info["cuda_built"] = bool(hvd.cuda_built())
        return info

    def setup(self) -> None:
        hvd = _hvd()
        hvd.init()
        if hvd.size() != self.env.world_size or hvd.rank() != self.env.rank:
            raise LaunchError(f"Horovod sees rank {hvd.rank()} of {hvd.size()} but {self.env.launcher} says "
                              f"{self.env.rank} of {self.env.world_size}; launch with mpirun/srun/horovodrun")
        self._hvd = hvd

    def teardown(self) -> None:
        hvd = getattr(self, "_hvd", None)
        if hvd is not None and hvd.is_initialized():
            hvd.shutdown()

    def convert_sync_batchnorm(self, model: nn.Module) -> nn.Module:
        require_gpu_for_sync_bn(self.device, "hvd.SyncBatchNorm")
        return _convert_bn(model, self._hvd.SyncBatchNorm)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        hvd = self._hvd
        # Pre-divide by the world size before summing, as DDP does, so both average identically.
        return hvd.DistributedOptimizer(optimizer, named_parameters=self.unwrap_model(model).named_parameters(),
                                        op=hvd.Average, gradient_predivide_factor=float(hvd.size()))

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        hvd = self._hvd
        hvd.broadcast_parameters(self.unwrap_model(model).state_dict(), root_rank=0)
        if optimizer.state:  # never on a fresh optimizer: that would take an optimizer step
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def all_reduce(self, value: torch.Tensor | float, op: ReduceOp = "mean") -> torch.Tensor:
        hvd = self._hvd
        ops = {"sum": hvd.Sum, "mean": hvd.Average, "max": hvd.Max, "min": hvd.Min}
        t = torch.as_tensor(value, dtype=torch.float64).detach().clone().cpu()
        return hvd.allreduce(t, op=ops[op])

    def broadcast_buffers(self, model: nn.Module) -> None:
        with torch.no_grad():
            for name, b in self.unwrap_model(model).named_buffers():
                self._hvd.broadcast_(b, root_rank=0, name=f"dpcompare.buffer.{name}")

    def barrier(self) -> None:
        self._hvd.barrier()


def _convert_bn(module: nn.Module, sync_cls: type[nn.Module]) -> nn.Module:
    """Replace every BatchNorm layer by ``sync_cls``, keeping its parameters and running statistics."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, sync_cls):
        new = sync_cls(module.num_features, module.eps, module.momentum, module.affine,
                       module.track_running_stats)
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, _convert_bn(child, sync_cls))
    return module
