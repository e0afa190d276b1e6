"""Gradient accumulation and fp16 compression with Horovod, with gradient clipping on the averaged gradients.

Two backward passes per optimizer step (backward_passes_per_step=2), gradients sent as float16
(hvd.Compression.fp16), and the clipping pattern Horovod documents: optimizer.synchronize(), clip, then
optimizer.step() inside optimizer.skip_synchronize(). Adam, whose state broadcast_optimizer_state creates.
A plain Horovod script, on synthetic data:

    horovodrun -np 2 python fp16_accumulate.py --steps 20
    mpirun -np 2 python -m dpcompare.native fp16_accumulate.py --steps 20
"""

import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="fp16 compression and accumulation")
parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
parser.add_argument("--micro-batch", type=int, default=16, help="samples per backward pass and rank")
parser.add_argument("--accumulate", type=int, default=2, help="backward passes per optimizer step")
parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
parser.add_argument("--clip", type=float, default=1.0, help="gradient norm limit")
parser.add_argument("--seed", type=int, default=7, help="random seed")


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16,
                                         backward_passes_per_step=args.accumulate)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # every rank its own synthetic data, the same in every run
    generator = torch.Generator().manual_seed(args.seed + 1000 * hvd.rank())
    teacher = torch.randn(32, 4, generator=torch.Generator().manual_seed(args.seed))
    for step in range(args.steps):
        optimizer.zero_grad()
        for _ in range(args.accumulate):
            x = torch.randn(args.micro_batch, 32, generator=generator)
            loss = F.mse_loss(model(x), x @ teacher) / args.accumulate
            loss.backward()
        # Horovod: wait for the averaged gradients, clip them, then step without synchronizing again.
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        with optimizer.skip_synchronize():
            optimizer.step()
        average = hvd.allreduce(loss.detach() * args.accumulate, name="train_loss")
        if hvd.rank() == 0 and step % 5 == 0:
            print(f"step {step}: loss {average.item():.5f}")


if __name__ == "__main__":
    main(parser.parse_args())
