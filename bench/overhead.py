#!/usr/bin/env python
"""What does dpcompare cost? Its trainer against a minimal hand-written loop, per strategy, side by side.

    python bench/overhead.py [--np 2] [--rounds 6] [--epochs 3] [--strategies ddp,horovod]

For each strategy one ``mpirun -np N`` job sets up the process group once, then alternates the
hand-written loop and ``dpcompare.training.loop.train`` (same model, data, batch and steps), swapping the
order every round so machine noise hits both alike; the ratio's spread over rounds is printed too. Throughput is
measured the same way for both: training samples of all ranks per epoch divided by the slowest rank's wall time for that
epoch, the first epoch of every segment left out as warm-up. Prints dpcompare's median throughput as a ratio of
the hand-written loop's (target: >= 0.99).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from quiet import wait_for_quiet
from torch.utils.data import DataLoader, DistributedSampler

from dpcompare.config import TrainConfig
from dpcompare.data.datasets import build_dataset
from dpcompare.models import build_model


def _loader(rank: int, world: int, batch: int, seed: int) -> tuple[DataLoader, DistributedSampler]:
    ds = build_dataset("digits").train
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
    return DataLoader(ds, batch_size=batch, sampler=sampler, drop_last=True), sampler


def _epochs(model, opt, loader, sampler, epochs, world, slowest) -> list[float]:  # noqa: ANN001
    """The loop everybody writes first. Returns global samples/s per epoch."""
    rates = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        running, n = 0.0, 0
        t = time.perf_counter()
        for x, y in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            running += loss.item()
            n += len(y)
        rates.append(n * world / slowest(time.perf_counter() - t))
    return rates


def hand_ddp(epochs: int, batch: int, lr: float, seed: int) -> list[float]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()

    def slowest(sec: float) -> float:
        t = torch.tensor([sec])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    torch.manual_seed(seed)
    model = DDP(build_model("convnet", (1, 8, 8), 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loader, sampler = _loader(rank, world, batch, seed)
    return _epochs(model, opt, loader, sampler, epochs, world, slowest)


def hand_horovod(epochs: int, batch: int, lr: float, seed: int) -> list[float]:
    import horovod.torch as hvd

    def slowest(sec: float) -> float:
        return float(hvd.allreduce(torch.tensor([sec]), op=hvd.Max))

    torch.manual_seed(seed)
    model = build_model("convnet", (1, 8, 8), 10)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                   named_parameters=model.named_parameters())
    loader, sampler = _loader(hvd.rank(), hvd.size(), batch, seed)
    return _epochs(model, opt, loader, sampler, epochs, hvd.size(), slowest)


HAND = {"ddp": hand_ddp, "horovod": hand_horovod}


def worker(a: argparse.Namespace) -> None:
    from dpcompare import backends
    from dpcompare.training.loop import train

    torch.set_num_threads(1)
    strategy = backends.create(a.strategy, device="cpu")
    strategy.connect()
    tmp = Path(a.result).parent
    cfg = TrainConfig(strategy=a.strategy, model="convnet", dataset="digits", epochs=a.epochs, batch_size=a.batch,
                      lr=0.05, seed=1, out=str(tmp / f"run-{a.strategy}"), tensorboard=False, progress="none",
                      overwrite=True, threads=1, warmup_steps=0)
    hand: list[list[float]] = []  # per round: samples/s of each measured epoch
    ours: list[list[float]] = []
    for r in range(a.rounds):
        for which in (("hand", "dpcompare") if r % 2 == 0 else ("dpcompare", "hand")):
            if which == "hand":
                hand.append(HAND[a.strategy](a.epochs, a.batch, 0.05, 1)[1:])
            else:
                train(cfg, strategy=strategy)
                rows = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
                ours.append([row["samples_per_sec"] for row in rows[1:]])
    if strategy.is_main:
        Path(a.result).write_text(json.dumps({"strategy": a.strategy, "hand": hand, "dpcompare": ours}))
    strategy.disconnect()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--epochs", type=int, default=5, help="epochs per segment (the first is warm-up)")
    p.add_argument("--batch", type=int, default=32, help="batch size per process")
    p.add_argument("--strategies", default="ddp,horovod")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--strategy", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        from dpcompare.launch.jobs import leave

        worker(a)
        leave(0)  # gloo's threads outlive the process group under DDP: no interpreter teardown for them to abort
    wait_for_quiet()

    from rich.console import Console
    from rich.table import Table

    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1")
    table = Table(title=f"dpcompare vs a hand-written loop: convnet on digits, np={a.np}, batch {a.batch}/process, "
                        f"{a.rounds} alternating rounds × {a.epochs - 1} measured epochs")
    for col in ("strategy", "hand-written samples/s", "dpcompare samples/s", "ratio (target ≥ 0.99)",
                "per-round ratios: quartiles"):
        table.add_column(col, justify="right")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for s in a.strategies.split(","):
            result = Path(tmp) / f"{s}.json"
            cmd = ["mpirun", "-np", str(a.np), "--oversubscribe", "--bind-to", "none", sys.executable, __file__,
                   "--worker", "--strategy", s, "--result", str(result), "--rounds", str(a.rounds),
                   "--epochs", str(a.epochs), "--batch", str(a.batch)]
            print(f"running {s} ({a.rounds} rounds)…", flush=True)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0 or not result.exists():
                print(proc.stderr[-3000:], file=sys.stderr)
                table.add_row(s, "failed", "", "", "")
                ok = False
                continue
            r = json.loads(result.read_text())
            h = statistics.median(x for rnd in r["hand"] for x in rnd)
            d = statistics.median(x for rnd in r["dpcompare"] for x in rnd)
            # Paired within a round (same minute of machine noise): the spread says how sure the ratio is.
            paired = [
                statistics.median(o) / statistics.median(m) for o, m in zip(r["dpcompare"], r["hand"], strict=True)
            ]
            q1, _, q3 = statistics.quantiles(paired, n=4) if len(paired) > 1 else (paired[0],) * 3
            table.add_row(s, f"{h:,.0f}", f"{d:,.0f}", f"{d / h:.3f}", f"{q1:.3f} – {q3:.3f}")
    Console().print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
