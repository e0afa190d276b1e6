"""When one process dies (SIGKILL) the whole job ends soon, non-zero, and the lost rank is named.

Under mpirun the launcher ends the other ranks as soon as one dies by a signal and names it; DDP's
survivors see the reset TCP connections at once and say so in one line (no traceback). Horovod over
MPI does not notice a dead peer by itself (a single host's shared-memory transport never fails): the
launcher is what ends it, which is why srun lines carry --kill-on-bad-exit=1.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from dpcompare.cli import main
from dpcompare.launch.env import LaunchEnv
from dpcompare.launch.failures import is_lost_peer, lost_peer_message
from dpcompare.launch.rendezvous import free_port

from conftest import DPCOMPARE, FAST, mpi_env, mpirun_cmd, needs_horovod, needs_mpi

END_WITHIN_S = 60.0
FIRST_EPOCH_WITHIN_S = 180.0
GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:52124: Connection reset by peer. This is typically caused by a remote worker hanging "
              "or bugs in the application. Check the logs of the remote worker before reporting an error.")
LONG_RUN = ("train", *FAST, "--epochs", "200", "--progress", "lines", "--overwrite")


class HorovodInternalError(RuntimeError):
    """Stands in for horovod.common.exceptions.HorovodInternalError (recognised by name)."""


# -- recognising a lost peer ------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [
    RuntimeError(GLOO_RESET),
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:4242"),
    RuntimeError("[c10d] gloo: Timed out waiting 300000ms for recv operation to complete"),
    HorovodInternalError("Horovod has been shut down. This was caused by an exception on one of the ranks"),
])
def test_lost_peer_is_recognised(exc: BaseException) -> None:
    assert is_lost_peer(exc)
    msg = lost_peer_message(exc, LaunchEnv(rank=0, world_size=2, launcher="openmpi"))
    assert msg is not None and "\n" not in msg
    assert msg.startswith("lost contact with another process (rank 1) in a collective on rank 0 of 2")
    assert "pair.cc" not in msg and "typically caused" not in msg


@pytest.mark.parametrize("exc", [
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), ValueError("Connection reset by peer"),
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"), KeyError("gloo"),
])
def test_other_errors_are_not_lost_peers(exc: BaseException) -> None:
    assert not is_lost_peer(exc) and lost_peer_message(exc, LaunchEnv()) is None


def test_main_reports_a_lost_peer_in_one_line(monkeypatch, capsys) -> None:
    import dpcompare.training.command as cli

    def boom(a: object) -> int:
        try:
            raise RuntimeError(GLOO_RESET)
        except RuntimeError as e:  # as torch raises it: from inside another handler
            raise RuntimeError("DDP reducer failed") from e

    for k, v in {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(cli, "_cmd_train", boom)
    assert main(["train", "--strategy", "ddp"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("dpcompare train: error: lost contact with another process (rank 0) in a collective "
                          "on rank 1 of 2: Read error [127.0.0.1]:52124: Connection reset by peer;")

    def other(a: object) -> int:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(cli, "_cmd_train", other)
    with pytest.raises(RuntimeError, match="mat1"):  # a real bug keeps its traceback
        main(["train", "--strategy", "ddp"])


# -- killing a rank for real ------------------------------------------------------------------------------
class _Output:
    """Collect a process's merged output on a thread; wait for a line without polling sleeps."""

    def __init__(self, p: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self._t = threading.Thread(target=self._pump, args=(p,), daemon=True)
        self._t.start()

    def _pump(self, p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            self._q.put(line)
        self._q.put(None)

    def wait_for(self, pattern: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                return False
            if line is None:
                return False
            self.lines.append(line)
            if re.search(pattern, line):
                return True
        return False

    def rest(self) -> str:
        self._t.join(timeout=30)
        while not self._q.empty():
            line = self._q.get()
            if line is not None:
                self.lines.append(line)
        return "".join(self.lines)


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, env=env, start_new_session=True)


def _kill_group(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def _rank_pid(root: int, rank: int) -> int | None:
    """The descendant of ``root`` that Open MPI started as ``rank`` (read from /proc/PID/environ)."""
    want = f"OMPI_COMM_WORLD_RANK={rank}".encode()
    for child in psutil.Process(root).children(recursive=True):
        with contextlib.suppress(OSError):
            if want in Path(f"/proc/{child.pid}/environ").read_bytes().split(b"\0"):
                return child.pid
    return None


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("strategy", ["ddp", pytest.param("horovod", marks=[needs_horovod, pytest.mark.horovod])])
def test_mpirun_job_ends_when_a_rank_is_killed(tmp_path: Path, strategy: str) -> None:
    p = _start(mpirun_cmd(2, *LONG_RUN, "--strategy", strategy, "--out", str(tmp_path / "run")), mpi_env())
    try:
        out = _Output(p)
        assert out.wait_for(r"^epoch +1/", FIRST_EPOCH_WITHIN_S), "no first epoch line:\n" + out.rest()[-3000:]
        victim = _rank_pid(p.pid, 1)
        assert victim is not None, "rank 1's process not found among mpirun's descendants"
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        try:
            rc = p.wait(timeout=END_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job still runs {END_WITHIN_S:.0f} s after rank 1 was killed:\n{out.rest()[-3000:]}")
        elapsed = time.monotonic() - t0
        text = out.rest()
    finally:
        _kill_group(p)
    assert rc == 128 + signal.SIGKILL, text[-3000:]  # mpirun passes the victim's signal on
    # mpirun names the lost rank ("... process rank 1 with PID ... exited on signal 9")
    assert re.search(r"rank 1 with PID \d+ .*signal 9", text, re.S), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    lost = [ln for ln in text.splitlines() if "lost contact" in ln]
    assert all(ln.startswith("dpcompare train: error: lost contact") for ln in lost) and len(lost) <= 1
    print(f"{strategy}: mpirun ended {elapsed:.2f} s after rank 1 was killed, exit {rc}")


def test_ddp_survivor_notices_a_dead_peer_by_itself(tmp_path: Path) -> None:
    """Without a launcher to end the job, gloo's reset connection ends rank 0 at once, in one line."""
    base = mpi_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")), "WORLD_SIZE": "2",
                    "LOCAL_WORLD_SIZE": "2"})
    cmd = [DPCOMPARE, *LONG_RUN, "--strategy", "ddp", "--out", str(tmp_path / "run")]
    procs = [_start(cmd, {**base, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
    try:
        out = _Output(procs[0])
        _Output(procs[1])  # drain it
        assert out.wait_for(r"^epoch +1/", FIRST_EPOCH_WITHIN_S), "no first epoch line:\n" + out.rest()[-3000:]
        procs[1].kill()
        t0 = time.monotonic()
        try:
            rc = procs[0].wait(timeout=END_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank 0 still runs {END_WITHIN_S:.0f} s after rank 1 was killed:\n{out.rest()[-3000:]}")
        elapsed = time.monotonic() - t0
        text = out.rest()
    finally:
        for p in procs:
            _kill_group(p)
    assert rc == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [ln for ln in text.splitlines() if ln.startswith("dpcompare train: error:")]
    assert len(errors) == 1 and "lost contact with another process (rank 1) in a collective on rank 0 of 2" \
        in errors[0], text[-3000:]
    # far below the process group's timeout (300 s): gloo sees the reset connection, not a timeout
    assert elapsed < 30, f"rank 0 needed {elapsed:.1f} s"
    print(f"ddp without a launcher: rank 0 ended {elapsed:.2f} s after rank 1 was killed")
