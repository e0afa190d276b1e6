"""One training loop for every strategy.

The loop never asks which strategy it runs: the strategy wraps the model and the optimizer, makes the
ranks agree on the initial state, and reduces metrics. Rank 0 writes ``metrics.jsonl`` (an object
per epoch), ``summary.json``, checkpoints and TensorBoard events in ``OUT``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from dpcompare import backends, checkpoint, knobs, models
from dpcompare.backends.base import Strategy
from dpcompare.config import TrainConfig
from dpcompare.data.datasets import build_dataset, eval_loader, train_loader
from dpcompare.errors import ConfigError, DivergedError
from dpcompare.files import PHASES, RUN_FILES, atomic_write_json, atomic_write_text, remove_stale_temporaries
from dpcompare.launch.env import LaunchEnv, detect_launch_env
from dpcompare.options import changed_settings
from dpcompare.progress import ProgressLine
from dpcompare.training.tracing import TraceSession
from dpcompare.versions import versions


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


class StepTiming(NamedTuple):
    """Seconds one step spent in each phase (:data:`~dpcompare.files.PHASES`) and in all."""

    data: float
    forward: float
    backward: float
    optimizer: float
    total: float


class PhaseTimer:
    """Times the phases of one step; ``sync`` waits for the device so each phase holds its own work."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync
        self.start = self.last = 0.0
        self.laps: dict[str, float] = {}

    def begin(self) -> None:
        self.start = self.last = time.perf_counter()
        self.laps = {}

    def lap(self, phase: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.laps[phase] = self.laps.get(phase, 0.0) + now - self.last  # summed over micro-batches
        self.last = now

    def result(self) -> StepTiming:
        """The step so far; its total includes the loop's own bookkeeping since ``begin``."""
        return StepTiming(**self.laps, total=time.perf_counter() - self.start)


def _peak_rss_mb() -> float:
    """The process's peak resident memory: Linux's VmHWM (which a compare worker resets before each run),
    else the lifetime maximum getrusage keeps."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _timing_summary(strategy: Strategy, steps: list[StepTiming], samples_per_step: int) -> dict[str, Any]:
    """Every rank's timed steps → global throughput (the slowest rank decides) and step statistics."""
    totals = [s.total for s in steps] or [0.0]
    mine = {"step_ms_median": statistics.median(totals) * 1e3, "step_ms_p95": float(np.percentile(totals, 95)) * 1e3,
            **{f"{p}_ms": statistics.median([getattr(s, p) for s in steps] or [0.0]) * 1e3 for p in PHASES},
            "measured_seconds": sum(s.total for s in steps), "measured_steps": float(len(steps)),
            "peak_rss_mb": _peak_rss_mb()}
    table = strategy.all_gather_floats(list(mine.values()))
    per_rank = [{"rank": r, **dict(zip(mine, row, strict=True))} for r, row in enumerate(table)]
    for r in per_rank:
        r["measured_steps"] = int(r["measured_steps"])
    slowest = max(per_rank, key=lambda r: r["measured_seconds"])
    measured = slowest["measured_steps"]
    sps = samples_per_step * measured / slowest["measured_seconds"] if slowest["measured_seconds"] > 0 else 0.0
    return {
        "samples_per_sec": sps,
        "measured_steps": measured,
        "measured_seconds": slowest["measured_seconds"],
        "step_ms_median": max(r["step_ms_median"] for r in per_rank),
        "step_ms_p95": max(r["step_ms_p95"] for r in per_rank),
        "phases_ms": {p: statistics.fmean(r[f"{p}_ms"] for r in per_rank) for p in PHASES},
        "peak_rss_mb": max(r["peak_rss_mb"] for r in per_rank),
        "per_rank": per_rank,
    }


MEMORY_KINDS = ("params", "grads", "optimizer_state")


def _memory_summary(strategy: Strategy, mine: dict[str, int], timing: dict[str, Any]) -> dict[str, Any]:
    """Bytes of parameters, gradients and optimizer state on every rank (tensor accounting, at the end of
    training) with each rank's peak RSS; the top-level figures are the largest rank's, in MB."""
    values = [float(mine[k]) for k in MEMORY_KINDS]
    table = strategy.all_gather_floats([*values, float(sum(values))])
    per_rank = [{"rank": r, **{f"{k}_bytes": int(v) for k, v in zip((*MEMORY_KINDS, "total"), row, strict=True)},
                 "peak_rss_mb": timing["per_rank"][r]["peak_rss_mb"]} for r, row in enumerate(table)]
    return {**{f"{k}_mb": max(r[f"{k}_bytes"] for r in per_rank) / 2**20 for k in (*MEMORY_KINDS, "total")},
            "peak_rss_mb": timing["peak_rss_mb"], "per_rank": per_rank}


def timing_only_steps(cfg: TrainConfig, strategy: Strategy, loader: Any, sampler: Any, last_epoch: int,
                      step_times: list[StepTiming], one_step: Callable[[Any], Any], steps_per_epoch: int) -> int:
    """Step on through further epochs' batches until ``cfg.min_timed_steps`` steps are timed; the count.

    These steps come after the last evaluation and write no metrics or checkpoints: they only lengthen
    the timing. Every rank times the same steps, so every rank takes the same number of extra steps.
    """
    extra, epoch = 0, last_epoch
    while len(step_times) < cfg.min_timed_steps:
        sampler.set_epoch(epoch)
        epoch += 1
        it = iter(loader)
        for _ in range(steps_per_epoch):  # each step takes `accumulate` batches
            one_step(it)
            extra += 1
            if len(step_times) >= cfg.min_timed_steps:
                break
    return extra


def evaluate(model: nn.Module, strategy: Strategy, loader: Any) -> float:
    """Test accuracy over the whole test set; every rank evaluates with rank 0's BatchNorm statistics."""
    strategy.broadcast_buffers(model)
    correct = total = 0
    with strategy.evaluating(model) as module, torch.no_grad():
        module.eval()
        for x, y in loader:
            pred = module(x.to(strategy.device)).argmax(1).cpu()
            correct += int((pred == y).sum())
            total += len(y)
        module.train()
    c = strategy.all_reduce(torch.tensor([correct, total], dtype=torch.float64), "sum")
    return float(c[0] / c[1])


class EvalCurve:
    """Test accuracy against training time and steps, and when it first reached ``target``.

    ``train_seconds`` counts only the time spent in optimizer steps (the slowest rank's), not start-up,
    evaluation or checkpoints; ``add`` is called at every evaluation point.
    """

    def __init__(self, target: float = 0.0) -> None:
        self.target = target
        self.rows: list[dict[str, float]] = []
        self.reached: dict[str, float] | None = None

    def add(self, step: int, train_seconds: float, test_accuracy: float, epoch: float) -> None:
        row = {"step": step, "epoch": round(epoch, 4), "train_seconds": round(train_seconds, 6),
               "test_accuracy": test_accuracy}
        if self.rows and self.rows[-1]["step"] == step:  # an epoch's end that was also an --eval-every point
            return
        self.rows.append(row)
        if self.target and self.reached is None and test_accuracy >= self.target:
            self.reached = row

    def summary(self) -> dict[str, Any]:
        r = self.reached
        return {"target_accuracy": self.target or None, "eval_curve": self.rows,
                "time_to_accuracy_s": r["train_seconds"] if r else None,
                "steps_to_accuracy": int(r["step"]) if r else None, "epochs_to_accuracy": r["epoch"] if r else None}


def all_finite(strategy: Strategy, loss: torch.Tensor, model: nn.Module) -> bool:
    """True when the loss and the (already all-reduced) gradients are finite on every rank.

    Every rank gets the same answer (a max all-reduce of a flag), so all of them stop at the same step.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    ok = bool(torch.isfinite(loss).all()) and all(bool(torch.isfinite(g).all()) for g in grads)
    return float(strategy.all_reduce(0.0 if ok else 1.0, "max")) == 0.0


def diverged_message(strategy: Strategy, epoch: int, step: int, last_good: Path | None) -> str:
    where = (f"last good checkpoint: {last_good} (--resume {last_good} with a lower --lr continues from it)"
             if last_good else "no checkpoint was written before it (--checkpoint-every N keeps one)")
    return (f"training diverged at step {step} (epoch {epoch}) under {strategy.name}: the loss or the gradients "
            f"are not finite (NaN/inf); {where}")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def train(cfg: TrainConfig, env: LaunchEnv | None = None, strategy: Strategy | None = None) -> dict[str, Any]:
    """Run one training job under ``cfg.strategy``; return the summary (on every rank).

    With ``strategy`` (already set up) the job runs inside that process group and leaves it up.
    """
    env = strategy.env if strategy else (env or detect_launch_env())
    if cfg.out is None:
        cfg = dataclasses.replace(cfg, out=f"runs/{cfg.strategy}-np{env.world_size}")
    out = Path(cfg.out)
    resume_path = resolve_resume(cfg)
    guard_out(cfg, resuming=resume_path is not None or cfg.resume == "auto")
    if env.rank == 0:  # what killed writes of an earlier run in OUT left behind
        for folder in (out, out / checkpoint.CKPT_DIR):
            remove_stale_temporaries(folder)

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

    backends.get(cfg.strategy).check_config(cfg, env.world_size)  # refuse a knob before joining anyone
    if strategy is not None:
        strategy.configure(cfg)
        if cfg.trace:
            strategy.prepare_trace(out)
        return _train(cfg, strategy, data, model, ckpt, resume_path, out)
    strategy = backends.create(cfg.strategy, env=env, device=cfg.device, iface=cfg.iface, timeout_s=cfg.timeout)
    strategy.configure(cfg)
    if cfg.trace:
        strategy.prepare_trace(out)
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
        strategy.load_full_optimizer_state(model, optimizer, ckpt["optimizer"])
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
        changes = changed_settings(ckpt["config"], run_info)
        if changes:
            notes.append("differs from the checkpoint's run: " + ", ".join(changes))
    strategy.broadcast_initial_state(model, optimizer)

    loader, sampler = train_loader(data.train, cfg.batch_size, strategy.rank, world, cfg.seed)
    test_loader = eval_loader(data.test, strategy.rank, world)
    accumulate = cfg.accumulate
    steps_per_epoch = len(loader) // accumulate
    if steps_per_epoch == 0:
        raise ConfigError(f"--accumulate {accumulate} needs {accumulate} batches per optimizer step but each process "
                          f"has {len(loader)} per epoch; use a smaller --accumulate or --batch-size")
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps:
        total_steps = min(total_steps, cfg.max_steps) if cfg.epochs else cfg.max_steps
    last_epoch = cfg.epochs if not cfg.max_steps else min(cfg.epochs or 10**9, -(-cfg.max_steps // steps_per_epoch))
    criterion = nn.CrossEntropyLoss()
    global_batch = cfg.batch_size * world * accumulate
    amp_dtype = knobs.amp_dtype(cfg.amp)
    scaler = strategy.make_grad_scaler()

    writer = None
    if main:
        out.mkdir(parents=True, exist_ok=True)
        _write_jsonl(out / "metrics.jsonl", history)  # a fresh run starts empty; a resumed one keeps its past
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(out / "tensorboard"))

    n_params = sum(p.numel() for p in strategy.unwrap_model(model).parameters())
    # mpirun gives every rank a pseudo-terminal even when its output is a file: a bar only for one process.
    rep = ProgressLine(max(total_steps - global_step, 0), "train", cfg.progress, enabled=main,
                       bar_allowed=strategy.env.launcher == "none")
    rep.print(f"dpcompare: {strategy.name} · {world} process{'es' if world > 1 else ''} ({strategy.env.launcher}) "
              f"· {device} · {cfg.model} ({n_params:,} parameters) · {cfg.dataset} "
              f"({len(data.train)} train / {len(data.test)} test) · batch {cfg.batch_size}/process"
              f"{f' × {accumulate} micro-batches' if accumulate > 1 else ''}, "
              f"global {global_batch} · lr {lr:g} · {steps_per_epoch} steps/epoch")
    if knobs.active(cfg):
        rep.print("knobs: " + ", ".join(f"{k}={v}" for k, v in knobs.active(cfg).items()))
    for n in notes:
        rep.print(n)
    if cfg.target_accuracy and ckpt is not None:
        rep.print("note: time to accuracy counts only this run's steps (the resumed-from run's time is unknown)")

    timer = PhaseTimer(torch.cuda.synchronize if device.type == "cuda" else (lambda: None))
    step_times: list[StepTiming] = []
    step_losses: list[float] = []
    done_steps = 0
    last_good = resume_path  # the newest checkpoint this run could continue from

    curve = EvalCurve(cfg.target_accuracy)
    train_seconds = 0.0  # this rank's time in optimizer steps (the eval curve's clock)

    def eval_point(step: int, epoch: float) -> float:
        acc = evaluate(model, strategy, test_loader)
        curve.add(step, float(strategy.all_reduce(train_seconds, "max")), acc, epoch)
        return acc

    tracer = TraceSession(cfg.trace, cfg.warmup_steps, strategy, model, optimizer) if cfg.trace else None

    def one_step(it: Any, step_no: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One optimizer step (``accumulate`` micro-batches from ``it``), timed by phase once past warm-up.

        Returns the step's mean loss, the sum of its samples' losses and the number of samples.
        """
        nonlocal done_steps
        if tracer:
            tracer.before_step(done_steps)
        timer.begin()
        optimizer.zero_grad()  # set_to_none by default; Horovod takes no arguments
        lval = torch.zeros((), dtype=torch.float64)
        total = torch.zeros((), dtype=torch.float64)
        n = 0
        for micro in range(accumulate):  # gradients summed locally, exchanged after the last
            x, y = next(it)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            timer.lap("data")
            with strategy.accumulation_context(model, micro):  # DDP's no_sync covers forward and backward
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    loss = criterion(model(x), y)
                timer.lap("forward")
                scaled = loss / accumulate if accumulate > 1 else loss
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
                timer.lap("backward")
            micro_loss = loss.detach().to(torch.float64).cpu()
            lval += micro_loss / accumulate
            total += micro_loss * len(y)
            n += len(y)
        strategy.optimizer_step(optimizer, scaler)
        timer.lap("optimizer")
        if tracer:
            tracer.after_step(step_no, timer.start, timer.laps)
        done_steps += 1
        if done_steps > cfg.warmup_steps:
            step_times.append(timer.result())
        return lval, total, n

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
                t_step = time.perf_counter()
                lval, total, n = one_step(it, global_step + 1)
                train_seconds += time.perf_counter() - t_step
                global_step += 1
                loss_sum += total
                seen += n
                if cfg.record_step_loss:
                    step_losses.append(float(strategy.all_reduce(lval, "mean")))
                if rep.has_bar:  # formatting the loss costs a little: only when a bar shows it
                    rep.update(1, f"epoch {epoch}/{last_epoch} loss {float(lval):.4f}")
                if not all_finite(strategy, lval, model):  # after the timing: the check is not a phase
                    # Every rank stops here. The barrier lets the backend's worker threads finish and drop the
                    # check's tensors while Python still runs: a gloo thread releasing one during interpreter
                    # shutdown aborts the process (seen once, in CI).
                    strategy.barrier()
                    raise DivergedError(diverged_message(strategy, epoch, global_step, last_good))
                if cfg.eval_every and global_step % cfg.eval_every == 0 and global_step % steps_per_epoch:
                    eval_point(global_step, epoch - 1 + (global_step % steps_per_epoch) / steps_per_epoch)
            epoch_seconds = time.perf_counter() - t_epoch
            sums = strategy.all_reduce(torch.stack([loss_sum, torch.tensor(float(seen), dtype=torch.float64)]), "sum")
            slowest = float(strategy.all_reduce(epoch_seconds, "max"))
            train_loss = float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
            acc = eval_point(global_step, float(epoch))
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
                last_good = checkpoint.checkpoint_path(out, epoch)

        timing_only = timing_only_steps(cfg, strategy, loader, sampler, last_epoch, step_times, one_step,
                                        steps_per_epoch)
        if timing_only:
            rep.print(f"timed {timing_only} more steps after the last epoch, for timing only "
                      f"(--min-steps {cfg.min_timed_steps}; accuracy and loss above are final)")

    timing = _timing_summary(strategy, step_times, global_batch)
    timing["timing_only_steps"] = timing_only
    memory = _memory_summary(strategy, strategy.memory_bytes(model, optimizer), timing)
    communication = tracer.finish(out, {"strategy": strategy.name, "world_size": world, "model": cfg.model,
                                        "dataset": cfg.dataset, "batch_size": cfg.batch_size}) if tracer else None
    summary = {
        "strategy": strategy.name, "world_size": world, "launcher": strategy.env.launcher,
        "device": str(device), "model": cfg.model, "dataset": cfg.dataset, "epochs": last_epoch,
        "steps": global_step, "batch_size": cfg.batch_size, "global_batch_size": global_batch, "lr": lr,
        "seed": cfg.seed, "final_train_loss": history[-1]["train_loss"] if history else None,
        "final_test_accuracy": history[-1]["test_accuracy"] if history else None,
        "samples_per_sec": timing["samples_per_sec"], "timing": timing, "memory": memory,
        **curve.summary(),
        "resumed_from": str(resume_path) if resume_path else None,
        "sync_mechanism": strategy.sync_mechanism, "knobs": knobs.active(cfg),
        "comm": {**strategy.comm_report(), "optimizer_steps": done_steps, "micro_batches": done_steps * accumulate},
        "config": run_info, "versions": versions(),
    }
    if communication is not None:  # rank 0, from OUT/trace.json
        summary["communication"] = communication
    if main:
        if cfg.record_step_loss:
            (out / "step_losses.json").write_text(json.dumps(step_losses))
        atomic_write_json(out / "summary.json", summary)
        if writer:
            writer.close()
        if cfg.target_accuracy:
            r = curve.reached
            rep.print(f"time to accuracy {cfg.target_accuracy:g}: " + (
                f"{r['train_seconds']:.2f} s of training, step {int(r['step'])} (epoch {r['epoch']:g})" if r
                else "not reached"))
        rep.print(f"done: final test accuracy {summary['final_test_accuracy']:.4f}, "
                  f"{timing['samples_per_sec']:,.0f} samples/s (all ranks) → {out}/summary.json")
    strategy.barrier()
    return summary


def save_checkpoint(strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                    run_info: dict[str, Any], epoch: int, global_step: int, history: list[dict[str, Any]],
                    out: Path) -> Path | None:
    """Rank 0 writes ``OUT/checkpoints/epoch-<N>.pt``; every rank waits for it."""
    path = None
    model_state, optimizer_state = strategy.full_state_dicts(model, optimizer)  # every rank: may gather
    if strategy.is_main:
        state = {
            "format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
            "model": model_state, "optimizer": optimizer_state, "epoch": epoch, "global_step": global_step,
            "sampler": {"seed": cfg.seed, "epoch": epoch, "position": 0},
            "rng": checkpoint.rng_state(), "config": run_info, "strategy": strategy.name,
            "world_size": strategy.world_size, "versions": versions(), "history": list(history),
        }
        path = checkpoint.atomic_save(state, checkpoint.checkpoint_path(out, epoch))
        checkpoint.prune_checkpoints(out, cfg.keep_last, cfg.keep_every, keep=(path,))
    strategy.barrier()
    return path

