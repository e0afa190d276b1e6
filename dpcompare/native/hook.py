"""The import hook: ``import horovod`` and ``import horovod.torch`` resolve to the native layer.

:func:`install` puts a finder first on ``sys.meta_path``, so the layer wins even where real Horovod is installed.
``horovod.torch`` and its submodules (``mpi_ops``, ``optimizer``, ``functions``...) are all :mod:`.hvd`,
``horovod.torch.elastic`` and ``horovod.common.elastic`` :mod:`.elastic`;
``horovod`` is a small package with ``__version__`` and a refusing ``horovod.run``; ``horovod.runner.util.threads``
(``in_thread``, which Horovod's own test utilities import) is answered, the rest of ``horovod.runner`` refused at
the name used; every other part of Horovod (TensorFlow, Keras, MXNet, Spark, Ray) fails to import with one line
naming the native road.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Any

from dpcompare.native.calls import HOROVOD_VERSION, RUN, Unsupported, module_refusal

#: modules that are the layer itself
ALIASES = frozenset({"horovod.torch", "horovod.torch.mpi_ops", "horovod.torch.optimizer", "horovod.torch.functions",
                     "horovod.torch.compression", "horovod.torch.sync_batch_norm", "horovod.common.exceptions"})
#: modules that are the layer's Horovod Elastic (:mod:`.elastic`)
ELASTIC = frozenset({"horovod.torch.elastic", "horovod.torch.elastic.state", "horovod.torch.elastic.sampler",
                     "horovod.common.elastic"})
#: empty packages on the way to an alias
PACKAGES = frozenset({"horovod.common"})
#: packages on the way to the one launcher utility answered: their other names are refused at use
RUNNER_PACKAGES = frozenset({"horovod.runner", "horovod.runner.util"})
THREADS = "horovod.runner.util.threads"


def _run(*args: Any, **kwargs: Any) -> Any:
    raise Unsupported(f"horovod.run is not supported by dpcompare's native Horovod layer; natively: {RUN.native}")


def _fill_root(module: types.ModuleType) -> None:
    module.__doc__ = "Horovod's top-level package, answered by dpcompare's native layer (horovod.torch only)."
    module.__version__ = f"{HOROVOD_VERSION}+dpcompare.native"  # type: ignore[attr-defined]
    module.run = _run  # type: ignore[attr-defined]


def in_thread(target: Any, args: tuple[Any, ...] = (), name: str | None = None, daemon: bool = True,
              silent: bool = False) -> threading.Thread:
    """``horovod.runner.util.threads.in_thread``: ``target(*args)`` in a started thread (errors not printed when
    ``silent``)."""
    def body() -> None:
        try:
            target(*args)
        except BaseException:
            if not silent:
                raise
    thread = threading.Thread(target=body, name=name, daemon=daemon)
    thread.start()
    return thread


def _fill_runner(module: types.ModuleType) -> None:
    def refuse(attr: str) -> Any:
        if attr.startswith("__") or attr in ("util", "threads"):
            raise AttributeError(attr)
        raise module_refusal(f"{module.__name__}.{attr}")
    module.__getattr__ = refuse  # type: ignore[attr-defined]


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        if name == "horovod":
            _fill_root(module)
        elif name in ALIASES:
            # what the import statement returns is whatever sys.modules holds for the name once this returns
            from dpcompare.native import hvd

            sys.modules[name] = hvd
        elif name in RUNNER_PACKAGES:
            _fill_runner(module)
        elif name == THREADS:
            module.in_thread = in_thread  # type: ignore[attr-defined]
        elif name in ELASTIC:
            # lazy: the native layer loads torch: imported only for the native arm
            from dpcompare.native import elastic

            sys.modules[name] = elastic
        elif name not in PACKAGES:
            raise module_refusal(name)


class HorovodFinder(importlib.abc.MetaPathFinder):
    """Answers ``horovod`` and ``horovod.*`` before any other finder."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "horovod" and not fullname.startswith("horovod."):
            return None
        return importlib.util.spec_from_loader(fullname, _Loader(), is_package=True)


def install() -> None:
    """Make ``import horovod...`` mean the native layer in this process (idempotent). Any Horovod module imported
    before is forgotten, so the script's own import gets the layer."""
    if not any(isinstance(f, HorovodFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, HorovodFinder())
    for name in [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]:
        del sys.modules[name]


def installed() -> bool:
    return any(isinstance(f, HorovodFinder) for f in sys.meta_path)
