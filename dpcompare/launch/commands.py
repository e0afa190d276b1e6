"""``dpcompare launch`` (build and run an mpirun/srun line) and ``dpcompare slurm`` (write an sbatch script)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpcompare.argtypes import nonneg_int as _nonneg
from dpcompare.argtypes import positive_int as _positive
from dpcompare.errors import ConfigError, LaunchError
from dpcompare.files import atomic_write_text
from dpcompare.launch import mpirun, slurm
from dpcompare.launch.jobs import Placement, dpcompare_command, run_job
from dpcompare.options import deprecate

#: sub-commands that may not be launched themselves (they start processes of their own)
_NOT_LAUNCHABLE = ("launch", "slurm", "compare", "parity")

LAUNCH_DESCRIPTION = """\
Print the command line that runs a dpcompare command as N processes, then run it (exit code: the job's).

Outside Slurm the line is Open MPI's or MPICH/Intel MPI's mpirun (told apart by `mpirun --version`,
or --mpi), with the flags Horovod's docs recommend (--bind-to none --map-by slot) and PATH,
LD_LIBRARY_PATH, VIRTUAL_ENV (this Python's), OMP_NUM_THREADS and every HOROVOD_*, NCCL_*, GLOO_*,
MASTER_* variable set here forwarded to every rank. Inside a Slurm allocation (salloc, sbatch) with no
--hosts it is srun. The line is the same for every --strategy: DDP finds its rendezvous address and
network interface by itself, Horovod joins the MPI world.
"""

LAUNCH_EPILOG = """\
examples:
  dpcompare launch --np 2 -- train --strategy ddp --out runs/ddp
  dpcompare launch --np 8 --hosts nodeA:4,nodeB:4 -- train --strategy horovod --out runs/hvd
  dpcompare launch --np 8 --hostfile hosts.txt --mpi-net 10.0.0.0/24 -- train --strategy ddp
  dpcompare launch --np 4 --mpi mpich --dry-run -- train --strategy ddp     # print only
  salloc -N 2 --ntasks-per-node 4 dpcompare launch --np 8 -- train --strategy ddp   # srun line

Hosts with different interface names: --mpi-net SUBNET keeps MPI's own traffic (Horovod, and
DDP's rendezvous exchange) on that network; gloo/NCCL pick the interface that reaches rank 0 on
each host unless --iface names one.
"""

SLURM_DESCRIPTION = """\
Write an sbatch script that runs a dpcompare command on every task of a Slurm job with srun, using
this Python environment (activated on every node) and OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK. The
script is the same for every --strategy: dpcompare reads its rank from SLURM_PROCID/SLURM_NTASKS/
SLURM_LOCALID, DDP meets on the job's first node, Horovod initialises MPI through srun's PMI plugin:
srun --mpi=pmix whenever `srun --mpi=list` here lists pmix (Open MPI aborts in MPI_Init under a plain
srun when the cluster's MpiDefault is none). Submit it with `sbatch FILE`.
"""

SLURM_EPILOG = """\
examples:
  dpcompare slurm --nodes 2 --gpus-per-node 4 --tasks-per-node 4 --cpus-per-task 8 --time 00:30:00 \\
      --out-file job.sbatch -- train --strategy ddp --dataset digits --out runs/ddp-2x4
  dpcompare slurm --nodes 4 --tasks-per-node 1 --cpus-per-task 32 --time 2-00:00:00 --partition cpu \\
      --account proj42 --srun-mpi pmix --out-file hvd.sbatch -- train --strategy horovod --out runs/hvd
  sbatch job.sbatch
"""


def _time(text: str) -> str:
    try:
        return slurm.parse_time(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def command_words(a: argparse.Namespace, sub: Any) -> list[str]:
    """The dpcompare command after ``--``, checked by its own parser (exit 2 on a bad flag)."""
    words = list(a.command_argv)
    if words[:1] == ["--"]:
        words = words[1:]
    choices = [c for c in sub.choices if c not in _NOT_LAUNCHABLE]
    if not words or words[0] not in choices:
        got = f"got {words[0]!r}" if words else "got nothing"
        raise ConfigError(f"expected a dpcompare command after --, e.g. `-- train --strategy ddp` ({got}; "
                          f"one of: {', '.join(choices)})")
    sub.choices[words[0]].parse_args(words[1:])
    return words


def run_printed(np: int, words: Sequence[str], dry_run: bool, placement: Placement | None = None,
                **launcher: Any) -> int:
    """Print the line that runs ``dpcompare WORDS`` as ``np`` processes (``placement``: e.g. a lab's hosts), then
    run it with its output on this terminal (unless ``dry_run``); its exit code."""
    cmd = dpcompare_command(np, words, placement, **launcher)
    print(shlex.join(cmd), flush=True)
    if dry_run:
        return 0
    try:
        rc, _ = run_job(cmd, None, mpirun.job_env(), None)
    except FileNotFoundError:
        raise LaunchError(f"{cmd[0]} not found on PATH") from None
    if rc is None:  # stopped at a time limit (none is set here)
        return 1
    return rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's convention


def _cmd_launch(a: argparse.Namespace, sub: Any) -> int:
    words = command_words(a, sub)
    if a.hostfile and not a.dry_run and not Path(a.hostfile).is_file():
        raise ConfigError(f"--hostfile {a.hostfile}: no such file")
    use_srun = {"auto": None, "mpirun": False, "srun": True}[a.launcher]
    return run_printed(a.np, words, a.dry_run, hosts=a.hosts, hostfile=a.hostfile, use_srun=use_srun, flavor=a.mpi,
                       mpi_net=a.mpi_net, iface=a.iface)


def _cmd_slurm(a: argparse.Namespace, sub: Any) -> int:
    if a.out is None:  # not argparse's required=: the old spelling --out, which warns, gives it too
        raise ConfigError("dpcompare slurm needs --out-file FILE: where to write the sbatch script")
    words = command_words(a, sub)
    out = Path(a.out)
    if out.exists() and not a.force:
        raise ConfigError(f"{out} already exists; pass --overwrite to replace it, or another --out-file")
    spec = slurm.SbatchSpec(nodes=a.nodes, tasks_per_node=a.tasks_per_node, cpus_per_task=a.cpus_per_task,
                            time=a.time, gpus_per_node=a.gpus_per_node, partition=a.partition,
                            account=a.account, job_name=a.job_name, log=a.log,
                            chdir=a.chdir or os.getcwd(),
                            srun_mpi=slurm.resolve_srun_mpi(a.srun_mpi))
    venv = mpirun.current_venv()
    text = slurm.sbatch_script(spec, [*mpirun.dpcompare_argv(), *words], venv, str(Path(sys.executable).parent),
                               name=str(out))
    try:
        atomic_write_text(out, text)
    except OSError as e:
        raise ConfigError(f"cannot write {out}: {e.strerror}") from None
    gpus = f", {a.gpus_per_node} GPUs" if a.gpus_per_node else ""
    print(f"wrote {out}: {a.nodes} node{'s' if a.nodes > 1 else ''} × {a.tasks_per_node} tasks "
          f"({a.nodes * a.tasks_per_node} processes), {a.cpus_per_task} CPUs per task{gpus} per node, "
          f"time limit {a.time}, log {a.log}")
    print(f"submit it with: sbatch {shlex.quote(str(out))}")
    return 0


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:

    p = sub.add_parser("launch", help="print and run the mpirun (or srun) line that starts N processes",
                       description=LAUNCH_DESCRIPTION, epilog=LAUNCH_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=_positive, required=True, help="number of processes")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--hosts", metavar="H1:N,H2:N", help="hosts and their slots, e.g. nodeA:2,nodeB:2")
    where.add_argument("--hostfile", metavar="FILE", help="MPI hostfile (Open MPI's -hostfile, Hydra's -f)")
    p.add_argument("--mpi", choices=mpirun.FLAVORS,
                   help="flags of Open MPI or of MPICH/Intel MPI (default: read from `mpirun --version`)")
    p.add_argument("--launcher", choices=["auto", "mpirun", "srun"], default="auto",
                   help="auto: srun inside a Slurm allocation when no hosts are named, else mpirun")
    p.add_argument("--mpi-net", metavar="SUBNET|IF",
                   help="network for MPI's own TCP traffic: Open MPI's btl/oob_tcp_if_include (a subnet like "
                        "10.0.0.0/24 or interface names), Hydra's -iface (one interface name)")
    p.add_argument("--iface", help="interface for gloo/NCCL on every rank (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); "
                                   "default: each rank picks the one that reaches rank 0")
    p.add_argument("--dry-run", action="store_true", help="print the line, do not run it")
    p.add_argument("command_argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the dpcompare command every process runs, e.g. -- train --strategy ddp")
    p.set_defaults(func=lambda a: _cmd_launch(a, sub))

    s = sub.add_parser("slurm", help="write an sbatch script that runs a dpcompare command with srun",
                       description=SLURM_DESCRIPTION, epilog=SLURM_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--nodes", type=_positive, required=True, help="nodes (#SBATCH --nodes)")
    s.add_argument("--tasks-per-node", type=_positive, default=1,
                   help="processes per node, usually one per GPU (default: 1)")
    s.add_argument("--cpus-per-task", type=_positive, default=1,
                   help="CPU cores per process; also OMP_NUM_THREADS (default: 1)")
    s.add_argument("--gpus-per-node", type=_nonneg, default=0, help="GPUs per node; 0: none requested (default: 0)")
    s.add_argument("--time", type=_time, required=True, metavar="HH:MM:SS", help="time limit (or D-HH:MM:SS)")
    s.add_argument("--partition", help="#SBATCH --partition (default: the cluster's)")
    s.add_argument("--account", help="#SBATCH --account (default: yours)")
    s.add_argument("--job-name", default="dpcompare", help="#SBATCH --job-name (default: dpcompare)")
    s.add_argument("--sbatch-output", dest="log", default="%x-%j.out", metavar="PATTERN",
                   help="#SBATCH --output: the job's log, %%x job name, %%j job id (default: %%x-%%j.out)")
    s.add_argument("--chdir", metavar="DIR",
                   help="folder the job runs in; relative paths of the command start there (default: this one)")
    s.add_argument("--srun-mpi", metavar="TYPE", default="auto",
                   help="srun --mpi=TYPE (pmix, pmi2, ...); auto: pmix when `srun --mpi=list` lists it, else "
                        f"no --mpi; {slurm.CLUSTER_DEFAULT}: never pass --mpi (the cluster's MpiDefault) "
                        "(default: auto)")
    s.add_argument("--out-file", dest="out", metavar="FILE", help="the sbatch script to write (required)")
    s.add_argument("--overwrite", dest="force", action="store_true", help="replace FILE when it exists")
    for old, new in (("--log", "--sbatch-output"), ("--out", "--out-file"), ("--force", "--overwrite")):
        deprecate(s, old, new)
    s.add_argument("command_argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the dpcompare command every task runs, e.g. -- train --strategy ddp")
    s.set_defaults(func=lambda a: _cmd_slurm(a, sub))
