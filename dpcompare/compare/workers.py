"""Persistent workers for ``dpcompare compare --workers persistent``: one long-lived job per process count
runs the comparison's training runs one after another, so a run costs its training, not a launch.

A fresh ``mpirun … dpcompare train`` spends about 5 s of a 8 s demo run starting: Python, torch and
torch._dynamo imports, MPI start-up. A worker pays that once. Each run still starts from nothing that
matters to its measurement: ``dpcompare train`` builds the data, model and optimizer, joins its strategy's
process group (a new gloo group for DDP, ``hvd.init()`` for Horovod) and leaves it at the end
(``destroy_process_group()``, ``hvd.shutdown()``, which stops Horovod's background thread), so no arm's
threads run while another arm is timed. MPI belongs to the worker (mpi4py starts it first), which is what
lets Horovod start again after a shutdown. The environment is restored after every run and the peak-memory
mark reset before it.

Protocol: compare listens on a TCP socket; every rank of the worker job connects, proves it holds the key
(a file only compare and the job can read) and says its rank; then, per run, compare sends every rank a JSON
line ``{"argv": [...train flags], "stdout": path, "stderr": path}`` and each rank answers ``{"rc": code}``
when its ``dpcompare train`` returned. A run that fails ends the job (its ranks exit with the code, so the
launcher stops them all); compare records the failure and starts a new job for the next run.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import os
import secrets
import selectors
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dpcompare.launch.env import detect_launch_env
from dpcompare.launch.jobs import leave, start_job, stop_job
from dpcompare.training import command as train_command

#: seconds a new worker job may take until every rank has connected
START_TIMEOUT = 300.0
#: how often waiting code checks that the worker job is still alive
POLL_SECONDS = 1.0


# ----------------------------------------------------------------------------------------------- worker side
def _send(f: TextIO, obj: dict[str, Any]) -> None:
    f.write(json.dumps(obj) + "\n")
    f.flush()


def _reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) so that each run reports its own peak."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # not atomic: a kernel control file, not data


@contextlib.contextmanager
def _output_to(stdout: str, stderr: str) -> Iterator[None]:
    """Send this process's file descriptors 1 and 2 (Python's and the libraries') to the run's logs."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(stdout, "a") as out, open(stderr, "a") as err:  # not atomic: log streams, written as the run goes
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def run_train(argv: list[str], stdout: str, stderr: str) -> int:
    """One ``dpcompare train`` in this process, its output in the run's logs; its exit code."""
    base_env = dict(os.environ)
    _reset_peak_rss()
    with _output_to(stdout, stderr):
        try:
            code = train_command.main(argv)
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001  (whatever it was, the run failed: its log says why)
            traceback.print_exc()
            code = 1
    os.environ.clear()
    os.environ.update(base_env)  # the rendezvous address and port are the run's own
    return code


def serve(address: str, key_file: str) -> int:
    from mpi4py import MPI  # noqa: F401  (MPI is the worker's: Horovod then leaves it running at shutdown)

    rank = detect_launch_env().rank
    host, port = address.rsplit(":", 1)
    key = Path(key_file).read_text().strip()
    with socket.create_connection((host, int(port))) as sock, sock.makefile("rw") as f:
        _send(f, {"key": key, "rank": rank})
        for line in f:
            req = json.loads(line)
            if req.get("stop"):
                break
            code = run_train(req["argv"], req["stdout"], req["stderr"])
            _send(f, {"rc": code})
            if code != 0:  # the process group may be in any state: end the job, compare starts another
                leave(code)
    leave(0)
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dpcompare.compare.workers",
                                description="A dpcompare compare worker (started by compare --workers persistent).")
    p.add_argument("--connect", required=True, metavar="HOST:PORT")
    p.add_argument("--key-file", required=True)
    a = p.parse_args(argv)
    return serve(a.connect, a.key_file)


# ----------------------------------------------------------------------------------------------- compare side
@dataclass
class _Job:
    proc: subprocess.Popen[bytes]
    log: Path
    conns: dict[int, tuple[socket.socket, Any]] = field(default_factory=dict)  # rank → (socket, its file)

    def alive(self) -> bool:
        return self.proc.poll() is None


class WorkerPool:
    """compare's side: one worker job per process count (and launch options: a binding of the ranks), started on
    first use, replaced after a failure.

    ``command(np, argv, **options)`` is the launcher's command line for ``argv`` as ``np`` processes (mpirun or
    srun; ``options``: :func:`~dpcompare.launch.mpirun.job_command`'s, e.g. ``bind``).
    """

    def __init__(self, folder: Path, env: dict[str, str], command: Callable[..., list[str]],
                 *, local: bool = True) -> None:
        self.folder, self.env, self.command, self.local = folder, env, command, local
        self.jobs: dict[tuple[int, tuple[tuple[str, Any], ...]], _Job] = {}
        self.started = 0

    def run(self, np: int, argv: list[str], run_dir: Path, timeout: float | None,
            options: dict[str, Any] | None = None) -> tuple[int | None, float]:
        """Run ``dpcompare train ARGV`` on the np-process worker started with launch ``options``; (exit code or None
        on timeout, seconds)."""
        t0 = time.perf_counter()
        out, err = run_dir / "stdout.log", run_dir / "stderr.log"
        # not atomic: the run's log streams, emptied for the run (appended to as it goes, like a child's output)
        out.write_text("")
        err.write_text("")  # not atomic: as above
        key = (np, tuple(sorted((options or {}).items())))
        if key in self.jobs and not self.jobs[key].alive():
            self._stop(key)
        try:
            job = self.jobs.get(key) or self._start(key, timeout)
        except _JobFailed as e:
            with open(err, "a") as f:  # not atomic: a log stream
                f.write(str(e) + "\n")
            return e.code, time.perf_counter() - t0
        deadline = None if timeout is None else t0 + timeout
        try:
            for _, conn in job.conns.values():
                _send(conn, {"argv": argv, "stdout": str(out), "stderr": str(err)})
            codes = self._replies(job, deadline)
        except OSError:
            codes = None
        except BaseException:  # Ctrl-C: take the job down with us
            self._stop(key)
            raise
        wall = time.perf_counter() - t0
        if codes is not None and all(c == 0 for c in codes):
            return 0, wall
        timed_out = codes is None and deadline is not None and time.perf_counter() >= deadline
        if codes is None and not timed_out:  # a rank is gone: its launcher ends the job and says why
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.proc.wait(timeout=10)
        self._stop(key)  # a failed or stopped run ends its job: the next run gets a new one
        with open(err, "a") as f:  # not atomic: a log stream
            f.write(_tail(job.log))  # what the launcher said (a rank killed by a signal, ...)
        if codes is None:
            return (None if timed_out else (job.proc.returncode or 1)), wall
        return next(c for c in codes if c != 0), wall

    def close(self) -> None:
        for key in list(self.jobs):
            job = self.jobs[key]
            for _, conn in job.conns.values():
                with contextlib.suppress(OSError):
                    _send(conn, {"stop": True})
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.proc.wait(timeout=30)
            self._stop(key)

    # ---------------------------------------------------------------------------------------------- internals
    def _start(self, slot: tuple[int, tuple[tuple[str, Any], ...]], timeout: float | None) -> _Job:
        np, options = slot[0], dict(slot[1])
        self.folder.mkdir(parents=True, exist_ok=True)
        key = secrets.token_hex(16)
        key_file = self.folder / ".worker-key"
        key_file.touch(mode=0o600)
        key_file.write_text(key)  # not atomic: created 0600 first, so that the key is never readable by others
        host = "127.0.0.1" if self.local else socket.gethostname()
        server = socket.create_server(("127.0.0.1" if self.local else "", 0))
        self.started += 1
        log = self.folder / f"worker-np{np}-{self.started}.log"
        cmd = self.command(np, [sys.executable, "-m", "dpcompare.compare.workers", "--connect",
                                f"{host}:{server.getsockname()[1]}", "--key-file", str(key_file)], **options)
        with open(log, "w") as f:  # not atomic: the worker job's output stream
            f.write(" ".join(cmd) + "\n")
            f.flush()
            proc = start_job(cmd, self.env, f, subprocess.STDOUT)
        job = _Job(proc, log)
        self.jobs[slot] = job
        deadline = time.monotonic() + min(START_TIMEOUT, timeout or START_TIMEOUT)
        server.settimeout(POLL_SECONDS)
        try:
            while len(job.conns) < np:
                if not job.alive() or time.monotonic() > deadline:
                    raise _JobFailed(f"the worker job (np={np}) ended or hung before every rank had connected; "
                                     f"its output:\n{_tail(log)}", job.proc.returncode or 1)
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                sock.settimeout(None)
                f = sock.makefile("rw")
                hello = json.loads(f.readline() or "{}")
                if not hmac.compare_digest(str(hello.get("key", "")), key):
                    f.close()
                    sock.close()
                    continue
                job.conns[int(hello["rank"])] = sock, f
        except BaseException:
            self._stop(slot)
            raise
        finally:
            server.close()
            key_file.unlink(missing_ok=True)
        return job

    def _replies(self, job: _Job, deadline: float | None) -> list[int] | None:
        """Every rank's exit code, or None when the job died or the deadline passed first."""
        codes: dict[int, int] = {}
        sel = selectors.DefaultSelector()
        for rank, (sock, f) in job.conns.items():
            sel.register(sock, selectors.EVENT_READ, (rank, f))
        try:
            while len(codes) < len(job.conns):
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    return None
                ready = sel.select(POLL_SECONDS if left is None else min(POLL_SECONDS, left))
                for key, _ in ready:
                    rank, f = key.data
                    line = f.readline()
                    if not line:
                        return None  # that rank is gone
                    codes[rank] = int(json.loads(line)["rc"])
                    sel.unregister(key.fileobj)
                if not ready and not job.alive():
                    return None
            return [codes[r] for r in sorted(codes)]
        finally:
            sel.close()

    def _stop(self, key: tuple[int, tuple[tuple[str, Any], ...]]) -> None:
        job = self.jobs.pop(key, None)
        if job is None:
            return
        for sock, f in job.conns.values():
            with contextlib.suppress(OSError):
                f.close()
                sock.close()
        stop_job(job.proc)


class _JobFailed(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _tail(log: Path, lines: int = 20) -> str:
    """The last lines of a worker job's log after its first (the command line), or ""."""
    try:
        text = log.read_text(errors="replace").splitlines()[1:]
    except OSError:
        return ""
    return "".join(f"{ln}\n" for ln in text[-lines:])


if __name__ == "__main__":
    sys.exit(main())
