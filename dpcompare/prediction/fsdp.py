"""FSDP2's step (``fully_shard`` on every module that owns parameters): all-gathers before each unit's forward
and backward, a reduce-scatter after each unit's backward.

Assumptions:
- A unit is a module that owns parameters (parameters named ``a.b.weight`` and ``a.b.bias`` form unit ``a.b``);
  its backward order is the order its gradients became ready, its forward order the reverse.
- Forward compute is shared among units in proportion to their bytes; a unit's backward compute runs from the
  previous unit's last gradient to its own last gradient (the traced timeline).
- Before a unit computes, its parameters are all-gathered (fp32); the next unit's all-gather is issued when
  this unit starts computing (prefetch of one). After a unit's backward its gradients are reduce-scattered
  (fp16 or bf16 if asked). Every collective runs one at a time, in the order issued. Parameters are freed after
  forward and gathered again for backward.
- Each rank updates its 1/n shard: the optimizer's compute is the traced full update divided by n.
- Gradient ticks of a traced ``fsdp`` run come after the reduce-scatter: trace ddp or single and predict it
  with ``--strategies fsdp`` for a compute timeline without communication in it.
"""

from __future__ import annotations

from dpcompare.prediction.network import Network
from dpcompare.prediction.schedule import Schedule, Step
from dpcompare.trace import ALL_GATHER, REDUCE_SCATTER


class FSDPSchedule(Schedule):
    name = "fsdp"
    tunable = ("grad_compression",)
    shards_optimizer = True

    def link_bound(self, net: Network, nbytes: float) -> float:
        """All-gathers and reduce-scatters (a reduce-scatter moves what an all-gather does)."""
        return net.bytes_time(ALL_GATHER, nbytes)

    def units(self) -> list[tuple[str, float, float]]:
        """(unit, bytes, backward compute seconds) in backward order."""
        order: list[str] = []
        size: dict[str, float] = {}
        last: dict[str, float] = {}
        for g in self.profile.grads:
            unit = g.name.rpartition(".")[0]
            if unit not in size:
                order.append(unit)
            size[unit] = size.get(unit, 0.0) + g.nbytes
            last[unit] = g.ready
        order.sort(key=lambda u: last[u])
        ends = [last[u] for u in order]
        return [(u, size[u], end - (ends[i - 1] if i else 0.0)) for i, (u, end) in enumerate(zip(order, ends,
                                                                                                  strict=True))]

    def _pass(self, work: list[tuple[float, float, float]], comm: list[float]) -> float:
        """One pass (forward or backward) over units given as (all-gather s, compute s, reduce-scatter s, 0 if
        none); appends every collective's seconds to ``comm``; returns when the pass and its collectives end."""
        free = done = 0.0  # the channel's and the compute's next free moment
        gathered = [0.0] * len(work)
        gathered[0] = free = work[0][0]
        for i, (_, compute, scatter) in enumerate(work):
            start = max(done, gathered[i])
            if i + 1 < len(work):  # prefetch the next unit's parameters
                free = max(free, start) + work[i + 1][0]
                gathered[i + 1] = free
            done = start + compute
            if scatter:
                free = max(free, done) + scatter
        comm += [w[0] for w in work] + [w[2] for w in work if w[2]]
        return max(done, free)

    def predict(self, net: Network) -> Step:
        p, k, b = self.profile, self.knobs, self.backend()
        units = self.units()
        total = sum(s for _, s, _ in units) or 1.0
        gather = {u: net.cost(ALL_GATHER, s, b) for u, s, _ in units}
        fwd = [(gather[u], p.forward * s / total, 0.0) for u, s, _ in reversed(units)]
        bwd = [(gather[u], d, net.cost(REDUCE_SCATTER, s * k.wire, b)) for u, s, d in units]
        comm: list[float] = []
        forward, backward = self._pass(fwd, comm), self._pass(bwd, comm)
        step = p.data + forward + max(backward, p.backward) + self.optimizer(net.ranks)
        nbytes = 2 * total + total * k.wire
        return self.step(net, step, comm, nbytes, units=len(units))
