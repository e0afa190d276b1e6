"""gloo on CUDA tensors: two processes on one GPU (NCCL refuses that), an all-reduce and a few DDP steps.

Part of bench/gpu_check.sh; runs on its own too: ``python bench/gpu_gloo.py``. Exit code 0 when the
all-reduce gives the right sum and both ranks end with the same weights (or, without ``--require-gpu``,
when there is no GPU).
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dev = torch.device("cuda", 0)
    t = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    want = world * (world + 1) / 2
    assert t.device.type == "cuda" and torch.allclose(t, torch.full_like(t, want)), f"all_reduce gave {t[0]}"

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 10).to(dev))  # gloo over CUDA tensors
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(5):
        x, y = torch.randn(32, 64, generator=g).to(dev), torch.randint(0, 10, (32,), generator=g).to(dev)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(gathered[0], x) for x in gathered), "ranks ended with different weights"
    if rank == 0:
        print(f"gloo on {torch.cuda.get_device_name(0)}: all_reduce of CUDA tensors ok, DDP 5 steps, "
              f"{world} ranks with identical weights")
    dist.destroy_process_group()


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU: torch sees no CUDA device")
        return 1 if "--require-gpu" in sys.argv else 0
    world = 2
    mp.spawn(_worker, args=(world, _free_port()), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
