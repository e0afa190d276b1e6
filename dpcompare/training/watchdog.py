"""A step that does not finish within ``--timeout`` ends the process, in one line.

A lost peer makes gloo (DDP) raise once its own timeout expires, but a peer whose link crawls keeps MPI (Horovod
over mpirun) waiting as long as bytes still trickle: no library times out on a collective that is merely slow.
The watchdog gives every non-elastic run the same bound: when a step has run ``--timeout`` seconds, this rank
says which step and why in one line and exits with the lost-peer code; its launcher (mpirun, srun) then ends
the job, and across a lab the lab names the host that was lost or crawls. Elastic runs recover instead and
have no watchdog.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType

from dpcompare.launch.failures import LOST_PEER_EXIT


def _leave(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os._exit(LOST_PEER_EXIT)


class StepWatchdog:
    """``with StepWatchdog(timeout, where):`` a thread that calls ``expire(message)`` (default: print it and exit)
    when a step begun with :meth:`begin` has not :meth:`end`-ed within ``timeout`` seconds."""

    def __init__(self, timeout: float, where: str, expire: Callable[[str], None] = _leave) -> None:
        self.timeout, self.where, self.expire = timeout, where, expire
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._step = 0
        self._stopped = False
        self._thread = threading.Thread(target=self._watch, name="dpcompare-step-watchdog", daemon=True)

    def __enter__(self) -> StepWatchdog:
        self._thread.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()

    def begin(self, step: int) -> None:
        with self._cond:
            self._step, self._deadline = step, time.monotonic() + self.timeout
            self._cond.notify()

    def end(self) -> None:
        with self._cond:
            self._deadline = None

    def _watch(self) -> None:
        with self._cond:
            while not self._stopped:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline = None
                self.expire(f"dpcompare train: error: step {self._step} did not finish within --timeout "
                            f"{self.timeout:g} s on {self.where}: a collective waited on a peer that is gone or whose "
                            "link crawls; see the launcher's messages for the host")
