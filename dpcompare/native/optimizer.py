"""``hvd.DistributedOptimizer`` on torch.distributed, with Horovod's semantics.

As in Horovod, the returned object is a new optimizer of a subclass of the wrapped optimizer's class (so
``isinstance(opt, torch.optim.SGD)`` holds and LR schedulers work) built on the same parameter groups, and:

- a hook on every parameter that requires a gradient counts down ``backward_passes_per_step`` backward passes;
  at zero the gradient is ready for the all-reduce (:mod:`.fusion`); one pass more before ``step()`` raises;
- ``synchronize()`` reduces what is left (parameters unused in this step get zero gradients, all-reduced),
  waits and writes the averaged gradients; ``step()`` calls it unless inside ``skip_synchronize()``;
- ``Average`` multiplies by ``1/gradient_predivide_factor`` before the sum and by ``factor/size`` after it;
- ``zero_grad()`` between ``backward()`` and ``synchronize()`` raises;
- at one process no hook is registered and nothing is reduced.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from dpcompare.native.calls import unsupported
from dpcompare.native.collectives import Adasum, Average
from dpcompare.native.compression import Compression
from dpcompare.native.fusion import GradientFusion
from dpcompare.native.process_sets import ProcessSet, global_process_set
from dpcompare.native.state import size

TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                   "Increase backward_passes_per_step to accumulate gradients locally.")
ZERO_GRAD_TOO_EARLY = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                       "optimizer.synchronize(). This is prohibited as it can cause a race condition.")


def _named(optimizer: torch.optim.Optimizer, named_parameters: Iterable[Any] | None) -> dict[torch.Tensor, str]:
    """parameter → name, checked as Horovod checks it (tuples, unique names, every parameter named)."""
    if named_parameters is None:
        pairs = [(f"allreduce.noname.{i}.{j}", v) for i, g in enumerate(optimizer.param_groups)
                 for j, v in enumerate(g["params"])]
    else:
        pairs = list(named_parameters)
    if any(not isinstance(p, tuple) for p in pairs):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                         "model.named_parameters().")
    names = [k for k, _ in pairs]
    dups = sorted({k for k in names if names.count(k) > 1})
    if dups:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {', '.join(dups)}")
    named_ids = {id(v) for _, v in pairs}
    unnamed = [id(v) for g in optimizer.param_groups for v in g["params"] if id(v) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(str(i) for i in unnamed)}")
    return {v: k for k, v in pairs}


def _explicit_groups(groups: Any, params: list[torch.Tensor]) -> list[list[int]] | None:
    """Horovod's ``groups``: a number of near-equal groups, or lists of parameters (the rest alone)."""
    if groups is None:
        return None
    if isinstance(groups, list):
        index = {id(p): i for i, p in enumerate(params)}
        seen: set[int] = set()
        out = []
        for group in groups:
            if any(not isinstance(p, torch.Tensor) for p in group):
                raise ValueError("groups must consist of torch.Tensor.")
            if any(id(p) in seen for p in group):
                raise ValueError("A parameter can only appear once in groups.")
            seen.update(id(p) for p in group)
            out.append([index[id(p)] for p in group if id(p) in index])
        return [g for g in out if g] + [[i] for i, p in enumerate(params) if id(p) not in seen]
    if not isinstance(groups, int) or groups <= 0:
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
    cut, extra = divmod(len(params), groups)
    bounds = [i * cut + min(i, extra) for i in range(groups + 1)]
    return [list(range(a, b)) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


class _HorovodOptimizer:
    """The behaviour the wrapped optimizer's class is extended with (first in the new class's MRO)."""

    def _setup(self, named: dict[torch.Tensor, str], compression: Any, backward_passes_per_step: int, op: int,
               gradient_predivide_factor: float, groups: Any, sparse_as_dense: bool, process_set: ProcessSet) -> None:
        self._parameter_names = named
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self._compression = compression
        self._synchronized = False
        self._should_synchronize = True
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self._requires_update = params
        self._delay = {p: backward_passes_per_step for p in params}
        pre, post = (1.0 / gradient_predivide_factor, gradient_predivide_factor) if op == Average else (1.0, 1.0)
        self._fusion = GradientFusion(params, [named.get(p, "") for p in params], op=op, prescale=pre,
                                      postscale=post, compression=compression, sparse_as_dense=sparse_as_dense,
                                      groups=_explicit_groups(groups, params), process_set=process_set)
        self._active = size() > 1 and bool(process_set.included())  # Horovod: no hooks outside the process set
        if self._active:
            for i, p in enumerate(params):
                p.register_post_accumulate_grad_hook(self._make_hook(i, p))

    def _make_hook(self, i: int, p: torch.Tensor) -> Any:
        def hook(_: torch.Tensor) -> None:
            if self._delay[p] <= 0:
                raise AssertionError(TOO_MANY_PASSES)
            self._fusion.mark_touched()
            self._delay[p] -= 1
            if self._delay[p] == 0:
                self._fusion.on_ready(i)
        return hook

    def synchronize(self) -> None:
        """Reduce the gradients not reduced yet, wait for all of them, and write the averages into ``.grad``."""
        if self._active:
            self._fusion.synchronize()
            for p in self._delay:
                self._delay[p] = self.backward_passes_per_step
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``optimizer.step()`` inside does not synchronize (after an explicit ``synchronize()``)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                              "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                              "your code.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return self._local_step(closure)

    def _local_step(self, closure: Any = None) -> Any:
        """The wrapped optimizer's own ``step()``, no communication (what broadcast_optimizer_state runs)."""
        return super().step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._fusion.touched:
            raise AssertionError(ZERO_GRAD_TOO_EARLY)
        super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._fusion.reset()
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)
        super().load_state_dict(state_dict)  # type: ignore[misc]


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Iterable[Any] | None = None,  # noqa: N802
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: int = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set) -> torch.optim.Optimizer:
    """A new optimizer of ``optimizer``'s class, on its parameter groups, that averages gradients across ranks."""
    if op == Adasum:
        raise unsupported("hvd.DistributedOptimizer(op=hvd.Adasum)", "DistributedOptimizer(op=Adasum)")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        groups = num_groups if groups is None else groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    named = _named(optimizer, named_parameters)
    base = type(optimizer)
    cls = type(base.__name__, (_HorovodOptimizer, base), {"__module__": __name__})
    new = cls.__new__(cls)
    base.__init__(new, optimizer.param_groups)  # type: ignore[misc]
    new._setup(named, compression, backward_passes_per_step, op, gradient_predivide_factor, groups,
               sparse_as_dense, process_set)
    return new
