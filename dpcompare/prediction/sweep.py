"""A schedule over host counts: step time, efficiency against one host, who wins where, which knob helps.

Scaling efficiency is weak scaling (the same batch per rank): the throughput at H hosts over H times the
throughput of one host, which is one host's step over H hosts' step (one host of one rank communicates nothing).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dpcompare.prediction.network import Link, Network
from dpcompare.prediction.profile import Profile
from dpcompare.prediction.schedule import Knobs, Schedule, Step
from dpcompare.prediction.strategies import schedule

#: knob → the factors tried for advice, and how the flag is spelt
TRIES: dict[str, tuple[tuple[float, ...], str]] = {
    "bucket_mb": ((0.5, 2, 4), "--bucket-mb"), "fusion_mb": ((0.25, 0.5, 2), "--bucket-mb"),
    "cycle_ms": ((0.2, 0.5, 2, 5), "--horovod-cycle-ms"), "fp16": ((1,), "--grad-compression fp16")}
MIN_GAIN = 0.01  # a knob must shorten the step by at least 1 % to be advised


def pct(x: float) -> str:
    return f"{100 * x:.0f} %"


@dataclass
class Curve:
    """One strategy modelled on one run's compute, at every host count asked."""

    label: str
    strategy: str
    run: str
    knobs: Knobs
    base: Step  # one host
    steps: list[Step]
    advice: str = ""
    knob_text: str = ""
    measured: dict[str, Any] = field(default_factory=dict)  # the traced run's own figures, at its own size
    notes: list[str] = field(default_factory=list)

    def efficiency(self, s: Step) -> float:
        return self.base.step / s.step if s.step > 0 else 0.0

    def below(self, threshold: float) -> int | None:
        """The first host count asked at which efficiency falls below ``threshold``, or None."""
        return next((s.hosts for s in self.steps if self.efficiency(s) < threshold), None)

    def as_dict(self, threshold: float) -> dict[str, Any]:
        return {"label": self.label, "strategy": self.strategy, "run": self.run, "knobs": dataclasses.asdict(self.knobs),
                "one_host_step_ms": round(self.base.step * 1e3, 4), "threshold": threshold,
                "below_threshold_at_hosts": self.below(threshold), "advice": self.advice, "notes": self.notes, "traced_run": self.measured,
                "steps": [{**s.as_dict(), "efficiency": round(self.efficiency(s), 4)} for s in self.steps]}


def knobs_of(p: Profile, over: dict[str, Any]) -> Knobs:
    """The run's own settings (dpcompare's --bucket-mb sets DDP's bucket and Horovod's fusion buffer alike),
    library defaults where it left them, then the command line's ``over`` (None: keep)."""
    cfg, d = p.config, Knobs()
    mine = {"bucket_mb": float(cfg.get("bucket_mb") or d.bucket_mb), "fusion_mb": float(cfg.get("bucket_mb")
            or d.fusion_mb), "cycle_ms": float(cfg.get("horovod_cycle_ms") or d.cycle_ms),
            "fp16": cfg.get("grad_compression") == "fp16"}
    mine.update({k: v for k, v in over.items() if v is not None})
    return Knobs(**mine)


MEASURED = ("step_ms", "step_ms_median", "backward_ms", "comm_ms_per_step", "overlap_pct", "wait_ms_per_step", "allreduce_ops_per_step",
            "allreduce_bytes_per_step")


def self_check(p: Profile, sched: Schedule) -> dict[str, Any] | None:
    """The model at the traced run's own size, on the all-reduce speed the trace itself shows (the median
    bus bandwidth of its all-reduces, no latency), against the traced steps' median; None without both."""
    n, measured = p.world_size, p.measured.get("step_ms_median")
    ops = p.measured.get("allreduces") or []
    if sched.name != p.strategy or n < 2 or not ops or not measured:
        return None
    busbw = statistics.median(2 * (n - 1) / n * b / t for b, t in ops)
    model = sched.run(Network(n, Link(0.0, busbw))).step * 1e3
    return {"busbw_gbit": round(busbw * 8 / 1e9, 4), "model_step_ms": round(model, 4),
            "traced_step_ms": round(measured, 4), "error_pct": round(100 * (model / measured - 1), 1)}


def curve(p: Profile, name: str, knobs: Knobs, net: Network, hosts: Sequence[int], label: str) -> Curve:
    sched = schedule(name)(p, knobs)
    traced = {"strategy": p.strategy, "world_size": p.world_size, "compute_ms": round(p.compute * 1e3, 4),
              **{k: p.measured.get(k) for k in MEASURED}, "self_check": self_check(p, sched)}
    return Curve(label, name, p.run, knobs, sched.run(net.with_hosts(1)), [sched.run(net.with_hosts(h)) for h in hosts],
                 knob_text=sched.describe_knobs(), notes=list(p.notes), measured=traced)


def advise(c: Curve, p: Profile, net: Network, threshold: float) -> str:
    """One line: the knob setting that shortens the step most where it matters (the first host count below
    ``threshold`` efficiency, else the largest), and by how much."""
    at = next((s for s in c.steps if c.efficiency(s) < threshold), c.steps[-1])
    cls: type[Schedule] = schedule(c.strategy)
    best: tuple[float, str, Step] | None = None
    for knob in cls.tunable:
        factors, flag = TRIES[knob]
        for f in factors:
            value = (not c.knobs.fp16) if knob == "fp16" else getattr(c.knobs, knob) * f
            if knob == "fp16" and not value:
                continue
            s = cls(p, dataclasses.replace(c.knobs, **{knob: value})).run(net.with_hosts(at.hosts))
            spelt = flag if knob == "fp16" else f"{flag} {value:g}"
            if best is None or s.step < best[0]:
                best = (s.step, spelt, s)
    where = f"{c.label} at {at.hosts} hosts"
    if best is None or best[0] > at.step * (1 - MIN_GAIN):
        tried = ", ".join(TRIES[k][1] for k in cls.tunable) or "no knob"
        return f"{where}: none of {tried} shortens the step by {pct(MIN_GAIN)} or more"
    s = best[2]
    hidden = (f", hides {s.hidden * 1e3:.2f} ms instead of {at.hidden * 1e3:.2f}" if at.hidden > 0 and
              abs(s.hidden - at.hidden) > 0.01 * at.hidden else "")
    return (f"{where}: {best[1]} would cut exposed communication from {at.exposed * 1e3:.2f} to "
            f"{s.exposed * 1e3:.2f} ms (step {100 * (s.step / at.step - 1):+.0f} %, efficiency "
            f"{pct(c.efficiency(at))} → {pct(c.base.step / s.step)}{hidden})")


def winners(curves: Sequence[Curve], hosts: Sequence[int]) -> list[tuple[int, str]]:
    """(hosts, label of the fastest curve) for every host count."""
    return [(h, min(curves, key=lambda c: c.steps[i].step).label) for i, h in enumerate(hosts)]


def verdict(curves: Sequence[Curve], hosts: Sequence[int]) -> list[str]:
    """Who wins where and the crossovers, in sentences."""
    if len(curves) < 2:
        return []
    runs: list[tuple[str, int, int]] = []  # label, first hosts, last hosts
    for h, label in winners(curves, hosts):
        if runs and runs[-1][0] == label:
            runs[-1] = (label, runs[-1][1], h)
        else:
            runs.append((label, h, h))
    lines = [f"fastest at {a}–{b} hosts: {label}" if a != b else f"fastest at {a} host{'s' * (a > 1)}: {label}"
             for label, a, b in runs]
    for (x, _, b), (y, a, _) in zip(runs, runs[1:], strict=False):
        lines.append(f"crossover between {b} and {a} hosts: {y} overtakes {x}")
    if len(runs) == 1:
        lines.append(f"no crossover between {hosts[0]} and {hosts[-1]} hosts")
    computes = [c.base.step for c in curves]
    if max(computes) > 1.2 * min(computes) and len({c.run for c in curves}) > 1:
        lines.append(f"the runs' own compute differs ({min(computes) * 1e3:.1f} to {max(computes) * 1e3:.1f} ms per "
                     "step on one host), so the winner reflects the traced compute as much as the network: give "
                     "--strategies to model every strategy on each run's compute")
    return lines
