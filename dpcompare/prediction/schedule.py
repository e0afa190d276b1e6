"""What every strategy's schedule shares: the knobs, the result of one predicted step, and a helper (fill).

A schedule takes a compute :class:`~.profile.Profile` and the :class:`Knobs`, and for a
:class:`~.network.Network` places the strategy's collectives on the step's timeline (in seconds from the start
of the step's forward), one collective at a time on one communication channel (gloo, MPI and NCCL each run a
process group's collectives in order). ``exposed`` is what the step lost to the network against the same step
with none; ``hidden`` the rest of the time a collective was in flight.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dpcompare.knobs import HOROVOD_CYCLE_MS, HOROVOD_FUSION_BYTES
from dpcompare.prediction.network import Network
from dpcompare.prediction.profile import Grad, Profile
from dpcompare.trace import ALL_REDUCE

MB = 2**20


@dataclass(frozen=True)
class Knobs:
    """The settings that change a schedule (MB are MiB, as the libraries count them)."""

    bucket_mb: float = 25.0  # DDP bucket_cap_mb
    #: DDP's first bucket; None: the same as the others. torch 2.15 uses its 1 MB first bucket only when
    #: bucket_cap_mb is left unset, and dpcompare always sets it (older torch used 1 MB always)
    first_bucket_mb: float | None = None
    horovod_fusion_mb: float = HOROVOD_FUSION_BYTES / MB  # HOROVOD_FUSION_THRESHOLD
    horovod_cycle_ms: float = HOROVOD_CYCLE_MS  # HOROVOD_CYCLE_TIME
    #: gradients on the wire: "none" (fp32), "fp16" or "bf16" (both 2 bytes: the wire time halves, the cast is free)
    grad_compression: str = "none"

    @property
    def wire(self) -> float:
        """Bytes on the wire per byte of fp32 gradient."""
        return 1.0 if self.grad_compression == "none" else 0.5


@dataclass
class Step:
    """One predicted step (seconds)."""

    strategy: str
    hosts: int
    ranks: int
    step: float
    compute: float  # the same step with an infinitely fast network
    comm: float  # total time a collective was in flight
    ops: int  # collectives per step
    wire_bytes: float  # bytes each rank sends into its collectives per step (the messages' sizes)
    batch: int  # samples per rank per step
    detail: dict[str, Any] = field(default_factory=dict)
    #: the time its bytes need on the link at the link's rate alone (no latency, no library's own cost): the part
    #: of the step the machine's state does not move (:meth:`moved`)
    link_bound: float = 0.0

    @property
    def exposed(self) -> float:
        return max(self.step - self.compute, 0.0)

    @property
    def hidden(self) -> float:
        return max(self.comm - self.exposed, 0.0)

    @property
    def no_overlap(self) -> float:
        """The upper bound: the compute and then every collective in a row, none overlapping."""
        return self.compute + self.comm

    def moved(self, f: float) -> Step:
        """The step in a launch whose machine ran ``f`` times as long: every part but its bytes' time on the link
        (:attr:`link_bound`, which the link's rate sets) scaled by ``f``; the compute too."""
        fixed = min(self.link_bound, self.step)
        return dataclasses.replace(self, step=fixed + (self.step - fixed) * f, compute=self.compute * f)

    @property
    def throughput(self) -> float:
        return self.ranks * self.batch / self.step if self.step > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        ms = {k: round(getattr(self, k) * 1e3, 4) for k in ("step", "compute", "comm", "exposed", "hidden",
                                                             "no_overlap")}
        return {"strategy": self.strategy, "hosts": self.hosts, "ranks": self.ranks,
                **{f"{k}_ms": v for k, v in ms.items()}, "ops": self.ops, "wire_bytes": round(self.wire_bytes),
                "samples_per_s": round(self.throughput, 3), **self.detail}


class Schedule:
    """Base of the per-strategy schedules: subclasses set ``name`` and write :meth:`predict`."""

    name: ClassVar[str] = ""
    #: the optimizer updates 1/n of the parameters (ZeRO, FSDP): its compute shrinks with the ranks
    shards_optimizer: ClassVar[bool] = False
    #: the :class:`Knobs` fields this schedule reads (what ``predict`` tries ×2, ×4, ÷2 for advice)
    tunable: ClassVar[tuple[str, ...]] = ()

    def __init__(self, profile: Profile, knobs: Knobs) -> None:
        self.profile, self.knobs = profile, knobs

    def backend(self) -> str:
        """The library that carries the collectives (the key into a calibration): torch's process group."""
        return "nccl" if self.profile.device.startswith("cuda") else "gloo"

    def optimizer(self, ranks: int) -> float:
        p = self.profile
        full = p.optimizer * (p.world_size if p.sharded else 1)
        return full / ranks if self.shards_optimizer else full

    def compute(self, ranks: int) -> float:
        p = self.profile
        return p.data + p.forward + p.backward + self.optimizer(ranks)

    def link_bound(self, net: Network, nbytes: float) -> float:
        """The time the step's ``nbytes`` of all-reduce messages need on the link at its rate alone."""
        return net.bytes_time(ALL_REDUCE, nbytes)

    def step(self, net: Network, step: float, comm: Sequence[float], nbytes: float, **detail: Any) -> Step:
        return Step(self.name, net.hosts, net.ranks, step, self.compute(net.ranks), sum(comm), len(comm), nbytes,
                    self.profile.batch, detail, link_bound=self.link_bound(net, nbytes))

    def predict(self, net: Network) -> Step:
        raise NotImplementedError

    def run(self, net: Network) -> Step:
        """:meth:`predict`, except that one rank alone communicates nothing (Horovod registers no hooks then)."""
        if net.ranks == 1:
            return self.step(net, self.compute(1), [], 0.0)
        return self.predict(net)

    def describe_knobs(self) -> str:
        """The knobs this schedule reads, as the flags spell them."""
        k = self.knobs
        said = {
            "bucket_mb": f"bucket {k.bucket_mb:g} MB",
            "horovod_fusion_mb": f"fusion {k.horovod_fusion_mb:g} MB",
            "horovod_cycle_ms": f"cycle {k.horovod_cycle_ms:g} ms",
            "grad_compression": f"{k.grad_compression} on the wire"
            if k.grad_compression != "none"
            else "fp32 on the wire",
        }
        return ", ".join(said[t] for t in self.tunable)


def fill(grads: Sequence[Grad], caps: Sequence[float]) -> list[list[Grad]]:
    """Consecutive groups of ``grads``, each closed once it holds at least its cap in bytes (the k-th group's cap
    is ``caps[min(k, len(caps) - 1)]``); a gradient is never split, so a group can exceed its cap."""
    groups: list[list[Grad]] = []
    current: list[Grad] = []
    size = 0.0
    for g in grads:
        current.append(g)
        size += g.nbytes
        if size >= caps[min(len(groups), len(caps) - 1)]:
            groups.append(current)
            current, size = [], 0.0
    return groups + [current] if current else groups
