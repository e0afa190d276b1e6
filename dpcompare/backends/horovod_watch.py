"""Horovod's all-reduces timed from their handles, during the traced steps only (``train --trace N``).

Horovod's own timeline needs ``HOROVOD_TIMELINE`` set before ``hvd.init()``, and then its writer thread spins
(``std::this_thread::yield`` in a loop) on rank 0 for the whole run, started or not: every step of a traced run
was 12-25 % slower. So by default dpcompare does not use it. Instead, while the traced steps run,
:class:`HandleWatcher` notes when ``DistributedOptimizer`` enqueues each gradient's all-reduce (its hook calls
``_allreduce_grad_async``) and a small thread polls the handles (``hvd.poll``) to stamp when each completes.
Horovod runs one fused operation at a time and completes all its tensors together, so tensors completing in
the same poll make one fused operation. Its start is not visible from Python: it is taken as the later of its
last tensor's enqueue and the previous operation's completion, so a span includes Horovod's negotiation and
cycle wait (under a millisecond by default) besides the all-reduce. The poll thread exists only inside the
traced window; untraced steps run exactly as without ``--trace``.

The poll thread must not slow the compute it watches: a thread waking every 0.2 ms took 18 % of the steps from
three ranks sharing two cores (squeezenet, one torch thread each, measured with the ranks' modes switched together
every 2 s). So it sleeps while no handle is pending (forward, the optimizer's update), polls every 0.2 ms while
``step()`` waits for it, and otherwise backs off to a tenth of the time since it last saw a handle start or
complete (0.2–2 ms): a completion is stamped at most that late.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from dpcompare import trace as tr

POLL_S = 2e-4  #: the shortest interval between polls (a completion is stamped this late at most while ``step()``
#: waits, plus the time to get the GIL)
POLL_MAX_S = 2e-3  #: the longest interval, while the main thread computes
POLL_SHARE = 0.1  #: the interval's share of the time since the watcher last saw a handle start or complete


class HandleWatcher:
    """Per-tensor enqueue → completion on this rank; :meth:`events` turns them into fused operations."""

    def __init__(self, recorder: tr.TraceRecorder, poll: Callable[[int], bool]) -> None:
        self.recorder, self._poll = recorder, poll
        self._pending: dict[int, tuple[str, int, float, str]] = {}  # handle → (tensor, bytes, enqueued_us, collective)
        # (tensor, bytes, enqueued_us, completed_us, collective)
        self.done: list[tuple[str, int, float, float, str]] = []
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._busy = threading.Event()  # set while a handle is pending: the thread sleeps on it otherwise
        self._hurry = threading.Event()  # set while step() waits for the pending handles
        self._nudge = threading.Event()  # cuts the thread's current sleep short when step() starts waiting
        self._since = time.perf_counter()  # when a handle last started or completed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpcompare-horovod-watch", daemon=True)
        self._thread.start()

    def enqueued(self, handle: int, tensor: str, nbytes: int, collective: str = tr.ALL_REDUCE) -> None:
        """Horovod took ``tensor``'s operation (an all-reduce; for a sparse gradient two all-gathers, its indices'
        and its values')."""
        with self._lock:
            if not self._pending:
                self._since = time.perf_counter()
            self._pending[handle] = (tensor, nbytes, self.recorder.now(), collective)
            self._idle.clear()
            self._busy.set()

    def wait_idle(self, timeout_s: float) -> None:
        """Block (releasing the GIL) until every handle seen so far has completed, so that ``synchronize`` may
        release them: polling a released handle raises."""
        self._hurry.set()
        self._nudge.set()
        try:
            self._idle.wait(timeout_s)
        finally:
            self._hurry.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._busy.wait()
            with self._lock:
                items = list(self._pending.items())
            finished = [h for h, _ in items if self._completed(h)]
            if finished:
                now = self.recorder.now()
                with self._lock:
                    for h in finished:
                        tensor, nbytes, t0, collective = self._pending.pop(h)
                        self.done.append((tensor, nbytes, t0, now, collective))
                    self._since = time.perf_counter()
                    if not self._pending:
                        self._idle.set()
                        self._busy.clear()
            self._nudge.wait(self._interval())
            self._nudge.clear()

    def _interval(self) -> float:
        if self._hurry.is_set():
            return POLL_S
        return min(POLL_MAX_S, max(POLL_S, POLL_SHARE * (time.perf_counter() - self._since)))

    def _completed(self, handle: int) -> bool:
        try:
            return bool(self._poll(handle))
        except Exception:  # released by someone else already (e.g. synchronize of a late enqueue): done
            return True

    def stop(self) -> None:
        """Stop polling (handles still pending are stamped now: the step that waits for them has ended)."""
        self._stop.set()
        self._busy.set()
        self._thread.join()
        now = self.recorder.now()
        with self._lock:
            self.done += [(t, b, t0, now, c) for t, b, t0, c in self._pending.values()]
            self._pending.clear()
            self._idle.set()

    def events(self) -> list[dict[str, Any]]:
        """One span per fused operation on :data:`tr.LANE_COMM` (bytes, tensors, the collective: all-reduces, and
        the all-gathers of sparse gradients) and, per tensor, its enqueue → completion span on a lane of its own
        (category ``horovod``)."""
        rank = self.recorder.rank
        out: list[dict[str, Any]] = []
        lanes: dict[str, int] = {}
        groups: dict[tuple[float, str], list[tuple[str, int, float, float, str]]] = {}
        for item in self.done:
            groups.setdefault((item[3], item[4]), []).append(item)
            lane = lanes.setdefault(item[0], tr.LANE_TENSORS + len(lanes))
            self.recorder.lanes[lane] = f"horovod: {item[0]}"
            out.append({"name": "enqueued → done", "cat": "horovod", "ph": "X", "ts": item[2],
                        "dur": item[3] - item[2], "pid": rank, "tid": lane})
        previous_end = float("-inf")
        for end, collective in sorted(groups):
            g = groups[(end, collective)]
            start = max(max(item[2] for item in g), previous_end)
            what = "all-gather" if collective == tr.ALL_GATHER else "all-reduce"
            out.append({"name": f"{what} ({len(g)} tensor{'s' if len(g) > 1 else ''})", "cat": tr.CAT_COMM,
                        "ph": "X", "ts": start, "dur": end - start, "pid": rank, "tid": tr.LANE_COMM,
                        "args": {"bytes": sum(item[1] for item in g), "tensors": [item[0] for item in g],
                                 "collective": collective, "timing": "last enqueue → completion"}})
            previous_end = end
        return out
