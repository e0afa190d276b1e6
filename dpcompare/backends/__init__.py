"""Data-parallel strategies behind one interface.

Importing this package imports no strategy (and not torch): names, summaries and the other facts of the
built-in strategies come from :mod:`~dpcompare.backends.catalog` (:func:`facts`), and :func:`get` imports a
strategy's module when it is first asked for, or a plug-in's ``MODULE:CLASS`` / ``path/to/file.py:CLASS``.

May import: the top-level modules and launch. From ``launch``: rendezvous, the launcher's environment, Open
MPI's settings; never ``training``, ``compare``, ``report`` or command-line code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpcompare.backends.catalog import one_process
from dpcompare.backends.registry import check_config, check_model, create, facts, get, names, register

if TYPE_CHECKING:
    from dpcompare.backends.base import Strategy, StrategyUnavailable

__all__ = ["Strategy", "StrategyUnavailable", "check_config", "check_model", "create", "facts", "get", "names",
           "one_process", "register"]


def __getattr__(name: str) -> Any:  # Strategy and StrategyUnavailable live with torch in base.py
    if name in ("Strategy", "StrategyUnavailable"):
        # lazy: base.py loads torch: imported on first use
        from dpcompare.backends import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
