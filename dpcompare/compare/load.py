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

A rank need not descend from the comparing process at all: the elastic arms' ranks on a lab's hosts are started
through ssh, by that host's sshd. Every process whose command line names the run's folder (each rank's ``--out``)
is the job's too, however it was started (compare names the folder across a lab): a thread samples their CPU time twice
a second while the run runs (a process that ends between two samples loses at most its last half second).

Busy is user + nice + system time; interrupt and soft-interrupt time is left out (the ranks' own loopback
traffic lands there, charged to no process). The report's threshold: :data:`dpcompare.report.regime.SHARED_SHARE`.

On a virtual machine the hypervisor may run other guests on this one's cores: the time it took is the ``steal``
column of ``/proc/stat``'s ``cpu`` line, read around each run (:func:`proc_stat_times`)::

    steal share = Δsteal ÷ Δ(user + nice + system + idle + iowait + irq + softirq + steal)

``compare --rerun-disturbed PCT`` runs a block again when one of its runs saw others' share above PCT % or a steal
share above a quarter of it (:func:`why_disturbed`): a stolen tick is lost by a rank outright, while others'
CPU may have run on a core the ranks did not need.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
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


#: ``/proc/stat``'s columns of the ``cpu`` line, in order (proc(5)); guest time is counted in user time already
STAT_COLUMNS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
#: the columns that add up to all the time the cores had
STAT_TOTAL = STAT_COLUMNS[:8]
#: a steal share this many times smaller than --rerun-disturbed's share of others' CPU disturbs a block too
STEAL_FACTOR = 4.0


def proc_stat_times(text: str) -> dict[str, int]:
    """The aggregate ``cpu`` line of a ``/proc/stat`` text as {column: ticks} (:data:`STAT_COLUMNS`; older
    kernels' missing columns are 0); ValueError when the text has no such line."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            ticks = [int(x) for x in parts[1:len(STAT_COLUMNS) + 1]]
            return dict(zip(STAT_COLUMNS, ticks + [0] * (len(STAT_COLUMNS) - len(ticks)), strict=True))
    raise ValueError("no aggregate cpu line in /proc/stat")


def read_proc_stat(path: str = "/proc/stat") -> dict[str, int] | None:
    """This machine's :func:`proc_stat_times` (None where there is no /proc/stat)."""
    try:
        with open(path) as f:
            return proc_stat_times(f.read())
    except (OSError, ValueError):
        return None


def steal_share(before: dict[str, int] | None, after: dict[str, int] | None) -> float | None:
    """The share of the cores' time the hypervisor stole between two :func:`proc_stat_times` (None: unknown)."""
    if before is None or after is None:
        return None
    total = sum(after[k] - before[k] for k in STAT_TOTAL)
    return round((after["steal"] - before["steal"]) / total, 4) if total > 0 else None


def why_disturbed(loads: list[dict[str, Any] | None], share: float) -> str | None:
    """Why a block whose runs saw ``loads`` (results.json's ``load``) is disturbed, or None: a run where other
    processes took more than ``share`` of the cores, or the hypervisor stole more than ``share`` ÷
    :data:`STEAL_FACTOR` of them. ``share`` 0: never disturbed."""
    if share <= 0:
        return None
    others = max((x.get("others_cpu_share") or 0.0 for x in loads if x), default=0.0)
    steal = max((x.get("steal_share") or 0.0 for x in loads if x), default=0.0)
    if steal > share / STEAL_FACTOR:
        return (f"the hypervisor stole {100 * steal:.0f} % of the cores during a run "
                f"(over {100 * share / STEAL_FACTOR:g} %)")
    if others > share:
        return f"other processes took {100 * others:.0f} % of the cores during a run (over {100 * share:g} %)"
    return None


#: seconds between two samples of the job's processes outside this process tree
SAMPLE_S = 0.5


class JobProcesses:
    """The job's processes outside this process tree (their command line names ``marker``, the run's folder),
    sampled by a thread: the CPU seconds each has taken, by (pid, start time), as last seen."""

    def __init__(self, me: psutil.Process, marker: str) -> None:
        self.me, self.marker = me, marker
        self.seen: dict[tuple[int, float], float] = {}
        self.sample()
        self.before = dict(self.seen)  # what those already running had taken before the run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpcompare-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        try:
            tree = {self.me.pid, *(c.pid for c in self.me.children(recursive=True))}
        except psutil.Error:
            tree = {self.me.pid}
        for p in psutil.process_iter(["cmdline", "create_time"]):
            try:
                if p.pid in tree or self.marker not in " ".join(p.info["cmdline"] or ()):
                    continue
                t = p.cpu_times()
            except psutil.Error:
                continue
            key = (p.pid, p.info["create_time"])
            self.seen[key] = max(self.seen.get(key, 0.0), t.user + t.system)

    def stop(self) -> float:
        """The last sample, then the CPU seconds all of them took."""
        self._stop.set()
        self._thread.join()
        self.sample()
        return sum(cpu - self.before.get(key, 0.0) for key, cpu in self.seen.items())


class LoadWatch:
    """Samples the machine and this process tree when made and at :meth:`result` (the run in between);
    ``marker``: the run's folder, which names the job's processes started outside the tree (ssh)."""

    def __init__(self, marker: str | None = None) -> None:
        _adopt_orphans(True)  # while the run runs
        self.me = psutil.Process()
        self.cores = psutil.cpu_count() or os.cpu_count() or 1
        self.loadavg_start = [round(x, 2) for x in os.getloadavg()]
        self.t0, self.busy0, self.tree0 = time.perf_counter(), _busy_seconds(), _tree_seconds(self.me)
        self.stat0 = read_proc_stat()
        self.remote = JobProcesses(self.me, marker) if marker else None

    def result(self) -> dict[str, Any]:
        """results.json's ``load`` of a run (docs/results-schema.md)."""
        wall = time.perf_counter() - self.t0
        away = self.remote.stop() if self.remote else 0.0
        busy, tree = _busy_seconds() - self.busy0, _tree_seconds(self.me) - self.tree0 + away
        _adopt_orphans(False)
        others = max(busy - tree, 0.0)
        return {"others_cpu_share": round(others / (self.cores * wall), 4) if wall > 0 else None,
                "others_cpu_s": round(others, 2), "job_cpu_s": round(tree, 2), "busy_cpu_s": round(busy, 2),
                "job_cpu_outside_s": round(away, 2), "steal_share": steal_share(self.stat0, read_proc_stat()),
                "cores": self.cores, "wall_s": round(wall, 2), "loadavg_start": self.loadavg_start,
                "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
