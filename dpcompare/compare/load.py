"""What else ran on the machine while a run ran: the CPU time other processes took, and the load average.

A verdict from a shared machine describes that machine: other work steals cycles from the ranks (worst for
Horovod, whose background thread busy-polls) and a strategy can come out several times slower than it is. The
comparing process samples, around each run, the machine's busy CPU time (``/proc/stat``, through psutil) and the
CPU time of its own process tree (itself, the launcher, the ranks, a persistent worker: every descendant,
living or reaped). A rank whose parent (e.g. Open MPI's daemon on a lab host) ends before reaping it would leave
the tree and count as another process's; so the comparing process adopts such orphans while a run runs (Linux's
child subreaper). It does not reap them: an ended orphan stays a zombie child, whose CPU time the samples keep
reading (a pid each, given back when compare ends), and no exit code that a launcher waits for is taken from it.
What the machine spent beyond that went to other processes::

    others' share = (machine busy CPU s − this process tree's CPU s) / (cores × wall s)

Busy is user + nice + system time; interrupt and soft-interrupt time is left out (the ranks' own loopback
traffic lands there, charged to no process). The report's threshold: :data:`dpcompare.report.regime.SHARED_SHARE`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import time
from typing import Any

import psutil

#: prctl's PR_SET_CHILD_SUBREAPER (linux/prctl.h)
_PR_SET_CHILD_SUBREAPER = 36


def _adopt_orphans(on: bool) -> None:
    """Whether this process adopts the orphans of its descendants from now on (Linux; elsewhere nothing happens)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system)


def _tree_seconds(root: psutil.Process) -> float:
    """CPU seconds of ``root`` and every descendant so far: the living ones' own time plus what each has reaped."""
    total = 0.0
    for p in (root, *root.children(recursive=True)):
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended between the listing and the reading: its parent counts it once it reaps it
        total += t.user + t.system + t.children_user + t.children_system
    return total


class LoadWatch:
    """Samples the machine and this process tree when made and at :meth:`result` (the run in between)."""

    def __init__(self) -> None:
        _adopt_orphans(True)  # while the run runs
        self.me = psutil.Process()
        self.cores = psutil.cpu_count() or os.cpu_count() or 1
        self.loadavg_start = [round(x, 2) for x in os.getloadavg()]
        self.t0, self.busy0, self.tree0 = time.perf_counter(), _busy_seconds(), _tree_seconds(self.me)

    def result(self) -> dict[str, Any]:
        """results.json's ``load`` of a run (docs/results-schema.md)."""
        wall = time.perf_counter() - self.t0
        busy, tree = _busy_seconds() - self.busy0, _tree_seconds(self.me) - self.tree0
        _adopt_orphans(False)
        others = max(busy - tree, 0.0)
        return {"others_cpu_share": round(others / (self.cores * wall), 4) if wall > 0 else None,
                "others_cpu_s": round(others, 2), "job_cpu_s": round(tree, 2), "busy_cpu_s": round(busy, 2),
                "cores": self.cores, "wall_s": round(wall, 2), "loadavg_start": self.loadavg_start,
                "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
