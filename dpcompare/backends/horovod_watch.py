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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from dpcompare import trace as tr

POLL_S = 2e-4  #: how often the thread polls outstanding handles (a completion is stamped this late at most,
#: plus the time to get the GIL)


class HandleWatcher:
    """Per-tensor enqueue → completion on this rank; :meth:`events` turns them into fused operations."""

    def __init__(self, recorder: tr.TraceRecorder, poll: Callable[[int], bool]) -> None:
        self.recorder, self._poll = recorder, poll
        self._pending: dict[int, tuple[str, int, float, str]] = {}  # handle → (tensor, bytes, enqueued_us, collective)
        self.done: list[tuple[str, int, float, float, str]] = []  # (tensor, bytes, enqueued_us, completed_us, collective)
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpcompare-horovod-watch", daemon=True)
        self._thread.start()

    def enqueued(self, handle: int, tensor: str, nbytes: int, collective: str = tr.ALL_REDUCE) -> None:
        """Horovod took ``tensor``'s operation (an all-reduce; for a sparse gradient two all-gathers, its indices'
        and its values')."""
        with self._lock:
            self._pending[handle] = (tensor, nbytes, self.recorder.now(), collective)
            self._idle.clear()

    def wait_idle(self, timeout_s: float) -> None:
        """Block (releasing the GIL) until every handle seen so far has completed, so that ``synchronize`` may
        release them: polling a released handle raises."""
        self._idle.wait(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                items = list(self._pending.items())
            finished = [h for h, _ in items if self._completed(h)]
            if finished:
                now = self.recorder.now()
                with self._lock:
                    for h in finished:
                        tensor, nbytes, t0, collective = self._pending.pop(h)
                        self.done.append((tensor, nbytes, t0, now, collective))
                    if not self._pending:
                        self._idle.set()
            time.sleep(POLL_S)

    def _completed(self, handle: int) -> bool:
        try:
            return bool(self._poll(handle))
        except Exception:  # released by someone else already (e.g. synchronize of a late enqueue): done
            return True

    def stop(self) -> None:
        """Stop polling (handles still pending are stamped now: the step that waits for them has ended)."""
        self._stop.set()
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
