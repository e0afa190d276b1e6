"""What a run steps with: the optimizer, the learning-rate schedule and the clipping norm.

Each comes from the flags (``--optimizer``, ``--lr-schedule``/``--lr-warmup-steps``, ``--clip-grad-norm``) or
from the workload's own builders (:class:`~dpcompare.data.workload.Workload`'s ``build_optimizer``,
``build_scheduler``, ``clip_grad_norm``), never from both. The optimizer is built on the plain model, before
:meth:`~dpcompare.backends.base.Strategy.setup` wraps the two; the schedule on the optimizer the strategy
returns, and stepped once per optimizer step. Schedules are torch's own (``LinearLR`` warm-up, then
``CosineAnnealingLR`` or ``StepLR``, joined by ``SequentialLR``): the same float operations in the same order
under every strategy, so the learning rate of step k is the same number everywhere.

On resume (:func:`restore_hyperparameters`) the checkpoint's optimizer and schedule state are loaded, and then the
current run's hyper-parameters win: every group keeps its own settings as this run built them (AdamW's no-decay
group stays at 0), and the scheduled learning rates are scaled by this run's ``--lr`` over the checkpoint's
(exactly unchanged when they are equal, so the schedule continues where it was).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import lr_scheduler

from dpcompare.errors import ConfigError

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig
    from dpcompare.data.workload import Workload

#: normalisation layers whose parameters AdamW never decays (whatever their shape)
NORM_LAYERS: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.InstanceNorm1d, nn.InstanceNorm2d,
    nn.InstanceNorm3d, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)

#: group keys a continued schedule owns: the learning rates
_SCHEDULED = ("lr", "initial_lr")


def check(cfg: TrainConfig, workload: Workload) -> None:
    """Refuse, before joining anyone, a schedule that lacks a setting, or a flag the workload's own builder
    replaces."""
    if cfg.lr_schedule == "step" and not cfg.lr_step_every:
        raise ConfigError("--lr-schedule step needs --lr-step-every N (optimizer steps between decays)")
    given = {"build_optimizer": [(f, getattr(cfg, n)) for n, f, off in (
                 ("optimizer", "--optimizer", "sgd"), ("momentum", "--momentum", 0.9),
                 ("weight_decay", "--weight-decay", 0.0)) if getattr(cfg, n) != off],
             "build_scheduler": [(f, getattr(cfg, n)) for n, f, off in (
                 ("lr_schedule", "--lr-schedule", "constant"), ("lr_warmup_steps", "--lr-warmup-steps", 0))
                 if getattr(cfg, n) != off],
             "clip_grad_norm": [("--clip-grad-norm", cfg.clip_grad_norm)] if cfg.clip_grad_norm else []}
    for field, flags in given.items():
        if getattr(workload, field) is not None and flags:
            flag, value = flags[0]
            raise ConfigError(f"{flag} {value}: the workload {workload.name!r} sets its own {field}, which replaces "
                              f"{flag}; drop {flag} (or the workload's {field})")


def no_decay(model: nn.Module) -> set[int]:
    """ids of the parameters AdamW does not decay: every parameter of a normalisation layer (:data:`NORM_LAYERS`)
    and every parameter of fewer than 2 dimensions (biases, other 1-D weights)."""
    ids = {id(p) for m in model.modules() if isinstance(m, NORM_LAYERS) for p in m.parameters(recurse=False)}
    return ids | {id(p) for p in model.parameters() if p.ndim < 2}


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's parameter groups: decay at ``weight_decay``, then no decay (:func:`no_decay`); an empty group is
    left out. Parameters keep the model's order within each group."""
    skip = no_decay(model)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if id(p) not in skip], "weight_decay": weight_decay},
              {"params": [p for p in params if id(p) in skip], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_optimizer(cfg: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """The optimizer ``--optimizer`` names, over ``model``'s parameters at ``lr``."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(decay_groups(model, cfg.weight_decay), lr=lr)
    raise ConfigError(f"unknown optimizer {cfg.optimizer!r}; choose sgd, adam or adamw")


def build_optimizer(cfg: TrainConfig, workload: Workload, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """The workload's own optimizer (``build_optimizer(model, lr)``) or the one the flags name."""
    if workload.build_optimizer is None:
        return make_optimizer(cfg, model, lr)
    opt = workload.build_optimizer(model, lr)
    if not isinstance(opt, torch.optim.Optimizer):
        raise ConfigError(f"the workload {workload.name!r}'s build_optimizer(model, lr) returned a "
                          f"{type(opt).__name__}, not a torch.optim.Optimizer")
    return opt


def make_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer,
                   total_steps: int) -> lr_scheduler.LRScheduler | None:
    """The schedule the flags ask for, over ``total_steps`` optimizer steps; None for a constant rate."""
    warm = cfg.lr_warmup_steps
    warmup = (lr_scheduler.LinearLR(optimizer, start_factor=1.0 / (warm + 1), end_factor=1.0, total_iters=warm)
              if warm else None)
    after: lr_scheduler.LRScheduler | None = None
    if cfg.lr_schedule == "cosine":
        after = lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warm))
    elif cfg.lr_schedule == "step":
        after = lr_scheduler.StepLR(optimizer, step_size=cfg.lr_step_every, gamma=cfg.lr_gamma)
    if warmup is not None and after is not None:
        return lr_scheduler.SequentialLR(optimizer, [warmup, after], milestones=[warm])
    return warmup or after


def build_scheduler(cfg: TrainConfig, workload: Workload, optimizer: torch.optim.Optimizer,
                    total_steps: int) -> Any:
    """The workload's own schedule (``build_scheduler(optimizer, total_steps)``) or the one the flags ask for."""
    if workload.build_scheduler is None:
        return make_scheduler(cfg, optimizer, total_steps)
    sched = workload.build_scheduler(optimizer, total_steps)
    if sched is not None and not callable(getattr(sched, "step", None)):
        raise ConfigError(f"the workload {workload.name!r}'s build_scheduler(optimizer, total_steps) returned a "
                          f"{type(sched).__name__}, which has no step()")
    return sched


def clip_norm(cfg: TrainConfig, workload: Workload) -> float:
    """The global gradient norm to clip to before each optimizer step (0: no clipping)."""
    return float(workload.clip_grad_norm if workload.clip_grad_norm is not None else cfg.clip_grad_norm)


def group_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Every group's hyper-parameters (all but its parameters) as this run built them."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def restore_hyperparameters(optimizer: torch.optim.Optimizer, scheduler: Any, settings: list[dict[str, Any]],
                            lr_ratio: float, sched_state: dict[str, Any] | None) -> None:
    """After the checkpoint's optimizer state was loaded, this run's ``settings`` (:func:`group_settings`) in
    each group. With a schedule to continue (this run has one and the checkpoint saved one), its state is loaded
    and the learning rates stay the checkpoint's, × ``lr_ratio`` (this run's ``--lr`` over the checkpoint's:
    exactly as saved when it is 1); otherwise they are this run's own (a schedule starts at its beginning)."""
    cont = scheduler is not None and sched_state is not None
    for g, mine in zip(optimizer.param_groups, settings, strict=True):
        g.update({k: v for k, v in mine.items() if not (cont and k in _SCHEDULED)})
    if not cont:
        return
    scheduler.load_state_dict(sched_state)
    if lr_ratio != 1.0:
        for g in optimizer.param_groups:
            for key in _SCHEDULED:
                if key in g:
                    g[key] *= lr_ratio
        for s in [scheduler, *getattr(scheduler, "_schedulers", [])]:  # a SequentialLR's parts too
            for key in ("base_lrs", "_last_lr"):
                if isinstance(getattr(s, key, None), list):
                    setattr(s, key, [v * lr_ratio for v in getattr(s, key)])


def describe(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The (plain) optimizer's class and its groups (tensors, weight decay), for the banner and summary.json."""
    return {"optimizer": type(optimizer).__name__,
            "param_groups": [{"tensors": len(g["params"]), "weight_decay": g.get("weight_decay", 0.0)}
                             for g in optimizer.param_groups]}


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The first group's learning rate now (the scheduled one)."""
    return float(optimizer.param_groups[0]["lr"])



def banner(stepping: dict[str, Any], cfg: TrainConfig, workload: Workload, total_steps: int) -> str:
    """The banner's line on what the run steps with, when it is more than one group, a constant rate and no
    clipping (empty otherwise)."""
    groups = stepping["param_groups"]
    parts = []
    if len(groups) > 1 or workload.build_optimizer is not None:
        parts.append(f"{stepping['optimizer']}: " + ", ".join(
            f"{g['tensors']} tensors at weight decay {g['weight_decay']:g}" for g in groups))
    sched = stepping.get("lr_scheduler")
    if sched is not None and workload.build_scheduler is not None:
        parts.append(f"lr schedule: the workload's {sched}, per optimizer step")
    elif sched is not None:
        warm = f"{cfg.lr_warmup_steps} warm-up steps, then " if cfg.lr_warmup_steps else ""
        what = {"cosine": f"cosine to 0 at step {total_steps}", "constant": "constant",
                "step": f"× {cfg.lr_gamma:g} every {cfg.lr_step_every} steps"}[cfg.lr_schedule]
        parts.append(f"lr schedule: {warm}{what} ({sched}, per optimizer step)")
    if stepping["clip_grad_norm"]:
        parts.append(f"gradients clipped to global norm {stepping['clip_grad_norm']:g}")
    return " · ".join(parts)
