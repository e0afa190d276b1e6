"""Command lines that start N processes: mpirun (Open MPI, MPICH/Intel MPI) or srun inside Slurm."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence


def in_slurm_allocation() -> bool:
    return "SLURM_JOB_ID" in os.environ and shutil.which("srun") is not None


def job_command(np: int, argv: Sequence[str], *, hosts: str | None = None, hostfile: str | None = None,
                use_srun: bool | None = None) -> list[str]:
    """The full command that runs ``argv`` as ``np`` processes (srun inside a Slurm allocation)."""
    if use_srun if use_srun is not None else in_slurm_allocation():
        return ["srun", f"--ntasks={np}", *argv]
    cmd = ["mpirun", "-np", str(np), "-bind-to", "none", "-map-by", "slot"]
    if hosts:
        cmd += ["-H", hosts]
    if hostfile:
        cmd += ["-hostfile", hostfile]
    return [*cmd, *argv]
