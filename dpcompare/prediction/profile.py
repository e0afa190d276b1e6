"""The compute of one step, read from a traced run: what the model keeps when it takes the network away.

From ``trace.json`` (see :mod:`dpcompare.trace`), per rank and traced step: the data and forward phases, the
backward phase up to its last gradient-ready tick (after that DDP's backward only waits for buckets), each
gradient's ready moment counted from the start of backward, and the optimizer phase less Horovod's wait inside
``step()``. Medians over every rank and traced step. A gradient's bytes come from its tick (``bytes``, traces
from this version on), else from the all-reduce that carried it (a bucket's or fused operation's bytes shared
equally among its tensors), else from the parameters' total in summary.json shared equally.

What it cannot separate: communication that slows the compute it overlaps (two cores shared with gloo's or
Horovod's thread), DDP's buffer broadcast inside the measured forward, and, for a traced ``fsdp`` run, the
reduce-scatter before each gradient lands on its shard (trace ddp or single and predict with ``--strategies``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcompare import trace as tr
from dpcompare.errors import ConfigError
from dpcompare.report.timeline import load_trace

SUMMARY = "summary.json"


@dataclass(frozen=True)
class Grad:
    name: str
    ready: float  # seconds after backward began
    nbytes: float


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

    @property
    def compute(self) -> float:
        return self.data + self.forward + self.backward + self.optimizer

    @property
    def grad_bytes(self) -> float:
        return sum(g.nbytes for g in self.grads)


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


def _allreduces(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(bytes, seconds) of every traced all-reduce (DDP's buckets on every rank, Horovod's fused operations)."""
    return [(float(e["args"]["bytes"]), e["dur"] / 1e6) for e in events
            if e.get("cat") == tr.CAT_COMM and tr.collective_of(e) == tr.ALL_REDUCE
            and (e.get("args") or {}).get("bytes") and e.get("dur", 0) > 0]


def _per_step(events: list[dict[str, Any]]) -> tuple[dict[str, list[float]], dict[str, list[float]],
                                                       dict[str, float]]:
    """Phase lengths (s) per traced step and rank, ready offsets (s) per parameter, bytes from the ticks."""
    phases: dict[str, list[float]] = {"data": [], "forward": [], "backward": [], "optimizer": []}
    ready: dict[str, list[float]] = {}
    tick_bytes: dict[str, float] = {}
    for steps in tr.steps_by_rank(events).values():
        for st in steps:
            ph = {e["name"]: e for e in tr.events_in(events, st, tr.CAT_PHASE)}
            bw = ph.get("backward")
            if bw is None or "forward" not in ph:
                continue
            ticks = [e for e in tr.events_in(events, st, tr.CAT_GRAD) if e["ts"] >= bw["ts"]]
            last = max((e["ts"] for e in ticks), default=bw["ts"] + bw["dur"])
            waits = sum(e["dur"] for e in tr.events_in(events, st, tr.CAT_WAIT))
            phases["data"].append(ph["data"]["dur"] / 1e6 if "data" in ph else 0.0)
            phases["forward"].append(ph["forward"]["dur"] / 1e6)
            phases["backward"].append(min(last - bw["ts"], bw["dur"]) / 1e6)
            opt = ph.get("optimizer")
            phases["optimizer"].append(max(opt["dur"] - waits, 0.0) / 1e6 if opt else 0.0)
            for e in ticks:
                ready.setdefault(e["name"], []).append((e["ts"] - bw["ts"]) / 1e6)
                if (e.get("args") or {}).get("bytes"):
                    tick_bytes[e["name"]] = float(e["args"]["bytes"])
    return phases, ready, tick_bytes


def _summary(folder: Path) -> dict[str, Any]:
    path = folder / SUMMARY
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}


def load_profile(folder: str | Path, is_sharded: Callable[[str], bool] = lambda s: False) -> Profile:
    """The compute profile of the traced run in ``folder`` (its trace.json and, when there, summary.json);
    ``is_sharded(strategy)``: whether that strategy shards the optimizer (its memory figures count one shard)."""
    folder = Path(folder)
    data = load_trace(folder)
    events, other = data["traceEvents"], data.get("otherData") or {}
    summary = _summary(folder)
    phases, ready, tick_bytes = _per_step(events)
    if not phases["forward"]:
        raise ConfigError(f"{folder}: the trace holds no complete traced step; rerun with --trace N (N ≥ 1) "
                          "and more steps than --warmup-steps")
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
    return Profile(
        run=str(folder), strategy=strategy, sharded=sharded, world_size=int(other.get("world_size") or summary.get("world_size") or 1),
        data=_median(phases["data"]), forward=_median(phases["forward"]), backward=_median(phases["backward"]),
        optimizer=_median(phases["optimizer"]), grads=grads,
        batch=int(other.get("batch_size") or summary.get("batch_size") or 1), buffer_bytes=buffers,
        device=str(summary.get("device", "cpu")), config=dict(summary.get("config") or {}),
        measured={**tr.communication_figures(events), "comm": summary.get("comm") or {},
                  "allreduces": _allreduces(events), "step_ms_median": _median(
                      [st["dur"] / 1e3 for steps in tr.steps_by_rank(events).values() for st in steps])}, notes=notes)


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
