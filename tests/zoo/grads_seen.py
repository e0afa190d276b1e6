"""Test-only strategies (``--strategy tests/zoo/grads_seen.py:HorovodSeen`` / ``:DDPSeen``): the library's own
behaviour for a parameter that got no gradient, recorded before dpcompare gives it a zero one.

After each library's exchange (Horovod's ``synchronize()``, DDP's backward), they count the trainable parameters
whose ``.grad`` is None and those whose ``.grad`` is all zeros, into summary.json's ``comm``.
"""

import torch

from dpcompare.backends.ddp import DDPStrategy
from dpcompare.backends.horovod import HorovodStrategy


def _count(strategy, optimizer: torch.optim.Optimizer) -> None:
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    strategy.counters["none_grads"] = strategy.counters.get("none_grads", 0) + sum(p.grad is None for p in params)
    strategy.counters["zero_grads"] = strategy.counters.get("zero_grads", 0) + sum(
        p.grad is not None and not bool(p.grad.any()) for p in params)


class HorovodSeen(HorovodStrategy):
    name = "horovod-seen"

    def synchronize(self, optimizer):
        super().synchronize(optimizer)
        _count(self, optimizer)


class DDPSeen(DDPStrategy):
    name = "ddp-seen"

    def synchronize(self, optimizer):
        super().synchronize(optimizer)
        _count(self, optimizer)
