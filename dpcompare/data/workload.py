"""A workload is everything one training job computes, as one object: model, data, loss and metrics.

The loop in :mod:`dpcompare.training` asks nothing else of the job: it builds the model and the datasets,
calls ``loss(output, target)`` on every micro-batch and accumulates every metric over the test set. A workload
may also bring its own optimizer, learning-rate schedule and clipping norm (``build_optimizer``,
``build_scheduler``, ``clip_grad_norm``); without them the flags decide. The built-in models × datasets are
instances (:func:`builtin`); a user's own (``--workload module:attr`` or ``path/to/file.py:attr``) is another.

This module imports no torch at import time; the callables it holds do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import Dataset


@dataclass(frozen=True)
class Metric:
    """An evaluation metric accumulated over the test set, summed across ranks, then finished.

    ``batch(output, target)`` returns ``(total, count)`` for one batch (for example correct answers and
    samples, or summed token negative log-likelihood and tokens); the value is ``finish(sum(total) /
    sum(count))`` over every batch of every rank.
    """

    name: str                 # "accuracy", "perplexity", "token accuracy"
    higher_is_better: bool
    batch: Callable[[Any, Any], tuple[float, int]]
    finish: Callable[[float], float] = float
    unit: str = ""            # "%" when the finished value is a share shown in per cent


@dataclass(frozen=True)
class ModelTraits:
    """What the pre-check (:func:`~dpcompare.data.plugins.check_workload`) saw when it ran one batch forward and
    backward on the CPU: the facts strategies and ``parity`` act on. Names are the plain module's parameter names.
    """

    #: trainable parameters (``requires_grad=True``) that got no gradient: DDP needs ``find_unused_parameters``
    unused: tuple[str, ...] = ()
    #: parameters whose gradient is sparse (``nn.Embedding(sparse=True)``)
    sparse: tuple[str, ...] = ()
    #: parameters frozen by the model (``requires_grad=False``): not trained, not exchanged
    frozen: tuple[str, ...] = ()
    #: module types that draw random numbers while training (Dropout...), by class name
    random: tuple[str, ...] = ()
    #: whether the model has BatchNorm layers (per-process batch statistics)
    batchnorm: bool = False


@dataclass(frozen=True)
class Workload:
    """Everything a training job computes. ``metrics[0]`` is the one verdicts and time-to-target use."""

    name: str
    build_model: Callable[[], nn.Module]
    build_data: Callable[[], tuple[Dataset, Dataset]]
    loss: Callable[[Any, Any], torch.Tensor]
    metrics: tuple[Metric, ...]
    collate: Callable[[list[Any]], Any] | None = None
    #: where it came from: "builtin" or the plug-in's import path (recorded in checkpoints, checked on resume)
    source: str = "builtin"
    #: free-form facts for the run banner and summary (parameters, vocabulary, sequence length, ...)
    info: dict[str, Any] = field(default_factory=dict)
    #: optional, its own optimizer: ``build_optimizer(model, lr)`` over the plain model's parameters at the run's
    #: learning rate (--lr, × processes with --scale-lr), e.g. with parameter groups; replaces --optimizer,
    #: --momentum and --weight-decay
    build_optimizer: Callable[[nn.Module, float], torch.optim.Optimizer] | None = None
    #: optional, its own learning-rate schedule: ``build_scheduler(optimizer, total_steps)``, a torch
    #: ``LRScheduler`` stepped once after every optimizer step; replaces --lr-schedule and --lr-warmup-steps
    build_scheduler: Callable[[torch.optim.Optimizer, int], Any] | None = None
    #: optional, clip the gradients to this global 2-norm before every optimizer step; replaces --clip-grad-norm
    clip_grad_norm: float | None = None
    #: what the pre-check saw of the model (filled by it; None: not checked, as for the built-in workloads)
    traits: ModelTraits | None = None

    @property
    def metric(self) -> Metric:
        return self.metrics[0]

    @property
    def label(self) -> str:
        """What it trains, in words, wherever a run is described: its model and dataset when ``info`` names them
        (the built-in ones: ``convnet · digits``), else its name (a plug-in's own)."""
        return " · ".join(str(self.info[k]) for k in ("model", "dataset") if self.info.get(k)) or self.name
