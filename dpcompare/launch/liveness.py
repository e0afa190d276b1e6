"""A lost peer noticed in seconds under torchrun's elastic agent: heartbeats on the job's store.

Used by the elastic arms whose workers torchrun starts: ``native-elastic`` and a port's (the script runner,
:mod:`dpcompare.native.runner`) and ``ddp-elastic`` (the training loop, :func:`watching`).

A host that dies with its link down sends nothing, not even its sockets' FIN: the survivors' gloo collective
waits on it until the collective timeout (``--timeout``, minutes), and torchrun's agents restart nothing while
their own workers are alive. Horovod Elastic notices such a host in seconds (its driver loses the worker's ssh
session). Here every worker of an elastic job (``TORCHELASTIC_RUN_ID`` set) beats on the job's TCP store
(``MASTER_ADDR:MASTER_PORT``, a client of its own with a short timeout) from a daemon thread, once every
:data:`BEAT_S`, and watches the beats of the next :data:`WATCHED` ranks. A peer whose beat has not moved for
:data:`LOST_S` (``$DPCOMPARE_LOST_PEER_S``), or a store that has not answered for as long, is a lost peer: the
worker says so in one line and ends with :data:`RESTART_EXIT`, and its agent restarts the group with the hosts
left, as after a failed collective (:mod:`.elastic`). A step that is slow but alive is no loss: the beats come
from a thread of their own, whatever the step is doing.

A worker that ends cleanly marks the job done (:func:`stop`); from then no worker counts a silent peer as lost
(peers finish at different times), and the store's host waits a moment, so that the others read the mark before
the store goes with it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

#: a worker's exit code after a lost peer or a failed collective under torchrun: its agent restarts the group
RESTART_EXIT = 75
#: seconds between beats, and seconds without a beat (or an answer from the store) that make a peer lost
BEAT_S = 1.0
LOST_S = 5.0
LOST_VAR = "DPCOMPARE_LOST_PEER_S"
#: seconds a peer that has never beaten may take to start (importing torch on a busy machine)
START_GRACE_S = 60.0
#: how many of the next ranks each worker watches (every rank is watched by its predecessors; a whole host lost
#: is noticed by the worker before it)
WATCHED = 4
PREFIX = "dpcompare.alive/"
DONE_KEY, SEEN_KEY = PREFIX + "done", PREFIX + "seen"

_monitor: Monitor | None = None


def lost_after() -> float:
    """Seconds of silence that make a peer lost (``$DPCOMPARE_LOST_PEER_S``, else :data:`LOST_S`)."""
    value = os.environ.get(LOST_VAR)
    return float(value) if value else LOST_S


def _leave(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RESTART_EXIT)  # no teardown: the main thread may be waiting in a collective on the lost peer


class Monitor:
    """Beats for ``rank`` and watches the next ranks' beats on ``store``; ``expire(message)`` on a lost peer."""

    def __init__(self, store: Any, rank: int, size: int, lost_s: float,
                 expire: Callable[[str], None] = _leave, clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.rank, self.size, self.lost_s = store, rank, size, lost_s
        self.expire, self.clock = expire, clock
        self.watched = [(rank + i) % size for i in range(1, min(WATCHED, size - 1) + 1)]
        now = clock()
        self.last: dict[int, tuple[int, float]] = {p: (0, now) for p in self.watched}
        self.answered = now
        self.finished = threading.Event()

    def tick(self) -> str | None:
        """One beat and one look at the watched peers: why this worker must leave, or None."""
        now = self.clock()
        try:
            self.store.add(f"{PREFIX}{self.rank}", 1)
            if self.store.add(DONE_KEY, 0) > 0:
                self.store.add(SEEN_KEY, 1)
                self.finished.set()
                return None
            beats = {p: self.store.add(f"{PREFIX}{p}", 0) for p in self.watched}
        except Exception as e:  # a store that does not answer: its host (rank 0's) may be the one lost
            if now - self.answered >= self.lost_s:
                return (f"the job's store has not answered for {now - self.answered:.0f} s "
                        f"({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})")
            return None
        self.answered = now
        for peer, beat in beats.items():
            seen, since = self.last[peer]
            if beat != seen:
                self.last[peer] = (beat, now)
            elif now - since >= (self.lost_s if beat > 0 else max(self.lost_s, START_GRACE_S)):
                return f"rank {peer} has not beaten for {now - since:.0f} s"
        return None

    def run(self) -> None:
        """Beat at once, then every :data:`BEAT_S`, until the job is done or a peer is lost."""
        while not self.finished.is_set():
            why = self.tick()
            if why is not None and not self.finished.is_set():
                self.expire(f"dpcompare: lost peer seen by rank {self.rank} of {self.size}: {why}; ending this "
                            f"worker (exit {RESTART_EXIT}) so that torchrun restarts the group with the hosts left")
                return
            self.finished.wait(BEAT_S)

    def finish(self, wait_s: float) -> None:
        """Mark the job done; the store's host waits up to ``wait_s`` for every peer to end or read the mark."""
        self.finished.set()
        with contextlib.suppress(Exception):  # the store already gone: nobody left to tell
            done = self.store.add(DONE_KEY, 1)
            deadline = self.clock() + wait_s
            while self.rank == 0 and done + self.store.add(SEEN_KEY, 0) < self.size and self.clock() < deadline:
                time.sleep(BEAT_S / 10)  # polling the peers' marks on the store, bounded by wait_s
                done = self.store.add(DONE_KEY, 0)


def _client(lost_s: float) -> Any:
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=max(lost_s, 1.0)), wait_for_workers=False)


def _group_started(finished: threading.Event) -> bool:
    """Wait until this process has joined its process group (False: the worker ended first)."""
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    import torch.distributed as dist

    while not dist.is_initialized():
        if finished.wait(BEAT_S / 10):  # the group's creation has no event to wait on: its flag, read 10× a beat
            return False
    return True


def start() -> bool:
    """Start the heartbeat of this worker when it is one of torchrun's elastic agent's with peers (True)."""
    global _monitor
    env = os.environ
    if _monitor is not None or "TORCHELASTIC_RUN_ID" not in env or int(env.get("WORLD_SIZE", "1")) < 2:
        return False
    if not (env.get("MASTER_ADDR") and env.get("MASTER_PORT") and env.get("RANK")):
        return False
    lost_s = lost_after()
    monitor = Monitor(None, int(env["RANK"]), int(env["WORLD_SIZE"]), lost_s)

    def connect_and_run() -> None:
        # rank 0 starts the store when the script calls init_process_group: connect once the group exists (a
        # client that tried before could wait out its connection backoff and miss a peer lost meanwhile)
        if not _group_started(monitor.finished):
            return
        try:
            store = _client(max(lost_s, 60.0))
            store.set_timeout(timedelta(seconds=max(lost_s, 1.0)))
        except Exception:  # no store (the script never joined the group): nothing to watch
            return
        monitor.store = store
        monitor.answered = monitor.clock()
        monitor.last = {p: (0, monitor.answered) for p in monitor.watched}
        monitor.run()

    threading.Thread(target=connect_and_run, name="dpcompare-liveness", daemon=True).start()
    _monitor = monitor
    return True


def stop(clean: bool) -> None:
    """The worker ends: ``clean`` marks the job done (no silent peer is lost from now); else the beats stop, and
    the peers notice this worker gone."""
    global _monitor
    monitor, _monitor = _monitor, None
    if monitor is None:
        return
    if clean and monitor.store is not None:
        monitor.finish(3 * BEAT_S)
    monitor.finished.set()


@contextlib.contextmanager
def watching() -> Iterator[bool]:
    """``with watching():`` the heartbeat of this worker while the block runs (True: started, under torchrun);
    the block's clean end marks the job done."""
    started, clean = start(), False
    try:
        yield started
        clean = True
    finally:
        if started:
            stop(clean)
