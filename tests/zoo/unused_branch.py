"""A classifier with an auxiliary head its forward never calls (left over from an experiment), as a user writes a
plug-in. DDP stops at its second step unless it is told to look for parameters without a gradient; dpcompare's
pre-check finds them and runs DDP with ``find_unused_parameters=True``.

    mpirun -np 2 dpcompare train --strategy ddp --workload tests/zoo/unused_branch.py:workload
"""

import torch
import torch.nn.functional as F
from torch import nn

from dpcompare.data.workload import Metric, Workload


def points(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :4].argmax(1))


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)
        self.aux_head = nn.Linear(32, 4)  # not used any more

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
    return float((logits.argmax(1) == y).sum()), len(y)


def workload() -> Workload:
    return Workload("two heads", build_model=TwoHeads, build_data=lambda: (points(512, 0), points(128, 1)),
                    loss=F.cross_entropy, metrics=(Metric("accuracy", True, accuracy, unit="%"),))
