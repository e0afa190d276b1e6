"""``--workload lightning:MODULE:ATTR`` (or ``lightning:path/to/file.py:ATTR``): a LightningModule as a workload,
trained by dpcompare's loop under every strategy, without Lightning's Trainer.

ATTR is a LightningModule class (built with no argument), or a function (``f()`` or ``f(cfg)``) returning a
LightningModule or a ``(LightningModule, LightningDataModule)`` pair. What dpcompare takes from them:

- the loss: ``training_step(batch, batch_idx)``'s return (a tensor, or a dict's ``"loss"``);
- the optimizer and learning-rate schedule: ``configure_optimizers()`` (one optimizer; a scheduler stepped per
  optimizer step, ``"interval": "step"``, or per epoch, Lightning's default, when the run is given in epochs);
- the data: the datasets and collate functions of the datamodule's, else the module's, ``train_dataloader()`` and
  ``val_dataloader()`` (their batch size and sampler are dpcompare's: ``--batch-size`` per process, the same
  ``DistributedSampler`` as every workload);
- the metrics: what ``validation_step`` logs with ``self.log(name, value)`` (the calls are captured; the first
  name is the metric verdicts use; names with loss, error, perplexity, mse or mae are better lower).

A module that needs what only the Trainer provides is refused in one line naming it: ``self.trainer`` (and what
reads it: ``self.optimizers()``, ``self.lr_schedulers()``, ``self.manual_backward``), manual optimization
(``automatic_optimization = False``), more than one optimizer. Lightning's other hooks (``on_train_start``...)
are not called. ``--lr`` is the module's own (``configure_optimizers`` sets it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import default_collate

from dpcompare.data.workload import Metric, Workload
from dpcompare.errors import ConfigError

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig

#: a logged name with one of these in it is better lower
LOWER_IS_BETTER = ("loss", "err", "perplexity", "ppl", "mse", "mae")


def lightning_workload(spec: str, obj: Any, cfg: TrainConfig) -> Workload:
    """The Workload of ``--workload lightning:MODULE:ATTR`` (``obj``: what ATTR names); a module that cannot be
    trained without the Trainer is refused in one line."""
    who = f"--workload {spec}"
    make = _maker(obj, cfg, who)
    with torch.random.fork_rng(devices=[]):  # the run's weights are drawn later, from the run's seed
        module, data = make()
        _refuse_manual(module, who)
        train, val = _loader(data, "train", who), _loader(data, "val", who)
        names = _logged_names(module, val, who)
    schedulers: list[dict[str, Any]] = []  # configure_optimizers' scheduler, kept for build_scheduler
    return Workload(
        f"{type(module).__name__} (Lightning)", build_model=lambda: LightningStep(make()[0], who),
        build_data=lambda: (train.dataset, val.dataset), loss=_loss, metrics=tuple(_metric(n) for n in names),
        collate=_collate(train.collate_fn), source=spec,
        build_optimizer=lambda model, lr: _optimizer(model, who, schedulers),
        build_scheduler=_scheduler(cfg, who, schedulers), info={"lightning": type(module).__qualname__})


def _maker(obj: Any, cfg: TrainConfig, who: str) -> Callable[[], tuple[Any, Any]]:
    """What builds a fresh (module, source of the dataloaders: the datamodule, else the module) from ``obj``."""
    def make() -> tuple[Any, Any]:
        made = _call(obj, cfg, who)
        module, datamodule = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
        if not (hasattr(module, "training_step") and hasattr(module, "configure_optimizers")):
            raise ConfigError(f"{who} gave {type(module).__name__}, not a LightningModule (no training_step and "
                              "configure_optimizers)")
        if datamodule is not None:
            datamodule.prepare_data()
            datamodule.setup("fit")
        return module, datamodule if datamodule is not None else module

    return make


def _call(obj: Any, cfg: TrainConfig, who: str) -> Any:
    if isinstance(obj, type):
        return obj()
    if not callable(obj):
        raise ConfigError(f"{who} is a {type(obj).__name__}, not a LightningModule class or a function")
    takes = [p for p in inspect.signature(obj).parameters.values() if p.default is p.empty]
    return obj(cfg) if takes else obj()


def _refuse_manual(module: Any, who: str) -> None:
    if getattr(module, "automatic_optimization", True) is False:
        raise ConfigError(f"{who}: the module sets automatic_optimization = False (manual optimization, "
                          "self.manual_backward), which only Lightning's Trainer runs; dpcompare trains modules "
                          "whose training_step returns the loss")


def _loader(source: Any, split: str, who: str) -> Any:
    """``source``'s ``{split}_dataloader()`` (the datamodule's, else the module's), refused in one line if none."""
    method = getattr(source, f"{split}_dataloader", None)
    try:
        loader = method() if method is not None else None
    except Exception as e:  # noqa: BLE001  (Lightning's default raises: "... not implemented")
        raise ConfigError(f"{who}: {type(source).__name__}.{split}_dataloader() failed ({_trainer_hint(e)}); define "
                          f"{split}_dataloader() on the module or its datamodule") from None
    if getattr(loader, "dataset", None) is None:
        raise ConfigError(f"{who}: {type(source).__name__}.{split}_dataloader() gave {type(loader).__name__}, not a "
                          "DataLoader over a Dataset (dpcompare takes its dataset and collate_fn)")
    return loader


def _collate(inner: Callable[[list[Any]], Any] | None) -> Callable[[list[Any]], Any]:
    """Lightning's batch as the loop's (inputs, target) pair: the whole batch as inputs, and as target the number
    of samples (a tensor of that length: the loop and the metrics count samples with ``len(target)``)."""
    collate = inner or default_collate

    def pair(samples: list[Any]) -> tuple[Any, Any]:
        return collate(samples), torch.zeros(len(samples))

    return pair


def _loss(output: torch.Tensor, target: Any) -> torch.Tensor:
    return output  # LightningStep's training forward is training_step's loss already


def _metric(name: str) -> Metric:
    """A logged value as a metric: its mean over the validation set, weighted by each batch's samples."""
    lower = any(w in name.lower() for w in LOWER_IS_BETTER)
    return Metric(name, not lower, lambda logged, target: (float(logged[name]) * len(target), len(target)))


def _logged_names(module: Any, val: Any, who: str) -> list[str]:
    """The names ``validation_step`` logs, from one batch of the validation set (evaluation mode, no gradients)."""
    step = LightningStep(module, who)
    batch = _collate(val.collate_fn)([val.dataset[i] for i in range(min(2, len(val.dataset)))])[0]
    step.eval()
    with torch.no_grad():
        logged = step(batch)
    if not logged:
        raise ConfigError(f"{who}: validation_step logged nothing; log the metric with self.log(name, value), e.g. "
                          "self.log('val_acc', acc)")
    return list(logged)


class LightningStep(nn.Module):
    """The LightningModule as dpcompare's loop trains it: in training mode ``forward(batch)`` is ``training_step``'s
    loss; in evaluation mode it is what ``validation_step`` logged (name → value).

    The module is the child ``lightning`` (never ``module``: that name is DDP's wrapper's, which checkpoints strip),
    so its state_dict keys are ``lightning.<the module's keys>``.
    """

    def __init__(self, lightning: nn.Module, who: str) -> None:
        super().__init__()
        self.lightning, self.who, self.index = lightning, who, 0
        self.logged: dict[str, Any] = {}
        lightning.log = self._log  # type: ignore[method-assign]  # captured instead of the Trainer's loggers
        lightning.log_dict = self._log_dict  # type: ignore[method-assign]

    def _log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self.logged[name] = value.detach() if hasattr(value, "detach") else value

    def _log_dict(self, values: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        for k, v in values.items():
            self._log(k, v)

    def forward(self, batch: Any) -> Any:
        self.logged = {}
        step = self.lightning.training_step if self.training else self.lightning.validation_step
        try:
            out = step(batch, self.index)
        except RuntimeError as e:
            if "attached to a `Trainer`" in str(e):
                raise ConfigError(f"{self.who}: {step.__name__} uses self.trainer (or what reads it: "
                                  "self.optimizers(), self.lr_schedulers(), self.manual_backward), which only "
                                  "Lightning's Trainer sets; dpcompare runs the module without one") from None
            raise
        self.index += 1
        if not self.training:
            return dict(self.logged)
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if loss is None:
            raise ConfigError(f"{self.who}: training_step returned {type(out).__name__}, not the loss (a tensor or "
                              "a dict with 'loss')")
        return loss


def _optimizer(model: nn.Module, who: str, schedulers: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """``configure_optimizers()``'s one optimizer; its scheduler goes into ``schedulers`` (for :func:`_scheduler`)."""
    module = model.lightning  # type: ignore[union-attr]
    optimizers, configs = _split(module.configure_optimizers(), who)
    if len(optimizers) != 1:
        raise ConfigError(f"{who}: configure_optimizers() gave {len(optimizers)} optimizers; dpcompare steps one "
                          "(several, as for GANs, need Lightning's Trainer and manual optimization)")
    schedulers[:] = configs
    return optimizers[0]


def _split(config: Any, who: str) -> tuple[list[Any], list[dict[str, Any]]]:
    """Lightning's forms of ``configure_optimizers()``'s return: optimizers, and schedulers as config dicts."""
    if isinstance(config, torch.optim.Optimizer):
        return [config], []
    if isinstance(config, Mapping):
        sched = config.get("lr_scheduler")
        return [config["optimizer"]], [] if sched is None else [_scheduler_config(sched)]
    if isinstance(config, tuple | list) and len(config) == 2 and isinstance(config[0], list | tuple):
        return list(config[0]), [_scheduler_config(s) for s in config[1]]
    if isinstance(config, tuple | list) and all(isinstance(o, torch.optim.Optimizer) for o in config):
        return list(config), []
    if isinstance(config, tuple | list) and all(isinstance(o, Mapping) for o in config):
        return [c["optimizer"] for c in config], [_scheduler_config(c["lr_scheduler"]) for c in config
                                                   if c.get("lr_scheduler") is not None]
    raise ConfigError(f"{who}: configure_optimizers() gave {type(config).__name__}, which is none of Lightning's "
                      "forms (an optimizer, a dict with 'optimizer', ([optimizers], [schedulers]))")


def _scheduler_config(s: Any) -> dict[str, Any]:
    return dict(s) if isinstance(s, Mapping) else {"scheduler": s}


def _scheduler(
    cfg: TrainConfig, who: str, configs: list[dict[str, Any]]
) -> Callable[[torch.optim.Optimizer, int], Any]:
    """``build_scheduler(optimizer, total_steps)``: configure_optimizers' scheduler, moved onto the optimizer the
    strategy wrapped (Horovod's and ZeRO's are other objects), stepped per optimizer step (``interval: step``) or
    every epoch's steps (``interval: epoch``, when the run is given in epochs)."""
    def build(optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
        if not configs:
            return None
        if len(configs) > 1 or configs[0].get("frequency", 1) != 1:
            raise ConfigError(f"{who}: configure_optimizers() gave several schedulers or a 'frequency'; dpcompare "
                              "steps one scheduler, every step or every epoch")
        sched, interval = configs[0]["scheduler"], configs[0].get("interval", "epoch")
        _rebind(sched, optimizer)
        if interval == "step":
            return sched
        if not cfg.epochs or cfg.max_steps:
            raise ConfigError(f"{who}: configure_optimizers()'s scheduler steps every epoch (interval 'epoch', "
                              "Lightning's default), and with --max-steps the epoch's length is not known before the "
                              "run: train with --epochs only, or return {'scheduler': s, 'interval': 'step'}")
        return EveryN(sched, max(1, total_steps // cfg.epochs))

    return build


def _rebind(sched: Any, optimizer: torch.optim.Optimizer) -> None:
    """Point ``sched`` at ``optimizer`` (same parameter groups, in the same order): the learning rates it set on
    the optimizer configure_optimizers built are copied over."""
    for mine, theirs in zip(optimizer.param_groups, sched.optimizer.param_groups, strict=True):
        if mine is not theirs:
            mine.update({k: v for k, v in theirs.items() if k != "params"})
    sched.optimizer = optimizer


class EveryN:
    """A scheduler stepped once every ``n`` optimizer steps (an epoch's), with its state for checkpoints."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner, self.n, self.count = inner, n, 0

    def step(self) -> None:
        self.count += 1
        if self.count % self.n == 0:
            self.inner.step()

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "n": self.n, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.n, self.count = state["n"], state["count"]


def _trainer_hint(e: BaseException) -> str:
    text = " ".join(str(e).split())[:200]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
