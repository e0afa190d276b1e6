"""How much communication hides behind compute, and how much compute it slows: measured, or the stated assumption.

A schedule says which collectives *could* run during compute (``Step.hidden``). Two figures correct it:

- ``hide``: the share of that hideable communication that really overlapped the compute it could hide behind;
  the rest waits in the step. 1: all of it (the schedules' own assumption).
- ``slow``: seconds of compute lost per second of communication in flight during it (gloo's or Horovod's thread
  taking a core from backward on a shared CPU; on a GPU, NCCL kernels sharing the SMs and memory bandwidth). 0:
  none (the schedules' assumption).

Corrected step = schedule's step + hidden · ((1 − hide) + hide · slow). The no-overlap upper bound, whatever the
figures, is compute + every collective in a row (``Step.no_overlap``).

They are learnt (:func:`measure`) from a traced run whose communication is slow enough to matter (a short run on
a shaped lab link, ``predict --overlap-from RUN``) against the compute of the run being predicted, traced where
communication was fast: ``slow`` from how much longer its backward compute took per second of communication in
flight inside it; ``hide`` from the seconds of communication inside backward's compute over what the schedule
hides for the same run at the speed its own collectives ran. Both read only intervals: a phase's span and the
spans of the trace's collective events (:func:`.profile._in_flight`), so a GPU trace whose collective events come
from the NCCL stream fits the same mechanism. Only backward's window is read: FSDP's all-gathers prefetched during
forward count as not hidden (DDP's buffer broadcast at forward's start, which is exposed, would otherwise count
as hidden).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from dpcompare.prediction.network import Network, trace_link
from dpcompare.prediction.profile import Profile
from dpcompare.prediction.schedule import Knobs, Schedule, Step

BASIS = "assumed, nothing measured: communication hides wherever the schedule lets it and slows no compute"
ASSUMED = f"{BASIS} (give --overlap-from a traced run on a slow link to measure it)"


@dataclass(frozen=True)
class Overlap:
    hide: float = 1.0
    slow: float = 0.0
    source: str = ASSUMED
    measured: bool = False

    def apply(self, s: Step) -> Step:
        """``s`` with its hideable communication corrected (unchanged under the assumption)."""
        if not self.measured or s.hidden <= 0:
            return s
        extra = s.hidden * ((1 - self.hide) + self.hide * self.slow)
        return dataclasses.replace(s, step=s.step + extra)

    def as_dict(self) -> dict[str, object]:
        return {"hide": round(self.hide, 4), "slow": round(self.slow, 4), "measured": self.measured,
                "source": self.source}


def measure(shaped: Profile, reference: Profile, schedule: type[Schedule], knobs: Knobs) -> Overlap:
    """``hide`` and ``slow`` from ``shaped`` (a traced run on a slow link) against ``reference`` (the compute of the
    same workload and strategy traced on a fast one); the assumption, saying why, when they cannot be read."""
    s = shaped.samples
    link = trace_link(shaped.measured.get("allreduces") or [], shaped.world_size)
    where = f"{shaped.run} (np={shaped.world_size})"
    if s is None or link is None or not len(s):
        return Overlap(source=f"{BASIS}: --overlap-from {where} traced no collective to learn from")
    overlapped = float(statistics.median(s.overlapped))
    hideable = schedule(reference, knobs).run(Network(shaped.world_size, link)).hidden
    if overlapped <= 0 or hideable <= 0:
        return Overlap(source=f"{BASIS}: in --overlap-from {where} no communication ran during backward's "
                              f"compute ({overlapped * 1e3:.1f} ms; the schedule hides {hideable * 1e3:.1f} ms there)")
    hide = min(max(overlapped / hideable, 0.0), 1.0)
    slow = max(shaped.backward - reference.backward, 0.0) / overlapped
    return Overlap(hide, slow, measured=True, source=(
        f"measured on {where}: {overlapped * 1e3:.1f} ms of communication during backward's compute against "
        f"{hideable * 1e3:.1f} ms the schedule hides there (hide {hide:.2f}); backward took "
        f"{(shaped.backward - reference.backward) * 1e3:+.1f} ms against {reference.run} "
        f"(slow {slow:.2f} s of compute per s overlapped)"))
