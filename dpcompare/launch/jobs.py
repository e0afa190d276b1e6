"""Who starts a job, who stops it, and how a command's process ends.

:func:`dpcompare_command` is the one builder of a job's command line (``dpcompare launch``, ``compare`` and
``parity`` all use it); it is pure. :func:`start_job` starts a job in its own session so that
:func:`stop_job` can take all its processes down; :func:`run_job` is a fresh run from start to end, its output
in RUN/stdout.log and RUN/stderr.log. :func:`run_command` turns a command's failures into exit codes (one
line, no traceback) and :func:`leave` ends the process.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from dpcompare.errors import DpcompareError
from dpcompare.launch.env import reporting_rank
from dpcompare.launch.mpirun import dpcompare_argv, job_command

#: seconds a stopped job gets after SIGTERM, then after SIGKILL
STOP_GRACE = (10.0, 5.0)


def dpcompare_command(np: int | None, words: Sequence[str], **launcher: Any) -> list[str]:
    """``dpcompare WORDS`` (e.g. ``train --strategy ddp ...``) as ``np`` processes through mpirun or srun
    (``launcher``: :func:`~dpcompare.launch.mpirun.job_command`'s options); ``np`` None: one plain process."""
    argv = [*dpcompare_argv(), *words]
    return argv if np is None else job_command(np, argv, **launcher)


def start_job(cmd: Sequence[str], env: dict[str, str], stdout: IO[Any] | int | None,
              stderr: IO[Any] | int | None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session (so that :func:`stop_job` reaches every process it starts)."""
    return subprocess.Popen(list(cmd), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)


def stop_job(p: subprocess.Popen[bytes]) -> None:
    """End a job started by :func:`start_job`: SIGTERM to the whole group, SIGKILL if it lingers."""
    for sig, wait in zip((signal.SIGTERM, signal.SIGKILL), STOP_GRACE, strict=True):
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run_job(cmd: Sequence[str], run_dir: Path, env: dict[str, str], timeout: float | None) -> tuple[int | None, float]:
    """Run one job with its output in RUN/stdout.log and RUN/stderr.log; (exit code or None on timeout, seconds).

    Ctrl-C (or any error) while it runs takes the job's processes down too.
    """
    t0 = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as out, open(run_dir / "stderr.log", "w") as err:  # not atomic: log streams
        p = start_job(cmd, env, out, err)
        try:
            rc: int | None = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            stop_job(p)
        except BaseException:
            stop_job(p)
            raise
    return rc, time.perf_counter() - t0


def run_command(name: str, func: Callable[[Any], int | None], args: Any) -> int:
    """``func(args)``'s exit code, a user's error (one line on stderr, from the reporting rank) as its code,
    Ctrl-C as 130, and a collective that lost a peer as one line."""
    try:
        return int(func(args) or 0)
    except DpcompareError as e:
        # Every rank of a job meets the same refusal: one line, from the reporting rank (or from every
        # rank when the error is local to one, e.g. an inconsistent launch environment).
        if e.local or reporting_rank():
            sys.stderr.write(f"dpcompare {name}: error: {e}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"dpcompare {name}: interrupted; files already written are kept\n")
        return 130
    except Exception as e:  # a collective failed because another process died: one line, no traceback
        from dpcompare.launch.failures import LOST_PEER_EXIT, lost_peer_message

        msg = lost_peer_message(e)
        if msg is None:
            raise
        sys.stderr.write(f"dpcompare {name}: error: {msg}\n")
        return LOST_PEER_EXIT


def leave(code: int) -> None:
    """End the process with ``code``; after a successful command that loaded torch, skip Python's teardown.

    Every file a command writes is closed by the time it returns, and its strategy has left the process
    group. What remains is the interpreter unwinding torch, torch._dynamo and CUDA's libraries, about 1.4 s
    a process on a 2-core machine: a tenth of a short ``dpcompare compare`` run, for nothing. MPI, if
    mpi4py started it, is finalized first so that mpirun sees a clean exit. Failures take the normal path.
    """
    if code != 0 or "torch" not in sys.modules:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(code)
