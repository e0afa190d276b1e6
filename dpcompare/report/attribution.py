"""Why one arm is faster: the difference of each phase of the step, paired over blocks like the verdict.

For every throughput verdict, each block gives the other arm's median phase times minus the baseline's
(data, forward, backward, optimizer, and *other*: the step's median less the phases, where bookkeeping,
the divergence check and waits outside the phases land). The mean of those per-block differences, with its
95 % Student-t interval, says how many milliseconds each phase moved. The strategies' declared communication
(:data:`dpcompare.backends.catalog.COMMUNICATION`) says what each does in the phases that account for it.

Everything is said in milliseconds: when phases offset each other (Horovod's backward shorter because nothing
waits there, its step() longer because the wait moved there), a phase's share of the small net gap is a
meaningless 500 %. ``lines`` are the two short lines the terminal prints; ``text`` the whole sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from dpcompare.backends.catalog import COMMUNICATION, IF_BUFFERS
from dpcompare.files import PHASES
from dpcompare.report.groups import arm_of, arm_pairs, unit_blocks
from dpcompare.report.intervals import Interval, mean_ci, unit_means
from dpcompare.report.mechanisms import threads_of
from dpcompare.trace import UNNAMED

#: the phases of a step in the attribution: the timed ones and the rest of the step
STEP_PARTS = (*PHASES, "other")
#: a phase "accounts for" the gap when it holds at least this share of it
MAIN_SHARE = 0.25


@dataclass(frozen=True)
class PhaseShift:
    phase: str
    diff: Interval           # other − baseline, ms per step
    share: float | None      # diff.mean ÷ the step's mean difference


@dataclass(frozen=True)
class Attribution:
    np: int
    baseline: str
    other: str
    step_diff: Interval      # other − baseline, ms per step (median step time)
    shifts: list[PhaseShift]
    main: list[str]          # phases that account for the gap, largest first
    text: str
    lines: list[str] = field(default_factory=list)  # the terminal's two short lines
    cpu: dict[str, dict[str, Any]] = field(default_factory=dict)  # arm → :func:`thread_cpu` (what took the cores)

    def to_json(self) -> dict[str, Any]:
        def iv(i: Interval) -> dict[str, Any]:
            return {"mean_ms": i.mean, "ci_low_ms": i.lo, "ci_high_ms": i.hi, "blocks": i.n}

        return {"np": self.np, "baseline": self.baseline, "other": self.other, "step": iv(self.step_diff),
                "phases": {s.phase: {**iv(s.diff), "share": s.share} for s in self.shifts},
                "main": self.main, "text": self.text, "lines": self.lines,
                **({"cpu_ms": self.cpu} if self.cpu else {})}


def _parts(run: dict[str, Any]) -> dict[str, float] | None:
    """A run's median ms per step by part, 'other' being the step less the timed phases."""
    phases, step = run.get("phases_ms"), (run.get("step_ms") or {}).get("median")
    if not phases or step is None:
        return None
    parts = {p: float(phases.get(p, 0.0)) for p in PHASES}
    parts["other"] = max(float(step) - sum(parts.values()), 0.0)
    parts["step"] = float(step)
    return parts


def _paired_parts(results: dict[str, Any], baseline: str, other: str, np_: int) -> list[tuple[dict, dict]]:
    per: dict[str, dict[int, dict[str, float]]] = {baseline: {}, other: {}}
    for r in results.get("runs", []):
        a = arm_of(r)
        if a in per and int(r["np"]) == np_ and r.get("status") == "ok" and (parts := _parts(r)):
            per[a][int(r["repeat"])] = parts
    reps = sorted(set(per[baseline]) & set(per[other]))
    return [(per[baseline][k], per[other][k]) for k in reps]


def attribute(results: dict[str, Any], baseline: str, other: str, np_: int) -> Attribution | None:
    """The per-phase paired difference between two arms at ``np_``; None without two common blocks."""
    pairs = _paired_parts(results, baseline, other, np_)
    if len(pairs) < 2:
        return None
    unit = unit_blocks(results)

    def diff(key: str) -> Interval:
        d = unit_means([o[key] - b[key] for b, o in pairs], unit)
        iv = mean_ci(d)
        assert iv is not None
        return iv

    step = diff("step")
    shifts = [PhaseShift(p, iv := diff(p), iv.mean / step.mean if step.mean else None) for p in STEP_PARTS]
    main = _main_phases(shifts, step)
    return Attribution(np_, baseline, other, step, shifts, main,
                       _explain(results, baseline, other, step, shifts, main, np_),
                       _lines(results, baseline, other, step, shifts, main, np_),
                       {a: c for a in (baseline, other) if (c := thread_cpu(results, a, np_))})


def _main_phases(shifts: list[PhaseShift], step: Interval) -> list[str]:
    """Phases that move the same way as the step and hold a real share of it, largest first."""
    same_way = [s for s in shifts if s.share is not None and s.share >= MAIN_SHARE]
    return [s.phase for s in sorted(same_way, key=lambda s: -abs(s.diff.mean))]


def _strategy(results: dict[str, Any], arm: str) -> str:
    for a in (results.get("config") or {}).get("arms") or []:
        if a.get("label") == arm:
            return str(a.get("strategy"))
    return next((str(r["strategy"]) for r in results.get("runs", []) if arm_of(r) == arm), arm)


def communication_in(strategy: str, phase: str, buffers: bool | None = None,
                     results: dict[str, Any] | None = None) -> str | None:
    """What ``strategy`` declares it communicates in ``phase`` (None: nothing); a declaration for models with
    buffers is dropped when the runs recorded none (``buffers`` False) and stated plainly when they had some.

    A built-in strategy's declaration is its catalog line's; a plug-in's, its class's, as the comparison
    recorded it (``results`` ``environment.strategies``)."""
    recorded = ((results or {}).get("environment") or {}).get("strategies") or {}
    declared = COMMUNICATION.get(strategy) or (recorded.get(strategy) or {}).get("communication") or {}
    what = declared.get(phase)
    if what and what.endswith(IF_BUFFERS) and buffers is not None:
        return what.removesuffix(IF_BUFFERS) if buffers else None
    return what


def _buffers(results: dict[str, Any], arm: str) -> bool | None:
    """Whether the arm's model had buffers (summary regime ``buffer_mb``); None when its runs did not record it."""
    mb = [r["regime"]["buffer_mb"] for r in results.get("runs", [])
          if arm_of(r) == arm and isinstance(r.get("regime"), dict) and "buffer_mb" in r["regime"]]
    return any(x > 0 for x in mb) if mb else None


def _unsure(iv: Interval) -> str:
    """A warning when the phase's own interval does not exclude zero."""
    return ", its interval includes 0" if iv.has_ci and iv.lo <= 0.0 <= iv.hi else ""  # type: ignore[operator]


def _ms(v: float) -> str:
    """Milliseconds with the digits that matter: 160 ms, 2.4 ms, 0.28 ms."""
    a = abs(v)
    return f"{a:.0f} ms" if a >= 100 else f"{a:.1f} ms" if a >= 10 else f"{a:.2f} ms"


def _signed(v: float) -> str:
    return ("+" if v >= 0 else "−") + _ms(v)


def _its(phase: str) -> str:
    """How the sentence names a part of the step: "its backward", "the rest of its step" (``other``)."""
    return "the rest of its step" if phase == "other" else f"its {phase}"


def _short(phase: str) -> str:
    return "the rest" if phase == "other" else phase


def _against(shifts: list[PhaseShift]) -> list[PhaseShift]:
    """Phases that move against the step by at least a quarter of its gap (the time moved between phases)."""
    return [s for s in shifts if s.share is not None and s.share <= -MAIN_SHARE]


def _brief(what: str) -> str:
    """A declared communication's first clause, without its parentheses: for one short terminal line."""
    buffers = what.endswith(IF_BUFFERS)
    what = re.sub(r"\s+\((?:[^()]|\([^()]*\))+\)", "", what.removesuffix(IF_BUFFERS))
    return re.split(r"; |, (?=started|whatever|then)", what)[0] + (" (if it has buffers)" if buffers else "")


def _comm(results: dict[str, Any], arms: tuple[str, str], phase: str) -> dict[str, str | None]:
    return {arm: communication_in(_strategy(results, arm), phase, _buffers(results, arm), results) for arm in arms}


def _explain(results: dict[str, Any], baseline: str, other: str, step: Interval, shifts: list[PhaseShift],
             main: list[str], np_: int = 0) -> str:
    """The whole sentence (report and results.json): the net gap, each phase that moved in ms, what each
    strategy communicates there."""
    net = f"{other}'s step is {_ms(step.mean)} {'shorter' if step.mean < 0 else 'longer'} than {baseline}'s"
    if not main:
        return f"{net}, spread over the step: no phase holds a quarter of the gap."
    by = {s.phase: s for s in shifts}
    against = _against(shifts)
    moved = [by[p] for p in main] + against
    text = net + ": " + ", ".join(
        f"{_its(s.phase)} {_ms(s.diff.mean)} {'shorter' if s.diff.mean < 0 else 'longer'}{_unsure(s.diff)}"
        for s in moved)
    text += "." if step.has_ci else " (one unit of blocks: no intervals yet)."
    if against:
        text += (f" The phases offset each other: time moved from {' and '.join(_short(s.phase) for s in against)} "
                 f"to {' and '.join(_short(p) for p in main)}, and only the net {_ms(step.mean)} changes the "
                 "throughput.")
    comm = []
    for s in moved:
        what = _comm(results, (baseline, other), s.phase)
        if any(what.values()):
            comm.append(f"in {_short(s.phase)}, " + "; ".join(f"{arm}: {w}" if w else f"{arm} communicates nothing"
                                                     for arm, w in what.items()))
    if comm:
        silent = _silent_longer(results, baseline, other, moved)
        cores = _cores_sentence(results, baseline, other, np_) if silent else None
        return text + " Communication there — " + " — ".join(comm) + "." + (
            f" In {' and '.join(map(_short, silent))} the arm that took longer communicates nothing. {cores}"
            if cores else "")
    cores = _cores_sentence(results, baseline, other, np_)
    if cores:
        return text + " Neither strategy communicates in " + " or ".join(map(_short, main)) + ". " + cores
    return text + (" Neither strategy communicates in " + " or ".join(map(_short, main)) + ": look at threads and CPU "
                   "contention (a background thread competing for cores, vCPU wake-ups) and per-step framework "
                   "overhead, not at the network.")


def thread_cpu(results: dict[str, Any], arm: str, np_: int) -> dict[str, Any] | None:
    """The arm's CPU ms per step at ``np_`` (results.json ``runs[].cpu_ms``), mean over its ok runs: the main
    thread's (``main``), the other threads' (``helpers``), and the busiest other threads of its first run."""
    runs = [r["cpu_ms"] for r in results.get("runs", []) if arm_of(r) == arm and int(r["np"]) == np_
            and r.get("status") == "ok" and isinstance(r.get("cpu_ms"), dict)]
    if not runs:
        return None
    return {"main": sum(c["main"] for c in runs) / len(runs), "helpers": sum(c["helpers"] for c in runs) / len(runs),
            "threads": runs[0].get("threads") or [], "runs": len(runs)}


def _busiest(cpu: dict[str, Any]) -> str:
    top = (cpu.get("threads") or [None])[0]
    if not top or top.get("ms", 0) < 0.01:
        return ""
    return f", the busiest {'an unnamed thread' if top['name'] == UNNAMED else repr(top['name'])} {_ms(top['ms'])}"


def _cores_sentence(results: dict[str, Any], baseline: str, other: str, np_: int) -> str | None:
    """What took the cores, measured: each arm's other threads' CPU ms per step (the libraries' background and
    communication threads), beside the main thread's; None when the runs did not record it."""
    cpu = {a: thread_cpu(results, a, np_) for a in (other, baseline)}
    if not all(cpu.values()):
        return None
    o, b = cpu[other], cpu[baseline]
    assert o is not None and b is not None
    more, less = (other, baseline) if o["helpers"] >= b["helpers"] else (baseline, other)
    m, lo = cpu[more], cpu[less]
    assert m is not None and lo is not None
    return (f"What took the cores: besides its main thread, {more} ran {_ms(m['helpers'])} of CPU per step on other "
            f"threads ({threads_of(_strategy(results, more), results)}{_busiest(m)}), {less} {_ms(lo['helpers'])} "
            f"({threads_of(_strategy(results, less), results)}); the main threads took {_ms(o['main'])} ({other}) and "
            f"{_ms(b['main'])} ({baseline}) of CPU per step. Threads that compete with compute for the cores slow "
            "the phases that communicate nothing.")


def _lines(results: dict[str, Any], baseline: str, other: str, step: Interval, shifts: list[PhaseShift],
           main: list[str], np_: int = 0) -> list[str]:
    """Two or three short lines for the terminal: the phases that moved, in ms; the communication in the first;
    what took the cores where the arm that took longer communicates nothing (when the runs measured it)."""
    net = f"{other}'s step {_ms(step.mean)} {'shorter' if step.mean < 0 else 'longer'} than {baseline}'s"
    if not main:
        return [f"{net}, spread over the step (no phase holds a quarter of it)"]
    by = {s.phase: s for s in shifts}
    moved = [by[p] for p in main] + _against(shifts)
    first = f"{net}: " + ", ".join(f"{_short(s.phase)} {_signed(s.diff.mean)}" for s in moved)
    if not step.has_ci:
        first += " (no intervals yet)"
    phase = main[0]
    what = _comm(results, (baseline, other), phase)
    if not any(what.values()):
        cpu = {a: thread_cpu(results, a, np_) for a in (other, baseline)}
        if all(cpu.values()):
            return [first, f"in {_short(phase)} neither communicates; other threads' CPU per step: " + ", ".join(
                f"{a} {_ms(c['helpers'])}" for a, c in cpu.items() if c) + " (main: " + " vs ".join(
                _ms(c["main"]) for c in cpu.values() if c) + f"; {threads_of(_strategy(results, other), results)})"]
        return [first, f"in {_short(phase)} neither communicates: threads, CPU contention, framework overhead"]
    lines = [first, f"in {_short(phase)} — " + "; ".join(f"{arm}: {_brief(w) if w else 'nothing'}"
                                                        for arm, w in what.items())]
    silent = _silent_longer(results, baseline, other, moved)
    cpu = {a: thread_cpu(results, a, np_) for a in (other, baseline)}
    if silent and all(cpu.values()):
        lines.append(f"in {' and '.join(map(_short, silent))} the longer arm communicates nothing; other threads' "
                     "CPU per step: " + ", ".join(f"{a} {_ms(c['helpers'])}" for a, c in cpu.items() if c)
                     + f" ({threads_of(_strategy(results, other), results)})")
    return lines


def _silent_longer(results: dict[str, Any], baseline: str, other: str, moved: list[PhaseShift]) -> list[str]:
    """The moved phases where the arm that took longer communicates nothing (its time went elsewhere: the cores)."""
    out = []
    for s in moved:
        longer = other if s.diff.mean > 0 else baseline
        if s.phase != "other" and not _comm(results, (longer,), s.phase)[longer]:
            out.append(s.phase)
    return out


def attributions(results: dict[str, Any]) -> list[Attribution]:
    """One attribution per throughput verdict that has at least two paired blocks, paired as the verdicts are
    (:func:`~dpcompare.report.groups.arm_pairs`: within each link of a link sweep)."""
    return [a for n, base, other in arm_pairs(results) if (a := attribute(results, base, other, n)) is not None]


def for_report(results: dict[str, Any], recompute: bool = False) -> list[dict[str, Any]]:
    """The attributions as results.json stores them (``attributions``), computed from the runs when absent,
    when the comparison is unfinished, or with ``recompute``."""
    stored = results.get("attributions")
    if not recompute and results.get("complete", True) and isinstance(stored, list) and stored \
            and all(isinstance(a, dict) and "phases" in a for a in stored):
        return stored
    return [a.to_json() for a in attributions(results)]
