"""The trainer's side of ``dpcompare train --trace N``: which steps to record, and the merge at the end.

The recorder and the trace format are :mod:`dpcompare.trace`; each strategy adds its communication through
:meth:`strategy.tracer.start <dpcompare.backends.parts.Tracer.start>` and, on rank 0, the library's own events
(:meth:`~dpcompare.backends.parts.Tracer.library_events`).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpcompare.trace import (
    CAT_STEP,
    TRACE_FILE,
    TraceRecorder,
    communication_figures,
    link_from_env,
    write_trace,
)

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from dpcompare.backends.base import Strategy


class TraceSession:
    """The trainer's side of ``--trace N``: which steps to record, and the merge at the end.

    ``before_step(done)`` is called before every step with the number of steps done so far in this run,
    ``after_step(...)`` after it; recording covers steps ``warmup + 1 .. warmup + N``. ``finish`` is a
    collective (every rank calls it); rank 0 writes ``trace.json`` and every rank gets the figures.

    The steps after the traced window are timed too (their phases only): what the tracing itself cost the compute
    (Horovod's handle watcher slowed a 20 ms step's forward by a tenth and more on two shared cores) is the traced
    steps' forward against theirs, which ``predict --untraced-compute`` takes out
    (:func:`dpcompare.prediction.profile.load_profile`).
    """

    def __init__(self, steps: int, warmup: int, strategy: Strategy, model: nn.Module, optimizer: Optimizer) -> None:
        self.steps, self.warmup = steps, warmup
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.recorder = TraceRecorder(strategy.rank)
        self.recorded = 0
        self.active = False
        self.untraced: list[dict[str, float]] = []  # phases (s) of each step after the traced window

    def before_step(self, done_steps: int) -> None:
        if not self.active and done_steps == self.warmup and self.recorded < self.steps:
            self.strategy.tracer.start(self.model, self.optimizer, self.recorder)
            self.active = True

    def after_step(self, global_step: int, start_perf: float, laps: dict[str, float]) -> None:
        if not self.active:
            if self.recorded >= self.steps:
                self.untraced.append(dict(laps))
            return
        self.recorder.step(global_step, start_perf, laps)
        self.recorded += 1
        if self.recorded >= self.steps:
            self._stop()

    def _stop(self) -> None:
        if self.active:
            self.strategy.tracer.stop()
            self.active = False

    def finish(self, out: Path, info: dict[str, Any]) -> dict[str, Any] | None:
        """Gather every rank's events to rank 0, add the library's own (Horovod's timeline), write the file."""
        self._stop()
        rec = self.recorder
        mine = rec.metadata() + rec.events
        gathered = self.strategy.gather_bytes(json.dumps({"events": mine, "notes": rec.notes,
                                                          "untraced": untraced_phases(self.untraced)}).encode())
        if not self.strategy.is_main:
            return None
        events: list[dict[str, Any]] = []
        notes: list[str] = []
        untraced: list[dict[str, Any]] = []
        for rank, blob in enumerate(gathered):
            part = json.loads(blob)
            events += part["events"]
            notes += part["notes"]
            untraced += [{"rank": rank, **part["untraced"]}] if part["untraced"] else []
        steps = [e for e in events if e.get("cat") == CAT_STEP and e["pid"] == 0]
        lib_events, lib_notes = self.strategy.tracer.library_events(rec, [(e["ts"], e["ts"] + e["dur"]) for e in steps])
        events += lib_events
        notes += lib_notes
        if not steps:
            notes.append(f"no step was traced: the run took no more than --warmup-steps ({self.warmup}) steps")
        link = link_from_env()  # DPCOMPARE_LINK_BPS: set by `dpcompare lab` for its runs
        world = self.strategy.world_size
        write_trace(out / TRACE_FILE, events, {**info, "world_size": world, "link_bps": link,
                                               "traced_steps": len(steps), "notes": notes,
                                               "untraced_steps": untraced,
                                               # the communication came from rank 0's view (Horovod's timeline)
                                               "library_timeline_rank0": bool(lib_events)})
        return communication_figures(events, world, link) if steps else None


def untraced_phases(laps: list[dict[str, float]]) -> dict[str, Any] | None:
    """The steps after the traced window: how many, and each phase's median (ms); None without any."""
    if not laps:
        return None
    phases = sorted({k for lap in laps for k in lap})
    return {"steps": len(laps), "phases_ms": {k: 1e3 * statistics.median(lap[k] for lap in laps if k in lap)
                                              for k in phases}}
