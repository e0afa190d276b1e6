"""``dpcompare train`` runs under ``mpirun -np N`` that share one job per process count.

Each ``mpirun … dpcompare train`` spends seconds starting Python, torch and MPI before its first step; tests that
train several runs with the same process count run them here instead, one after another on the persistent worker
job ``compare --workers persistent`` uses (:class:`dpcompare.compare.workers.WorkerPool`): every run still builds
its data, model and optimizer and joins and leaves its strategy's process group, as ``dpcompare train`` does. A
failed run ends its job (the next run starts a new one). Tests about the launch itself (exit codes, one-line
refusals, what a child imports) keep ``conftest.dpcompare(..., np=N)``.
"""

from __future__ import annotations

import atexit
from pathlib import Path

from dpcompare.compare.workers import WorkerPool
from dpcompare.launch.mpirun import job_command

from conftest import mpi_env

_POOL: WorkerPool | None = None


def _pool(folder: Path) -> WorkerPool:
    global _POOL
    if _POOL is None:
        _POOL = WorkerPool(folder, mpi_env(), job_command)
        atexit.register(_POOL.close)
    return _POOL


def train(*args: str, out: Path, np: int = 2, timeout: float = 300) -> str:
    """``dpcompare train ARGS --out OUT`` as ``np`` processes on the shared job; what it printed (its stdout.log).
    A run that fails fails the test with the end of its logs."""
    out.mkdir(parents=True, exist_ok=True)
    rc, _ = _pool(out.parent).run(np, [*args, "--out", str(out)], out, timeout)
    stdout, stderr = ((out / name).read_text(errors="replace") for name in ("stdout.log", "stderr.log"))
    assert rc == 0, f"dpcompare train {' '.join(args)} at np={np} exited {rc}\nstdout:\n{stdout[-3000:]}\n" \
                    f"stderr:\n{stderr[-3000:]}"
    return stdout
