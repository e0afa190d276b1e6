"""Users' own training jobs: ``--workload``, ``--model`` and ``--dataset`` given as ``MODULE:ATTR`` or
``path/to/file.py:ATTR``, resolved into one :class:`~dpcompare.data.workload.Workload`.

- ``--workload SPEC``: ATTR is a Workload, or a function returning one, called with no argument or with the
  TrainConfig (when it takes a parameter).
- ``--model SPEC`` with a built-in ``--dataset``: ATTR builds the ``nn.Module``: ``f()``, ``f(cfg)`` or
  ``f(input_shape, num_classes)`` (by how many parameters it requires). On a text dataset input_shape is
  ``(seq_len,)`` and num_classes the vocabulary (256).
- ``--dataset SPEC`` with a built-in ``--model``: ATTR returns ``(train, test)`` or ``(train, test,
  num_classes)`` torch Datasets of (input, target) pairs: ``f()`` or ``f(cfg)``.

Every plug-in is tried on one batch on the CPU (:func:`check_workload`) before any process group forms: one
that does not import, returns the wrong type, or whose output does not fit its loss is a ConfigError naming
it and what it gave. The Workload's ``source`` (the SPEC) goes into checkpoints, so a resume can check it.
Every process of a job imports the same SPEC: the flags reach the child processes like any other setting.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from dpcompare import models
from dpcompare.data.builtin import builtin
from dpcompare.data.catalog import TEXT_DATASETS
from dpcompare.data.workload import ModelTraits, Workload
from dpcompare.errors import ConfigError
from dpcompare.files import is_plugin, load_attr, one_line

#: ``--workload lightning:MODULE:ATTR``: a LightningModule (:mod:`dpcompare.data.lightning`)
LIGHTNING = "lightning:"

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig


def _required_params(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _call(fn: Any, flag: str, spec: str, *args: Any) -> Any:
    """``fn`` called with as many of ``args`` as it requires (0, 1 or all of them)."""
    if not callable(fn):
        raise ConfigError(f"{flag} {spec} is a {type(fn).__name__}, not a function")
    n = _required_params(fn)
    use = args[:n] if n <= 1 else args
    try:
        return fn(*use)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{flag} {spec} failed when called with {len(use)} argument(s): {one_line(e)}") from None


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}" if not isinstance(value, type) else f"the class {value.__name__}"


def load_workload(spec: str, cfg: TrainConfig) -> Workload:
    """``--workload SPEC``: a Workload, or a function returning one (called with nothing or with ``cfg``)."""
    obj = load_attr(spec, "--workload")
    if not isinstance(obj, Workload):
        obj = _call(obj, "--workload", spec, cfg) if callable(obj) and not isinstance(obj, type) else obj
    if not isinstance(obj, Workload):
        raise ConfigError(f"--workload {spec} gave {_describe(obj)}; expected a dpcompare Workload "
                          "(from dpcompare.data.workload import Workload) or a function returning one")
    return obj if obj.source != "builtin" else dataclasses.replace(obj, source=spec)


def _builtin(cfg: TrainConfig) -> Workload:
    """The built-in workload of ``cfg``: a language model on text, else the loop's own image classification."""
    if cfg.dataset in TEXT_DATASETS or models.is_language_model(cfg.model):
        # lazy: it loads torch, numpy
        from dpcompare.data.text import text_workload

        return text_workload(cfg)
    return builtin(cfg)


def _with_plugin_model(cfg: TrainConfig) -> Workload:
    """``--model SPEC`` on a built-in dataset: the built-in job's data, loss and metrics, the user's model."""
    text = cfg.dataset in TEXT_DATASETS
    stand_in = next(n for n in models.MODELS if models.is_language_model(n)) if text else "mlp"
    base = _builtin(dataclasses.replace(cfg, model=stand_in))  # the data, loss and metrics of the dataset's kind
    factory = load_attr(cfg.model, "--model")

    @functools.cache
    def bundle() -> Any:
        from dpcompare.data.datasets import build_dataset  # here, not at the top: it loads torch and numpy

        return build_dataset(cfg.dataset, cfg.data_dir, cfg.input_shape, cfg.samples, cfg.augment)

    def build_data() -> Any:
        return base.build_data() if text else (bundle().train, bundle().test)

    def build_model() -> Any:
        shape, classes = ((cfg.seq_len,), 256) if text else (bundle().input_shape, bundle().num_classes)
        if _required_params(factory) == 1:
            return _call(factory, "--model", cfg.model, cfg)
        return _call(factory, "--model", cfg.model, shape, classes)

    return dataclasses.replace(base, name=f"{cfg.model} on {cfg.dataset}", build_model=build_model,
                               build_data=build_data, source=f"model {cfg.model}",
                               info={**base.info, "model": cfg.model})


def _with_plugin_dataset(cfg: TrainConfig) -> Workload:
    """``--dataset SPEC`` for a built-in model: the user's (train, test[, num_classes]) datasets."""
    lm = models.is_language_model(cfg.model)
    base = _builtin(dataclasses.replace(cfg, dataset="tokens" if lm else "synthetic"))
    factory = load_attr(cfg.dataset, "--dataset")
    given = _call(factory, "--dataset", cfg.dataset, cfg)
    if not (
        isinstance(given, tuple | list) and len(given) in (2, 3) and all(hasattr(d, "__getitem__") for d in given[:2])
    ):
        raise ConfigError(f"--dataset {cfg.dataset} gave {_describe(given)}; expected (train, test) or "
                          "(train, test, num_classes) torch Datasets of (input, target) pairs")
    train, test = given[0], given[1]
    if lm:
        classes = int(given[2]) if len(given) == 3 else 256
        shape = (cfg.seq_len,)
    elif len(given) == 3:
        classes, shape = int(given[2]), tuple(train[0][0].shape)
    else:
        raise ConfigError(f"--dataset {cfg.dataset} gave (train, test) for the classifier --model {cfg.model}; "
                          "return (train, test, num_classes)")
    options = {"seed": cfg.seed} if lm else {"width": cfg.width}
    return dataclasses.replace(base, name=f"{cfg.model} on {cfg.dataset}", build_data=lambda: (train, test),
                               build_model=lambda: models.build_model(cfg.model, shape, classes, **options),
                               source=f"dataset {cfg.dataset}", info={**base.info, "dataset": cfg.dataset})


def _settle(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the defaults a language model implies: ``--model gpt-tiny`` alone trains on pydoc."""
    default = {f.name: f.default for f in dataclasses.fields(cfg)}["dataset"]
    if not cfg.workload and models.is_language_model(cfg.model) and cfg.dataset == default:
        return dataclasses.replace(cfg, dataset="pydoc")
    return cfg


class Job(NamedTuple):
    """What a run trains: its config (with the defaults its workload implies) and the workload."""

    cfg: TrainConfig
    workload: Workload


def resolve_workload(cfg: TrainConfig, given: Workload | None = None, check: bool = True) -> Job:
    """What ``cfg`` trains, in one place, once per run and before any process group forms: ``given`` (a Workload
    handed to ``dpcompare.train`` from Python), else the plug-in ``cfg`` names (``--workload``, or ``--model`` or
    ``--dataset`` as ``MODULE:ATTR`` / ``path/to/file.py:ATTR``), else the built-in one. A given Workload or a
    plug-in is tried on one batch (unless ``check=False``); a built-in is not."""
    if given is not None and not isinstance(given, Workload):
        raise ConfigError(f"dpcompare.train(workload=...) got {type(given).__name__}; expected a Workload, "
                          "'module:attr' or None")
    cfg = _settle(cfg)
    if given is not None:
        w = given if given.source != "builtin" else dataclasses.replace(given, source=f"python:{given.name}")
    elif cfg.workload and cfg.workload.startswith(LIGHTNING):  # a LightningModule, without the Trainer
        # lazy: it loads torch, numpy
        from dpcompare.data.lightning import lightning_workload

        w = lightning_workload(cfg.workload, load_attr(cfg.workload[len(LIGHTNING):], "--workload"), cfg)
    elif cfg.workload:
        w = load_workload(cfg.workload, cfg)
    elif is_plugin(cfg.model):
        w = _with_plugin_model(cfg)
    elif is_plugin(cfg.dataset):
        w = _with_plugin_dataset(cfg)
    else:
        return Job(cfg, _builtin(cfg))
    if check:
        w = dataclasses.replace(w, traits=check_workload(w))
        check_sparse(cfg, w)
    return Job(cfg, w)


def check_sparse(cfg: TrainConfig, w: Workload) -> None:
    """Refuse the flags' optimizer where it cannot take the sparse gradients the pre-check saw."""
    if w.traits is None or not w.traits.sparse or w.build_optimizer is not None:
        return
    if cfg.optimizer != "sgd" or cfg.weight_decay:
        raise ConfigError(f"{w.source}: {', '.join(w.traits.sparse)} get sparse gradients (nn.Embedding(sparse=True)), "
                          f"which --optimizer {cfg.optimizer}{' with --weight-decay' if cfg.weight_decay else ''} "
                          "cannot take: use --optimizer sgd without --weight-decay, or give the workload its own "
                          "optimizer (build_optimizer: Adagrad, SparseAdam)")


def check_workload(w: Workload, batch_size: int = 2) -> ModelTraits:
    """Build ``w`` and run one small batch through its model, loss (forward and backward) and metrics on the CPU;
    what it saw of the model (:class:`~dpcompare.data.workload.ModelTraits`): the trainable parameters that got
    no gradient, the sparse gradients, the frozen parameters, the random operations, BatchNorm.

    Any failure is one ConfigError naming the workload's source and what went wrong. The run's random streams
    are left as they were.
    """
    import torch  # here, not at the top: dpcompare --help loads this module

    who = w.source if w.source != "builtin" else w.name
    with torch.random.fork_rng(devices=[]):  # leave the run's random streams as they were
        stage = "building its datasets"
        try:
            inputs, target = _first_batch(w, batch_size, who)
            stage = "building its model"
            model = w.build_model()
            if not isinstance(model, torch.nn.Module):
                raise ConfigError(f"{who}: its model builder gave {_describe(model)}, not a torch.nn.Module")
            traits = _forward_backward(w, model, inputs, target, who)
            stage = "running its model on one batch in evaluation mode"
            model.eval()  # as evaluation runs it
            with torch.no_grad():
                output = model(inputs)
                for m in w.metrics:
                    stage = f"its metric {m.name!r} on the model's output ({_shape(output)})"
                    total, count = m.batch(output, target)
                    float(total), int(count)
        except ConfigError:
            raise
        except _Stage as e:
            raise ConfigError(f"{who}: {e.stage} failed: {one_line(e.__cause__)}") from None  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"{who}: {stage} failed: {one_line(e)}") from None
    return traits


class _Stage(Exception):
    """A failure inside one stage of the pre-check (the stage's name; the real exception is its cause)."""

    def __init__(self, stage: str) -> None:
        super().__init__(stage)
        self.stage = stage


def _first_batch(w: Workload, batch_size: int, who: str) -> tuple[Any, Any]:
    """The first ``batch_size`` training samples through the workload's collate: (inputs, target)."""
    from torch.utils.data import default_collate  # here, not at the top: dpcompare --help loads this module

    try:
        train, _ = w.build_data()
    except Exception as e:
        raise _Stage("building its datasets") from e
    try:
        batch = (w.collate or default_collate)([train[i] for i in range(min(batch_size, len(train)))])
    except Exception as e:
        raise _Stage("reading a batch of its training set") from e
    if isinstance(batch, Mapping) or not (isinstance(batch, tuple | list) and len(batch) == 2):
        raise ConfigError(f"{who}: a batch of its training set is {_describe(batch)[:60]}...; the loop needs "
                          "(inputs, target) pairs: make the collate function return (inputs, target), where inputs "
                          "may be a dict of tensors")
    return batch[0], batch[1]


def _forward_backward(w: Workload, model: Any, inputs: Any, target: Any, who: str) -> ModelTraits:
    """One batch forward in training mode and the loss's backward; what they showed of the model."""
    import torch  # here, not at the top: dpcompare --help loads this module

    model.train()
    before = torch.get_rng_state()
    try:
        output = model(inputs)
    except Exception as e:
        raise _Stage("running its model on one batch") from e
    drew = not torch.equal(before, torch.get_rng_state())
    stage = f"its loss on the model's output ({_shape(output)}) and the target ({_shape(target)})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # torch warns when a loss broadcasts mismatched shapes
            loss = w.loss(output, target)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point()):
            raise ConfigError(f"{who}: its loss gave {_describe(loss)}, not a one-element float tensor")
        if loss.requires_grad:
            stage = "the backward pass of its loss"
            loss.backward()
    except ConfigError:
        raise
    except Exception as e:
        raise _Stage(stage) from e
    return model_traits(model, drew)


def model_traits(model: Any, drew_random: bool) -> ModelTraits:
    """What one forward and backward left on ``model``'s parameters (``drew_random``: the forward drew random
    numbers)."""
    from torch import nn  # here, not at the top: dpcompare --help loads this module

    params = list(model.named_parameters())
    dropouts = sorted({type(m).__name__ for m in model.modules() if "dropout" in type(m).__name__.lower()})
    random = tuple(dropouts or ["random numbers drawn in forward"]) if drew_random else ()
    return ModelTraits(
        unused=tuple(n for n, p in params if p.requires_grad and p.grad is None),
        sparse=tuple(n for n, p in params if p.grad is not None and p.grad.is_sparse),
        frozen=tuple(n for n, p in params if not p.requires_grad), random=random,
        batchnorm=any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()))


def _shape(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return f"shape {tuple(shape)}" if shape is not None else type(x).__name__
