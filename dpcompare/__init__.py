"""dpcompare: one training job under DDP and Horovod, compared honestly."""

from __future__ import annotations

from typing import Any

from dpcompare.versions import __version__ as __version__

__all__ = ["train", "compare_runs"]


def __getattr__(name: str) -> Any:
    """``dpcompare.train`` and ``dpcompare.compare_runs`` (:mod:`dpcompare.api`), imported on first use so that
    ``import dpcompare`` stays free of torch."""
    if name in __all__:
        # lazy: the root package reaches the whole API: imported on first use
        from dpcompare import api

        return getattr(api, name)
    raise AttributeError(f"module 'dpcompare' has no attribute {name!r}")
