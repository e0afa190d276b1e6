"""Shared fixtures: run dpcompare as a user would, one process or under ``mpirun -np N``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DPCOMPARE = str(BIN / "dpcompare")


def mpi_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # A test's own process may carry launcher variables (pytest under mpirun/srun): drop them.
    for k in list(env):
        if k.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_", "SLURM_", "HOROVOD_RANK", "HOROVOD_SIZE")) or k in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    env.update(extra or {})
    return env


def mpirun_cmd(np: int, *args: str) -> list[str]:
    return ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none", DPCOMPARE, *args]


def run(cmd: list[str], timeout: float = 300, env: dict[str, str] | None = None, check: bool = True,
        cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or mpi_env(), cwd=cwd)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout[-3000:]}\n"
                             f"stderr:\n{p.stderr[-3000:]}")
    return p


def dpcompare(*args: str, np: int = 0, **kw: object) -> subprocess.CompletedProcess[str]:
    """``dpcompare ARGS`` as one process (np=0) or under ``mpirun -np NP``."""
    cmd = mpirun_cmd(np, *args) if np else [DPCOMPARE, *args]
    return run(cmd, **kw)  # type: ignore[arg-type]


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def have_horovod() -> bool:
    try:
        import horovod.torch  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


needs_mpi = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (make setup)")
needs_horovod = pytest.mark.skipif(not have_horovod(), reason="Horovod is not installed (make setup builds it)")

# Small, fast training flags shared by the distributed tests.
FAST = ("--model", "convnet", "--dataset", "digits", "--no-tensorboard", "--threads", "1", "--warmup-steps", "2")
