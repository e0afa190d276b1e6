"""Who starts a job, who stops it, and how a command's process ends.

:func:`job_line` (and :func:`dpcompare_command`, for ``dpcompare WORDS``) is the one builder of a job's command
line: mpirun or srun, or a :class:`Placement`'s own line (the lab's hosts). ``dpcompare launch``, compare,
parity, ``lab bench`` and ``Lab.run`` all build their jobs here; it is pure. :func:`start_job` starts a job in
its own session so that :func:`stop_job` can take all its processes down; :func:`run_job` is a fresh run from
start to end, with its output in RUN/stdout.log and RUN/stderr.log (:func:`log_tail` reads what it said last)
and a time limit. :func:`run_command` turns a command's failures into exit codes (one line, no traceback) and
:func:`leave` ends the process.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from dpcompare.errors import DpcompareError
from dpcompare.launch.env import reporting_rank
from dpcompare.launch.mpirun import dpcompare_argv, job_command

#: seconds a stopped job gets after SIGTERM, then after SIGKILL
STOP_GRACE = (10.0, 5.0)
#: where :func:`run_job` keeps a job's output, in its run folder
LOGS = ("stdout.log", "stderr.log")


class Placement(Protocol):
    """Where a job's ranks run when not where mpirun or srun would put them: :class:`dpcompare.lab.Lab` (its
    emulated hosts) implements it. launch/ may not import the lab; the lab brings its placement here."""

    def command(self, argv: Sequence[str], np: int | None = None, **options: Any) -> list[str]:
        """The whole command running ``argv`` as ``np`` ranks there, with the variables its ranks need on the line
        itself (so that the recorded line reruns the job alone); ``options``: the placement's own (e.g. the
        lab's ``per_host`` and ``mpi_options``)."""
        ...


def job_line(argv: Sequence[str], np: int, placement: Placement | None = None, **options: Any) -> list[str]:
    """``argv`` as ``np`` processes: through ``placement`` when given (``options``: its own), else mpirun or srun
    (``options``: :func:`~dpcompare.launch.mpirun.job_command`'s)."""
    if placement is not None:
        return placement.command(argv, np, **options)
    return job_command(np, argv, **options)


def dpcompare_command(np: int | None, words: Sequence[str], placement: Placement | None = None,
                      **options: Any) -> list[str]:
    """``dpcompare WORDS`` (e.g. ``train --strategy ddp ...``) as ``np`` processes (:func:`job_line`); ``np``
    None: one plain process on this machine."""
    argv = [*dpcompare_argv(), *words]
    return argv if np is None else job_line(argv, np, placement, **options)


def start_job(cmd: Sequence[str], env: dict[str, str], stdout: IO[Any] | int | None,
              stderr: IO[Any] | int | None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session (so that :func:`stop_job` reaches every process it starts)."""
    return subprocess.Popen(list(cmd), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)


def stop_job(p: subprocess.Popen[bytes]) -> None:
    """End a job started by :func:`start_job`: SIGTERM to the whole group, SIGKILL if any of it lingers.

    The job is over when its leader (e.g. mpirun) has exited *and* every other process of its session (the
    ranks it started) is gone, not only when the leader is.
    """
    for sig, grace in zip((signal.SIGTERM, signal.SIGKILL), STOP_GRACE, strict=True):
        deadline = time.monotonic() + grace
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=grace)
        while p.returncode is not None and _group_alive(p.pid):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if p.returncode is not None and not _group_alive(p.pid):
            return


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (zombies, waiting for their parent, are not)."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: any member, zombie or not
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while we looked
        if fields[2] == str(pgid) and fields[0] not in "ZX":
            return True
    return False


def run_job(cmd: Sequence[str], run_dir: Path | None, env: dict[str, str],
            timeout: float | None) -> tuple[int | None, float]:
    """Run one job in its own session with its output in RUN/stdout.log and RUN/stderr.log (``run_dir`` None: on
    this terminal), stopped after ``timeout`` seconds; (exit code, or None when it was stopped; seconds).

    Ctrl-C (or any error) while it runs takes the job's processes down too.
    """
    t0 = time.perf_counter()
    with contextlib.ExitStack() as files:
        out: IO[Any] | None = None
        err: IO[Any] | None = None
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            out, err = (files.enter_context(open(run_dir / name, "w")) for name in LOGS)  # not atomic: log streams
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


def log_tail(run_dir: Path, lines: int = 15) -> str:
    """The last ``lines`` lines a job run by :func:`run_job` wrote to stderr (to stdout when stderr is empty)."""
    for name in reversed(LOGS):
        path = run_dir / name
        text = path.read_text(errors="replace").strip() if path.exists() else ""
        if text:
            return "\n".join(text.splitlines()[-lines:])
    return ""


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
        else:
            _let_the_reporting_rank_speak()
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"dpcompare {name}: interrupted; files already written are kept\n")
        return 130
    except ModuleNotFoundError as e:  # a dependency dpcompare declares, absent from this environment
        sys.stderr.write(f"dpcompare {name}: error: Python module {e.name!r} is not installed here; install "
                         "dpcompare's dependencies (make setup, or pip install -e .), then rerun\n")
        return 2
    except Exception as e:  # a collective failed because another process died: one line, no traceback
        # lazy: an optional dependency, tried where it is used
        from dpcompare.launch.failures import LOST_PEER_EXIT, lost_peer_message

        msg = lost_peer_message(e)
        if msg is None:
            raise
        sys.stderr.write(f"dpcompare {name}: error: {msg}\n")
        return LOST_PEER_EXIT


#: how long a silent rank waits before it exits with a refusal (the launcher ends it sooner, once rank 0 exits)
SILENT_RANK_GRACE_S = 5.0


def _let_the_reporting_rank_speak() -> None:
    """A rank that stays silent about a refusal every rank meets waits before it exits: mpirun and torchrun kill
    the whole job when the first rank exits non-zero, and a silent rank exiting first would kill rank 0 before it
    printed the one line that says what to do. Rank 0's exit ends this wait (the launcher stops the job)."""
    time.sleep(SILENT_RANK_GRACE_S)


def leave(code: int, *, script: bool = False) -> None:
    """End the process with ``code`` without Python's teardown once a command that loaded torch returns.

    Every file a command writes is closed by the time it returns, and its strategy has left the process
    group. What remains is the interpreter unwinding torch, torch._dynamo and CUDA's libraries: about 1.4 s
    a process on a 2-core machine, a tenth of a short ``dpcompare compare`` run, for nothing. It is also
    where gloo's worker threads, which outlive ``destroy_process_group`` while anything (DDP's reducer, a
    script's module) still holds the group, can release the last collective's tensors or run a future's
    Python callback: taking the GIL of an interpreter that is finalizing aborts the process (signal 6, seen
    in CI after a diverged run, a finished one and a Horovod script on the native layer).

    After a failure the atexit handlers still run (a failure path may have registered clean-up). After a
    user's ``script``, the process ends the way Python ends one up to its teardown: the script's other
    non-daemon threads are joined, then every atexit handler runs. MPI, if mpi4py started it, is finalized
    last so that mpirun sees the exit code, not a crash.
    """
    if "torch" not in sys.modules:
        sys.exit(code)
    if script:
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
    if code != 0 or script:
        atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(code)
