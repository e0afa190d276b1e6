"""Name → strategy class. Strategies register with ``@register``; the CLI lists ``names()``."""

from __future__ import annotations

from dpcompare.backends.base import Strategy
from dpcompare.errors import ConfigError

_REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"strategy {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    return list(_REGISTRY)


def get(name: str) -> type[Strategy]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}; choose from {', '.join(names())}") from None


def create(name: str, **kwargs: object) -> Strategy:
    """Instantiate a strategy after checking its library is importable."""
    from dpcompare.backends.base import StrategyUnavailable

    cls = get(name)
    try:
        cls.check_available()
    except StrategyUnavailable as e:
        raise ConfigError(str(e)) from None
    return cls(**kwargs)  # type: ignore[arg-type]
