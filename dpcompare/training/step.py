"""The step runner: one optimizer step over ``accumulate`` micro-batches, timed phase by phase.

It owns what a step needs and nothing about epochs: the loss of the workload, mixed precision and the
gradient scaler, the phase timer, the tracer's hooks, and the list of timed steps (those after warm-up)
that the timing summary reads. Everything done to gradients goes through the strategy's hooks
(:class:`~dpcompare.backends.base.Strategy`: zero_grad, accumulation_context, backward, clip_grad_norm,
optimizer_step), so the runner never asks which strategy it runs; the learning-rate schedule steps once after
each optimizer step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from dpcompare import knobs
from dpcompare.backends.base import Strategy
from dpcompare.config import TrainConfig
from dpcompare.trace import CpuClock
from dpcompare.training.tracing import TraceSession


class StepTiming(NamedTuple):
    """Seconds one step spent in each phase (:data:`~dpcompare.files.PHASES`) and in all."""

    data: float
    forward: float
    backward: float
    optimizer: float
    total: float


class PhaseTimer:
    """Times the phases of one step; ``sync`` waits for the device so each phase holds its own work."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync
        self.start = self.last = 0.0
        self.laps: dict[str, float] = {}

    def begin(self) -> None:
        self.start = self.last = time.perf_counter()
        self.laps = {}

    def lap(self, phase: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.laps[phase] = self.laps.get(phase, 0.0) + now - self.last  # summed over micro-batches
        self.last = now

    def result(self) -> StepTiming:
        """The step so far; its total includes the loop's own bookkeeping since ``begin``."""
        return StepTiming(**self.laps, total=time.perf_counter() - self.start)


class StepResult(NamedTuple):
    """One step's mean loss, the sum of its samples' losses and the number of samples (this rank's)."""

    loss: torch.Tensor
    loss_sum: torch.Tensor
    samples: int


def to_device(obj: Any, device: torch.device) -> Any:
    """A batch's tensors on ``device``, inside tuples, lists and dicts as a workload's collate made them."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


class StepRunner:
    """Runs optimizer steps; keeps every rank's timed steps (``times``) and the count of steps taken."""

    def __init__(self, cfg: TrainConfig, strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer,
                 loss: Callable[[Any, Any], torch.Tensor], tracer: TraceSession | None = None,
                 scheduler: Any = None, max_norm: float = 0.0) -> None:
        self.strategy, self.model, self.optimizer, self.loss, self.tracer = strategy, model, optimizer, loss, tracer
        self.scheduler = scheduler  # a torch LRScheduler stepped after every optimizer step, or None
        self.max_norm = max_norm  # clip to this global gradient norm before every optimizer step (0: never)
        self.accumulate = cfg.accumulate
        self.warmup = cfg.warmup_steps
        self.amp_dtype = knobs.amp_dtype(cfg.amp)
        self.scaler = strategy.precision.grad_scaler(strategy.cfg.amp)
        device = strategy.device
        self.timer = PhaseTimer(torch.cuda.synchronize if device.type == "cuda" else (lambda: None))
        self.times: list[StepTiming] = []
        self.cpu = CpuClock()  # the main thread's and the other threads' CPU time over the timed steps
        self.done = 0  # optimizer steps taken by this runner

    def step(self, it: Iterator[Any], step_no: int = 0) -> StepResult:
        """One optimizer step (``accumulate`` micro-batches from ``it``), timed by phase once past warm-up."""
        if self.tracer:
            self.tracer.before_step(self.done)
        timer = self.timer
        if self.done >= self.warmup:
            self.cpu.begin()
        timer.begin()
        self.strategy.zero_grad(self.optimizer)
        mean = torch.zeros((), dtype=torch.float64)
        total = torch.zeros((), dtype=torch.float64)
        n = 0
        for micro in range(self.accumulate):  # gradients summed locally, exchanged after the last
            x, y = next(it)
            x, y = to_device(x, self.strategy.device), to_device(y, self.strategy.device)
            timer.lap("data")
            loss = self._forward_backward(x, y, micro)
            micro_loss = loss.detach().to(torch.float64).cpu()
            mean += micro_loss / self.accumulate
            total += micro_loss * len(y)
            n += len(y)
        self.update()
        timer.lap("optimizer")
        if self.tracer:
            self.tracer.after_step(step_no, timer.start, timer.laps)
        self.done += 1
        if self.done > self.warmup:
            self.times.append(timer.result())
            self.cpu.end()
        return StepResult(mean, total, n)

    def update(self) -> None:
        """Clip (the strategy synchronises first), step, and move the learning-rate schedule on by one step."""
        if self.max_norm:
            self.strategy.clip_grad_norm(self.model, self.optimizer, self.max_norm, self.scaler)
        self.strategy.optimizer_step(self.optimizer, self.scaler)
        if self.scheduler is not None:
            self.scheduler.step()

    def _forward_backward(self, x: Any, y: Any, micro: int) -> torch.Tensor:
        """One micro-batch's forward and backward; its (unscaled) loss."""
        device = self.strategy.device
        with self.strategy.accumulation_context(self.model, micro):  # DDP's no_sync covers forward and backward
            with torch.autocast(device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                loss = self.loss(self.model(x), y)
            self.timer.lap("forward")
            self.strategy.backward(loss / self.accumulate if self.accumulate > 1 else loss, self.scaler)
            self.timer.lap("backward")
        return loss

    def timing_only(self, loader: Any, sampler: Any, last_epoch: int, steps_per_epoch: int, min_timed: int) -> int:
        """Step on through further epochs' batches until ``min_timed`` steps are timed; the count.

        These steps come after the last evaluation and write no metrics or checkpoints: they only lengthen
        the timing. Every rank times the same steps, so every rank takes the same number of extra steps.
        """
        extra, epoch = 0, last_epoch
        while len(self.times) < min_timed:
            sampler.set_epoch(epoch)
            epoch += 1
            it = iter(loader)
            for _ in range(steps_per_epoch):  # each step takes `accumulate` batches
                self.step(it)
                extra += 1
                if len(self.times) >= min_timed:
                    break
        return extra

    def all_finite(self, loss: torch.Tensor) -> bool:
        """True when the loss and the (already all-reduced) gradients are finite on every rank.

        Every rank gets the same answer (a max all-reduce of a flag), so all of them stop at the same step.
        """
        grads = [p.grad._values() if p.grad.is_sparse else p.grad for p in self.model.parameters()
                 if p.grad is not None]
        ok = bool(torch.isfinite(loss).all()) and all(bool(torch.isfinite(g).all()) for g in grads)
        return float(self.strategy.all_reduce(0.0 if ok else 1.0, "max")) == 0.0
