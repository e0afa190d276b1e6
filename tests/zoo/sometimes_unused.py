"""A model whose every other training forward skips a layer (think of a branch taken only for some inputs): the
pre-check's one batch uses every parameter, the second step does not, and DDP needs --find-unused-parameters on.
"""

import torch
import torch.nn.functional as F
from torch import nn

from dpcompare.data.workload import Metric, Workload


class Alternating(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.calls = nn.Linear(8, 8), nn.Linear(8, 2), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        return self.b(self.a(x) if self.calls % 2 else x)


def workload() -> Workload:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=g)
    ds = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    metric = Metric("accuracy", True, lambda out, y: (float((out.argmax(1) == y).sum()), len(y)))
    return Workload("alternating", build_model=Alternating, build_data=lambda: (ds, ds), loss=F.cross_entropy,
                    metrics=(metric,))
