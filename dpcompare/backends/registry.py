"""Name → strategy class. Names come from :mod:`~dpcompare.backends.catalog` (nothing imported); a
strategy's module is imported on first :func:`get`, which registers the class the catalog names. The checks that
need every strategy (:func:`check_config`) are here, above the strategies, not in their base class."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dpcompare.backends.catalog import STRATEGIES
from dpcompare.backends.catalog import names as names
from dpcompare.errors import ConfigError

if TYPE_CHECKING:
    from dpcompare.backends.base import Strategy
    from dpcompare.config import TrainConfig

_REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    if cls.name not in STRATEGIES:
        raise ValueError(f"strategy {cls.name!r} is not in backends/catalog.py")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"strategy {cls.name!r} registered twice")
    cls.summary = STRATEGIES[cls.name][1]
    _REGISTRY[cls.name] = cls
    return cls


def get(name: str) -> type[Strategy]:
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r}; choose from {', '.join(names())}")
    if name not in _REGISTRY:
        module, _, cls = STRATEGIES[name][0].partition(":")
        register(getattr(importlib.import_module(module), cls))
    return _REGISTRY[name]


def check_config(name: str, cfg: TrainConfig, world_size: int) -> None:
    """Refuse, before any process group work, a knob strategy ``name`` cannot honour (naming the strategies that
    can, :func:`dpcompare.knobs.refuse_unhonoured`), then the values it cannot take (its ``check_config``)."""
    from dpcompare import knobs

    cls = get(name)
    knobs.refuse_unhonoured(cfg, name, {n: get(n).knobs for n in names()})
    cls.check_config(cfg, world_size)


def create(name: str, **kwargs: object) -> Strategy:
    """Instantiate a strategy after checking its library is importable."""
    from dpcompare.backends.base import StrategyUnavailable

    cls = get(name)
    try:
        cls.check_available()
    except StrategyUnavailable as e:
        raise ConfigError(str(e)) from None
    return cls(**kwargs)  # type: ignore[arg-type]
