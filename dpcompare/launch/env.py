"""Who am I? Rank, world size, local rank and local size from whichever launcher started us.

Launchers are recognised by their variables, most specific first: torchrun (``RANK`` ...),
horovodrun (``HOROVOD_RANK`` ...), Open MPI (``OMPI_COMM_WORLD_*``), MPICH / Intel MPI (``PMI_*``),
Slurm's srun (``SLURM_PROCID`` ...). None of them means one process. A launcher whose variables are
only partly set is an error, not a silent fall-back to one process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from dpcompare.errors import LaunchError


@dataclass(frozen=True)
class LaunchEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    launcher: str = "none"

    @property
    def is_mpi(self) -> bool:
        """True when the processes share an MPI world (mpi4py can talk to the others)."""
        return self.launcher in ("openmpi", "mpich")


@dataclass(frozen=True)
class _Launcher:
    name: str
    rank: str
    size: str
    local_rank: tuple[str, ...]
    local_size: tuple[str, ...]
    hint: str
    #: Slurm: its variables are set outside a task too (an allocation's shell, the batch and extern steps), told
    #: apart by the step id; ``SLURM_STEP_NUM_TASKS`` is the step's size
    has_steps: bool = False


#: set by whatever places ranks of "different hosts" on the same CPUs (``dpcompare lab``): how many ranks share
#: this machine's cores, so that ``--threads 0`` divides the cores among all of them, not among the host's ranks
CPU_SHARERS = "DPCOMPARE_RANKS_SHARING_CPUS"


def ranks_sharing_cpus(env: LaunchEnv, environ: Mapping[str, str] = os.environ) -> int:
    """The ranks whose threads compete for this machine's cores: the host's ranks, or more in a lab."""
    try:
        return max(env.local_size, int(environ.get(CPU_SHARERS, "0") or 0))
    except ValueError:
        return env.local_size


#: set on every rank by a launch line for ``--bind comm`` or ``core`` (:func:`dpcompare.launch.mpirun.job_command`):
#: under ``comm`` a strategy with a communication thread of its own pins it with :func:`comm_thread_cores`; under
#: ``core`` :func:`default_threads` counts the rank's own cores
BIND_VAR = "DPCOMPARE_BIND"


def comm_thread_cores(env: LaunchEnv, environ: Mapping[str, str] = os.environ) -> str | None:
    """Under ``--bind comm``: a core for each local rank's communication thread, spread over the cores this
    process may use, comma-separated by local rank as ``HOROVOD_THREAD_AFFINITY`` takes them ("0,1": 2 ranks on
    2 cores; "0,2": 2 ranks on 4 cores); None under any other binding."""
    if environ.get(BIND_VAR) != "comm":
        return None
    cores = sorted(os.sched_getaffinity(0))
    ranks = max(1, env.local_size)
    return ",".join(str(cores[i * len(cores) // ranks]) for i in range(ranks))


def local_cores() -> int:
    """The cores this process may run on (its affinity: a cpuset, ``taskset``, a launcher's binding)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call (macOS)
        return os.cpu_count() or 1


def bound_by_launcher(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the launcher bound this rank to cores (a core each, a socket's), not left it free on every core:
    dpcompare's own ``--bind core``, Open MPI 4's mpirun (which binds by default: a core each at np ≤ 2) or srun's
    ``--cpu-bind`` (its type is "none" when it did not bind)."""
    slurm = environ.get("SLURM_CPU_BIND_TYPE", "")
    return (environ.get(BIND_VAR) == "core" or environ.get("OMPI_MCA_orte_bound_at_launch") == "1"
            or (bool(slurm) and not slurm.startswith("none")))


def default_threads(env: LaunchEnv, environ: Mapping[str, str] = os.environ,
                    cores: set[int] | None = None, machine: int | None = None) -> int:
    """torch's intra-op threads for ``--threads 0``: the cores this process may run on (its affinity: a cgroup's
    cpuset, ``taskset``, the launcher's binding), shared among the ranks that compete for them. A rank its launcher
    bound shares its cores only with the ranks bound to the same ones (none for a core each; a socket's ranks);
    an unbound one shares them with every rank on the host (:func:`ranks_sharing_cpus`). Counting the machine's
    cores instead gave a rank that plain ``mpirun -np 2`` bound to one core as many threads as half the machine."""
    mine = len(cores) if cores is not None else local_cores()
    machine = machine or os.cpu_count() or mine
    sharers = ranks_sharing_cpus(env, environ)
    if bound_by_launcher(environ):
        sharers = -(-sharers * mine // machine)  # ranks per set of this size, rounded up
    return max(1, mine // max(1, sharers))


# Order matters: torchrun/horovodrun can run inside an MPI or Slurm job, and mpirun inside Slurm.
LAUNCHERS: tuple[_Launcher, ...] = (
    _Launcher("torchrun", "RANK", "WORLD_SIZE", ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",), "torchrun"),
    _Launcher("horovodrun", "HOROVOD_RANK", "HOROVOD_SIZE", ("HOROVOD_LOCAL_RANK",),
              ("HOROVOD_LOCAL_SIZE",), "horovodrun"),
    _Launcher("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", ("OMPI_COMM_WORLD_LOCAL_RANK",),
              ("OMPI_COMM_WORLD_LOCAL_SIZE",), "Open MPI's mpirun"),
    _Launcher("mpich", "PMI_RANK", "PMI_SIZE", ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
              ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"), "MPICH/Intel MPI's mpirun"),
    _Launcher("slurm", "SLURM_PROCID", "SLURM_NTASKS", ("SLURM_LOCALID",),
              ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"), "srun", has_steps=True),
)


# Step ids of Slurm's batch and extern steps (SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT), not srun tasks.
_SLURM_NOT_A_TASK = {"4294967294", "4294967295", "batch", "extern"}


def _int(env: Mapping[str, str], var: str, launcher: str) -> int:
    raw = env[var]
    try:
        # Slurm writes per-node counts like "2(x3)" or "4,2": the first figure is this layout's.
        return int(raw.split("(")[0].split(",")[0])
    except ValueError:
        raise LaunchError(f"{var}={raw!r} is not a whole number; check how {launcher} was started") from None


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in env), None)


def detect_launch_env(env: Mapping[str, str] | None = None) -> LaunchEnv:
    """Read the launcher's variables from ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    for spec in LAUNCHERS:
        required = {"rank": spec.rank, "size": spec.size}
        present = {k: v for k, v in required.items() if v in env}
        local_var = _first(env, spec.local_rank)
        if not present:
            continue
        if spec.has_steps and env.get("SLURM_STEP_ID", env.get("SLURM_STEPID")) in _SLURM_NOT_A_TASK:
            # The batch script's own shell (or the extern step) is not an srun task.
            continue
        missing = [v for k, v in required.items() if k not in present]
        if local_var is None:
            missing.append(" or ".join(spec.local_rank))
        if missing:
            have = ", ".join(present.values())
            raise LaunchError(
                f"inconsistent launch environment: {have} set but {', '.join(missing)} missing; "
                f"start all ranks with {spec.hint}, or unset {have} to run as one process"
            )
        rank = _int(env, spec.rank, spec.hint)
        size = _int(env, spec.size, spec.hint)
        if spec.has_steps and "SLURM_STEP_NUM_TASKS" in env:
            size = _int(env, "SLURM_STEP_NUM_TASKS", spec.hint)
        local_rank = _int(env, local_var, spec.hint)
        ls_var = _first(env, spec.local_size)
        local_size = _int(env, ls_var, spec.hint) if ls_var else max(local_rank + 1, 1)
        if size < 1 or not 0 <= rank < size:
            raise LaunchError(f"inconsistent launch environment: rank {rank} with world size {size} "
                              f"({spec.rank}, {spec.size}); check the {spec.hint} command line")
        if not 0 <= local_rank < max(local_size, local_rank + 1):
            raise LaunchError(f"inconsistent launch environment: local rank {local_rank} ({local_var})")
        return LaunchEnv(rank, size, local_rank, max(local_size, local_rank + 1), spec.name)
    return LaunchEnv()


def launcher_rank_size(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(rank, size) from the first launcher whose variables are set, without validating them; None if none."""
    env = os.environ if env is None else env
    for spec in LAUNCHERS:
        if spec.has_steps and (spec.rank not in env or env.get(
                "SLURM_STEP_ID", env.get("SLURM_STEPID")) in _SLURM_NOT_A_TASK):
            continue  # an allocation (salloc, the sbatch script's shell) sets SLURM_NTASKS but is no srun task
        if spec.rank in env or spec.size in env:
            try:
                rank = int(env.get(spec.rank, "0").split("(")[0])
                return rank, int(env.get(spec.size, "1").split("(")[0].split(",")[0])
            except ValueError:
                return 0, 1
    return None


def reporting_rank(env: Mapping[str, str] | None = None) -> bool:
    """True on the one process that prints what every rank would print alike (rank 0, or a lone process)."""
    rs = launcher_rank_size(env)
    return rs is None or rs[0] == 0


def under_launcher(env: Mapping[str, str] | None = None) -> bool:
    """True when a launcher started this process as one of several."""
    rs = launcher_rank_size(env)
    return rs is not None and rs[1] > 1
