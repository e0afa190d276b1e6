"""Name → strategy class. Names come from :mod:`~dpcompare.backends.catalog` (nothing imported); a
strategy's module is imported on first :func:`get` and registers its class with ``@register``."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dpcompare.backends.catalog import STRATEGIES
from dpcompare.backends.catalog import names as names
from dpcompare.errors import ConfigError

if TYPE_CHECKING:
    from dpcompare.backends.base import Strategy

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
        importlib.import_module(STRATEGIES[name][0])  # registers it
    return _REGISTRY[name]


def create(name: str, **kwargs: object) -> Strategy:
    """Instantiate a strategy after checking its library is importable."""
    from dpcompare.backends.base import StrategyUnavailable

    cls = get(name)
    try:
        cls.check_available()
    except StrategyUnavailable as e:
        raise ConfigError(str(e)) from None
    return cls(**kwargs)  # type: ignore[arg-type]
