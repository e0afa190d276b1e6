"""A bag-of-words classifier over a large vocabulary with a sparse embedding, as a user writes a plug-in.

``nn.Embedding(sparse=True)`` gives the table a sparse gradient: only the rows a batch used. torch's SGD (with
momentum, without weight decay) and Adagrad take sparse gradients; Adam does not (SparseAdam does).

    dpcompare parity --np 2 --strategies ddp,horovod,zero --workload tests/zoo/sparse_bag.py:workload
"""

import torch
import torch.nn.functional as F
from torch import nn

from dpcompare.data.workload import Metric, Workload

VOCABULARY, WORDS, CLASSES = 5000, 12, 4


def documents(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(0, VOCABULARY, (n, WORDS), generator=g)
    return torch.utils.data.TensorDataset(words, words[:, :3].sum(1) % CLASSES)


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.words = nn.Embedding(VOCABULARY, 32, sparse=True)
        self.out = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        return self.out(self.words(words).mean(1))


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
    return float((logits.argmax(1) == y).sum()), len(y)


def workload() -> Workload:
    return Workload("sparse bag of words", build_model=Bag, build_data=lambda: (documents(512, 0), documents(128, 1)),
                    loss=F.cross_entropy, metrics=(Metric("accuracy", True, accuracy, unit="%"),))
