"""``dpcompare train --trace N``: the recorder, the trace format and its figures (no strategy, no trainer).

What a strategy records during a step sits here, below the backends: :class:`TraceRecorder`, the
categories and lanes, :func:`write_trace`, and :func:`communication_figures` (pure arithmetic on the
events, which the trainer writes to ``summary.json`` and the report tabulates: both sides need it, and
``training`` may not import ``report``). The trainer's side (which steps, the merge) is
:class:`dpcompare.training.tracing.TraceSession`; reading and drawing a trace file is
:mod:`dpcompare.report.timeline`; Horovod's own timeline is converted in
:mod:`dpcompare.backends.horovod_timeline`.

After the warm-up, N steps are recorded on every rank: the phases the trainer's :class:`PhaseTimer`
already times (data, forward, backward, optimizer), a tick when each parameter's gradient is ready
(``register_post_accumulate_grad_hook``, the same under every strategy) and whatever communication
the strategy can show (its tracer, :class:`dpcompare.backends.parts.Tracer`): DDP's bucket all-reduces from a comm hook,
Horovod's negotiation and fused all-reduces from its own timeline plus the wait inside ``step()``.
Each rank stamps its events in microseconds since the Unix epoch (``perf_counter`` anchored once to
``time.time``), so ranks on one host share one clock (across hosts, as well as their clocks agree).
Rank 0 gathers every rank's events and writes ``OUT/trace.json`` (opens in ui.perfetto.dev and
chrome://tracing), and :func:`communication_figures` turns it into the ``communication`` block of
``summary.json``.

Layout of ``trace.json``: one process (``pid``) per rank, threads (``tid``): :data:`LANE_PHASES` (a
``step`` span with the phase spans inside; Horovod's wait nested in ``optimizer``), :data:`LANE_GRADS`
(gradient-ready instants), :data:`LANE_COMM` and up (all-reduce spans, category ``allreduce``, with
``bytes`` and ``tensors`` in ``args``; DDP gives each bucket its own lane because buckets overlap) and,
for Horovod, one lane per tensor as Horovod's timeline draws it.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dpcompare.files import PHASES, atomic_write_json

TRACE_FILE = "trace.json"
LANE_PHASES, LANE_GRADS, LANE_COMM, LANE_BROADCAST = 0, 1, 2, 3
#: DDP bucket ``i`` is drawn on lane ``LANE_BUCKETS + i``; Horovod tensor ``j`` on ``LANE_TENSORS + j``
LANE_BUCKETS, LANE_TENSORS = 100, 1000
CAT_STEP, CAT_PHASE, CAT_GRAD, CAT_COMM, CAT_COMM_PHASE, CAT_WAIT = (
    "step", "phase", "grad_ready", "allreduce", "allreduce_phase", "wait")
LANE_NAMES = {LANE_PHASES: "step phases", LANE_GRADS: "gradient ready", LANE_COMM: "all-reduce"}


class TraceRecorder:
    """Collects one rank's events; every timestamp is microseconds since the Unix epoch (float)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._offset_us = (time.time() - time.perf_counter()) * 1e6
        self.events: list[dict[str, Any]] = []
        self.lanes: dict[int, str] = dict(LANE_NAMES)
        self.notes: list[str] = []

    def us(self, perf_counter_s: float) -> float:
        """A ``time.perf_counter()`` reading on the trace's clock."""
        return perf_counter_s * 1e6 + self._offset_us

    def now(self) -> float:
        return self.us(time.perf_counter())

    def span(self, name: str, cat: str, start_us: float, end_us: float, tid: int = LANE_PHASES,
             **args: Any) -> None:
        ev = {"name": name, "cat": cat, "ph": "X", "ts": start_us, "dur": max(end_us - start_us, 0.0),
              "pid": self.rank, "tid": tid}
        if args:
            ev["args"] = args
        self.events.append(ev)  # list.append is atomic: safe from gloo's and autograd's threads

    def tick(self, name: str, cat: str, ts_us: float, tid: int = LANE_GRADS, **args: Any) -> None:
        ev = {"name": name, "cat": cat, "ph": "i", "s": "t", "ts": ts_us, "pid": self.rank, "tid": tid}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def step(self, index: int, start_perf: float, laps: dict[str, float]) -> None:
        """One step from the trainer's phase timer: the ``step`` span and a span per phase inside it."""
        t = start_perf
        spans = []
        for phase in PHASES:
            if phase in laps:
                spans.append((phase, t, t + laps[phase]))
                t += laps[phase]
        self.span(f"step {index}", CAT_STEP, self.us(start_perf), self.us(t), step=index)
        for phase, a, b in spans:
            self.span(phase, CAT_PHASE, self.us(a), self.us(b), step=index)

    def metadata(self) -> list[dict[str, Any]]:
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}},
                {"name": "process_sort_index", "ph": "M", "pid": self.rank, "args": {"sort_index": self.rank}}]
        for tid, name in sorted(self.lanes.items()):
            meta.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": tid,
                         "args": {"sort_index": tid}})
        return meta


def write_trace(path: Path, events: list[dict[str, Any]], info: dict[str, Any]) -> Path:
    """Chrome-trace JSON (object form): timestamps relative to the earliest event, its epoch time in ``otherData``."""
    stamped = [e for e in events if "ts" in e]
    origin = min((e["ts"] for e in stamped), default=0.0)
    out = []
    for e in events:
        if "ts" in e:
            e = {**e, "ts": round(e["ts"] - origin, 3)}
            if "dur" in e:
                e["dur"] = round(e["dur"], 3)
        out.append(e)
    data = {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"clock": "microseconds since clock_origin_epoch_us", "clock_origin_epoch_us": origin,
                          **info}}
    return atomic_write_json(path, data)


# -- figures ---------------------------------------------------------------------------------------------
def union_spans(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def spans_length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def clip_spans(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def steps_by_rank(events: Sequence[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") == CAT_STEP:
            out.setdefault(e["pid"], []).append(e)
    return {r: sorted(s, key=lambda e: e["ts"]) for r, s in sorted(out.items())}


def events_in(events: Sequence[dict[str, Any]], step: dict[str, Any], cat: str) -> list[dict[str, Any]]:
    """Events of ``cat`` on the step's rank that start inside the step."""
    a, b = step["ts"], step["ts"] + step["dur"]
    return [e for e in events if e.get("cat") == cat and e["pid"] == step["pid"] and a <= e["ts"] <= b]


# -- the network's formulas: one home for the trace's figures, `lab bench` and `predict` --------------------
#: the collective a ``CAT_COMM`` event stands for (``args["collective"]``; absent: an all-reduce), and the one
#: spelling of each collective in bench files, calibrations and predictions
ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER = "all_reduce", "broadcast", "all_gather", "reduce_scatter"
#: DDP's all-reduce of a sparse gradient: gloo coalesces it, all-gathers every rank's indices and values and sums
#: them locally, so on the wire it is an all-gather (``bytes``: the gathered indices and values)
SPARSE_ALL_REDUCE = "sparse_all_reduce"
COLLECTIVES = (ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER, SPARSE_ALL_REDUCE)
#: spellings read in files and flags written before there was one (``lab bench`` files up to 0.2)
OLD_NAMES = {"allreduce": ALL_REDUCE, "allgather": ALL_GATHER, "reducescatter": REDUCE_SCATTER}
#: bits per second of each host's link, set by ``dpcompare lab`` for the ranks it runs (or by the user)
LINK_ENV = "DPCOMPARE_LINK_BPS"


def collective_name(name: str) -> str:
    """A collective's name as dpcompare spells it (``all_reduce``); older spellings (``allreduce``,
    ``all-reduce``) read too."""
    name = name.strip().lower().replace("-", "_")
    return OLD_NAMES.get(name, name)


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``collective`` over ``n`` ranks: what each rank's link must carry per
    byte of the operation (``bytes`` is the full buffer: all-gather's output, reduce-scatter's input)."""
    if collective == ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if collective in (ALL_GATHER, REDUCE_SCATTER, SPARSE_ALL_REDUCE):
        return (n - 1) / n
    if collective == BROADCAST:
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def latency_steps(collective: str, n: int) -> int:
    """The message steps that each pay the latency α in ``collective`` over ``n`` ranks: a ring's 2(n−1) for an
    all-reduce, n−1 for an all-gather or reduce-scatter, a pipelined tree's ⌈log2 n⌉ for a broadcast."""
    if collective == ALL_REDUCE:
        return 2 * (n - 1)
    if collective == BROADCAST:
        return math.ceil(math.log2(n)) if n > 1 else 0
    return n - 1


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of times ``ys`` against sizes ``xs``: the α-β fit, wherever dpcompare fits one.

    Theil-Sen (scipy.stats.theilslopes, ``method="joint"``: the median of the pairwise slopes, the intercept the
    median of what is left), not least squares: a measured collective is only ever slower than its line (it
    waited for a late peer, for a core that backward held, for tokens a shaped link had not refilled), never
    faster, and a median ignores those while least squares tilts towards them.
    """
    from scipy.stats import theilslopes  # here, not at the top: dpcompare --help loads this module

    slope, intercept, _, _ = theilslopes(ys, xs, method="joint")
    return float(intercept), float(slope)


def idle_gap_s(burst_bytes: float, rate_Bps: float) -> float:
    """How long `lab bench` idles a shaped link before each operation it times: twice the time the link's
    token bucket (tbf's burst of ``burst_bytes``) takes to refill at ``rate_Bps``; 0 without a bucket."""
    return 2 * burst_bytes / rate_Bps if burst_bytes > 0 and rate_Bps > 0 else 0.0


def burst_of_gap(gap_s: float, rate_Bps: float) -> float:
    """The burst an idle gap of ``gap_s`` refilled at ``rate_Bps`` (:func:`idle_gap_s` the other way round)."""
    return gap_s / 2 * rate_Bps if gap_s > 0 and rate_Bps > 0 else 0.0


def link_from_env(environ: dict[str, str] | None = None) -> float | None:
    """The link rate ``DPCOMPARE_LINK_BPS`` gives (bits/s), or None (unset, empty, not a positive number)."""
    raw = (os.environ if environ is None else environ).get(LINK_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def collective_of(event: dict[str, Any]) -> str:
    return str((event.get("args") or {}).get("collective", ALL_REDUCE))


def aligned_starts(events: Sequence[dict[str, Any]]) -> dict[int, float]:
    """``id(event)`` → when its collective could start: the latest start of the same operation over the ranks.

    A rank's span begins when *it* issued the operation, so it includes waiting for slower ranks; the
    operation itself cannot begin before the last rank issued it (nccl-tests synchronises ranks for this
    reason). The same operation: the same step, collective and position among that rank's operations of the
    kind in the step. Where the ranks recorded different numbers of them (or one rank only, as with Horovod's
    own timeline), the spans are kept as they are.
    """
    ops: dict[tuple[int, str], dict[int, list[dict[str, Any]]]] = {}
    for rank, steps in steps_by_rank(events).items():
        for st in steps:
            for e in sorted(events_in(events, st, CAT_COMM), key=lambda e: e["ts"]):
                ops.setdefault((st["args"]["step"], collective_of(e)), {}).setdefault(rank, []).append(e)
    out: dict[int, float] = {}
    for per_rank in ops.values():
        lists = list(per_rank.values())
        if len(lists) < 2 or len({len(x) for x in lists}) != 1:
            continue
        for same in zip(*lists, strict=True):
            start = max(e["ts"] for e in same)
            out.update({id(e): min(max(e["ts"], start), e["ts"] + e["dur"]) for e in same})
    return out


def _step_row(events: Sequence[dict[str, Any]], st: dict[str, Any], starts: dict[int, float]) -> dict[str, Any]:
    """One rank's traced step: collective time (union of the spans from :func:`aligned_starts`), the part hidden
    behind backward's computation (between the start of backward and its last gradient-ready tick), per
    collective the same, bytes and operations."""
    comm = events_in(events, st, CAT_COMM)
    bw = next((e for e in events_in(events, st, CAT_PHASE) if e["name"] == "backward"), None)
    computing: tuple[float, float] | None = None
    if bw:  # backward computes until its last gradient is ready; after that it only waits
        ticks = [e["ts"] for e in events_in(events, st, CAT_GRAD) if bw["ts"] <= e["ts"]]
        computing = (bw["ts"], min(max(ticks, default=bw["ts"] + bw["dur"]), bw["ts"] + bw["dur"]))

    def split(spans: list[dict[str, Any]]) -> tuple[float, float]:
        busy = union_spans((starts.get(id(e), e["ts"]), e["ts"] + e["dur"]) for e in spans)
        return spans_length(busy), spans_length(clip_spans(busy, *computing)) if computing else 0.0

    kinds = {}
    for kind in COLLECTIVES:
        mine = [e for e in comm if collective_of(e) == kind]
        if mine:
            busy, hidden = split(mine)
            kinds[kind] = {"ops": len(mine), "bytes": sum((e.get("args") or {}).get("bytes", 0) for e in mine),
                           "busy": busy, "hidden": hidden}
    busy, hidden = split(comm)
    return {"rank": st["pid"], "comm": busy, "hidden": hidden, "kinds": kinds, "ops": len(comm),
            "wait": sum(e["dur"] for e in events_in(events, st, CAT_WAIT)), "step": st["dur"],
            "backward": bw["dur"] if bw else 0.0}


def _collective_figures(kind: str, rows: list[dict[str, Any]], n: int, link: float | None) -> dict[str, Any]:
    """Per traced step (mean over ``rows``): operations, bytes, time with one in flight; algbw = bytes / that
    time, busbw = algbw × :func:`bus_factor`, in Gbit/s, and busbw as a share of the link when it is known."""
    per = [r["kinds"].get(kind, {"ops": 0, "bytes": 0, "busy": 0.0, "hidden": 0.0}) for r in rows]
    m = max(len(per), 1)
    busy_s = sum(p["busy"] for p in per) / 1e6
    algbw = sum(p["bytes"] for p in per) * 8 / busy_s / 1e9 if busy_s > 0 else None
    busbw = algbw * bus_factor(kind, n) if algbw is not None else None
    return {"count": sum(p["ops"] for p in per) / m, "bytes_per_step": sum(p["bytes"] for p in per) / m,
            "ms_per_step": busy_s * 1e3 / m,
            "hidden_pct": 100.0 * sum(p["hidden"] for p in per) / (busy_s * 1e6) if busy_s > 0 else None,
            "algbw_gbit_s": algbw, "busbw_gbit_s": busbw,
            "busbw_pct_link": 100.0 * busbw * 1e9 / link if busbw is not None and link else None}


def communication_figures(events: Sequence[dict[str, Any]], world_size: int | None = None,
                          link: float | None = None) -> dict[str, Any]:
    """Per traced step (means over steps and over the ranks that recorded communication).

    ``comm_ms_per_step``: time with at least one collective in flight (from the moment the last rank issued it:
    :func:`aligned_starts`; waiting for a slower rank is not communication), split into ``hidden_ms_per_step`` (behind
    backward's computation: between the start of ``backward`` and its last gradient-ready tick; DDP's backward
    also waits for the last buckets, which is not hidden) and ``exposed_ms_per_step`` (the rest: the step waited);
    ``overlap_pct`` = ``hidden_pct``; ``collectives``: per kind (all_reduce, broadcast, all_gather,
    reduce_scatter, sparse_all_reduce) what :func:`_collective_figures` gives, nccl-tests' algbw and busbw with
    ``world_size`` ranks (default: the ranks in the trace) and busbw as a share of ``link`` (bits/s);
    ``allreduce_bytes_per_step`` and ``allreduce_ops_per_step``: the all-reduces (DDP: buckets; Horovod: fused
    operations); ``wait_ms_per_step``: time blocked in ``optimizer.step()`` waiting for them (Horovod).
    """
    starts = aligned_starts(events)
    rows = [_step_row(events, st, starts) for steps in steps_by_rank(events).values() for st in steps]
    ranks = sorted({r["rank"] for r in rows})
    n = world_size or max(len(ranks), 1)
    with_comm = sorted({r["rank"] for r in rows if r["ops"]})
    use = [r for r in rows if r["rank"] in with_comm] or rows
    m = max(len(use), 1)
    comm, hidden = sum(r["comm"] for r in use), sum(r["hidden"] for r in use)
    kinds = {k: _collective_figures(k, use, n, link) for k in COLLECTIVES if any(k in r["kinds"] for r in use)}
    allreduce = kinds.get(ALL_REDUCE, {"count": 0.0, "bytes_per_step": 0.0})
    return {
        "traced_steps": len(rows) // max(len(ranks), 1),
        "world_size": n,
        "ranks_with_comm": with_comm,
        "link_gbit_s": link / 1e9 if link else None,
        "comm_ms_per_step": comm / m / 1e3,
        "exposed_ms_per_step": (comm - hidden) / m / 1e3,
        "hidden_ms_per_step": hidden / m / 1e3,
        "hidden_pct": 100.0 * hidden / comm if comm > 0 else None,
        "overlap_pct": 100.0 * hidden / comm if comm > 0 else None,
        "collectives": kinds,
        "allreduce_bytes_per_step": allreduce["bytes_per_step"],
        "allreduce_ops_per_step": allreduce["count"],
        "wait_ms_per_step": sum(r["wait"] for r in rows) / max(len(rows), 1) / 1e3,
        "step_ms": sum(r["step"] for r in rows) / max(len(rows), 1) / 1e3,
        "backward_ms": sum(r["backward"] for r in rows) / max(len(rows), 1) / 1e3,
    }


def trace_figures(data: dict[str, Any]) -> dict[str, Any]:
    """:func:`communication_figures` of a loaded trace.json, with the world size and link rate it recorded."""
    other = data.get("otherData") or {}
    return communication_figures(data["traceEvents"], other.get("world_size"), other.get("link_bps"))


# -- what took the cores: the CPU time of this process's threads over the timed steps -----------------------------

#: helper threads a run's summary names, the busiest first
NAMED_THREADS = 6


def thread_cpu_s() -> dict[int, tuple[str, float]]:
    """Every thread of this process: its id → (its name, CPU seconds so far, user + system), read from
    ``/proc/self/task`` (Linux; elsewhere nothing). gloo names its threads (``gloo_tcp_loop``,
    ``pt_gloo_runloop``); Horovod's background thread and OpenMP's workers keep the process's name."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
        tick = float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, AttributeError):
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)": the state is field 3
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except (OSError, IndexError):
            continue  # the thread ended between the listing and the reading
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)  # utime, stime (fields 14, 15)
    return out


#: what a helper thread that kept the process's name is called (Horovod's background thread, OpenMP's workers)
UNNAMED = "unnamed"


def unnamed(name: str, threads: dict[int, tuple[str, float]], main: int) -> str:
    """A thread's name, or :data:`UNNAMED` when it is only the process's (the main thread's) name."""
    return UNNAMED if main in threads and name == threads[main][0] else name


class CpuClock:
    """The CPU time of the thread that runs the steps (``main``) and of every other thread of the process
    (``helpers``: the libraries' background and communication threads, intra-op workers) over the timed steps.

    Each timed step reads two clocks at its start and end (``time.thread_time``, ``time.process_time``: a few
    microseconds), so the split is exact per step and evaluation between steps is left out; the threads are
    read from ``/proc`` once at the first timed step and once at :meth:`figures`, to say which helper threads
    took the time (their shares of the helpers' CPU over that window)."""

    def __init__(self) -> None:
        self.main_s = self.all_s = 0.0
        self.steps = 0
        self._start: tuple[float, float] | None = None
        self._threads: dict[int, tuple[str, float]] | None = None

    def begin(self) -> None:
        if self._threads is None:
            self._threads = thread_cpu_s()
        self._start = (time.thread_time(), time.process_time())

    def end(self) -> None:
        if self._start is None:
            return
        self.main_s += time.thread_time() - self._start[0]
        self.all_s += time.process_time() - self._start[1]
        self.steps += 1
        self._start = None

    def figures(self) -> dict[str, Any] | None:
        """ms per timed step of the main thread and of the others, and the busiest other threads (name, ms per
        step); None when no step was timed."""
        if not self.steps:
            return None
        main = 1e3 * self.main_s / self.steps
        helpers = max(1e3 * (self.all_s - self.main_s) / self.steps, 0.0)
        return {"main": main, "helpers": helpers, "threads": self._busiest(helpers)}

    def _busiest(self, helpers_ms: float) -> list[dict[str, Any]]:
        before, now, me = self._threads or {}, thread_cpu_s(), threading.get_native_id()
        spent = {
            tid: (unnamed(name, now, me), cpu - before.get(tid, (name, 0.0))[1])
            for tid, (name, cpu) in now.items()
            if tid != me
        }
        total = sum(s for _, s in spent.values())
        if total <= 0:
            return []
        top = sorted(spent.items(), key=lambda kv: -kv[1][1])[:NAMED_THREADS]
        return [{"name": name, "tid": tid, "ms": helpers_ms * s / total} for tid, (name, s) in top if s > 0]
