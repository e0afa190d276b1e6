"""A lost peer noticed in seconds under torchrun (dpcompare/launch/liveness.py).

The monitor's rules on a store and clock of the test's own; then two workers of the native layer as torchrun
starts them (its variables, no agent: the agent would notice its own worker's end, not a silent peer) where rank
1 is stopped with SIGSTOP, as a host whose link went down: silent, its sockets open, so that gloo waits on it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpcompare.launch import liveness
from dpcompare.launch.liveness import DONE_KEY, RESTART_EXIT, Monitor
from dpcompare.launch.rendezvous import free_port

from conftest import ROOT

PEER = ROOT / "tests" / "liveness_peer.py"
LOST_S = 2.0


class _Store:
    """The few TCPStore calls the monitor makes; ``down``: every call fails, as a store on a lost host."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.down = False

    def add(self, key: str, n: int) -> int:
        if self.down:
            raise RuntimeError("connection timed out")
        self.values[key] = self.values.get(key, 0) + n
        return self.values[key]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _monitor(size: int = 3) -> tuple[Monitor, _Store, _Clock]:
    store, clock = _Store(), _Clock()
    return Monitor(store, 0, size, LOST_S, expire=pytest.fail, clock=clock), store, clock


def test_a_peer_that_beats_is_never_lost_and_a_silent_one_is() -> None:
    m, store, clock = _monitor()
    assert m.watched == [1, 2]
    for _ in range(10):  # a slow step: peers beat from their own thread, far longer than LOST_S in all
        store.add(f"{liveness.PREFIX}1", 1)
        store.add(f"{liveness.PREFIX}2", 1)
        clock.now += LOST_S * 0.9
        assert m.tick() is None
    store.add(f"{liveness.PREFIX}1", 1)  # rank 2 goes silent
    clock.now += LOST_S
    assert m.tick() == f"rank 2 has not beaten for {LOST_S:.0f} s"
    assert store.values[f"{liveness.PREFIX}0"] == 11  # its own beat, once per tick


def test_a_peer_starting_slowly_gets_the_grace_and_a_finished_job_stops_watching() -> None:
    m, store, clock = _monitor(size=2)
    clock.now += liveness.START_GRACE_S - 1  # rank 1 still importing torch: never beaten yet
    assert m.tick() is None
    clock.now += 1
    assert m.tick() == f"rank 1 has not beaten for {liveness.START_GRACE_S:.0f} s"
    m2, store2, clock2 = _monitor(size=2)
    store2.add(f"{liveness.PREFIX}1", 1)
    assert m2.tick() is None
    store2.add(DONE_KEY, 1)  # rank 1 ended cleanly: its silence from now on is no loss
    clock2.now += 10 * LOST_S
    assert m2.tick() is None and m2.finished.is_set()
    assert store2.values[liveness.SEEN_KEY] == 1


def test_a_store_that_stops_answering_is_a_lost_peer_after_as_long() -> None:
    m, store, clock = _monitor()
    store.down = True
    clock.now += LOST_S / 2
    assert m.tick() is None
    clock.now += LOST_S / 2
    assert m.tick() == f"the job's store has not answered for {LOST_S:.0f} s (connection timed out)"


def _workers(tmp_path: Path, mode: str) -> list[subprocess.Popen]:
    port, procs = free_port("127.0.0.1"), []
    for rank in range(2):
        env = {**os.environ, "TORCHELASTIC_RUN_ID": f"liveness-{mode}", "RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), liveness.LOST_VAR: f"{LOST_S:g}", "HOROVOD_GLOO_TIMEOUT_SECONDS": "300",
               "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "dpcompare.native", "--as", "native", "--threads", "1", "--", "python",
               str(PEER), f"{3 * LOST_S:g}", mode]
        procs.append(subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return procs


def test_a_silent_peer_ends_the_survivor_in_seconds_and_ranks_that_end_apart_end_cleanly(tmp_path: Path) -> None:
    """Two jobs at once: one whose rank 1 goes silent after a slow first step (3 x LOST_S: no loss), one whose
    ranks end 3 x LOST_S apart (rank 0, which held the store, first: no loss either)."""
    (tmp_path / "finish").mkdir()
    finishing = _workers(tmp_path / "finish", "finish")
    survivor, peer = _workers(tmp_path, "loop")
    try:
        line = peer.stdout.readline()  # after a first step rank 1 made 3 x LOST_S slow
        assert line.startswith("ready"), (line, peer.stderr.read() if peer.poll() is not None else "")
        assert survivor.poll() is None, survivor.stderr.read()  # the slow step was no loss
        peer.send_signal(signal.SIGSTOP)  # its host lost: silent, sockets open
        t0 = time.monotonic()
        rc = survivor.wait(timeout=120)
        noticed = time.monotonic() - t0
        err = survivor.stderr.read()
        codes = [p.wait(timeout=120) for p in finishing]
        errs = [p.stderr.read() for p in finishing]
    finally:
        for p in (survivor, peer, *finishing):
            p.kill()
            p.wait()
    assert rc == RESTART_EXIT, err
    assert "lost peer seen by rank 0 of 2: rank 1 has not beaten for" in err, err
    assert noticed < 30, noticed  # against the collective's 300 s; LOST_S plus a beat, on a quiet machine
    assert codes == [0, 0], errs
    assert not any("lost peer" in e for e in errs), errs
