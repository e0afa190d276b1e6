"""Data-parallel strategies behind one interface. Importing this package registers all of them."""

from dpcompare.backends import ddp, fsdp, horovod, single, zero  # noqa: F401  (registration side effect)
from dpcompare.backends.base import Strategy, StrategyUnavailable
from dpcompare.backends.registry import create, get, names, register

__all__ = ["Strategy", "StrategyUnavailable", "create", "get", "names", "register"]
