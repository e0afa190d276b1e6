"""Horovod's step: a background thread fuses the gradients ready in each cycle; ``optimizer.step()`` waits.

Assumptions:
- The background thread wakes every ``HOROVOD_CYCLE_TIME`` (cycles counted from the start of backward), or at
  once when the previous cycle's work took longer. Each cycle takes the gradients ready by then, in ready order,
  and fuses consecutive ones into all-reduces of up to ``HOROVOD_FUSION_THRESHOLD`` bytes (a larger tensor goes
  alone); they run one at a time.
- Each cycle with work first agrees which tensors are ready everywhere: with the response cache warm, a bit-vector
  all-reduce of a few bytes, priced as the bench's smallest all-reduce less its bytes' wire time (its fixed cost,
  which the α-β fit leaves out), or 2⌈log2 n⌉·α without a bench.
- On a shaped link with a burst (:class:`.network.Bucket`) an all-reduce that follows another before the link's
  bucket refilled waits for the bytes it lacks; the bucket is full when backward starts.
- ``optimizer.step()`` starts when backward's compute is done and then waits for the last all-reduce; the
  optimizer then runs. Horovod syncs no buffers.
- No slowdown of compute by the background thread (on a shared CPU there is: :mod:`.overlap`, when measured); weak
  scaling; fp16 or bf16 compression halves the bytes and costs nothing else.
"""

from __future__ import annotations

import math

from dpcompare.knobs import horovod_fusion
from dpcompare.prediction.network import Network
from dpcompare.prediction.profile import Grad
from dpcompare.prediction.schedule import MB, Schedule, Step
from dpcompare.trace import ALL_REDUCE


def fuse(grads: list[Grad], threshold: float) -> list[list[Grad]]:
    """Consecutive groups of ``grads`` of at most ``threshold`` bytes (a larger tensor alone): Horovod's fusion
    (:func:`dpcompare.knobs.horovod_fusion`, the native layer's plan too), which never lets a fused buffer exceed the
    threshold (DDP's buckets may: :func:`.schedule.fill`)."""
    return [[grads[i] for i in group] for group in horovod_fusion(range(len(grads)), [g.nbytes for g in grads],
                                                                   threshold=threshold)]


class HorovodSchedule(Schedule):
    name = "horovod"
    tunable = ("horovod_fusion_mb", "horovod_cycle_ms", "grad_compression")

    def backend(self) -> str:
        """nccl on GPUs; gloo or mpi on CPUs; ``mpi-rd`` (`lab bench`'s label) under ``--mpi-allreduce
        recursive-doubling``, ``mpi-<algorithm>`` for another forced algorithm (no bench record: the plain link)."""
        cfg = self.profile.config
        if self.profile.device.startswith("cuda"):
            return "nccl"
        if str(cfg.get("horovod_ops", "default")) == "gloo":
            return "gloo"
        algorithm = str(cfg.get("mpi_allreduce", "default"))
        return {"default": "mpi", "recursive-doubling": "mpi-rd"}.get(algorithm, f"mpi-{algorithm}")

    def negotiation(self, net: Network) -> float:
        """One cycle's agreement, a bit-vector all-reduce of a few bytes: what the bench's smallest all-reduce paid
        beyond its bytes' wire time (:meth:`.network.Network.fixed`), else 2⌈log2 n⌉·α."""
        if net.ranks < 2:
            return 0.0
        fixed = net.fixed(self.backend(), ALL_REDUCE)
        if fixed is not None:
            return fixed
        return 2 * math.ceil(math.log2(net.ranks)) * net.link(self.backend(), ALL_REDUCE, nbytes=1.0).alpha

    def predict(self, net: Network) -> Step:
        p, k = self.profile, self.knobs
        c = k.horovod_cycle_ms / 1e3
        negotiate = self.negotiation(net)
        costs: list[float] = []
        nbytes, t, free, i, cycles = 0.0, 0.0, 0.0, 0, 0
        bucket = net.bucket()
        grads = p.grads
        while i < len(grads):
            if grads[i].ready > t:  # asleep until the first cycle tick at or after the next ready gradient
                t += math.ceil((grads[i].ready - t) / c - 1e-9) * c if c > 0 else grads[i].ready - t
            ready = [g for g in grads[i:] if g.ready <= t + 1e-12]
            i += len(ready)
            cycles += 1
            free = max(free, t) + negotiate
            costs.append(negotiate)
            for group in fuse(ready, k.horovod_fusion_mb * MB):
                size = sum(g.nbytes for g in group) * k.wire
                cost = bucket.cost(ALL_REDUCE, size, self.backend(), free)
                free += cost
                costs.append(cost)
                nbytes += size
            t = max(t + c, free)
        wait = max(free - p.backward, 0.0)
        step = p.data + p.forward + p.backward + wait + self.optimizer(net.ranks)
        return self.step(net, step, costs, nbytes, cycles=cycles, fused_allreduces=len(costs) - cycles,
                         wait_in_step_ms=round(wait * 1e3, 4))
