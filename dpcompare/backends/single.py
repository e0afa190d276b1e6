"""One process, no communication: the baseline every distributed run is compared with.

It also holds the one-process versions of the collectives (the serial computation model): every
strategy must implement them, so a new strategy that forgets one fails loudly instead of reporting
rank-local metrics.
"""

from __future__ import annotations

import torch
from torch import nn

from dpcompare.backends.base import ReduceOp, Strategy
from dpcompare.errors import LaunchError


class SingleStrategy(Strategy):
    name = "single"
    sync_mechanism = "none: one process holds every gradient"

    def connect(self) -> None:
        if self.env.world_size != 1:
            raise LaunchError(f"--strategy single runs one process but {self.env.launcher} started "
                              f"{self.env.world_size}; drop mpirun/srun or use --strategy ddp|horovod")
        _ = self.device

    def disconnect(self) -> None:
        """No process group to leave."""

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Nothing to agree on: one process."""

    def all_reduce(self, value: torch.Tensor | float, op: ReduceOp = "mean") -> torch.Tensor:
        return torch.as_tensor(value, dtype=torch.float64).detach().clone().cpu()

    def broadcast_buffers(self, model: nn.Module) -> None:
        """One process: its buffers are rank 0's."""

    def barrier(self) -> None:
        """Nobody to wait for."""
