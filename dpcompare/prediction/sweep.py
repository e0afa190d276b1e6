"""A schedule over host counts: step time, efficiency against one host, who wins where, which knob helps.

Scaling efficiency is weak scaling (the same batch per rank): the throughput at H hosts over H times the
throughput of one host, which is one host's step over H hosts' step (one host of one rank communicates nothing).

Every figure has a band (:class:`Noise`): a percentile bootstrap over the inputs' own noise. Each replicate
draws the traced (rank, step) rows again with replacement (:meth:`.profile.Profile.resampled`: the compute, the
gradients' ready times, the traced all-reduces of the floor) and each bench size's repeats
(:meth:`.network.Bench.profiles`), and runs the schedule again; the band is the replicates' 2.5th to 97.5th
percentile (numpy). Where the bench saw two speeds the step is the mixture's expectation and both modes' steps are
given. A band wider than ±5 % says which input to measure more of. The **interval** widens the band by the model's
own error as a validation measured it (:mod:`.interval`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpcompare.prediction.interval import ModelError
from dpcompare.prediction.network import Bench, Network, trace_link
from dpcompare.prediction.overlap import Overlap
from dpcompare.prediction.profile import Profile
from dpcompare.prediction.schedule import Knobs, Schedule, Step
from dpcompare.prediction.strategies import schedule, trace_floors

#: knob → the factors tried for advice, and how the flag is spelt
TRIES: dict[str, tuple[tuple[float, ...], str]] = {
    "bucket_mb": ((0.5, 2, 4), "--bucket-mb"), "horovod_fusion_mb": ((0.25, 0.5, 2), "--bucket-mb"),
    "horovod_cycle_ms": ((0.2, 0.5, 2, 5), "--horovod-cycle-ms"), "grad_compression": (("fp16",), "--grad-compression")}
MIN_GAIN = 0.01  # a knob must shorten the step by at least 1 % to be advised
BAND_WIDE = 0.05  # a band wider than ±5 % of its figure asks for more measurements


@dataclass(frozen=True)
class Noise:
    """What a band is drawn from: the traced steps (always), the bench's repeats (``bench``: None without measured
    rows), the trace's all-reduces when they floor the link (``floor_from_trace``); and how."""

    bench: Bench | None = None
    floor_from_trace: bool = False
    replicates: int = 200  # 0: no band
    seed: int = 0
    level: float = 0.95


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
    #: per host count (one host first, then ``steps``): the band's (low, high) step and efficiency; empty: no band
    bands: list[tuple[float, float]] = field(default_factory=list)
    eff_bands: list[tuple[float, float]] = field(default_factory=list)
    #: per host count, the step in Open MPI's fast and slow mode, where the bench saw two; empty otherwise
    modes: list[tuple[float, float]] = field(default_factory=list)
    overlap: Overlap = field(default_factory=Overlap)
    band_advice: str = ""
    band_info: dict[str, Any] = field(default_factory=dict)
    #: per host count (one host first): the band widened by ``model_error``; empty: no model error given
    intervals: list[tuple[float, float]] = field(default_factory=list)
    model_error: ModelError | None = None
    #: the traced step (s) no prediction at ``floor_hosts`` hosts or more goes below (:func:`step_floor`); 0: none
    floor_step: float = 0.0
    floor_hosts: int = 0

    def band(self, i: int) -> tuple[float, float]:
        """The step's band at ``steps[i]`` (the point itself without a band)."""
        return self.bands[i + 1] if self.bands else (self.steps[i].step, self.steps[i].step)

    def efficiency(self, s: Step) -> float:
        return self.base.step / s.step if s.step > 0 else 0.0

    def below(self, threshold: float) -> int | None:
        """The first host count asked at which efficiency falls below ``threshold``, or None."""
        return next((s.hosts for s in self.steps if self.efficiency(s) < threshold), None)

    def step_dict(self, i: int) -> dict[str, Any]:
        s = self.steps[i]
        out = {**s.as_dict(), "efficiency": round(self.efficiency(s), 4)}
        if self.bands:
            (lo, hi), (elo, ehi) = self.bands[i + 1], self.eff_bands[i + 1]
            out.update(step_ms_low=round(lo * 1e3, 4), step_ms_high=round(hi * 1e3, 4),
                       efficiency_low=round(elo, 4), efficiency_high=round(ehi, 4))
        if self.intervals:
            lo, hi = self.intervals[i + 1]
            out.update(interval_ms_low=round(lo * 1e3, 4), interval_ms_high=round(hi * 1e3, 4))
        if self.modes:
            out.update(fast_mode_step_ms=round(self.modes[i + 1][0] * 1e3, 4),
                       slow_mode_step_ms=round(self.modes[i + 1][1] * 1e3, 4))
        return out

    def as_dict(self, threshold: float) -> dict[str, Any]:
        return {"label": self.label, "strategy": self.strategy, "run": self.run,
                "knobs": dataclasses.asdict(self.knobs),
                "one_host_step_ms": round(self.base.step * 1e3, 4), "threshold": threshold,
                "below_threshold_at_hosts": self.below(threshold), "advice": self.advice, "notes": self.notes,
                "traced_run": self.measured,
                "band": self.band_info, "band_advice": self.band_advice, "overlap": self.overlap.as_dict(),
                "model_error": self.model_error.as_dict() if self.model_error else None,
                "steps": [self.step_dict(i) for i in range(len(self.steps))]}


def knobs_of(p: Profile, over: dict[str, Any]) -> Knobs:
    """The run's own settings (dpcompare's --bucket-mb sets DDP's bucket and Horovod's fusion buffer alike),
    library defaults where it left them, then the command line's ``over`` (None: keep)."""
    cfg, d = p.config, Knobs()
    mine = {"bucket_mb": float(cfg.get("bucket_mb") or d.bucket_mb), "horovod_fusion_mb": float(cfg.get("bucket_mb")
            or d.horovod_fusion_mb), "horovod_cycle_ms": float(cfg.get("horovod_cycle_ms") or d.horovod_cycle_ms),
            "grad_compression": str(cfg.get("grad_compression") or "none")}
    mine.update({k: v for k, v in over.items() if v is not None})
    return Knobs(**mine)


MEASURED = ("step_ms", "step_ms_median", "backward_ms", "comm_ms_per_step", "overlap_pct", "wait_ms_per_step",
            "allreduce_ops_per_step",
            "allreduce_bytes_per_step", "allreduce_wait_s", "pooled_runs")


def self_check(p: Profile, sched: Schedule) -> dict[str, Any] | None:
    """The model at the traced run's own size, on the link its all-reduces themselves ran on
    (:func:`.network.trace_link`), against the traced steps' median; None without both."""
    n, measured = p.world_size, p.measured.get("step_ms_median")
    link = trace_link(p.measured.get("allreduces") or [], n)
    if sched.name != p.strategy or link is None or not measured:
        return None
    model = sched.run(Network(n, link)).step * 1e3
    return {"busbw_gbit": round(link.bandwidth * 8 / 1e9, 4), "alpha_us": round(link.alpha * 1e6, 1),
            "model_step_ms": round(model, 4),
            "traced_step_ms": round(measured, 4), "error_pct": round(100 * (model / measured - 1), 1)}


def step_floor(p: Profile, name: str, noise: Noise) -> float:
    """With ``floor_from_trace`` (a slower link than the traced run's, on the same machines), the traced step: at
    its host count or more a slower link cannot make ``p``'s own strategy faster than it ran. 0: no floor."""
    return p.traced_step if noise.floor_from_trace and name == p.strategy else 0.0


def floored(s: Step, floor: float, hosts: int) -> Step:
    """``s``, no shorter than ``floor`` where it has ``hosts`` hosts or more (its communication then exposed)."""
    if s.hosts < hosts or s.step >= floor:
        return s
    return dataclasses.replace(s, step=floor, detail={**s.detail, "floored_by_traced_step": True})


def curve(p: Profile, name: str, knobs: Knobs, net: Network, hosts: Sequence[int], label: str,
          noise: Noise | None = None, overlap: Overlap | None = None, model_error: ModelError | None = None) -> Curve:
    """``name``'s schedule on ``p``'s compute at one host and at ``hosts``, corrected by ``overlap``; with its band
    (``noise``), the band widened by ``model_error`` and, where the bench saw two speeds, the step in each."""
    sched, ov, noise = schedule(name)(p, knobs), overlap or Overlap(), noise or Noise()
    traced = {"strategy": p.strategy, "world_size": p.world_size, "compute_ms": round(p.compute * 1e3, 4),
              **{k: p.measured.get(k) for k in MEASURED}, "self_check": self_check(p, sched)}
    counts, floor = [1, *hosts], step_floor(p, name, noise)
    points = [floored(ov.apply(sched.run(net.with_hosts(h))), floor, p.world_size) for h in counts]
    c = Curve(label, name, p.run, knobs, points[0], points[1:], knob_text=sched.describe_knobs(), notes=list(p.notes),
              measured=traced, overlap=ov, floor_step=floor, floor_hosts=p.world_size)
    if held := [s.hosts for s in points if s.detail.get("floored_by_traced_step")]:
        c.notes.append(f"at {_counts(held)} host{'s' * (held[-1] > 1)} the model's step fell below the traced one "
                       f"({floor * 1e3:.1f} ms at np={p.world_size}): the traced step is given (--floor-from-trace: "
                       "a slower link cannot make it shorter)")
    if noise.bench is not None and noise.bench.bimodal:
        fast, slow = ([floored(ov.apply(sched.run(
            dataclasses.replace(net, profiles={**net.profiles, **noise.bench.profiles(m)}).with_hosts(h))),
            floor, p.world_size).step for h in counts] for m in ("fast", "slow"))
        c.modes = list(zip(fast, slow, strict=True))
    if noise.replicates > 0:
        _band(c, p, net, counts, noise)
    if model_error is not None:
        c.model_error = model_error
        c.intervals = [model_error.interval(s.step, c.bands[i] if c.bands else (s.step, s.step))
                       for i, s in enumerate(points)]
    return c


def _replicates(c: Curve, p: Profile, net: Network, counts: Sequence[int], noise: Noise, n: int, trace: bool = True,
                bench: bool = True, launches: bool = True) -> np.ndarray:
    """``n`` bootstrap replicates (rows) of the step at each of ``counts``: the traced rows, the launches' spread
    and/or the bench's repeats drawn again (numpy's Generator, seeded: the same replicates every run)."""
    rng = np.random.default_rng(noise.seed)
    out = np.empty((n, len(counts)))
    for k in range(n):
        pk, nk = p.resampled(rng) if trace else p, net
        f = p.launch_factor(rng) if launches else 1.0
        if bench and noise.bench is not None:
            nk = dataclasses.replace(nk, profiles={**net.profiles, **noise.bench.profiles("expected", rng)})
        if trace and noise.floor_from_trace:
            nk = dataclasses.replace(nk, floors=trace_floors(pk))
        sched, floor = schedule(c.strategy)(pk, c.knobs), pk.traced_step if c.floor_step else 0.0
        out[k] = [floored(c.overlap.apply(sched.run(nk.with_hosts(h))), floor, c.floor_hosts).moved(f).step
                  for h in counts]
    return out


def _band(c: Curve, p: Profile, net: Network, counts: Sequence[int], noise: Noise) -> None:
    """The curve's bands (step and efficiency per host count) and, when one is wider than ±5 %, what to measure."""
    arr = _replicates(c, p, net, counts, noise, noise.replicates)
    q = [50 * (1 - noise.level), 50 * (1 + noise.level)]
    lo, hi = np.percentile(arr, q, axis=0)
    elo, ehi = np.percentile(arr[:, :1] / arr, q, axis=0)
    c.bands = [(float(a), float(b)) for a, b in zip(lo, hi, strict=True)]
    c.eff_bands = [(float(a), float(b)) for a, b in zip(elo, ehi, strict=True)]
    traced = len(p.samples) if p.samples is not None else 0
    runs = p.samples.launches if p.samples is not None else 1
    spread = p.spread if p.spread is not None and p.spread.df > 0 else None
    repeats = noise.bench.repeats if noise.bench is not None else None
    how = ((f" within each of {runs} traced runs" if runs > 1 else "") + ", the step less its bytes' time on the link "
           "scaled by the launches' spread (Student's t)" if spread
           else (f" of {runs} traced runs, the runs drawn first" if runs > 1 else ""))
    c.band_info = {"level": noise.level, "replicates": noise.replicates, "traced_steps": traced, "traced_runs": runs,
                   "launch_spread": spread.as_dict() if spread else None, "bench_repeats_per_size": repeats,
                   "method": "percentile bootstrap over the traced (rank, step) rows" + how
                   + (" and each bench size's repeats" if repeats else "")}
    points = [c.base, *c.steps]
    half = [(b - a) / 2 / s.step if s.step > 0 else 0.0 for (a, b), s in zip(c.bands, points, strict=True)]
    worst = int(np.argmax(half))
    if half[worst] <= BAND_WIDE:
        return
    at = f"{c.label}: band ±{100 * half[worst]:.0f} % at {counts[worst]} host{'s' * (counts[worst] > 1)}, wider than " \
         f"±{100 * BAND_WIDE:.0f} %"
    n = max(noise.replicates // 2, 20)

    def width(**held: bool) -> float:
        return float(np.ptp(np.percentile(_replicates(c, p, net, counts[worst:worst + 1], noise, n, **held), q)))

    parts = {"trace": width(bench=False, launches=False), "bench": width(trace=False, launches=False) if repeats
             else 0.0, "launches": width(trace=False, bench=False) if spread else 0.0}
    more = max(2 * traced, 10)
    c.band_advice = f"{at}: " + {
        "bench": f"mostly the bench's repeats ({repeats} times per size): bench again with twice as many "
                 "(`lab bench --repeats 4` or more)",
        "trace": f"mostly the traced steps ({traced} rank-steps): trace more (--trace with {more} or more rank-steps)",
        "launches": f"mostly what moves between launches (±{100 * spread.sd:.0f} % from one to the next): a run you "
                    f"launch moves that much whatever was traced; more traced launches narrow only their mean's part "
                    f"({runs} of this arm; compare --repeats {2 * runs} --trace N), a quieter machine both" if spread
                    else ""}[max(parts, key=parts.__getitem__)]


def advise(c: Curve, p: Profile, net: Network, threshold: float) -> str:
    """One line: the knob setting that shortens the step most where it matters (the first host count below
    ``threshold`` efficiency, else the largest), and by how much."""
    at = next((s for s in c.steps if c.efficiency(s) < threshold), c.steps[-1])
    cls: type[Schedule] = schedule(c.strategy)
    best: tuple[float, str, Step] | None = None
    for knob in cls.tunable:
        factors, flag = TRIES[knob]
        for f in factors:
            if knob == "grad_compression" and c.knobs.grad_compression != "none":
                continue  # already 2 bytes a value on the wire
            value = f if knob == "grad_compression" else getattr(c.knobs, knob) * f
            s = floored(c.overlap.apply(cls(p, dataclasses.replace(c.knobs, **{knob: value})).run(
                net.with_hosts(at.hosts))), c.floor_step, c.floor_hosts)
            spelt = f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"
            if best is None or s.step < best[0]:
                best = (s.step, spelt, s)
    where = f"{c.label} at {at.hosts} hosts"
    if best is None or best[0] > at.step * (1 - MIN_GAIN):
        tried = ", ".join(TRIES[k][1] for k in cls.tunable) or "no knob"
        return f"{where}: none of {tried} shortens the step by {pct(MIN_GAIN)} or more"
    s = best[2]
    moved = abs(s.hidden - at.hidden)  # said when it shows at the two decimals printed
    hidden = (f", hides {s.hidden * 1e3:.2f} ms instead of {at.hidden * 1e3:.2f}" if at.hidden > 0 and
              moved > 0.01 * at.hidden and moved >= 5e-6 else "")
    return (f"{where}: {best[1]} would cut exposed communication from {at.exposed * 1e3:.2f} to "
            f"{s.exposed * 1e3:.2f} ms (step {100 * (s.step / at.step - 1):+.0f} %, efficiency "
            f"{pct(c.efficiency(at))} → {pct(c.base.step / s.step)}{hidden})")


def winners(curves: Sequence[Curve], hosts: Sequence[int]) -> list[tuple[int, str]]:
    """(hosts, label of the fastest curve) for every host count."""
    return [(h, min(curves, key=lambda c: c.steps[i].step).label) for i, h in enumerate(hosts)]


def undecided(curves: Sequence[Curve], i: int) -> list[str]:
    """The curves whose band at ``hosts[i]`` overlaps the fastest one's (empty: the fastest is told apart)."""
    best = min(curves, key=lambda c: c.steps[i].step)
    lo = best.band(i)[0]
    return [c.label for c in curves if c is not best and c.band(i)[0] <= best.band(i)[1] and c.band(i)[1] >= lo]


def verdict(curves: Sequence[Curve], hosts: Sequence[int]) -> list[str]:
    """Who wins where and the crossovers, in sentences; where the bands overlap, said so."""
    if len(curves) < 2:
        return []
    runs: list[tuple[str, int, int, int]] = []  # label, first hosts, last hosts, index of the last
    for i, (h, label) in enumerate(winners(curves, hosts)):
        if runs and runs[-1][0] == label:
            runs[-1] = (label, runs[-1][1], h, i)
        else:
            runs.append((label, h, h, i))
    lines = []
    for label, a, b, last in runs:
        first = hosts.index(a)
        ties = {h: undecided(curves, i) for i, h in enumerate(hosts[first:last + 1], start=first)}
        tied = [h for h, t in ties.items() if t]
        where = f"{a}–{b} hosts" if a != b else f"{a} host{'s' * (a > 1)}"
        lines.append(f"fastest at {where}: {label}" + ("" if not tied else " (bands overlap with "
                     f"{', '.join(sorted({x for t in ties.values() for x in t}))} at {_counts(tied)} hosts: not told "
                     "apart there)"))
    for (x, _, b, i), (y, a, _, _) in zip(runs, runs[1:], strict=False):
        close = bool(undecided(curves, i) or undecided(curves, i + 1))
        lines.append(f"crossover between {b} and {a} hosts: {y} overtakes {x}" +
                     (" (inside the bands: where exactly is not decided)" if close else ""))
    if len(runs) == 1:
        lines.append(f"no crossover between {hosts[0]} and {hosts[-1]} hosts")
    computes = [c.base.step for c in curves]
    if max(computes) > 1.2 * min(computes) and len({c.run for c in curves}) > 1:
        lines.append(f"the runs' own compute differs ({min(computes) * 1e3:.1f} to {max(computes) * 1e3:.1f} ms per "
                     "step on one host), so the winner reflects the traced compute as much as the network: give "
                     "--strategies to model every strategy on each run's compute")
    return lines


def _counts(hosts: Sequence[int]) -> str:
    return ", ".join(map(str, hosts)) if len(hosts) <= 4 else f"{hosts[0]}–{hosts[-1]}"
