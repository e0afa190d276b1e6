"""A plain MLP; ``--width`` sets the hidden size, so its gradient volume (communication) is tunable."""

from __future__ import annotations

import math

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(),
            nn.Linear(width, width), nn.ReLU(), nn.Linear(width, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
