"""Evaluation: every metric of the workload over the whole test set, and the metric curve over training.

The first metric (``workload.metric``) is the one the curve, the run summary and time-to-target use;
``--target-accuracy`` is its target, reached when the value first gets to it (``>=`` when higher is
better, ``<=`` when lower is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dpcompare.backends.base import Strategy
from dpcompare.data.workload import Metric
from dpcompare.training.step import to_device


def evaluate(model: nn.Module, strategy: Strategy, loader: Any, metrics: Sequence[Metric]) -> dict[str, float]:
    """Every metric by name over the whole test set; every rank evaluates with rank 0's BatchNorm statistics.

    Each metric's (total, count) is summed over batches, then over ranks, then finished.
    """
    strategy.broadcast_buffers(model)
    sums = torch.zeros(len(metrics), 2, dtype=torch.float64)
    with strategy.evaluating(model) as module, torch.no_grad():
        module.eval()
        for x, y in loader:
            output = module(to_device(x, strategy.device))
            target = to_device(y, strategy.device)
            for i, m in enumerate(metrics):
                total, count = m.batch(output, target)
                sums[i, 0] += float(total)
                sums[i, 1] += float(count)
        module.train()
    c = strategy.all_reduce(sums.flatten(), "sum").reshape(-1, 2)
    return {m.name: m.finish(float(c[i, 0] / c[i, 1])) if c[i, 1] > 0 else float("nan")
            for i, m in enumerate(metrics)}


def reached(value: float, target: float, higher_is_better: bool = True) -> bool:
    """Whether ``value`` has got to ``target`` for a metric that is better higher (or lower)."""
    return value >= target if higher_is_better else value <= target


class EvalCurve:
    """The metric against training time and steps, and when it first reached ``target``.

    ``train_seconds`` counts only the time spent in optimizer steps (the slowest rank's), not start-up,
    evaluation or checkpoints; ``add`` is called at every evaluation point. Rows hold ``test_metric`` and,
    when the metric is accuracy, ``test_accuracy`` too.
    """

    def __init__(self, target: float = 0.0, metric: str = "accuracy", higher_is_better: bool = True) -> None:
        self.target = target
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.rows: list[dict[str, float]] = []
        self.reached: dict[str, float] | None = None

    def add(self, step: int, train_seconds: float, value: float, epoch: float) -> None:
        if self.rows and self.rows[-1]["step"] == step:  # an epoch's end that was also an --eval-every point
            return
        row = {"step": step, "epoch": round(epoch, 4), "train_seconds": round(train_seconds, 6)}
        if self.metric == "accuracy":
            row["test_accuracy"] = value
        row["test_metric"] = value
        self.rows.append(row)
        if self.target and self.reached is None and reached(value, self.target, self.higher_is_better):
            self.reached = row

    def summary(self) -> dict[str, Any]:
        r = self.reached
        return {"target_accuracy": self.target or None, "eval_curve": self.rows,
                "time_to_accuracy_s": r["train_seconds"] if r else None,
                "steps_to_accuracy": int(r["step"]) if r else None, "epochs_to_accuracy": r["epoch"] if r else None}
