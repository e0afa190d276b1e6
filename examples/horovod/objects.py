"""Python objects and gathers with Horovod: a settings dict from rank 0, per-rank results all-gathered.

rank 0 chooses the run's settings and shares them with hvd.broadcast_object; each rank scores a different number
of validation samples and hvd.allgather collects the scores (first dimensions differ per rank);
hvd.allgather_object gathers a summary per rank. The model has an auxiliary head used only on some steps: Horovod
then all-reduces zero gradients for it, which SGD with weight decay and momentum still applies. A plain Horovod
script, on synthetic data:

    horovodrun -np 2 python objects.py
    mpirun -np 2 python -m dpcompare.native objects.py
"""

import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="objects, gathers and an unused head")
parser.add_argument("--steps", type=int, default=12, help="optimizer steps")
parser.add_argument("--seed", type=int, default=3, help="random seed")


class TwoHeads(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, width), nn.Tanh())
        self.main = nn.Linear(width, 1)
        self.aux = nn.Linear(width, 1)

    def forward(self, x, use_aux):
        h = self.body(x)
        return self.main(h) + (self.aux(h) if use_aux else 0)


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    # rank 0 decides; everyone gets its settings (rank 1's own choice is overwritten)
    settings = {"width": 24 + hvd.rank(), "lr": 0.05, "aux_every": 3, "decided_by": hvd.rank()}
    settings = hvd.broadcast_object(settings, root_rank=0)
    model = TwoHeads(settings["width"])
    optimizer = torch.optim.SGD(model.parameters(), lr=settings["lr"], momentum=0.9, weight_decay=1e-3)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    generator = torch.Generator().manual_seed(args.seed + hvd.rank())
    for step in range(args.steps):
        x = torch.randn(8, 16, generator=generator)
        y = x.sum(dim=1, keepdim=True).sin()
        optimizer.zero_grad()
        loss = F.mse_loss(model(x, use_aux=step % settings["aux_every"] == 0), y)
        loss.backward()
        optimizer.step()

    # validation: rank r scores 5 + r samples; allgather concatenates the uneven parts in rank order
    with torch.no_grad():
        xv = torch.randn(5 + hvd.rank(), 16, generator=generator)
        scores = (model(xv, use_aux=False) - xv.sum(dim=1, keepdim=True).sin()).abs().squeeze(1)
    every = hvd.allgather(scores, name="val_scores")
    total = hvd.allreduce(torch.tensor(float(len(scores))), name="val_count", op=hvd.Sum)
    summaries = hvd.allgather_object({"rank": hvd.rank(), "samples": len(scores), "worst": scores.max().item()})
    if hvd.rank() == 0:
        print(f"settings {settings}")
        print(f"validation error {every.mean().item():.5f} over {int(total.item())} samples ({len(every)} gathered)")
        print(f"per rank: {summaries}")


if __name__ == "__main__":
    main(parser.parse_args())
