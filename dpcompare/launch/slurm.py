"""sbatch scripts that run a dpcompare command on every task of a Slurm allocation with ``srun``.

srun starts one task per process; dpcompare reads its rank from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID
(env.py), DDP meets on the first node of the step (rendezvous.py) and Horovod initialises MPI through
srun's PMI plugin (``--mpi``; the cluster's MpiDefault when not given). The script is the same for
every strategy.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dpcompare import __version__
from dpcompare.errors import ConfigError

_TIME = re.compile(r"^(?:(?P<d>\d+)-(?P<dh>\d{1,2})|(?P<h>\d+)):(?P<m>[0-5]\d):(?P<s>[0-5]\d)$")


def parse_time(text: str) -> str:
    """Check a Slurm time limit ``HH:MM:SS`` or ``D-HH:MM:SS`` (not zero); return it unchanged."""
    m = _TIME.match(text.strip())
    if not m or (m["dh"] is not None and int(m["dh"]) > 23):
        raise ValueError(f"{text!r} is not a time limit like 01:30:00 (HH:MM:SS) or 2-00:00:00 (D-HH:MM:SS)")
    if not any(int(v) for v in m.groupdict(default="0").values()):
        raise ValueError(f"{text!r}: the time limit must be longer than zero")
    return text.strip()


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
        "# the first node of the step; Horovod initialises MPI through srun's PMI plugin (--mpi, or the",
        "# cluster's MpiDefault). --kill-on-bad-exit ends every task when one fails, instead of waiting.",
        " ".join(srun) + " " + shlex.join(argv),
        "",
    ]
    return "\n".join(lines)
