"""One process, no communication: the baseline every distributed run is compared with.

It also holds the one-process versions of the collectives (the serial computation model): every
strategy must implement them, so a new strategy that forgets one fails loudly instead of reporting
rank-local metrics.

As ``parity``'s reference (``--emulate-ranks N``, hidden) it takes each step as N processes would: the loop hands
it rank 0's micro-batches, then rank 1's... (:class:`~dpcompare.data.datasets.ReplayLoader`), and
:class:`Replay` starts each rank's micro-batches from the random state and BatchNorm statistics the step began
with, as each process does (every process is seeded alike), and keeps rank 0's at the end (checkpoints hold rank
0's buffers). Each micro-batch's loss is divided by N × K, so the summed gradient is what N processes average.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dpcompare.backends.base import ReduceOp, Strategy
from dpcompare.errors import ConfigError, LaunchError

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig


class SingleStrategy(Strategy):
    name = "single"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._steps = 0  # optimizer steps begun (--emulate-ranks)
        self._replay: Replay | None = None  # the step's emulated ranks
        self.diverged_at: int | None = None  # first step whose emulated ranks drew different amounts of random numbers

    @classmethod
    def check_config(cls, cfg: TrainConfig, world_size: int) -> None:
        super().check_config(cfg, world_size)
        if cfg.emulate_ranks and cfg.accumulate % cfg.emulate_ranks:
            raise ConfigError(f"--emulate-ranks {cfg.emulate_ranks} takes --accumulate as processes × micro-batches "
                              f"per process: a multiple of {cfg.emulate_ranks}, not {cfg.accumulate}")

    def accumulation_context(self, model: nn.Module, micro_step: int) -> contextlib.AbstractContextManager[Any]:
        """Under ``--emulate-ranks``: each emulated rank's micro-batches start from the step's random state and
        BatchNorm statistics (:class:`Replay`)."""
        if self.cfg.emulate_ranks <= 1:
            return contextlib.nullcontext()
        if micro_step == 0:
            self._steps += 1
            self._replay = Replay(model, self.device, self._diverged)
        assert self._replay is not None
        return self._replay.micro(micro_step, self.cfg.accumulate // self.cfg.emulate_ranks, self.cfg.accumulate)

    def comm_report(self) -> dict[str, Any]:
        replay = {"emulated_ranks": self.cfg.emulate_ranks, "diverged_at_step": self.diverged_at} \
            if self.cfg.emulate_ranks else {}
        return {**super().comm_report(), **replay}

    def _diverged(self) -> None:
        if self.diverged_at is None:
            self.diverged_at = self._steps

    def connect(self) -> None:
        if self.env.world_size != 1:
            raise LaunchError(f"--strategy single runs one process but {self.env.launcher} started "
                              f"{self.env.world_size}; drop mpirun/srun or use --strategy ddp|horovod")
        _ = self.device

    def disconnect(self) -> None:
        """No process group to leave."""

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Nothing to agree on: one process."""

    def _do_all_reduce(self, t: torch.Tensor, op: ReduceOp) -> torch.Tensor:
        return t  # one process: every reduction of one value is that value

    def broadcast_buffers(self, model: nn.Module) -> None:
        """One process: its buffers are rank 0's."""

    def barrier(self) -> None:
        """Nobody to wait for."""


class Replay:
    """One step of N emulated processes in one: each rank's micro-batches start from the random state and the
    buffers (BatchNorm statistics) the step began with; at the end rank 0's are kept.

    Every process is seeded alike, so each starts the step from the same random state as long as all of them drew
    as many random numbers as the others so far (same batch shapes); ``diverged`` is called when they did not.
    """

    def __init__(self, model: nn.Module, device: torch.device, diverged: Callable[[], None]) -> None:
        self.model, self.cuda, self.diverged = model, device if device.type == "cuda" else None, diverged
        self.start_rng = self._rng()
        self.start_buffers = [b.detach().clone() for b in model.buffers()]
        self.rank0_rng: tuple[torch.Tensor, ...] | None = None
        self.rank0_buffers: list[torch.Tensor] = []

    def _rng(self) -> tuple[torch.Tensor, ...]:
        cpu = torch.get_rng_state()
        return (cpu, torch.cuda.get_rng_state(self.cuda)) if self.cuda is not None else (cpu,)

    def _set_rng(self, state: tuple[torch.Tensor, ...]) -> None:
        torch.set_rng_state(state[0])
        if self.cuda is not None:
            torch.cuda.set_rng_state(state[1], self.cuda)

    def _end_of_rank(self) -> None:
        """A rank's micro-batches are done: the first's state is kept; the others' must have drawn as much."""
        now = self._rng()
        if self.rank0_rng is None:
            self.rank0_rng = now
            self.rank0_buffers = [b.detach().clone() for b in self.model.buffers()]
        elif not all(torch.equal(a, b) for a, b in zip(now, self.rank0_rng, strict=True)):
            self.diverged()

    @contextlib.contextmanager
    def micro(self, micro_step: int, per_rank: int, total: int) -> Iterator[None]:
        if micro_step and micro_step % per_rank == 0:  # the next rank starts where the step started
            self._end_of_rank()
            self._set_rng(self.start_rng)
            with torch.no_grad():
                for b, start in zip(self.model.buffers(), self.start_buffers, strict=True):
                    b.copy_(start)
        yield
        if micro_step == total - 1:  # the step's last micro-batch: keep rank 0's state and buffers
            self._end_of_rank()
            self._set_rng(self.rank0_rng)  # type: ignore[arg-type]
            with torch.no_grad():
                for b, kept in zip(self.model.buffers(), self.rank0_buffers, strict=True):
                    b.copy_(kept)
