"""A small next-item recommender, written as a user writes a plug-in from docs/workloads.md.

Traits of real models it brings: a collate function that pads variable-length histories and returns a dict of
inputs, dropout, LayerNorm, a frozen (pre-trained, ``requires_grad=False``) item-embedding table, and its own metric,
"hit rate" (the true next item among the top 5 scores).

    dpcompare parity --np 2 --strategies ddp,horovod,zero,fsdp --workload tests/zoo/recommender.py:workload
"""

import torch
import torch.nn.functional as F
from torch import nn

from dpcompare.data.workload import Metric, Workload

ITEMS, DIM, LONGEST = 64, 16, 8


class History(torch.utils.data.Dataset):
    """Histories of 3 to 8 items; the next item is a fixed function of the last two."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(3, LONGEST + 1, (n,), generator=g)
        self.rows = [torch.randint(0, ITEMS, (int(k),), generator=g) for k in lengths]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        row = self.rows[i]
        return row, int((row[-1] * 7 + row[-2]) % ITEMS)


def collate(samples: list[tuple[torch.Tensor, int]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Pad to the longest history of all (fixed shapes), with a mask of the real items."""
    ids = torch.zeros(len(samples), LONGEST, dtype=torch.long)
    mask = torch.zeros(len(samples), LONGEST, dtype=torch.bool)
    for i, (row, _) in enumerate(samples):
        ids[i, :len(row)] = row
        mask[i, :len(row)] = True
    return {"ids": ids, "mask": mask}, torch.tensor([y for _, y in samples])


class Recommender(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.items = nn.Embedding(ITEMS, DIM)
        self.items.weight.requires_grad_(False)  # pre-trained and frozen
        self.position = nn.Parameter(torch.randn(LONGEST, DIM) * 0.1)
        self.mix = nn.Sequential(nn.Linear(DIM, 64), nn.GELU(), nn.Dropout(0.2), nn.Linear(64, DIM))
        self.norm = nn.LayerNorm(DIM)
        self.drop = nn.Dropout(0.1)
        self.score = nn.Linear(DIM, ITEMS)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        h = self.items(batch["ids"]) + self.position
        h = self.norm(h + self.mix(h))
        mask = batch["mask"].unsqueeze(-1).float()
        pooled = (h * mask).sum(1) / mask.sum(1)
        return self.score(self.drop(pooled))


def hits(scores: torch.Tensor, target: torch.Tensor) -> tuple[float, int]:
    top = scores.topk(5, dim=1).indices
    return float((top == target.unsqueeze(1)).any(1).sum()), len(target)


def workload() -> Workload:
    return Workload("recommender", build_model=Recommender, build_data=lambda: (History(512, 0), History(128, 1)),
                    loss=F.cross_entropy, metrics=(Metric("hit rate", True, hits, unit="%"),), collate=collate)
