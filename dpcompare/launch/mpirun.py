"""Command lines that start N processes: mpirun (Open MPI, MPICH/Intel MPI) or srun inside Slurm.

The builders are pure functions of their arguments (the environment is passed in), so every line can
be unit-tested without MPI. Only :func:`mpi_flavor` runs anything (``mpirun --version``), and the
flavour is read from that text by :func:`flavor_from_version`.

The line is the same for every strategy: DDP finds its rendezvous by itself (rendezvous.py) and
Horovod initialises from the MPI world, so nothing here depends on ``--strategy``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from dpcompare.errors import ConfigError, LaunchError
from dpcompare.launch.env import BIND_VAR, local_cores
from dpcompare.launch.openmpi import YIELD_VAR
from dpcompare.launch.slurm import default_srun_mpi

FLAVORS = ("openmpi", "mpich")
#: where the ranks run (``compare --bind``): ``none``, the scheduler's choice (Horovod's advice for its
#: background thread); ``comm``, the ranks as with ``none`` but each rank's communication thread on a core of its
#: own (the launch line sets :data:`~dpcompare.launch.env.BIND_VAR`; Horovod's strategy turns it into
#: ``HOROVOD_THREAD_AFFINITY``) and MPI's waits yielding the core (:data:`~dpcompare.launch.openmpi.YIELD_VAR`);
#: ``core``, each rank bound to its own cores (``cores_per_rank`` of them: its intra-op threads)
BINDINGS = ("none", "comm", "core")
#: forwarded to every rank when set here (VIRTUAL_ENV: see :func:`forwarded_env`)
FORWARD_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS")
FORWARD_PREFIXES = ("HOROVOD_", "NCCL_", "GLOO_", "MASTER_", "WANDB_", "MLFLOW_", "DPCOMPARE_")
#: variables ``--iface`` sets on every rank (rendezvous.py leaves them alone when already set)
IFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


# -- what to run --------------------------------------------------------------------------------------
def current_venv() -> str | None:
    """The virtual environment of the running Python (``sys.prefix``), or None outside one."""
    return sys.prefix if sys.prefix != sys.base_prefix else None


def dpcompare_argv() -> list[str]:
    """This Python's ``dpcompare`` console script, else ``python -m dpcompare`` (absolute paths)."""
    script = Path(sys.executable).parent / "dpcompare"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    module = "dpcompare" if importlib.util.find_spec("dpcompare.__main__") else "dpcompare.cli"
    return [sys.executable, "-m", module]


def forwarded_env(environ: Mapping[str, str], iface: str | None = None,
                  venv: str | None = None) -> dict[str, str]:
    """Variables every rank should get, with their values, in a stable order.

    PATH, LD_LIBRARY_PATH, PYTHONPATH, OMP_NUM_THREADS and any HOROVOD_*, NCCL_*, GLOO_*, MASTER_* set in
    ``environ``; VIRTUAL_ENV is ``venv`` (the running Python's) when given, else ``environ``'s;
    ``iface`` sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME.
    """
    out = {n: environ[n] for n in FORWARD_NAMES if environ.get(n)}
    if venv:
        out["VIRTUAL_ENV"] = venv
    out.update({k: environ[k] for k in sorted(environ) if k.startswith(FORWARD_PREFIXES) and k not in out})
    if iface:
        out.update({v: iface for v in IFACE_VARS})
    return out


# -- which MPI ----------------------------------------------------------------------------------------
def flavor_from_version(text: str) -> str | None:
    """``openmpi`` or ``mpich`` (MPICH, Intel MPI, MVAPICH: Hydra's flags) from ``mpirun --version``."""
    t = text.lower()
    if re.search(r"open mpi|openrte|spectrum mpi", t):
        return "openmpi"
    if re.search(r"hydra|mpich|intel\(r\) mpi|mvapich", t):
        return "mpich"
    return None


def mpi_flavor(mpirun: str = "mpirun") -> str:
    """The flavour of the ``mpirun`` on PATH; LaunchError when it is missing or unknown."""
    exe = shutil.which(mpirun)
    if exe is None:
        raise LaunchError(f"{mpirun} not found on PATH; install Open MPI or MPICH (make setup), "
                          "or pass --mpi openmpi|mpich to print the line anyway with --dry-run")
    return _flavor_of(os.path.realpath(exe))


@functools.lru_cache(maxsize=8)
def _flavor_of(exe: str) -> str:
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"`{exe} --version` failed ({e}); pass --mpi openmpi|mpich") from None
    flavor = flavor_from_version(p.stdout + p.stderr)
    if flavor is None:
        first = (p.stdout + p.stderr).strip().splitlines()[:1]
        raise LaunchError(f"cannot tell which MPI {exe} is ({first[0] if first else 'no output'!r}); "
                          "pass --mpi openmpi|mpich")
    return flavor


# -- hosts --------------------------------------------------------------------------------------------
def parse_hosts(text: str) -> list[tuple[str, int | None]]:
    """``nodeA:2,nodeB:2`` → [("nodeA", 2), ("nodeB", 2)]; a host without ``:N`` has None slots."""
    out: list[tuple[str, int | None]] = []
    for item in (x.strip() for x in text.split(",")):
        name, sep, slots = item.partition(":")
        if not name or any(c.isspace() for c in name) or (sep and not (slots.isdigit() and int(slots) > 0)):
            raise ConfigError(f"--hosts {text!r}: {item!r} is not HOST or HOST:SLOTS (e.g. nodeA:2,nodeB:2)")
        out.append((name, int(slots) if sep else None))
    return out


def _hosts_text(hosts: list[tuple[str, int | None]]) -> str:
    return ",".join(h if s is None else f"{h}:{s}" for h, s in hosts)


def check_slots(np: int, hosts: list[tuple[str, int | None]]) -> None:
    """Refuse --np larger than the slots --hosts names (when every host says how many)."""
    if hosts and all(s is not None for _, s in hosts):
        total = sum(s or 0 for _, s in hosts)
        if np > total:
            raise ConfigError(f"--np {np} but --hosts gives {total} slot{'s' if total != 1 else ''}; "
                              "raise the :SLOTS counts or lower --np")


# -- the lines ----------------------------------------------------------------------------------------
def openmpi_command(np: int, argv: Sequence[str], *, hosts: str | None = None, hostfile: str | None = None,
                    env: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None,
                    oversubscribe: bool = False, mpi_net: str | None = None,
                    mpirun: str = "mpirun", bind: str = "none", cores_per_rank: int = 1) -> list[str]:
    """Open MPI's ``mpirun`` with the flags Horovod's docs recommend and ``-x`` forwarding.

    ``bind`` (:data:`BINDINGS`): ``none`` leaves placement to the scheduler (``--bind-to none --map-by slot``), as
    does ``comm`` (whose variable ``env`` carries: see :func:`job_command`);
    ``core`` binds each rank to its own core (``--bind-to core --map-by core``), or to ``cores_per_rank`` cores
    (``--map-by slot:PE=N``) so that its intra-op threads have cores of their own.

    A variable of ``env`` whose value is ``environ``'s is forwarded by name (``-x NAME``), any other
    as ``-x NAME=VALUE``. ``mpi_net`` (a subnet like 10.0.0.0/24, or interface names) limits MPI's
    own TCP traffic (``btl_tcp_if_include``, ``oob_tcp_if_include``) to that network.
    """
    environ = os.environ if environ is None else environ
    cmd = [mpirun, "-np", str(np), *_openmpi_binding(bind, cores_per_rank)]  # two dashes: Open MPI 4 and 5
    if oversubscribe:
        cmd.append("--oversubscribe")
    if hosts:
        cmd += ["-H", _hosts_text(parse_hosts(hosts))]
    if hostfile:
        cmd += ["-hostfile", hostfile]
    if mpi_net:
        cmd += ["--mca", "btl_tcp_if_include", mpi_net, "--mca", "oob_tcp_if_include", mpi_net]
    for name, value in (env or {}).items():
        cmd += ["-x", name if environ.get(name) == value else f"{name}={value}"]
    return [*cmd, *argv]


def _openmpi_binding(bind: str, cores_per_rank: int) -> list[str]:
    """Open MPI's placement flags for ``bind`` (:data:`BINDINGS`)."""
    if bind in ("none", "comm"):  # comm: the ranks float; the variable job_command sets pins their threads
        return ["--bind-to", "none", "--map-by", "slot"]
    if bind == "core":
        return ["--bind-to", "core", "--map-by", f"slot:PE={cores_per_rank}" if cores_per_rank > 1 else "core"]
    raise ConfigError(f"--bind {bind!r}: choose from {', '.join(BINDINGS)}")


def mpich_command(np: int, argv: Sequence[str], *, hosts: str | None = None, hostfile: str | None = None,
                  env: Mapping[str, str] | None = None, mpi_net: str | None = None,
                  mpirun: str = "mpirun", bind: str = "none") -> list[str]:
    """Hydra's ``mpirun`` (MPICH, Intel MPI, MVAPICH): ``-n``, ``-ppn``, ``-hosts``, ``-f``, ``-genv``.

    Hosts with equal slot counts become ``-ppn N -hosts a,b``; unequal ones Hydra's ``-hosts a:2,b:4``.
    ``mpi_net`` must be an interface name here (Hydra's ``-iface``); Hydra takes no subnets.
    """
    cmd = [mpirun, "-n", str(np), *(["-bind-to", "core"] if bind == "core" else [])]
    if hosts:
        parsed = parse_hosts(hosts)
        slots = {s for _, s in parsed}
        if len(slots) == 1 and None not in slots:
            cmd += ["-ppn", str(slots.pop()), "-hosts", ",".join(h for h, _ in parsed)]
        else:
            cmd += ["-hosts", _hosts_text(parsed)]
    if hostfile:
        cmd += ["-f", hostfile]
    if mpi_net:
        if "/" in mpi_net or "," in mpi_net:
            raise ConfigError(f"--mpi-net {mpi_net!r}: MPICH's Hydra selects one interface by name "
                              "(e.g. --mpi-net eth1), not a subnet")
        cmd += ["-iface", mpi_net]
    for name, value in (env or {}).items():
        cmd += ["-genv", name, value]
    return [*cmd, *argv]


def srun_command(np: int | None, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] | None = None, mpi: str | None = None, bind: str = "none") -> list[str]:
    """``srun`` that ends the whole step when any task fails (``--kill-on-bad-exit=1``), with
    ``--mpi=MPI`` when given (Horovod's Open MPI needs a PMI plugin: see :mod:`dpcompare.launch.slurm`).

    srun passes its whole environment on; only variables of ``env`` that differ from ``environ``
    are added, through ``--export=ALL,NAME=VALUE``.
    """
    environ = os.environ if environ is None else environ
    cmd = ["srun"] + ([f"--ntasks={np}"] if np else []) + ["--kill-on-bad-exit=1"]
    if bind == "core":
        cmd.append("--cpu-bind=cores")
    if mpi:
        cmd.append(f"--mpi={mpi}")
    extra = [f"{k}={v}" for k, v in (env or {}).items() if environ.get(k) != v]
    if extra:
        cmd.append("--export=" + ",".join(["ALL", *extra]))
    return [*cmd, *argv]


def in_slurm_allocation(environ: Mapping[str, str] | None = None) -> bool:
    """True inside ``salloc``/``sbatch`` (SLURM_JOB_ID set and ``srun`` on PATH)."""
    environ = os.environ if environ is None else environ
    return "SLURM_JOB_ID" in environ and shutil.which("srun", path=environ.get("PATH")) is not None


def job_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to start a job with: unbuffered output, and Open MPI's consent to run as root
    (as in containers), which mpirun otherwise refuses."""
    env = dict(os.environ if environ is None else environ, PYTHONUNBUFFERED="1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def comm_vars(environ: Mapping[str, str]) -> dict[str, str]:
    """What ``--bind comm``'s launch line sets on every rank: :data:`~dpcompare.launch.env.BIND_VAR` (a strategy
    pins its communication thread from it) and Open MPI's yield on waits (``environ``'s own value wins, as a
    ``HOROVOD_THREAD_AFFINITY`` set by the user does)."""
    return {BIND_VAR: "comm", YIELD_VAR: environ.get(YIELD_VAR, "1")}


def job_command(np: int, argv: Sequence[str], *, hosts: str | None = None, hostfile: str | None = None,
                use_srun: bool | None = None, flavor: str | None = None, mpi_net: str | None = None,
                iface: str | None = None, environ: Mapping[str, str] | None = None,
                cores: int | None = None, mpirun: str = "mpirun", bind: str = "none",
                cores_per_rank: int = 1) -> list[str]:
    """The full command that runs ``argv`` as ``np`` processes, placed as ``bind`` says (:data:`BINDINGS`).

    ``srun`` inside a Slurm allocation when no hosts are named (``use_srun`` forces either way),
    otherwise ``mpirun`` of ``flavor`` (default: detected from ``mpirun --version``). Open MPI gets
    ``--oversubscribe`` when ``np`` exceeds the local cores (``cores``) and no hosts are named.
    """
    environ = os.environ if environ is None else environ
    if np < 1:
        raise ConfigError(f"--np {np}: need at least one process")
    env = forwarded_env(environ, iface, current_venv())
    if bind == "comm":
        env.update(comm_vars(environ))
    elif bind == "core":
        env[BIND_VAR] = "core"  # each rank's --threads 0 counts its own cores (launch.env.default_threads)
    if use_srun if use_srun is not None else (in_slurm_allocation(environ) and not (hosts or hostfile)):
        if hosts or hostfile or mpi_net:
            raise ConfigError("--hosts, --hostfile and --mpi-net are mpirun's; under srun the Slurm allocation "
                              "decides where processes run (or use --launcher mpirun)")

        return srun_command(np, argv, env=env, environ=environ, mpi=default_srun_mpi(dict(environ)), bind=bind)
    if hosts:
        check_slots(np, parse_hosts(hosts))
    flavor = flavor or mpi_flavor(mpirun)
    here = cores if cores is not None else local_cores()
    if bind == "core" and not (hosts or hostfile) and np * cores_per_rank > here:
        raise ConfigError(f"--bind {bind}: {np} ranks × {cores_per_rank} core(s) each but {here} cores here; lower "
                          "--np or --threads, or leave --bind out")
    if flavor == "openmpi":
        over = not (hosts or hostfile) and np > here
        return openmpi_command(np, argv, hosts=hosts, hostfile=hostfile, env=env, environ=environ,
                               oversubscribe=over, mpi_net=mpi_net, mpirun=mpirun, bind=bind,
                               cores_per_rank=cores_per_rank)
    if flavor == "mpich":
        return mpich_command(np, argv, hosts=hosts, hostfile=hostfile, env=env, mpi_net=mpi_net, mpirun=mpirun,
                             bind=bind)
    raise ConfigError(f"unknown MPI flavour {flavor!r}; choose from {', '.join(FLAVORS)}")
