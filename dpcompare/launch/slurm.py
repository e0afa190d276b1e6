"""sbatch scripts that run a dpcompare command on every task of a Slurm allocation with ``srun``.

srun starts one task per process; dpcompare reads its rank from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID
(env.py), DDP meets on the first node of the step (rendezvous.py) and Horovod initialises MPI through
srun's PMI plugin. Open MPI (which Horovod runs on here) starts under srun only through a PMI plugin
both sides know: with Slurm 22.05's ``MpiDefault=none`` a plain ``srun`` makes MPI_Init abort ("install
PMI-2 ... build Open MPI using --with-pmi"), while ``srun --mpi=pmix`` works. So ``--mpi=pmix`` is used
by default wherever ``srun --mpi=list`` lists pmix (:func:`default_srun_mpi`). The script is the same
for every strategy.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dpcompare.errors import ConfigError
from dpcompare.versions import __version__

_TIME = re.compile(r"^(?:(?P<d>\d+)-(?P<dh>\d{1,2})|(?P<h>\d+)):(?P<m>[0-5]\d):(?P<s>[0-5]\d)$")


def parse_time(text: str) -> str:
    """Check a Slurm time limit ``HH:MM:SS`` or ``D-HH:MM:SS`` (not zero); return it unchanged."""
    m = _TIME.match(text.strip())
    if not m or (m["dh"] is not None and int(m["dh"]) > 23):
        raise ValueError(f"{text!r} is not a time limit like 01:30:00 (HH:MM:SS) or 2-00:00:00 (D-HH:MM:SS)")
    if not any(int(v) for v in m.groupdict(default="0").values()):
        raise ValueError(f"{text!r}: the time limit must be longer than zero")
    return text.strip()


#: ``--srun-mpi`` value that leaves ``--mpi`` out (the cluster's MpiDefault, or SLURM_MPI_TYPE, decides)
CLUSTER_DEFAULT = "cluster"
#: the PMI plugins Open MPI (and so Horovod) starts with under srun, best first
PREFERRED_MPI = ("pmix",)


def srun_mpi_types(srun: str = "srun") -> tuple[str, ...]:
    """The MPI plugin types ``srun --mpi=list`` names (pmix, pmi2, none, ...); () without a working srun."""
    path = shutil.which(srun)
    return _mpi_types(path) if path else ()


@functools.lru_cache(maxsize=8)
def _mpi_types(path: str) -> tuple[str, ...]:
    try:
        p = subprocess.run([path, "--mpi=list"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ()
    words = re.findall(r"[A-Za-z0-9_]+", (p.stdout + p.stderr).split("specific", 1)[0])
    skip = {"MPI", "plugin", "types", "are", "srun"}
    return tuple(w for w in words if w not in skip)


def default_srun_mpi(environ: dict[str, str] | None = None) -> str | None:
    """``pmix`` when srun offers it and nothing else was chosen (SLURM_MPI_TYPE), else None (no --mpi)."""
    environ = dict(os.environ) if environ is None else environ
    if environ.get("SLURM_MPI_TYPE"):
        return None
    types = srun_mpi_types()
    return next((t for t in PREFERRED_MPI if t in types), None)


def resolve_srun_mpi(choice: str | None) -> str | None:
    """``--srun-mpi`` → the ``--mpi`` value to put on srun lines: None/auto → :func:`default_srun_mpi`,
    ``cluster`` → none at all, anything else as given."""
    if choice in (None, "auto"):
        return default_srun_mpi()
    return None if choice == CLUSTER_DEFAULT else choice


@dataclass(frozen=True)
class SbatchSpec:
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    time: str
    gpus_per_node: int = 0
    partition: str | None = None
    account: str | None = None
    job_name: str = "dpcompare"
    log: str = "%x-%j.out"
    chdir: str | None = None
    srun_mpi: str | None = None


def _directive_value(name: str, value: str) -> str:
    if not value or any(c.isspace() for c in value) or "#" in value:
        raise ConfigError(f"--{name} {value!r}: Slurm's #SBATCH lines take no spaces or '#' here")
    return value


def sbatch_script(spec: SbatchSpec, argv: Sequence[str], venv: str | None, bin_dir: str | None = None,
                  name: str = "THIS_FILE") -> str:
    """The text of an sbatch script that runs ``argv`` (absolute command first) once per task.

    ``venv`` is activated when given; otherwise ``bin_dir`` is put first on PATH. ``name``: the
    script's file name, for the comment saying how to submit it.
    """
    d = [f"--job-name={_directive_value('job-name', spec.job_name)}", f"--nodes={spec.nodes}",
         f"--ntasks-per-node={spec.tasks_per_node}", f"--cpus-per-task={spec.cpus_per_task}"]
    if spec.gpus_per_node > 0:
        d.append(f"--gpus-per-node={spec.gpus_per_node}")
    d.append(f"--time={parse_time(spec.time)}")
    if spec.partition:
        d.append(f"--partition={_directive_value('partition', spec.partition)}")
    if spec.account:
        d.append(f"--account={_directive_value('account', spec.account)}")
    if spec.chdir:
        d.append(f"--chdir={_directive_value('chdir', spec.chdir)}")
    d.append(f"--output={_directive_value('log', spec.log)}")

    srun = ["srun", "--kill-on-bad-exit=1", '--cpus-per-task="$SLURM_CPUS_PER_TASK"']
    if spec.srun_mpi:
        srun.append(f"--mpi={shlex.quote(spec.srun_mpi)}")
    if venv:
        env_line = f"source {shlex.quote(str(Path(venv) / 'bin' / 'activate'))}"
    elif bin_dir:
        env_line = f'export PATH={shlex.quote(bin_dir)}:"$PATH"'
    else:
        env_line = ":  # no virtual environment: the Python found on the nodes' PATH"
    tasks = spec.nodes * spec.tasks_per_node
    lines = [
        "#!/bin/bash",
        f"# Written by dpcompare {__version__} (`dpcompare slurm`): {tasks} processes on {spec.nodes} "
        f"node{'s' if spec.nodes > 1 else ''}.",
        f"# Submit with: sbatch {shlex.quote(name)}",
        *(f"#SBATCH {x}" for x in d),
        "",
        "set -eo pipefail",
        "",
        "# The Python environment that wrote this script.",
        env_line,
        'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
        "",
        "# One task per process; dpcompare reads SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID. DDP meets on",
        "# the first node of the step; Horovod initialises MPI through srun's PMI plugin (--mpi; Open MPI",
        "# aborts in MPI_Init under --mpi=none). --kill-on-bad-exit ends every task when one fails.",
        " ".join(srun) + " " + shlex.join(argv),
        "",
    ]
    return "\n".join(lines)
