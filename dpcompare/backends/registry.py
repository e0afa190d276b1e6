"""Name → strategy class. Built-in names come from :mod:`~dpcompare.backends.catalog` (nothing imported); a
built-in strategy's module is imported on first :func:`get`, which registers the class its catalog line names (a
strategy's module never imports this one).

A strategy outside the package is named by where it is, ``MODULE:CLASS`` or ``path/to/file.py:CLASS`` (as
``--workload`` names a workload): :func:`get` imports it (user code: the one place besides the catalog lines
that imports a strategy by a name given at run time) and checks that it is a Strategy subclass. Its facts
(summary, knobs, communication, whether it is distributed) are its class attributes.

Imports :mod:`~dpcompare.backends.base` only inside functions, as base reads the catalog, not this module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dpcompare.backends.catalog import STRATEGIES, Entry, check_name
from dpcompare.backends.catalog import names as names
from dpcompare.errors import ConfigError
from dpcompare.files import is_plugin, load_attr

if TYPE_CHECKING:
    from dpcompare.backends.base import Strategy
    from dpcompare.config import TrainConfig
    from dpcompare.data.workload import ModelTraits

_REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """List a built-in strategy by name, with its facts from its catalog line."""
    if cls.name not in STRATEGIES:
        raise ValueError(f"strategy {cls.name!r} is not in backends/catalog.py")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"strategy {cls.name!r} registered twice")
    entry = STRATEGIES[cls.name]
    cls.summary, cls.communication, cls.distributed, cls.knobs, cls.sync_mechanism = (
        entry.summary, entry.communication, entry.distributed, entry.knobs, entry.sync_mechanism)
    _REGISTRY[cls.name] = cls
    return cls


def get(name: str) -> type[Strategy]:
    """The class of built-in strategy ``name`` or of the plug-in ``MODULE:CLASS`` / ``path/to/file.py:CLASS``."""
    try:
        check_name(name)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if name not in _REGISTRY:
        if is_plugin(name):
            _REGISTRY[name] = _load_plugin(name)
        else:
            module, _, cls = STRATEGIES[name].module.partition(":")
            register(getattr(importlib.import_module(module), cls))
    return _REGISTRY[name]


def facts(name: str) -> Entry:
    """What dpcompare knows about strategy ``name``: its catalog line (torch-free), or a plug-in's class."""
    if name in STRATEGIES:
        return STRATEGIES[name]
    cls = get(name)
    return Entry(cls.__module__, cls.summary, cls.communication, cls.distributed, cls.knobs,
                 sync_mechanism=cls.sync_mechanism)


def check_config(name: str, cfg: TrainConfig, world_size: int) -> None:
    """Refuse, before any process group work, a knob strategy ``name`` cannot honour (naming the strategies that
    can) or a value it cannot take: its class's ``check_config``."""
    get(name).check_config(cfg, world_size)


def check_model(name: str, traits: ModelTraits | None, cfg: TrainConfig) -> None:
    """Refuse, before any process group work, a model strategy ``name`` cannot train, from what the workload's
    pre-check saw of it (nothing to check when it was not checked)."""
    if traits is not None:
        get(name).check_model(traits, cfg)


def create(name: str, **kwargs: object) -> Strategy:
    """Instantiate a strategy after checking its library is importable."""
    from dpcompare.backends.base import StrategyUnavailable  # here, not at the top: it loads torch

    cls = get(name)
    try:
        cls.check_available()
    except StrategyUnavailable as e:
        raise ConfigError(str(e)) from None
    return cls(**kwargs)  # type: ignore[arg-type]


def _load_plugin(spec: str) -> type[Strategy]:
    """The Strategy subclass at ``spec`` (:func:`dpcompare.files.load_attr`, the one plug-in loader); a ConfigError
    of one line saying what to fix when it is not one."""
    # lazy: it loads torch, numpy
    from dpcompare.backends.base import (
        Strategy,  # base reads the catalog, which names this module's strategies
    )

    cls = load_attr(spec, "--strategy", default=None)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        where, _, attr = spec.rpartition(":")
        got = ("nothing" if cls is None else f"the class {cls.__name__}" if isinstance(cls, type)
               else f"a {type(cls).__name__}")
        raise ConfigError(f"--strategy {spec}: {where} has {got} named {attr!r}, not a subclass of "
                          "dpcompare.backends.base.Strategy (or of backends.torchdist.TorchDistributedStrategy)")
    if "name" not in vars(cls):  # its name in summaries, checkpoints and messages: the spec it was given by
        cls.name = spec
    return cls
