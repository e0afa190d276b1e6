"""One training loop for every strategy and every workload.

The loop never asks which strategy it runs: the strategy wraps the model and the optimizer, makes the
ranks agree on the initial state, and reduces metrics. Nor does it ask what it trains: the
:class:`~dpcompare.data.workload.Workload` builds the model and the data and holds the loss and the
metrics. Rank 0 writes ``metrics.jsonl`` (an object per epoch), ``summary.json``, checkpoints and
TensorBoard events in ``OUT``.

:func:`train` reads what can be refused, joins the other processes (or uses the strategy it is given) and
hands over to a :class:`Run`, whose :meth:`Run.train` is the table of contents.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from dpcompare import backends, checkpoint, knobs
from dpcompare.backends.base import Strategy, listed
from dpcompare.config import TrainConfig
from dpcompare.data.datasets import eval_loader, replay_loader, train_loader
from dpcompare.data.plugins import resolve_workload
from dpcompare.data.workload import Workload
from dpcompare.errors import ConfigError, DivergedError
from dpcompare.files import (
    METRICS,
    RUN_FILES,
    SUMMARY,
    atomic_write_json,
    atomic_write_text,
    remove_stale_temporaries,
)
from dpcompare.launch import liveness
from dpcompare.launch.env import LaunchEnv, default_threads, detect_launch_env
from dpcompare.options import CONFIG_FILE, changed_settings, write_train_config
from dpcompare.progress import ProgressLine
from dpcompare.training import optim
from dpcompare.training.evaluation import EvalCurve, evaluate
from dpcompare.training.step import StepRunner
from dpcompare.training.steplog import StepLog
from dpcompare.training.summary import memory_summary, metric_keys, regime_facts, run_summary, timing_summary
from dpcompare.training.tracing import TraceSession
from dpcompare.training.trackers import Trackers, open_trackers
from dpcompare.training.watchdog import StepWatchdog
from dpcompare.versions import versions


def effective_lr(cfg: TrainConfig, world_size: int) -> float:
    return cfg.lr * world_size if cfg.scale_lr else cfg.lr


def use_deterministic_kernels() -> None:
    """GPU kernels that give the same bits every run (atomic-add backward passes replaced); CPU kernels are."""
    if not torch.cuda.is_available():
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS's first handle
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def default_out(cfg: TrainConfig, world_size: int) -> TrainConfig:
    """``cfg`` with its output folder, ``runs/<strategy>-np<N>`` unless ``--out`` names one (a plug-in's
    ``path/to/file.py:Class`` as one folder name, ``path-to-file.py-Class``)."""
    if cfg.out is not None:
        return cfg
    return dataclasses.replace(cfg, out=f"runs/{backends.catalog.folder(cfg.strategy)}-np{world_size}")


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


def diverged_message(strategy: Strategy, epoch: int, step: int, last_good: Path | None) -> str:
    where = (f"last good checkpoint: {last_good} (--resume {last_good} with a lower --lr continues from it)"
             if last_good else "no checkpoint was written before it (--checkpoint-every N keeps one)")
    return (f"training diverged at step {step} (epoch {epoch}) under {strategy.name}: the loss or the gradients "
            f"are not finite (NaN/inf); {where}")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


# -- before joining the other processes ---------------------------------------------------------------

class Start(NamedTuple):
    """What a run starts from, all read before joining anyone: the workload, its data and model (with the
    checkpoint's or ``--init-from``'s weights) and the checkpoint to resume."""

    workload: Workload
    train_set: Any
    test_set: Any
    model: nn.Module
    ckpt: dict[str, Any] | None
    resume_path: Path | None


def prepare(cfg: TrainConfig, env: LaunchEnv, workload: Workload | None) -> Start:
    """Everything that can be refused, read before joining the other processes."""
    resume_path = resolve_resume(cfg)
    guard_out(cfg, resuming=resume_path is not None or cfg.resume == "auto")
    if env.rank == 0:  # what killed writes of an earlier run in OUT left behind
        for folder in (Path(cfg.out), Path(cfg.out) / checkpoint.CKPT_DIR):
            remove_stale_temporaries(folder)
    torch.set_num_threads(cfg.threads or default_threads(env))
    checkpoint.seed_everything(cfg.seed)
    if cfg.deterministic:
        use_deterministic_kernels()
    workload = workload or resolve_workload(cfg).workload  # loop.train(cfg) from Python: the workload cfg names
    check_target(cfg, workload)
    optim.check(cfg, workload)
    train_set, test_set = workload.build_data()  # the data first, then the model (from the seed)
    model = workload.build_model()
    ckpt = checkpoint.load_checkpoint(resume_path) if resume_path else None
    if ckpt is not None:
        check_same_workload(ckpt, workload, resume_path)
        checkpoint.check_fits(model, ckpt["model"], resume_path, f" ({ckpt['config'].get('model')})")
        model.load_state_dict(ckpt["model"])
    elif cfg.init_from:
        weights = checkpoint.load_model_weights(cfg.init_from)
        checkpoint.check_fits(model, weights, cfg.init_from)
        model.load_state_dict(weights)
    backends.check_config(cfg.strategy, cfg, env.world_size)  # refuse a knob before joining anyone
    backends.check_model(cfg.strategy, workload.traits, cfg)  # and a model the strategy cannot train
    return Start(workload, train_set, test_set, model, ckpt, resume_path)


def check_target(cfg: TrainConfig, workload: Workload) -> None:
    m = workload.metric
    if m.unit == "%" and cfg.target_accuracy > 1:
        raise ConfigError(f"--target-accuracy {cfg.target_accuracy:g}: {m.name} is a fraction from 0 to 1 "
                          f"(0.95 for 95 %)")


def check_same_workload(ckpt: dict[str, Any], workload: Workload, path: Path | None) -> None:
    """Refuse to resume a checkpoint of another workload (older checkpoints are the built-in one's)."""
    recorded = (ckpt.get("workload") or {}).get("source", "builtin")
    if recorded != workload.source:
        raise ConfigError(f"{path} holds a run of the workload {recorded!r}, not {workload.source!r}: resume it "
                          f"with the same workload, or pass another --out")


def train(cfg: TrainConfig, env: LaunchEnv | None = None, strategy: Strategy | None = None,
          workload: Workload | None = None) -> dict[str, Any]:
    """Run one training job of ``workload`` (default: the built-in one ``cfg`` names) under ``cfg.strategy``;
    return the summary (on every rank).

    With ``strategy`` (already set up, as in a persistent worker) the job runs inside that process group and
    leaves it up; without, it creates the strategy, joins the other processes and leaves them at the end.
    """
    env = strategy.env if strategy else (env or detect_launch_env())
    cfg = default_out(cfg, env.world_size)
    start = prepare(cfg, env, workload)
    owned = strategy is None
    if strategy is None:
        strategy = backends.create(cfg.strategy, env=env, device=cfg.device, iface=cfg.iface, timeout_s=cfg.timeout)
    strategy.configure(cfg)
    strategy.configure_model(start.workload.traits)
    if cfg.trace:
        strategy.tracer.prepare(Path(cfg.out))
    with strategy if owned else contextlib.nullcontext(strategy):  # an owned strategy: connect ... disconnect
        return Run(cfg, strategy, start).train()


# -- inside the process group ---------------------------------------------------------------------------

class Run:
    """One training job inside a process group: the model and optimizer, the step runner, the clock, the
    history; each method is one part of :meth:`train`."""

    def __init__(self, cfg: TrainConfig, strategy: Strategy, start: Start) -> None:
        self.cfg, self.strategy, self.start = cfg, strategy, start
        self.workload, self.metric = start.workload, start.workload.metric
        self.out = Path(cfg.out)
        self.lr = effective_lr(cfg, strategy.world_size)
        info = self.workload.info  # a plug-in's own workload has no built-in model or dataset: its name says it
        self.run_info = {**cfg.to_dict(), "model": info.get("model"), "dataset": info.get("dataset"),
                         "workload_label": self.workload.label, "metric": self.metric.name,
                         "world_size": strategy.world_size, "effective_lr": self.lr}
        plain = optim.build_optimizer(cfg, self.workload, start.model, self.lr)
        self.stepping = {**optim.describe(plain), "clip_grad_norm": optim.clip_norm(cfg, self.workload)}
        self.model, self.optimizer = strategy.setup(start.model, plain)
        self.scheduler: Any = None  # the learning-rate schedule (lay_out knows the run's length)
        self.epoch_done = self.global_step = 0  # epochs finished, optimizer steps taken
        self.position = 0  # samples of the current epoch's order trained on (at any world size)
        self.kept_step = -1  # the step of the last commit or step checkpoint
        self.elastic = cfg.commit_every > 0
        self.step_log = StepLog(self.out, cfg.step_log or self.elastic)
        self.watchdog: StepWatchdog | None = None  # armed by watching() for a non-elastic run with peers
        self.history: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.last_good = start.resume_path  # the newest checkpoint this run could continue from
        self.train_seconds = 0.0  # this rank's time in optimizer steps (the eval curve's clock)
        self.step_losses: list[float] = []
        self.curve = EvalCurve(cfg.target_accuracy, self.metric.name, self.metric.higher_is_better)
        self.trackers = Trackers()  # TensorBoard, W&B, MLflow, CSV: opened on the reporting rank
        self.timing_only = 0

    def train(self) -> dict[str, Any]:
        """The whole run, in order; the summary."""
        self.lay_out()
        self.scheduler = optim.build_scheduler(self.cfg, self.workload, self.optimizer, self.total_steps)
        self.stepping["lr_scheduler"] = type(self.scheduler).__name__ if self.scheduler is not None else None
        self.restore()
        self.last_epoch = self.plan_epochs()  # from where the checkpoint left off
        if not self.elastic:  # an elastic run starts from rank 0's state inside its strategy's elastic.run
            self.strategy.broadcast_initial_state(self.model, self.optimizer)
        self.open_outputs()
        with self.trackers:  # a run that fails is marked failed in W&B/MLflow
            self.announce()
            self.steps = self.step_runner()
            with self.rep, self.watching():
                self.log_event("start", resumed_from=str(self.start.resume_path) if self.start.resume_path else None)
                if self.elastic:
                    self.strategy.elastic.run(self.epochs, self.model, self.optimizer, self)
                else:
                    self.epochs()
                self.time_only()
            return self.finish()

    def epochs(self) -> None:
        """Every epoch from where the run stands (``epoch_done``, ``position``): its steps, its row, its
        checkpoint, then a commit due at its last step (after the row, so that it holds the finished epoch)."""
        epoch = self.epoch_done + 1
        while self.more(epoch):
            self.end_epoch(epoch, *self.run_epoch(epoch))
            self.checkpoint(epoch)
            self.epoch_done, self.position = epoch, 0
            self.keep()
            epoch += 1

    def more(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` runs: every one of --epochs, or with --max-steps until that many steps."""
        cfg = self.cfg
        if cfg.max_steps:
            return self.global_step < cfg.max_steps and (not cfg.epochs or epoch <= cfg.epochs)
        return epoch <= cfg.epochs

    def watching(self) -> contextlib.AbstractContextManager[Any]:
        """The step watchdog (--timeout) of a run with peers; an elastic run recovers instead, and under torchrun
        its workers notice a lost peer by its missed heartbeats (:mod:`dpcompare.launch.liveness`)."""
        if self.elastic:
            return liveness.watching()
        if self.strategy.world_size < 2:
            return contextlib.nullcontext()
        self.watchdog = StepWatchdog(self.cfg.timeout, f"rank {self.strategy.rank} of {self.strategy.world_size}")
        return self.watchdog

    def restore(self) -> None:
        """From the checkpoint (if resuming): optimizer state and schedule, RNG, position and history."""
        ckpt = self.start.ckpt
        if ckpt is None:
            return
        self.restore_optimizer(ckpt)
        checkpoint.set_rng_state(ckpt["rng"])
        self.epoch_done, self.global_step = int(ckpt["epoch"]), int(ckpt["global_step"])
        self.position = int((ckpt.get("sampler") or {}).get("position", 0))
        self.kept_step = self.global_step
        self.history = [h for h in ckpt.get("history", []) if h["epoch"] <= self.epoch_done]
        self.notes.append(f"resuming from {self.start.resume_path} (epoch {self.epoch_done}, step "
                          f"{self.global_step}, written by {ckpt['strategy']} at np={ckpt['world_size']})")
        changes = changed_settings(ckpt["config"], self.run_info)
        if changes:
            self.notes.append("differs from the checkpoint's run: " + ", ".join(changes))

    def restore_optimizer(self, ckpt: dict[str, Any]) -> None:
        """The checkpoint's optimizer state, then this run's hyper-parameters in each group and the checkpoint's
        schedule, continued where it stopped (:func:`~dpcompare.training.optim.restore_hyperparameters`)."""
        mine = optim.group_settings(self.optimizer)
        saved = len(ckpt["optimizer"].get("param_groups") or [])
        if saved != len(mine):
            raise ConfigError(f"{self.start.resume_path} holds an optimizer of {saved} parameter group(s), this run's "
                              f"has {len(mine)}: resume with the checkpoint's --optimizer "
                              f"({ckpt['config'].get('optimizer')}), or start afresh with --init-from")
        self.strategy.full_state.load_optimizer(self.model, self.optimizer, ckpt["optimizer"])
        state = ckpt.get("scheduler")
        ratio = self.lr / float(ckpt["config"].get("effective_lr") or self.lr)
        optim.restore_hyperparameters(self.optimizer, self.scheduler, mine, ratio, state)
        if self.scheduler is not None and state is None:
            self.notes.append("the checkpoint saved no learning-rate schedule: this run's starts at its first step")
        elif self.scheduler is None and state is not None:
            self.notes.append("the checkpoint's learning-rate schedule is dropped: this run's rate is constant")
        elif state is not None and ckpt.get("schedule_steps") not in (None, self.total_steps):
            self.notes.append(f"the learning-rate schedule continues the checkpoint's, planned over "
                              f"{ckpt['schedule_steps']} steps (this run takes {self.total_steps})")

    def lay_out(self) -> None:
        """The loaders, and how many steps and epochs the run takes."""
        cfg, strategy, collate = self.cfg, self.strategy, self.workload.collate
        if cfg.emulate_ranks:  # parity's one-process reference: every process's batches, in one process
            self.loader, self.sampler = replay_loader(self.start.train_set, cfg.batch_size, cfg.emulate_ranks,
                                                      cfg.accumulate // cfg.emulate_ranks, cfg.seed, collate)
        else:
            self.loader, self.sampler = train_loader(self.start.train_set, cfg.batch_size, strategy.rank,
                                                     strategy.world_size, cfg.seed, collate=collate)
        self.test_loader = eval_loader(self.start.test_set, strategy.rank, strategy.world_size, collate=collate)
        accumulate = cfg.accumulate
        self.steps_per_epoch = len(self.loader) // accumulate
        if self.steps_per_epoch == 0:
            raise ConfigError(f"--accumulate {accumulate} needs {accumulate} batches per optimizer step but each "
                              f"process has {len(self.loader)} per epoch; use a smaller --accumulate or --batch-size")
        self.total_steps = self.steps_per_epoch * cfg.epochs
        if cfg.max_steps:
            self.total_steps = min(self.total_steps, cfg.max_steps) if cfg.epochs else cfg.max_steps
        self.global_batch = cfg.batch_size * strategy.world_size * accumulate
        self.last_epoch = self.plan_epochs()

    def plan_epochs(self) -> int:
        """The number of the run's last epoch, from where it stands (``epoch_done``, ``position``)."""
        cfg = self.cfg
        if not cfg.max_steps:
            return cfg.epochs
        left = max(cfg.max_steps - self.global_step, 0) + self.position // self.global_batch  # from the epoch's start
        return min(cfg.epochs or 10**9, self.epoch_done + -(-left // self.steps_per_epoch))

    def open_outputs(self) -> None:
        """Rank 0: OUT, ``metrics.jsonl`` (a fresh run's empty, a resumed one's past) and the trackers."""
        if self.strategy.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            write_train_config(self.out / CONFIG_FILE, self.cfg)
            _write_jsonl(self.out / METRICS, self.history)
            self.trackers = open_trackers(self.cfg, self.run_info, self.out, True, self.history)
        if not self.elastic:  # (a worker joining an elastic run meets the others only in its strategy's sync)
            self.strategy.barrier()  # rank 0's tracker start-up (W&B, MLflow) must not land in the first epoch's time

    def announce(self) -> None:
        """The progress line and the banner: who runs what, on what, how."""
        cfg, s, world = self.cfg, self.strategy, self.strategy.world_size
        accumulate = cfg.accumulate
        n_params = sum(p.numel() for p in s.unwrap_model(self.model).parameters())
        # mpirun gives every rank a pseudo-terminal even when its output is a file: a bar only for one process.
        self.rep = ProgressLine(max(self.total_steps - self.global_step, 0), "train", cfg.progress,
                                enabled=s.is_main, bar_allowed=s.env.launcher == "none")
        self.rep.print(
            f"dpcompare: {s.name} · {world} process{'es' if world > 1 else ''} ({s.env.launcher}) · {s.device} · "
            f"{self.workload.label} ({n_params:,} parameters; {len(self.start.train_set)} train / "
            f"{len(self.start.test_set)} test samples; metric: {self.metric.name}) · batch {cfg.batch_size}/process"
            f"{f' × {accumulate} micro-batches' if accumulate > 1 else ''}, "
            f"global {self.global_batch} · lr {self.lr:g} · {self.steps_per_epoch} steps/epoch")
        if knobs.active(cfg):
            self.rep.print("knobs: " + ", ".join(f"{k}={v}" for k, v in knobs.active(cfg).items()))
        stepping = optim.banner(self.stepping, cfg, self.workload, self.total_steps)
        if stepping:
            self.rep.print(stepping)
        for n in [*self.model_notes(), *self.notes]:
            self.rep.print(n)
        if cfg.target_accuracy and self.start.ckpt is not None:
            self.rep.print(f"note: time to {self.metric.name} counts only this run's steps (the resumed-from run's "
                           "time is unknown)")

    def model_notes(self) -> list[str]:
        """What the workload's pre-check saw that changes how the strategies train the model, one line each."""
        traits = self.workload.traits
        if traits is None or not traits.unused:
            return []
        return [f"trainable parameters without a gradient: {listed(traits.unused)} (the pre-check ran one batch "
                f"forward and backward); {self.strategy.unused_parameters_note()}"]

    def step_runner(self) -> StepRunner:
        cfg = self.cfg
        tracer = (TraceSession(cfg.trace, cfg.warmup_steps, self.strategy, self.model, self.optimizer)
                  if cfg.trace else None)
        return StepRunner(cfg, self.strategy, self.model, self.optimizer, self.workload.loss, tracer,
                          scheduler=self.scheduler, max_norm=self.stepping["clip_grad_norm"])

    def run_epoch(self, epoch: int) -> tuple[torch.Tensor, int, float]:
        """One epoch's steps (with ``--eval-every`` evaluations); this rank's loss sum, samples and seconds."""
        cfg, spe = self.cfg, self.steps_per_epoch
        self.sampler.set_epoch(epoch - 1)
        self.sampler.start_at(self.position)  # a resumed or rolled-back run: part-way through the epoch
        steps = len(self.loader) // cfg.accumulate
        loss_sum = torch.zeros((), dtype=torch.float64)
        seen = 0
        t_epoch = time.perf_counter()
        it = iter(self.loader)
        for i in range(steps):
            if cfg.max_steps and self.global_step >= cfg.max_steps:
                break
            r = self.step(it, epoch)
            loss_sum += r.loss_sum
            seen += r.samples
            g = self.global_step
            if cfg.eval_every and g % cfg.eval_every == 0 and g % spe:
                self.evaluate(g, epoch - 1 + (g % spe) / spe)
            if i < steps - 1 and not (cfg.max_steps and g >= cfg.max_steps):  # the epoch's last: after its row
                self.keep()  # (epochs() keeps it once the row is written)
        return loss_sum, seen, time.perf_counter() - t_epoch

    def step(self, it: Any, epoch: int) -> Any:
        """One optimizer step on the training clock, then the checks every rank makes after it."""
        t_step = time.perf_counter()
        if self.watchdog is not None:
            self.watchdog.begin(self.global_step + 1)
        r = self.steps.step(it, self.global_step + 1)
        if self.watchdog is not None:
            self.watchdog.end()
        self.train_seconds += time.perf_counter() - t_step
        self.global_step += 1
        self.position += self.global_batch
        self.step_log.write(self.strategy.is_main, step=self.global_step, world_size=self.strategy.world_size,
                            samples=self.global_batch)
        if self.cfg.record_step_loss:
            self.step_losses.append(float(self.strategy.all_reduce(r.loss, "mean")))
        if self.rep.has_bar:  # formatting the loss costs a little: only when a bar shows it
            self.rep.update(1, f"epoch {epoch}/{self.last_epoch} loss {float(r.loss):.4f}")
        if not self.steps.all_finite(r.loss):  # after the timing: the check is not a phase
            # Every rank stops here, together: the check all-reduced. The process then ends through
            # launch.jobs.leave, without the interpreter teardown that gloo's threads could abort.
            raise DivergedError(diverged_message(self.strategy, epoch, self.global_step, self.last_good))
        return r

    def evaluate(self, step: int, epoch: float) -> dict[str, float]:
        """Every metric now; the first goes on the eval curve at the slowest rank's training time."""
        values = evaluate(self.model, self.strategy, self.test_loader, self.workload.metrics)
        self.curve.add(step, float(self.strategy.all_reduce(self.train_seconds, "max")), values[self.metric.name],
                       epoch)
        return values

    def end_epoch(self, epoch: int, loss_sum: torch.Tensor, seen: int, seconds: float) -> None:
        """The epoch's row: loss and throughput over every rank, the evaluation; printed and written."""
        strategy = self.strategy
        sums = strategy.all_reduce(torch.stack([loss_sum, torch.tensor(float(seen), dtype=torch.float64)]), "sum")
        slowest = float(strategy.all_reduce(seconds, "max"))
        train_loss = float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
        values = self.evaluate(self.global_step, float(epoch))
        row = {"epoch": epoch, "step": self.global_step, "train_loss": train_loss, **metric_keys(self.metric, values),
               "samples_per_sec": float(sums[1]) / slowest if slowest > 0 else 0.0, "epoch_seconds": slowest,
               "lr": optim.current_lr(self.optimizer)}
        self.history.append(row)
        tag = "test_" + self.metric.name.replace(" ", "_")
        self.rep.print(f"epoch {epoch:>3}/{self.last_epoch}  train_loss {train_loss:.6f}  "
                       f"{tag} {row['test_metric']:.4f}  {row['samples_per_sec']:,.0f} samples/s  {slowest:.2f}s")
        if strategy.is_main:
            _write_jsonl(self.out / METRICS, self.history)
            self.trackers.log_epoch(self.global_step, row)

    def checkpoint(self, epoch: int) -> None:
        cfg = self.cfg
        if (cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0) or (
                not self.more(epoch + 1) and (cfg.checkpoint_every or cfg.save_final)):
            save_checkpoint(self.strategy, self.model, self.optimizer, cfg, self.run_info, epoch, self.global_step,
                            self.history, self.out, self.workload, self.scheduler, self.total_steps)
            self.last_good = checkpoint.checkpoint_path(self.out, epoch)

    # -- what survives a lost host: step checkpoints and commits (--checkpoint-steps, --commit-every) --------
    def keep(self) -> None:
        """At a multiple of --checkpoint-steps write a step checkpoint; at one of --commit-every, commit (the
        strategy's way: a checkpoint, or Horovod Elastic's commit in memory). Once per step."""
        cfg, g = self.cfg, self.global_step
        if g == self.kept_step:
            return
        saved = bool(cfg.checkpoint_steps) and g % cfg.checkpoint_steps == 0
        if saved:
            self.save_step()
        if cfg.commit_every and g % cfg.commit_every == 0:
            self.kept_step = g
            self.strategy.elastic.commit(lambda: None if saved else self.save_step())  # may raise HostsUpdatedInterrupt
            self.log_event("commit")
        self.kept_step = g

    def save_step(self) -> None:
        """``OUT/checkpoints/step-<S>.pt``: the state after this step, with where the epoch stands."""
        path = checkpoint.step_checkpoint_path(self.out, self.global_step)
        save_checkpoint(self.strategy, self.model, self.optimizer, self.cfg, self.run_info, self.epoch_done,
                        self.global_step, self.history, self.out, self.workload, self.scheduler, self.total_steps,
                        position=self.position, path=path)
        self.last_good = path
        self.log_event("checkpoint")

    def log_event(self, event: str, **fields: Any) -> None:
        """A line of OUT/steps.jsonl about the run rather than a step (start, reset, commit, checkpoint)."""
        self.step_log.write(self.strategy.is_main, event=event, step=self.global_step,
                            world_size=self.strategy.world_size, **fields)

    # -- the loop's side of an elastic run (backends.base.ElasticState) ---------------------------------------
    def progress(self) -> dict[str, Any]:
        return {"epoch_done": self.epoch_done, "position": self.position, "step": self.global_step,
                "history": list(self.history), "train_seconds": self.train_seconds,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def resume_from(self, progress: dict[str, Any]) -> None:
        self.epoch_done, self.position, self.global_step = (progress["epoch_done"], progress["position"],
                                                            progress["step"])
        self.history, self.train_seconds = list(progress["history"]), progress["train_seconds"]
        if self.scheduler is not None and progress.get("scheduler") is not None:
            self.scheduler.load_state_dict(progress["scheduler"])
        self.kept_step = self.global_step

    def on_reset(self) -> None:
        """The world changed: the data laid out again for this rank among the new ranks, and with --scale-lr the
        learning rate (and its schedule) scaled to the new size, as a run started at it."""
        old, self.lr = self.lr, effective_lr(self.cfg, self.strategy.world_size)
        if self.lr != old:
            mine = [{**g, "lr": g["lr"] * self.lr / old} for g in optim.group_settings(self.optimizer)]
            state = self.scheduler.state_dict() if self.scheduler is not None else None
            optim.restore_hyperparameters(self.optimizer, self.scheduler, mine, self.lr / old, state)
        self.run_info.update(world_size=self.strategy.world_size, effective_lr=self.lr)
        self.lay_out()
        self.log_event("reset")

    def time_only(self) -> None:
        """``--min-steps``: further steps after the last epoch, for timing only (at the last learning rate: the
        schedule ended with the run's steps)."""
        cfg = self.cfg
        self.steps.scheduler = None
        self.timing_only = self.steps.timing_only(self.loader, self.sampler, self.epoch_done, self.steps_per_epoch,
                                                  cfg.min_timed_steps)
        if self.timing_only:
            self.rep.print(f"timed {self.timing_only} more steps after the last epoch, for timing only "
                           f"(--min-steps {cfg.min_timed_steps}; {self.metric.name} and loss above are final)")

    def finish(self) -> dict[str, Any]:
        """Timing, memory and trace across ranks; rank 0 writes the summary; every rank returns it."""
        cfg, strategy, steps = self.cfg, self.strategy, self.steps
        timing = timing_summary(strategy, steps.times, self.global_batch, steps.cpu.figures())
        timing["timing_only_steps"] = self.timing_only
        memory = memory_summary(strategy, strategy.full_state.memory_bytes(self.model, self.optimizer), timing)
        communication = steps.tracer.finish(self.out, {
            "strategy": strategy.name, "world_size": strategy.world_size, "model": self.workload.label,
            "batch_size": cfg.batch_size}) if steps.tracer else None
        summary = run_summary(cfg, strategy, self.workload, self.history, {
            "lr": self.lr, "stepping": {**self.stepping, "final_lr": optim.current_lr(self.optimizer)},
            "global_batch": self.global_batch, "epochs": self.epoch_done, "steps": self.global_step,
            "timing": timing, "memory": memory, "curve": self.curve.summary(), "run_info": self.run_info,
            "comm": {"optimizer_steps": steps.done, "micro_batches": steps.done * cfg.accumulate}},
            self.start.resume_path)
        if communication is not None:  # rank 0, from OUT/trace.json
            summary["communication"] = communication
        summary["regime"] = regime_facts(strategy, self.model, communication)
        if strategy.is_main:
            self.write_summary(summary)
        strategy.barrier()
        return summary

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Rank 0: summary.json (and the step losses for parity), the closing lines."""
        cfg, out, name = self.cfg, self.out, self.metric.name
        if cfg.record_step_loss:
            atomic_write_json(out / "step_losses.json", self.step_losses)
        atomic_write_json(out / SUMMARY, summary)
        self.trackers.log_timing(summary["timing"])
        self.trackers.finish(summary)
        if cfg.target_accuracy:
            r = self.curve.reached
            self.rep.print(f"time to {name} {cfg.target_accuracy:g}: " + (
                f"{r['train_seconds']:.2f} s of training, step {int(r['step'])} (epoch {r['epoch']:g})" if r
                else "not reached"))
        final = summary["final_metric"]
        self.rep.print(f"done: final test {name} {final if final is None else format(final, '.4f')}, "
                       f"{summary['samples_per_sec']:,.0f} samples/s (all ranks) → {out}/summary.json")


def save_checkpoint(strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                    run_info: dict[str, Any], epoch: int, global_step: int, history: list[dict[str, Any]],
                    out: Path, workload: Workload | None = None, scheduler: Any = None,
                    schedule_steps: int | None = None, position: int = 0, path: Path | None = None) -> Path | None:
    """Rank 0 writes ``OUT/checkpoints/epoch-<N>.pt`` (or ``path``: a step checkpoint, ``position`` samples into
    epoch ``epoch + 1``), with the workload's source and the learning-rate schedule's state and planned length;
    every rank waits for it."""
    target, path = path or checkpoint.checkpoint_path(out, epoch), None
    model_state, optimizer_state = strategy.full_state.dicts(model, optimizer)  # every rank: may gather
    if strategy.is_main:
        state = {
            "format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
            "model": model_state, "optimizer": optimizer_state, "epoch": epoch, "global_step": global_step,
            "sampler": {"seed": cfg.seed, "epoch": epoch, "position": position},
            "rng": checkpoint.rng_state(), "config": run_info, "strategy": strategy.name,
            "world_size": strategy.world_size, "versions": versions(), "history": list(history),
            "workload": {"name": workload.name, "source": workload.source} if workload else
                        {"name": "classification", "source": "builtin"},
            "scheduler": scheduler.state_dict() if scheduler is not None else None, "schedule_steps": schedule_steps,
        }
        path = checkpoint.atomic_save(state, target)
        kind = "step" if path.name.startswith("step-") else "epoch"
        checkpoint.prune_checkpoints(out, cfg.keep_last, cfg.keep_every if kind == "epoch" else 0, keep=(path,),
                                     kind=kind)
    strategy.barrier()
    return path
