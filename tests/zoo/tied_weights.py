"""A tiny language model whose output layer shares its weight with the input embedding (weight tying, as GPT-2
and most language models do), written as a user writes a plug-in: two modules, one Parameter.

    dpcompare parity --np 2 --strategies ddp,horovod,zero,fsdp --workload tests/zoo/tied_weights.py:workload
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from dpcompare.data.workload import Metric, Workload

VOCABULARY, LENGTH = 50, 12


def sequences(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCABULARY, (n, 1), generator=g)
    tokens = (start + torch.arange(LENGTH + 1) * 3) % VOCABULARY  # each token is the last one plus 3
    return torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, 24)
        self.mix = nn.GRU(24, 24, batch_first=True)
        self.out = nn.Linear(24, VOCABULARY, bias=False)
        self.out.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.mix(self.embed(tokens))
        return self.out(h)


def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def nll(logits: torch.Tensor, target: torch.Tensor) -> tuple[float, int]:
    return float(F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum")), target.numel()


def workload() -> Workload:
    return Workload("tied LM", build_model=TiedLM, build_data=lambda: (sequences(512, 0), sequences(128, 1)),
                    loss=loss, metrics=(Metric("perplexity", False, nll, finish=math.exp),))
