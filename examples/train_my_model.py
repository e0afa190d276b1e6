"""Your own model and data under Horovod or DDP, from your own script.

    mpirun -np 2 python examples/train_my_model.py            # horovod
    mpirun -np 2 python examples/train_my_model.py ddp        # or ddp, zero, fsdp
"""
import sys

import torch
import torch.nn.functional as F

import dpcompare
from dpcompare.data.workload import Metric, Workload


def data():  # which half of 20 numbers has the larger sum; the same data in every process
    x = torch.randn(2048, 20, generator=torch.Generator().manual_seed(0))
    ds = torch.utils.data.TensorDataset(x, (x[:, :10].sum(1) > x[:, 10:].sum(1)).long())
    return torch.utils.data.Subset(ds, range(1792)), torch.utils.data.Subset(ds, range(1792, 2048))


def model():
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))


accuracy = Metric("accuracy", higher_is_better=True, unit="%",
                  batch=lambda out, y: (float((out.argmax(1) == y).sum()), len(y)))
halves = Workload("halves", build_model=model, build_data=data, loss=F.cross_entropy, metrics=(accuracy,))

if __name__ == "__main__":
    strategy = sys.argv[1] if len(sys.argv) > 1 else "horovod"
    dpcompare.train(halves, strategy=strategy, epochs=3, batch_size=32, lr=0.1,
                    out=f"runs/example-{strategy}", overwrite=True, tensorboard=False)
