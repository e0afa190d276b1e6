"""Gradients all-reduced as they become ready, fused into buffers, waited for in ``step()``.

Horovod's background thread fuses whatever gradients became ready within one cycle (``HOROVOD_CYCLE_TIME``, 1 ms)
into a buffer of at most ``HOROVOD_FUSION_THRESHOLD`` bytes (128 MiB), after the ranks agree by name on what is
ready. torch.distributed has no such negotiation: every rank must issue the same collectives in the same order.
So the groups are fixed:

- the first :data:`LEARN_AT` steps reduce every gradient at ``synchronize()``, in parameter order, in buffers up to
  the threshold (no overlap with backward);
- at the end of step :data:`LEARN_AT`, rank 0 groups the gradients as Horovod's cycle would (in the order they
  became ready, a new group when the cycle time has passed, the threshold is reached or the dtype changes) and
  every rank takes that plan;
- from then on a group is all-reduced from the gradient hooks as soon as all its gradients are ready and every
  earlier group has started, so the ranks issue the same all-reduces in the same order, overlapping backward.

A gradient that did not become ready by ``synchronize()`` (a parameter unused in this step) is reduced as zeros,
as Horovod does: another rank may have used it. Which gradients share a buffer does not change a sum at two ranks;
with more ranks it can change the last bit, as Horovod's own run-to-run grouping does.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dpcompare.knobs import (
    HOROVOD_CYCLE_MS,
    HOROVOD_CYCLE_VAR,
    HOROVOD_FUSION_BYTES,
    HOROVOD_FUSION_VAR,
    horovod_fusion,
)
from dpcompare.native import timeline
from dpcompare.native.collectives import (
    Pending,
    broadcast_object,
    sparse_allreduce_async,
    start_fused_allreduce,
)
from dpcompare.native.process_sets import ProcessSet, first_rank, global_process_set

THRESHOLD_VAR, DEFAULT_THRESHOLD = HOROVOD_FUSION_VAR, HOROVOD_FUSION_BYTES
CYCLE_VAR, DEFAULT_CYCLE_MS = HOROVOD_CYCLE_VAR, HOROVOD_CYCLE_MS
#: the step whose gradient timings (on rank 0) decide the groups for the rest of the run
LEARN_AT = 2


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


def fusion_threshold() -> int:
    """Bytes of one fused buffer (``HOROVOD_FUSION_THRESHOLD``, as Horovod reads it; 0: no fusion)."""
    return max(int(_env_number(THRESHOLD_VAR, DEFAULT_THRESHOLD)), 0)


def cycle_seconds() -> float:
    return max(_env_number(CYCLE_VAR, DEFAULT_CYCLE_MS), 0.0) / 1000.0


#: the groups of the first steps and of the learnt plan: Horovod's fusion, the plan ``predict`` models too
plan_groups = horovod_fusion


@dataclass
class _Flight:
    members: list[int]
    pending: Pending
    wires: list[torch.Tensor]
    contexts: list[Any]
    span: Any = None            # its timeline span, when a timeline is written


class GradientFusion:
    """The all-reduces of one DistributedOptimizer's gradients (see the module's docstring)."""

    def __init__(self, params: Sequence[torch.Tensor], names: Sequence[str], *, op: int, prescale: float,
                 postscale: float, compression: Any, sparse_as_dense: bool,
                 groups: list[list[int]] | None = None, process_set: ProcessSet = global_process_set) -> None:
        self.params, self.names, self.process_set = list(params), list(names), process_set
        self.op, self.prescale, self.postscale = op, prescale, postscale
        self.compression, self.sparse_as_dense = compression, sparse_as_dense
        self.threshold, self.cycle = fusion_threshold(), cycle_seconds()
        self.explicit = groups is not None
        self.plan: list[list[int]] | None = groups
        self.learned_steps = 0
        #: all-reduces started from the gradient hooks (during backward) and at synchronize(), over the run
        self.started = {"backward": 0, "synchronize": 0}
        self._buffers: dict[tuple[int, ...], torch.Tensor] = {}
        self.group_of: list[int] = []
        self.planned: set[int] = set()
        self.reset()

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.times = [math.inf] * len(self.params)
        self.next_group = 0
        self.flights: list[_Flight] = []
        self.touched = False
        #: gradients each group still waits for (a counter per group: a hook costs the same whatever its size)
        self.waiting = [len(g) for g in self.plan] if self.plan is not None else []
        if self.plan is not None and len(getattr(self, "group_of", ())) != len(self.params):
            self.group_of = [0] * len(self.params)
            for g, members in enumerate(self.plan):
                for i in members:
                    self.group_of[i] = g
            self.planned = {i for members in self.plan for i in members}

    # -- from the hooks -------------------------------------------------------------------------------------
    def mark_touched(self) -> None:
        self.touched = True

    def on_ready(self, i: int) -> None:
        """Parameter ``i``'s gradient is final for this step: start every group that is now complete."""
        self.ready[i] = True
        if self.plan is None:
            self.times[i] = time.perf_counter()
            return
        if i in self.planned:
            self.waiting[self.group_of[i]] -= 1
        while self.next_group < len(self.plan) and self.waiting[self.next_group] == 0:
            # explicit groups go through Horovod's grouped all-reduce, which ignores gradient_predivide_factor
            self._launch(self.plan[self.next_group], *((1.0, 1.0) if self.explicit else (None, None)))
            self.started["backward"] += 1
            self.next_group += 1

    # -- the all-reduces ------------------------------------------------------------------------------------
    def _wire(self, i: int) -> tuple[torch.Tensor, Any]:
        grad = self.params[i].grad
        assert grad is not None
        if grad.is_sparse:
            grad = grad.to_dense()
        return self.compression.compress(grad)

    def _launch(self, members: list[int], prescale: float | None = None, postscale: float | None = None) -> None:
        packed = [self._wire(i) for i in members]
        wires = [w for w, _ in packed]
        pre = self.prescale if prescale is None else prescale
        post = self.postscale if postscale is None else postscale
        key = tuple(members)
        buf = self._buffers.get(key) if len(members) > 1 else None
        span = timeline.begin("allreduce", [f"allreduce.{self.names[i]}" for i in members], wires) \
            if timeline.active() else None
        pending = start_fused_allreduce(wires, self.op, pre, post, buffer=buf, ps=self.process_set)
        timeline.started(span)
        if len(members) > 1 and buf is None:
            self._buffers[key] = pending.keep[0]
        self.flights.append(_Flight(members, pending, wires, [c for _, c in packed], span))

    def _finish(self, flight: _Flight) -> None:
        flight.pending.result()
        timeline.end(flight.span)
        for i, wire, ctx in zip(flight.members, flight.wires, flight.contexts, strict=True):
            grad = self.params[i].grad
            assert grad is not None
            out = self.compression.decompress(wire, ctx)
            if grad.is_sparse:
                grad.zero_().add_(out.to_sparse())
            elif out is not grad:
                grad.copy_(out)

    def synchronize(self) -> None:
        """Reduce what is left (unused parameters as zeros), wait for everything, write the averaged gradients."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        planned = self.planned if self.plan is not None else set()
        sparse = [i for i, p in enumerate(self.params)
                  if p.grad.is_sparse and not self.sparse_as_dense and i not in planned]
        dense = [i for i in range(len(self.params)) if i not in set(sparse)]
        launched_before = len(self.flights)
        if self.plan is None:
            for group in plan_groups(dense, self._nbytes(), self._kinds(), self.threshold):
                self._launch(group)
        elif self.explicit:  # Horovod reduces the members of unfinished groups one by one
            for group in self.plan[self.next_group:]:
                for i in group:
                    self._launch([i])
        else:
            for group in self.plan[self.next_group:]:
                self._launch(group)
        self.started["synchronize"] += len(self.flights) - launched_before
        gathers = [(i, sparse_allreduce_async(self.params[i].grad, self.names[i], self.op, self.process_set))
                   for i in sparse]
        for flight in self.flights:
            self._finish(flight)
        for i, wait in gathers:
            self.params[i].grad.zero_().add_(wait())
        if self.plan is None and self.touched:
            self.learned_steps += 1
            if self.learned_steps == LEARN_AT:
                self.plan = self._learn(dense)
        self.reset()

    # -- the plan -------------------------------------------------------------------------------------------
    def _wire_dtypes(self) -> list[torch.dtype]:
        return [self.compression.compress(torch.zeros((), dtype=p.dtype))[0].dtype for p in self.params]

    def _nbytes(self) -> list[int]:
        return [
            p.numel() * torch.empty((), dtype=d).element_size()
            for p, d in zip(self.params, self._wire_dtypes(), strict=True)
        ]

    def _kinds(self) -> list[Any]:
        return [(d, p.device) for p, d in zip(self.params, self._wire_dtypes(), strict=True)]

    def _learn(self, dense: list[int]) -> list[list[int]]:
        """The set's first rank (rank 0) groups this step's gradients as Horovod's cycle would; every rank takes its
        plan."""
        plan = None
        root = first_rank(self.process_set)
        if dist.get_rank() == root:
            order = sorted(dense, key=lambda i: (self.times[i], i))
            plan = plan_groups(order, self._nbytes(), self._kinds(), self.threshold, self.times, self.cycle)
        return broadcast_object(plan, root, name="dpcompare.fusion.plan", process_set=self.process_set)
