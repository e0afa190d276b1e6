"""DDP's step: buckets all-reduced during backward, one at a time; the step waits for the last.

Assumptions:
- Buckets are filled in the order the gradients became ready (DDP rebuilds them so after the first step) up to
  ``bucket_cap_mb`` (the first one up to ``first_bucket_mb`` when set: torch's 1 MB first bucket, which torch
  2.15 uses only when bucket_cap_mb is not given); a parameter is never split, so a bucket closes at the first
  gradient that brings it to its cap or beyond.
- A bucket's all-reduce starts when its last gradient is ready and the previous bucket's all-reduce is done (on
  a shaped link with a burst, paying for the bytes the link's bucket has not refilled: :class:`.network.Bucket`);
  with the traced wait for the last rank (``--straggler-from-trace``: :meth:`.network.Network.wait`), that much
  later, priced without it: the wait then delays the wire instead of hiding under it;
  backward returns when both its compute and the last all-reduce are done (then the optimizer runs).
- With buffers (BatchNorm statistics) rank 0 broadcasts them at the start of every forward, exposed.
- Communication does not slow the compute it overlaps (it does on a shared CPU: :mod:`.overlap` corrects the
  step when it was measured), and the gradients'
  compute is the traced one whatever the number of hosts (weak scaling, same batch per rank).
- fp16 or bf16 compression halves the bytes on the wire and costs nothing else.
"""

from __future__ import annotations

from dpcompare.prediction.network import Network
from dpcompare.prediction.profile import Grad
from dpcompare.prediction.schedule import MB, Schedule, Step, fill
from dpcompare.trace import ALL_REDUCE, BROADCAST


class DDPSchedule(Schedule):
    name = "ddp"
    tunable = ("bucket_mb", "grad_compression")

    def buckets(self) -> list[list[Grad]]:
        k = self.knobs
        first = k.bucket_mb if k.first_bucket_mb is None else min(k.first_bucket_mb, k.bucket_mb)
        return fill(self.profile.grads, [first * MB, k.bucket_mb * MB])

    def buffers_broadcast(self, net: Network) -> float:
        nbytes = self.profile.buffer_bytes or 0.0
        return net.cost(BROADCAST, nbytes, self.backend()) if nbytes else 0.0

    def backward(self, net: Network) -> tuple[float, list[float], float]:
        """(end of backward after its start, each bucket's all-reduce seconds, bytes on the wire)."""
        buckets = self.buckets()
        sizes = [sum(g.nbytes for g in b) * self.knobs.wire for b in buckets]
        bucket, costs, free, wait = net.bucket(), [], 0.0, net.wait(self.backend())
        for b, s in zip(buckets, sizes, strict=True):
            start = max(max(g.ready for g in b) + wait, free)
            costs.append(bucket.cost(ALL_REDUCE, s, self.backend(), start, own=wait > 0))
            free = start + costs[-1]
        return max(self.profile.backward, free), costs, sum(sizes)

    def predict(self, net: Network) -> Step:
        p = self.profile
        bcast = self.buffers_broadcast(net)
        backward, costs, nbytes = self.backward(net)
        step = p.data + p.forward + bcast + backward + self.optimizer(net.ranks)
        comm = costs + ([bcast] if bcast else [])
        return self.step(net, step, comm, nbytes + (p.buffer_bytes or 0.0) * bool(bcast),
                         buckets=len(costs), wait_after_backward_ms=round((backward - p.backward) * 1e3, 4))
