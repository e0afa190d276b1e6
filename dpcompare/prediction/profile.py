"""The compute of one step, read from a traced run: what the model keeps when it takes the network away.

From ``trace.json`` (see :mod:`dpcompare.trace`), per rank and traced step: the data and forward phases, the
backward phase up to its last gradient-ready tick (after that DDP's backward only waits for buckets), each
gradient's ready moment counted from the start of backward, and the optimizer phase less Horovod's wait inside
``step()``. Medians over every rank and traced step; each (rank, step) is also kept (:class:`Samples`) so that a
bootstrap can resample them (:meth:`Profile.resampled`), with the seconds a collective was in flight and how many
of them fell inside backward's compute (what :mod:`.overlap` reads on a run whose link is slow). A gradient's
bytes come from its tick (``bytes``, traces from this version on), else from the all-reduce that carried it (a
bucket's or fused operation's bytes shared equally among its tensors), else from the parameters' total in
summary.json shared equally. The traced all-reduces are kept as (bytes, seconds) for the floor, with the median
time a rank's all-reduce waited for the last rank to issue it (``allreduce_wait_s``, for ``--straggler-from-trace``).

Several traced launches of an arm are pooled (:func:`pooled`). What moves between launches (where the processes
landed, the machine's state) is larger on a shared machine than the steps of one launch show, and a bootstrap over
two or three launches cannot see how large: :func:`launch_spread` estimates it from every arm's launches together
(a random-effects model: one spread for the machine, Student's t over its degrees of freedom), and each replicate
scales the compute by a draw of it (:class:`LaunchSpread`).

What the tracing itself cost can be taken out: the trainer times the steps after the traced window too (their
phases, ``untraced_steps`` in trace.json), and when there are enough of them (:data:`PROBE_MIN_STEPS`) every traced
row's compute can be scaled by the untraced forward over the traced forward, per rank, the median over ranks
(:func:`probe_ratio`; the forward carries no gradient communication). Horovod's handle watcher slowed a 20 ms step
by a tenth to a third on two shared cores, some launches and not others, while elsewhere the ratio is noise (0.73 to
1.14 in run 27, bench/predict-validation.md). So by default (``untraced="auto"``,
``predict --untraced-compute auto``; kept by run 28) a profile is scaled only where the ratio says the tracing clearly
slowed it (below :data:`PROBE_APPLY_BELOW`); ``always`` scales every profile with enough untraced steps, ``never``
keeps the compute as traced.

What it cannot separate: communication that slows the compute it overlaps (two cores shared with gloo's or
Horovod's thread), DDP's buffer broadcast inside the measured forward, and, for a traced ``fsdp`` run, the
reduce-scatter before each gradient lands on its shard (trace ddp or single and predict with ``--strategies``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpcompare import trace as tr
from dpcompare.errors import ConfigError
from dpcompare.files import PHASES, SUMMARY
from dpcompare.report.timeline import load_trace

PROBE_MIN_STEPS = 8  #: untraced steps (per rank) needed before the tracing's own cost is taken out
PROBE_APPLY_BELOW = 0.9  #: below this untraced-over-traced ratio the tracing clearly slowed the run
#: when the compute is scaled to the untraced steps (``--untraced-compute``)
UNTRACED_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class Grad:
    name: str
    ready: float  # seconds after backward began
    nbytes: float


@dataclass(frozen=True)
class Samples:
    """Every traced (rank, step) of a run: rows of :data:`PHASES` and of each gradient's ready offset (NaN where a
    step lacks the tick), in the order of ``names``; ``comm`` and ``overlapped``: seconds a collective was in flight
    during the step, and of those, inside its backward compute (from backward's start to its last gradient)."""

    phases: np.ndarray
    names: tuple[str, ...]
    ready: np.ndarray
    comm: np.ndarray
    overlapped: np.ndarray
    launch: np.ndarray | None = None  # the traced run (launch) of each row, when several are pooled (:func:`pooled`)
    step: np.ndarray | None = None  # each row's whole traced step (s); None: not recorded
    rank: np.ndarray | None = None  # each row's rank (with ``step``)

    def slowest_step(self, rows: np.ndarray) -> float:
        """The traced step as a run reports it (``step_ms_median``): each rank's median over ``rows``, the slowest
        rank's; 0 without steps recorded."""
        if self.step is None or self.rank is None or not len(rows):
            return 0.0
        step, rank = self.step[rows], self.rank[rows]
        return float(max(np.median(step[rank == r]) for r in np.unique(rank)))

    def __len__(self) -> int:
        return len(self.phases)

    def drawn(self, rng: np.random.Generator) -> np.ndarray:
        """One bootstrap replicate's rows: drawn again with replacement; with several launches, the launches are
        drawn again first and then each drawn launch's own rows (so that the band holds what moves between
        launches — where the processes landed, the machine's state — and not only the steps of one)."""
        if self.launch is None or len(np.unique(self.launch)) < 2:
            return rng.integers(0, len(self), len(self))
        runs = [np.flatnonzero(self.launch == k) for k in np.unique(self.launch)]
        picked = rng.integers(0, len(runs), len(runs))
        return np.concatenate([rng.choice(runs[k], len(runs[k])) for k in picked])

    def within(self, rng: np.random.Generator) -> np.ndarray:
        """Each launch's own rows drawn again, every launch kept (the launches' spread is drawn apart:
        :class:`LaunchSpread`)."""
        if self.launch is None:
            return rng.integers(0, len(self), len(self))
        return np.concatenate([rng.choice(idx, len(idx)) for idx in
                               (np.flatnonzero(self.launch == k) for k in np.unique(self.launch))])

    @property
    def launches(self) -> int:
        return 1 if self.launch is None else len(np.unique(self.launch))

    def launch_computes(self) -> np.ndarray:
        """Each launch's compute per step (s): the sum of its phases' medians over its own rows."""
        keys = np.zeros(len(self)) if self.launch is None else self.launch
        return np.array([float(np.median(self.phases[keys == k], axis=0).sum()) for k in np.unique(keys)])


@dataclass(frozen=True)
class LaunchSpread:
    """How much a launch's compute per step moves from launch to launch: ``sd``, the standard deviation of its log
    (≈ a relative spread), pooled over ``arms`` arms' ``launches`` launches with ``df`` degrees of freedom. A
    replicate scales an arm's step, all but its bytes' time on the link (:meth:`.schedule.Step.moved`), by
    exp(sd · √(1 + 1/L) · t), t drawn from Student's t with ``df`` degrees of freedom and L the arm's own launches:
    the random-effects prediction interval for a *new* launch (the run a prediction is compared with is one: it
    moves by sd whatever was traced, and the L traced launches' mean by sd/√L), which a bootstrap over two launches
    understates."""

    sd: float = 0.0
    df: int = 0
    arms: int = 0
    launches: int = 0

    def factor(self, rng: np.random.Generator, launches: int) -> float:
        return float(np.exp(self.sd * np.sqrt(1 + 1 / max(launches, 1)) * rng.standard_t(self.df))) if self.df > 0 \
            else 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"sd_pct": round(100 * self.sd, 2), "df": self.df, "arms": self.arms, "launches": self.launches}


def launch_spread(profiles: Sequence[Profile]) -> LaunchSpread:
    """The launch-to-launch spread of the compute, pooled over every profile traced in two or more launches (the
    log of each launch's compute against its arm's mean); ``df`` 0 when none was."""
    ss, df, arms, launches = 0.0, 0, 0, 0
    for p in profiles:
        if p.samples is None or p.samples.launches < 2:
            continue
        logs = np.log(np.maximum(p.samples.launch_computes(), 1e-12))
        ss += float(np.sum((logs - logs.mean()) ** 2))
        df += len(logs) - 1
        arms += 1
        launches += len(logs)
    return LaunchSpread(float(np.sqrt(ss / df)) if df else 0.0, df, arms, launches)


@dataclass
class Profile:
    """One run's compute per step (seconds) and what the schedules need to know about the model."""

    run: str
    strategy: str
    world_size: int
    sharded: bool  # the run's optimizer updated 1/world_size of the parameters
    data: float
    forward: float
    backward: float  # until the last gradient is ready
    optimizer: float
    grads: list[Grad]  # in ready order
    batch: int = 1  # samples per rank per step
    buffer_bytes: float | None = None  # None: the trace does not say
    device: str = "cpu"
    config: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)  # the run's own figures, for comparison
    notes: list[str] = field(default_factory=list)
    samples: Samples | None = None  # None: a hand-made profile, nothing to resample
    spread: LaunchSpread | None = None  # the launches' spread (:func:`launch_spread`); None: not estimated
    traced_step: float = 0.0  # the slowest rank's median traced step (s), as the run ran it; 0: unknown

    @property
    def compute(self) -> float:
        return self.data + self.forward + self.backward + self.optimizer

    @property
    def grad_bytes(self) -> float:
        return sum(g.nbytes for g in self.grads)

    def resampled(self, rng: np.random.Generator) -> Profile:
        """The same run with its traced (rank, step) rows drawn again with replacement (one bootstrap replicate:
        every median recomputed; within each launch when a launches' spread is known, else the launches drawn
        first); itself without samples. Its all-reduces (the floor) are drawn again too."""
        s = self.samples
        if s is None or len(s) < 2:
            return self
        ops = self.measured.get("allreduces") or []
        within = self.spread is not None and self.spread.df > 0
        return self.from_rows(s.within(rng) if within else s.drawn(rng),
                              [ops[i] for i in rng.integers(0, len(ops), len(ops))] if ops else None)

    def launch_factor(self, rng: np.random.Generator) -> float:
        """A draw of how much longer a new launch runs than the traced one(s): the launches' spread's factor
        (:meth:`LaunchSpread.factor`), 1 without one."""
        if self.spread is None or self.spread.df <= 0 or self.samples is None or len(self.samples) < 2:
            return 1.0
        return self.spread.factor(rng, self.samples.launches)

    def scaled(self, f: float) -> Profile:
        """The compute (every phase, every gradient's ready moment, the traced step) ``f`` times as long."""
        return dataclasses.replace(self, data=self.data * f, forward=self.forward * f, backward=self.backward * f,
                                   optimizer=self.optimizer * f, traced_step=self.traced_step * f,
                                   grads=[dataclasses.replace(g, ready=g.ready * f) for g in self.grads])

    def from_rows(self, rows: np.ndarray, allreduces: list[tuple[float, float]] | None = None) -> Profile:
        """This profile with every median taken over ``rows`` of its samples (and ``allreduces``, when given, as
        its traced all-reduces)."""
        s = self.samples
        assert s is not None
        data, forward, backward, optimizer = (float(x) for x in np.median(s.phases[rows], axis=0))
        ready = s.ready[rows]
        have = ~np.all(np.isnan(ready), axis=0)
        med = np.full(len(s.names), np.nan)
        med[have] = np.nanmedian(ready[:, have], axis=0)
        at = dict(zip(s.names, med, strict=True))
        grads = sorted((Grad(g.name, float(at[g.name]) if not np.isnan(at.get(g.name, np.nan)) else g.ready,
                             g.nbytes) for g in self.grads), key=lambda g: (g.ready, g.name))
        measured = {**self.measured, "allreduces": allreduces} if allreduces is not None else self.measured
        step = s.slowest_step(rows) if s.step is not None else self.traced_step
        return dataclasses.replace(self, data=data, forward=forward, backward=backward, optimizer=optimizer,
                                   grads=grads, measured=measured, traced_step=step)


def pooled(profiles: Sequence[Profile]) -> Profile:
    """Several traced runs of one arm (a comparison's repeats, each its own launch) as one profile: every traced
    row of each, the medians over all of them, their all-reduces together, and a bootstrap that draws the launches
    again before their rows (:meth:`Samples.drawn`). One run, or a hand-made profile among them: the first alone."""
    first = profiles[0]
    if len(profiles) < 2 or any(p.samples is None for p in profiles):
        return first
    names = tuple(sorted({n for p in profiles for n in p.samples.names}))  # type: ignore[union-attr]

    def ready(s: Samples) -> np.ndarray:
        col = {n: i for i, n in enumerate(s.names)}
        return np.array([[r[col[n]] if n in col else np.nan for n in names] for r in s.ready], dtype=float)

    parts = [p.samples for p in profiles]
    steps = all(x.step is not None and x.rank is not None for x in parts)
    samples = Samples(np.concatenate([x.phases for x in parts]), names, np.concatenate([ready(x) for x in parts]),
                      np.concatenate([x.comm for x in parts]), np.concatenate([x.overlapped for x in parts]),
                      np.concatenate([np.full(len(x), k) for k, x in enumerate(parts)]),
                      step=np.concatenate([x.step for x in parts]) if steps else None,
                      rank=np.concatenate([x.rank for x in parts]) if steps else None)
    waits = [float(w) for p in profiles if (w := p.measured.get("allreduce_wait_s")) is not None]
    measured = {**first.measured, "pooled_runs": [p.run for p in profiles],
                "allreduce_wait_s": statistics.median(waits) if waits else None,
                "step_ms_median": _median([float(p.measured.get("step_ms_median") or 0.0) for p in profiles])}
    note = f"{len(profiles)} traced runs of this arm pooled ({len(samples)} rank-steps)"
    one = dataclasses.replace(first, samples=samples, measured=measured, notes=[*first.notes, note])
    return one.from_rows(np.arange(len(samples)), [op for p in profiles for op in p.measured.get("allreduces") or []])


def with_spread(profiles: Sequence[Profile], spread: LaunchSpread | None = None) -> list[Profile]:
    """Every profile with the launches' spread of them all (:func:`launch_spread`; or ``spread``, estimated
    elsewhere) and a note saying what it is; unchanged, with a note, when no arm was traced in two or more
    launches."""
    spread = spread if spread is not None else launch_spread(profiles)
    if spread.df == 0:
        note = ("one traced launch per arm: the band holds the noise of its steps, not what moves between launches "
                "(on a shared machine often more); trace two or more (compare --repeats 2 --trace N)")
        return [dataclasses.replace(p, notes=[*p.notes, note]) if p.samples is not None else p for p in profiles]
    note = (f"launch to launch the compute moved by ±{100 * spread.sd:.1f} % (sd, {spread.launches} launches of "
            f"{spread.arms} arm{'s' * (spread.arms > 1)}, {spread.df} degrees of freedom): the band draws it for a new "
            "launch (Student's t)")
    return [dataclasses.replace(p, spread=spread, notes=[*p.notes, note]) if p.samples is not None else p
            for p in profiles]


def _median(xs: list[float], default: float = 0.0) -> float:
    return statistics.median(xs) if xs else default


def _bytes_from_comm(events: list[dict[str, Any]]) -> dict[str, float]:
    """Parameter name → bytes, sharing each traced all-reduce's bytes equally among the tensors it carried."""
    out: dict[str, float] = {}
    for e in events:
        args = e.get("args") or {}
        names = args.get("tensors") or []
        if e.get("cat") == tr.CAT_COMM and names and args.get("bytes"):
            for n in names:
                out.setdefault(str(n), float(args["bytes"]) / len(names))
    return out


def _is_allreduce(e: dict[str, Any]) -> bool:
    """A traced all-reduce that says its bytes and lasted (DDP's bucket on one rank, a Horovod fused operation)."""
    return (e.get("cat") == tr.CAT_COMM and tr.collective_of(e) == tr.ALL_REDUCE
            and bool((e.get("args") or {}).get("bytes")) and e.get("dur", 0) > 0)


def _allreduces(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(bytes, seconds) of every traced all-reduce on every rank."""
    return [(float(e["args"]["bytes"]), e["dur"] / 1e6) for e in events if _is_allreduce(e)]


def _allreduce_wait(events: list[dict[str, Any]]) -> float | None:
    """The median seconds a rank's traced all-reduce waited for the last rank to issue it (None: no all-reduce
    matched on every rank): each rank's span less the operation's own (:func:`dpcompare.trace.aligned_starts`). A
    median over every rank's wait, as the floor's line is a median over every rank's span: the floor less this is
    the operation's own time."""
    starts = tr.aligned_starts(events)
    waits = [(starts[id(e)] - e["ts"]) / 1e6 for e in events if id(e) in starts and _is_allreduce(e)]
    return statistics.median(waits) if waits else None


def _in_flight(comm: list[dict[str, Any]], lo: float, hi: float) -> tuple[float, float]:
    """(seconds some collective was in flight, seconds of those between ``lo`` and ``hi``) for trace events in µs:
    the union of their spans, so two collectives at once count once (a GPU trace's NCCL stream events alike)."""
    spans = tr.union_spans((e["ts"], e["ts"] + e.get("dur", 0)) for e in comm)
    return tr.spans_length(spans) / 1e6, tr.spans_length(tr.clip_spans(spans, lo, hi)) / 1e6


def _per_step(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One row per traced (rank, step): phase lengths (s), ready offsets (s) per parameter, the seconds of
    communication in flight and of those inside backward's compute; and the bytes the ticks carry."""
    rows: list[dict[str, Any]] = []
    tick_bytes: dict[str, float] = {}
    for rank, steps in tr.steps_by_rank(events).items():
        for st in steps:
            ph = {e["name"]: e for e in tr.events_in(events, st, tr.CAT_PHASE)}
            bw = ph.get("backward")
            if bw is None or "forward" not in ph:
                continue
            ticks = [e for e in tr.events_in(events, st, tr.CAT_GRAD) if e["ts"] >= bw["ts"]]
            last = max((e["ts"] for e in ticks), default=bw["ts"] + bw["dur"])
            waits = sum(e["dur"] for e in tr.events_in(events, st, tr.CAT_WAIT))
            opt = ph.get("optimizer")
            comm, overlapped = _in_flight(
                tr.events_in(events, st, tr.CAT_COMM), bw["ts"], min(last, bw["ts"] + bw["dur"])
            )
            rows.append(
                {
                    "step": st["dur"] / 1e6,
                    "rank": rank,
                    "data": ph["data"]["dur"] / 1e6 if "data" in ph else 0.0,
                    "forward": ph["forward"]["dur"] / 1e6,
                    "backward": min(last - bw["ts"], bw["dur"]) / 1e6,
                    "optimizer": max(opt["dur"] - waits, 0.0) / 1e6 if opt else 0.0,
                    "ready": {e["name"]: (e["ts"] - bw["ts"]) / 1e6 for e in ticks},
                    "comm": comm,
                    "overlapped": overlapped,
                }
            )
            for e in ticks:
                if (e.get("args") or {}).get("bytes"):
                    tick_bytes[e["name"]] = float(e["args"]["bytes"])
    return rows, tick_bytes


def _samples(rows: list[dict[str, Any]]) -> Samples:
    names = tuple(sorted({n for r in rows for n in r["ready"]}))
    return Samples(phases=np.array([[r[k] for k in PHASES] for r in rows], dtype=float), names=names,
                   ready=np.array([[r["ready"].get(n, np.nan) for n in names] for r in rows], dtype=float),
                   comm=np.array([r["comm"] for r in rows]), overlapped=np.array([r["overlapped"] for r in rows]),
                   step=np.array([r["step"] for r in rows]), rank=np.array([r["rank"] for r in rows]))


def _summary(folder: Path) -> dict[str, Any]:
    path = folder / SUMMARY
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}


def probe_ratio(rows: list[dict[str, Any]], untraced: list[dict[str, Any]]) -> float | None:
    """The untraced steps' forward over the traced steps' (per rank, the median over ranks): how much faster the
    compute ran without the tracing; None when no rank has :data:`PROBE_MIN_STEPS` untraced steps."""
    ratios = []
    for u in untraced:
        fwd = (u.get("phases_ms") or {}).get("forward")
        traced = [r["forward"] for r in rows if r["rank"] == u.get("rank")]
        if fwd and traced and u.get("steps", 0) >= PROBE_MIN_STEPS and statistics.median(traced) > 0:
            ratios.append(fwd / 1e3 / statistics.median(traced))
    return statistics.median(ratios) if ratios else None


def _scaled_row(r: dict[str, Any], f: float) -> dict[str, Any]:
    """A traced (rank, step) row with its compute ``f`` times as long (its communication as it was)."""
    return {**r, **{k: r[k] * f for k in (*PHASES, "step")}, "ready": {n: t * f for n, t in r["ready"].items()}}


def _compute_rows(folder: Path, events: list[dict[str, Any]], untraced: list[dict[str, Any]], mode: str
                   ) -> tuple[list[dict[str, Any]], dict[str, float], list[str], dict[str, Any]]:
    """The trace's rows with the tracing's own cost taken out as ``mode`` says (:data:`UNTRACED_MODES`), their
    ticks' bytes, a note saying which compute was used, and the figures behind it."""
    rows, tick_bytes = _per_step(events)
    if not rows:
        raise ConfigError(f"{folder}: the trace holds no complete traced step; rerun with --trace N (N ≥ 1) "
                          "and more steps than --warmup-steps")
    ratio = probe_ratio(rows, untraced)
    if ratio is None:
        said = [f"compute as traced: no steps ran after the traced window to tell what the tracing cost (run more "
                f"than --warmup-steps + --trace, {PROBE_MIN_STEPS} or more)"]
        return rows, tick_bytes, said if mode == "always" else [], {"mode": mode, "ratio": None, "applied": False}
    slowed = ratio < PROBE_APPLY_BELOW
    scale = mode == "always" or (mode == "auto" and slowed)
    probe = {"mode": mode, "ratio": ratio, "applied": scale}
    if not scale:
        said = [f"the steps after the traced window ran their forward in {ratio:.2f}× the traced steps' time: the "
                "tracing slowed this run, --untraced-compute auto takes that out"]
        return rows, tick_bytes, said if slowed else [], probe
    return [_scaled_row(r, ratio) for r in rows], tick_bytes, [
        f"compute ×{ratio:.2f}: the steps after the traced window ran their forward in {ratio:.2f}× the traced "
        "steps' time (the tracing's own cost taken out)"], probe


def load_profile(folder: str | Path, is_sharded: Callable[[str], bool] = lambda s: False,
                 untraced: str = "auto") -> Profile:
    """The compute profile of the traced run in ``folder`` (its trace.json and, when there, summary.json);
    ``is_sharded(strategy)``: whether that strategy shards the optimizer (its memory figures count one shard);
    ``untraced``: when the compute is scaled to the steps after the traced window, taking the tracing's own cost
    out (:data:`UNTRACED_MODES`; ``auto``: where it clearly slowed the run)."""
    folder = Path(folder)
    data = load_trace(folder)
    events, other = data["traceEvents"], data.get("otherData") or {}
    summary = _summary(folder)
    rows, tick_bytes, said, probe = _compute_rows(folder, events, other.get("untraced_steps") or [], untraced)
    ready: dict[str, list[float]] = {}
    for r in rows:
        for n, t in r["ready"].items():
            ready.setdefault(n, []).append(t)
    if not ready:
        raise ConfigError(f"{folder}: the trace has no gradient-ready ticks; trace it again with this dpcompare")
    notes: list[str] = []
    from_comm = _bytes_from_comm(events)
    params_bytes = float((summary.get("memory") or {}).get("params_mb", 0.0)) * 2**20
    strategy = str(other.get("strategy") or summary.get("strategy") or "?")
    sharded = is_sharded(strategy)
    if sharded:
        params_bytes = 0.0  # the summary counts one shard
    fallback = params_bytes / len(ready) if params_bytes else 4.0 * 2**20 / len(ready)
    if len(tick_bytes) < len(ready):
        notes.append("gradient sizes taken from the traced all-reduces (bucket bytes shared among their tensors)"
                     if from_comm else "gradient sizes unknown: the parameters' total shared equally")
    grads = sorted((Grad(n, _median(ts), tick_bytes.get(n, from_comm.get(n, fallback))) for n, ts in ready.items()),
                   key=lambda g: (g.ready, g.name))
    buffers = next((float((e.get("args") or {}).get("bytes", 0)) for e in events if e.get("name") == "model_buffers"
                    and e.get("ph") == "M"), None)
    samples = _samples(rows)
    return Profile(
        run=str(folder), strategy=strategy, sharded=sharded,
        world_size=int(other.get("world_size") or summary.get("world_size") or 1),
        **{k: _median([r[k] for r in rows]) for k in PHASES}, grads=grads, samples=samples,
        traced_step=samples.slowest_step(np.arange(len(samples))),
        batch=int(other.get("batch_size") or summary.get("batch_size") or 1), buffer_bytes=buffers,
        device=str(summary.get("device", "cpu")), config=dict(summary.get("config") or {}),
        measured={**tr.communication_figures(events), "comm": summary.get("comm") or {}, "probe": probe,
                  "allreduces": _allreduces(events), "allreduce_wait_s": _allreduce_wait(events),
                  "step_ms_median": _median(
                      [st["dur"] / 1e3 for steps in tr.steps_by_rank(events).values() for st in steps])},
        notes=notes + said)


def find_runs(paths: list[str]) -> list[Path]:
    """Traced run folders among ``paths``: a run folder with trace.json, or a compare folder (runs/*/trace.json)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / tr.TRACE_FILE).is_file():
            out.append(p)
        elif p.is_dir() and (found := sorted(t.parent for t in p.glob(f"runs/*/{tr.TRACE_FILE}"))):
            out += found
        else:
            raise ConfigError(f"{p}: no trace.json here or under {p}/runs/*/; run `dpcompare train --trace N "
                              "--out DIR` (or `dpcompare compare ... --trace N`) first")
    return out
