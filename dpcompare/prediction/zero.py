"""ZeRO-1's step (torch ZeroRedundancyOptimizer over DDP): DDP's backward, then a sharded update and the
parameters sent back to every rank.

Assumptions:
- Backward exactly as :mod:`.ddp` (same buckets, same all-reduces; ``overlap_with_ddp`` is not used).
- Each rank updates 1/n of the parameters: the optimizer's compute is the traced full update divided by n.
- After the update every rank broadcasts the parameters it owns (fp32, never compressed); the n broadcasts of
  P/n bytes are issued together and priced as the all-gather of P bytes they amount to, fully exposed.
- Plus DDP's forward buffer broadcast; the other assumptions of :mod:`.ddp`.
"""

from __future__ import annotations

from dpcompare.prediction.ddp import DDPSchedule
from dpcompare.prediction.network import Network
from dpcompare.prediction.schedule import Step
from dpcompare.trace import ALL_GATHER, ALL_REDUCE


class ZeroSchedule(DDPSchedule):
    name = "zero"
    shards_optimizer = True

    def link_bound(self, net: Network, nbytes: float) -> float:
        """DDP's all-reduces, and the parameters' all-gather (the last ``grad_bytes`` of ``nbytes``)."""
        params = self.profile.grad_bytes
        return net.bytes_time(ALL_REDUCE, nbytes - params) + net.bytes_time(ALL_GATHER, params)

    def predict(self, net: Network) -> Step:
        p = self.profile
        bcast = self.buffers_broadcast(net)
        backward, costs, nbytes = self.backward(net)
        params = net.cost(ALL_GATHER, p.grad_bytes, self.backend())
        step = p.data + p.forward + bcast + backward + self.optimizer(net.ranks) + params
        comm = costs + [params] + ([bcast] if bcast else [])
        return self.step(net, step, comm, nbytes + p.grad_bytes, buckets=len(costs),
                         parameter_gather_ms=round(params * 1e3, 4))
