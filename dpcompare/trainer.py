"""One training loop for every strategy.

The loop never asks which strategy it runs: the strategy wraps the model and the optimizer, makes the
ranks agree on the initial state, and reduces metrics. Rank 0 writes ``metrics.jsonl`` (an object
per epoch), ``summary.json``, checkpoints and TensorBoard events in ``OUT``.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn

from dpcompare import backends, checkpoint, models
from dpcompare.backends.base import Strategy
from dpcompare.config import RESUME_RELEVANT, TrainConfig
from dpcompare.data import build_dataset, eval_loader, train_loader
from dpcompare.errors import ConfigError
from dpcompare.launch.env import LaunchEnv, detect_launch_env
from dpcompare.versions import versions

PHASES = ("data", "forward", "backward", "optimizer")
RUN_FILES = ("metrics.jsonl", "summary.json")


def effective_lr(cfg: TrainConfig, world_size: int) -> float:
    return cfg.lr * world_size if cfg.scale_lr else cfg.lr


def make_optimizer(cfg: TrainConfig, params: Any, lr: float) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
    raise ConfigError(f"unknown optimizer {cfg.optimizer!r}; choose sgd or adam")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_resume(cfg: TrainConfig) -> Path | None:
    if not cfg.resume:
        return None
    if cfg.resume == "auto":
        return checkpoint.latest_checkpoint(cfg.out)  # none yet: start fresh
    return Path(cfg.resume)


def guard_out(cfg: TrainConfig, resuming: bool) -> None:
    """Refuse to write over an earlier run in OUT unless resuming it or told to overwrite."""
    taken = [f for f in RUN_FILES if (Path(cfg.out) / f).exists()]
    if taken and not (resuming or cfg.overwrite):
        raise ConfigError(f"{cfg.out} already holds a run ({taken[0]}); pass --resume auto to continue it, "
                          "--overwrite to replace it, or another --out")


class _Reporter:
    """Rank 0's progress: a rich bar on a terminal, one line per epoch otherwise."""

    def __init__(self, enabled: bool, mode: str, total_steps: int, single_process: bool) -> None:
        self.console = Console(highlight=False)
        self.enabled = enabled and mode != "none"
        # mpirun gives every rank a pseudo-terminal even when its own output is a file: no bar there.
        use_bar = mode == "bar" or (mode == "auto" and sys.stdout.isatty() and single_process)
        self.progress = (Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=self.console)
                         if self.enabled and use_bar else None)
        self.task = self.progress.add_task("train", total=total_steps, info="") if self.progress else None

    def __enter__(self) -> _Reporter:
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress:
            self.progress.stop()

    def print(self, msg: str) -> None:
        if self.enabled:
            self.console.print(msg, soft_wrap=True)

    def advance(self, epoch: int, last_epoch: int, loss: torch.Tensor) -> None:
        if self.progress:  # formatting the loss costs a little: only when a bar shows it
            self.progress.update(self.task, advance=1, info=f"epoch {epoch}/{last_epoch} loss {float(loss):.4f}")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _timing_summary(strategy: Strategy, steps: list[tuple[float, ...]], samples_per_step: int) -> dict[str, Any]:
    """Per-step (phases..., total) of every rank → global throughput (slowest rank decides) and step statistics."""
    totals = [s[-1] for s in steps] or [0.0]
    ph = list(zip(*steps, strict=True))[: len(PHASES)] if steps else [[0.0]] * len(PHASES)
    mine = [statistics.median(totals) * 1e3, float(np.percentile(totals, 95)) * 1e3,
            *(statistics.median(p) * 1e3 for p in ph), sum(totals), float(len(steps)), _peak_rss_mb()]
    table = strategy.all_gather_floats(mine)
    per_rank = [{"rank": r, "step_ms_median": row[0], "step_ms_p95": row[1],
                 **{f"{p}_ms": row[2 + i] for i, p in enumerate(PHASES)},
                 "measured_seconds": row[6], "measured_steps": int(row[7]), "peak_rss_mb": row[8]}
                for r, row in enumerate(table)]
    slowest = max(per_rank, key=lambda r: r["measured_seconds"])
    measured = slowest["measured_steps"]
    sps = samples_per_step * measured / slowest["measured_seconds"] if slowest["measured_seconds"] > 0 else 0.0
    return {
        "samples_per_sec": sps,
        "measured_steps": measured,
        "step_ms_median": max(r["step_ms_median"] for r in per_rank),
        "step_ms_p95": max(r["step_ms_p95"] for r in per_rank),
        "phases_ms": {p: statistics.fmean(r[f"{p}_ms"] for r in per_rank) for p in PHASES},
        "peak_rss_mb": max(r["peak_rss_mb"] for r in per_rank),
        "per_rank": per_rank,
    }


def evaluate(model: nn.Module, strategy: Strategy, loader: Any) -> float:
    """Test accuracy over the whole test set; every rank evaluates with rank 0's BatchNorm statistics."""
    strategy.broadcast_buffers(model)
    module = strategy.unwrap_model(model)
    module.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            pred = module(x.to(strategy.device)).argmax(1).cpu()
            correct += int((pred == y).sum())
            total += len(y)
    module.train()
    c = strategy.all_reduce(torch.tensor([correct, total], dtype=torch.float64), "sum")
    return float(c[0] / c[1])


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def _config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [f"{k} {old.get(k)!r} → {new.get(k)!r}" for k in RESUME_RELEVANT
            if k in old and old.get(k) != new.get(k)]


def train(cfg: TrainConfig, env: LaunchEnv | None = None, strategy: Strategy | None = None) -> dict[str, Any]:
    """Run one training job under ``cfg.strategy``; return the summary (on every rank).

    With ``strategy`` (already set up) the job runs inside that process group and leaves it up.
    """
    env = strategy.env if strategy else (env or detect_launch_env())
    out = Path(cfg.out)
    resume_path = resolve_resume(cfg)
    guard_out(cfg, resuming=resume_path is not None or cfg.resume == "auto")

    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // env.local_size))
    seed_everything(cfg.seed)
    data = build_dataset(cfg.dataset, cfg.data_dir, cfg.input_shape, cfg.samples, cfg.augment)
    model = models.build_model(cfg.model, data.input_shape, data.num_classes, width=cfg.width)

    # Read everything that can be refused before joining the other processes.
    ckpt = checkpoint.load_checkpoint(resume_path) if resume_path else None
    if ckpt is not None:
        checkpoint.check_fits(model, ckpt["model"], resume_path, f" ({ckpt['config'].get('model')})")
        model.load_state_dict(ckpt["model"])
    elif cfg.init_from:
        weights = checkpoint.load_model_weights(cfg.init_from)
        checkpoint.check_fits(model, weights, cfg.init_from)
        model.load_state_dict(weights)

    if strategy is not None:
        return _train(cfg, strategy, data, model, ckpt, resume_path, out)
    strategy = backends.create(cfg.strategy, env=env, device=cfg.device, iface=cfg.iface, timeout_s=cfg.timeout)
    strategy.setup()
    try:
        return _train(cfg, strategy, data, model, ckpt, resume_path, out)
    finally:
        strategy.teardown()


def _train(cfg: TrainConfig, strategy: Strategy, data: Any, model: nn.Module, ckpt: dict[str, Any] | None,
           resume_path: Path | None, out: Path) -> dict[str, Any]:
    main = strategy.is_main
    world = strategy.world_size
    device = strategy.device
    lr = effective_lr(cfg, world)
    run_info = {**cfg.to_dict(), "world_size": world, "effective_lr": lr}

    if cfg.sync_bn:
        model = strategy.convert_sync_batchnorm(model)
    model = strategy.wrap_model(model.to(device))
    optimizer = strategy.wrap_optimizer(make_optimizer(cfg, model.parameters(), lr), model)

    start_epoch, global_step, history = 0, 0, []
    notes: list[str] = []
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        for g in optimizer.param_groups:  # the current run's hyper-parameters win over the checkpoint's
            g["lr"] = lr
            if "momentum" in g:
                g["momentum"] = cfg.momentum
            g["weight_decay"] = cfg.weight_decay
        checkpoint.set_rng_state(ckpt["rng"])
        start_epoch, global_step = int(ckpt["epoch"]), int(ckpt["global_step"])
        history = [h for h in ckpt.get("history", []) if h["epoch"] <= start_epoch]
        notes.append(f"resuming from {resume_path} (epoch {start_epoch}, step {global_step}, written by "
                     f"{ckpt['strategy']} at np={ckpt['world_size']})")
        changes = _config_changes(ckpt["config"], run_info)
        if changes:
            notes.append("differs from the checkpoint's run: " + ", ".join(changes))
    strategy.broadcast_initial_state(model, optimizer)

    loader, sampler = train_loader(data.train, cfg.batch_size, strategy.rank, world, cfg.seed)
    test_loader = eval_loader(data.test, strategy.rank, world)
    steps_per_epoch = len(loader)
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps:
        total_steps = min(total_steps, cfg.max_steps) if cfg.epochs else cfg.max_steps
    last_epoch = cfg.epochs if not cfg.max_steps else min(cfg.epochs or 10**9, -(-cfg.max_steps // steps_per_epoch))
    criterion = nn.CrossEntropyLoss()
    global_batch = cfg.batch_size * world

    writer = None
    if main:
        out.mkdir(parents=True, exist_ok=True)
        _write_jsonl(out / "metrics.jsonl", history)  # a fresh run starts empty; a resumed one keeps its past
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(out / "tensorboard"))

    n_params = sum(p.numel() for p in strategy.unwrap_model(model).parameters())
    rep = _Reporter(main, cfg.progress, max(total_steps - global_step, 0), strategy.env.launcher == "none")
    rep.print(f"dpcompare: {strategy.name} · {world} process{'es' if world > 1 else ''} ({strategy.env.launcher}) "
              f"· {device} · {cfg.model} ({n_params:,} parameters) · {cfg.dataset} "
              f"({len(data.train)} train / {len(data.test)} test) · batch {cfg.batch_size}/process, "
              f"global {global_batch} · lr {lr:g} · {steps_per_epoch} steps/epoch")
    for n in notes:
        rep.print(n)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step_times: list[tuple[float, ...]] = []
    step_losses: list[float] = []
    done_steps = 0
    model.train()
    with rep:
        for epoch in range(start_epoch + 1, last_epoch + 1):
            sampler.set_epoch(epoch - 1)
            loss_sum = torch.zeros((), dtype=torch.float64)
            seen = 0
            t_epoch = time.perf_counter()
            it = iter(loader)
            for _ in range(steps_per_epoch):
                if cfg.max_steps and global_step >= cfg.max_steps:
                    break
                t0 = time.perf_counter()
                x, y = next(it)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                sync()
                t1 = time.perf_counter()
                optimizer.zero_grad()  # set_to_none by default; Horovod takes no arguments
                loss = criterion(model(x), y)
                sync()
                t2 = time.perf_counter()
                loss.backward()
                sync()
                t3 = time.perf_counter()
                optimizer.step()
                sync()
                t4 = time.perf_counter()
                global_step += 1
                done_steps += 1
                lval = loss.detach().to(torch.float64).cpu()
                loss_sum += lval * len(y)
                seen += len(y)
                if cfg.record_step_loss:
                    step_losses.append(float(strategy.all_reduce(lval, "mean")))
                rep.advance(epoch, last_epoch, lval)
                if done_steps > cfg.warmup_steps:  # the step's total includes this loop's own bookkeeping
                    step_times.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, time.perf_counter() - t0))
            epoch_seconds = time.perf_counter() - t_epoch
            sums = strategy.all_reduce(torch.stack([loss_sum, torch.tensor(float(seen), dtype=torch.float64)]), "sum")
            slowest = float(strategy.all_reduce(epoch_seconds, "max"))
            train_loss = float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
            acc = evaluate(model, strategy, test_loader)
            row = {"epoch": epoch, "step": global_step, "train_loss": train_loss, "test_accuracy": acc,
                   "samples_per_sec": float(sums[1]) / slowest if slowest > 0 else 0.0,
                   "epoch_seconds": slowest}
            history.append(row)
            rep.print(f"epoch {epoch:>3}/{last_epoch}  train_loss {train_loss:.6f}  test_accuracy {acc:.4f}  "
                      f"{row['samples_per_sec']:,.0f} samples/s  {slowest:.2f}s")
            if main:
                with open(out / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
                if writer:
                    for k in ("train_loss", "test_accuracy", "samples_per_sec"):
                        writer.add_scalar(k, row[k], epoch)
            if (cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0) or (
                    epoch == last_epoch and (cfg.checkpoint_every or cfg.save_final)):
                save_checkpoint(strategy, model, optimizer, cfg, run_info, epoch, global_step, history, out)

    timing = _timing_summary(strategy, step_times, global_batch)
    summary = {
        "strategy": strategy.name, "world_size": world, "launcher": strategy.env.launcher,
        "device": str(device), "model": cfg.model, "dataset": cfg.dataset, "epochs": last_epoch,
        "steps": global_step, "batch_size": cfg.batch_size, "global_batch_size": global_batch, "lr": lr,
        "seed": cfg.seed, "final_train_loss": history[-1]["train_loss"] if history else None,
        "final_test_accuracy": history[-1]["test_accuracy"] if history else None,
        "samples_per_sec": timing["samples_per_sec"], "timing": timing,
        "resumed_from": str(resume_path) if resume_path else None,
        "sync_mechanism": strategy.sync_mechanism, "config": run_info, "versions": versions(),
    }
    if main:
        if cfg.record_step_loss:
            (out / "step_losses.json").write_text(json.dumps(step_losses))
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if writer:
            writer.close()
        rep.print(f"done: final test accuracy {summary['final_test_accuracy']:.4f}, "
                  f"{timing['samples_per_sec']:,.0f} samples/s (all ranks) → {out}/summary.json")
    strategy.barrier()
    return summary


def save_checkpoint(strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                    run_info: dict[str, Any], epoch: int, global_step: int, history: list[dict[str, Any]],
                    out: Path) -> Path | None:
    """Rank 0 writes ``OUT/checkpoints/epoch-<N>.pt``; every rank waits for it."""
    path = None
    if strategy.is_main:
        state = {
            "format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
            "model": checkpoint.plain_state_dict(strategy.unwrap_model(model).state_dict()),
            "optimizer": optimizer.state_dict(), "epoch": epoch, "global_step": global_step,
            "sampler": {"seed": cfg.seed, "epoch": epoch, "position": 0},
            "rng": checkpoint.rng_state(), "config": run_info, "strategy": strategy.name,
            "world_size": strategy.world_size, "versions": versions(), "history": list(history),
        }
        path = checkpoint.atomic_save(state, checkpoint.checkpoint_path(out, epoch))
    strategy.barrier()
    return path

