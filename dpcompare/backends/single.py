"""One process, no communication: the baseline every distributed run is compared with."""

from __future__ import annotations

from dpcompare.backends.base import Strategy
from dpcompare.backends.registry import register
from dpcompare.errors import LaunchError


@register
class SingleStrategy(Strategy):
    name = "single"
    summary = "one process, no communication (the baseline)"
    sync_mechanism = "none: one process holds every gradient"

    def setup(self) -> None:
        if self.env.world_size != 1:
            raise LaunchError(f"--strategy single runs one process but {self.env.launcher} started "
                              f"{self.env.world_size}; drop mpirun/srun or use --strategy ddp|horovod")
        _ = self.device
