"""Launch-environment discovery: each launcher's variables, precedence, half sets."""

import subprocess
import sys

import pytest

from dpcompare.errors import LaunchError
from dpcompare.launch.env import CPU_SHARERS, LaunchEnv, default_threads, detect_launch_env, ranks_sharing_cpus

from conftest import mpi_env


@pytest.mark.parametrize("env, expected", [
    ({}, LaunchEnv(0, 1, 0, 1, "none")),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, LaunchEnv(3, 4, 1, 2, "openmpi")),
    ({"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"},
     LaunchEnv(2, 3, 0, 1, "mpich")),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4(x2)",
      "SLURM_STEP_ID": "0"}, LaunchEnv(5, 8, 1, 4, "slurm")),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, LaunchEnv(1, 2, 1, 2, "torchrun")),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2"},
     LaunchEnv(0, 2, 0, 2, "horovodrun")),
])
def test_each_launcher(env, expected):
    assert detect_launch_env(env) == expected


def test_mpirun_inside_a_slurm_allocation_uses_mpi_ranks():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0",
           "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    got = detect_launch_env(env)
    assert (got.launcher, got.rank, got.world_size) == ("openmpi", 1, 2)


def test_slurm_batch_shell_is_not_a_task():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "4294967294"}
    assert detect_launch_env(env).world_size == 1


def test_srun_step_task_count_wins_over_job_task_count():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1"}
    assert detect_launch_env(env).world_size == 2


@pytest.mark.parametrize("env, missing", [
    ({"RANK": "0"}, "WORLD_SIZE"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "LOCAL_RANK"),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, "OMPI_COMM_WORLD_RANK"),
    ({"PMI_RANK": "1", "MPI_LOCALRANKID": "0"}, "PMI_SIZE"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "SLURM_LOCALID"),
])
def test_half_a_set_is_an_error_naming_what_is_missing(env, missing):
    with pytest.raises(LaunchError, match=missing) as e:
        detect_launch_env(env)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("env", [
    {"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
    {"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
    {"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0"},
])
def test_impossible_values_are_errors(env):
    with pytest.raises(LaunchError):
        detect_launch_env(env)


def test_an_allocation_without_a_step_is_not_a_launcher() -> None:
    """salloc's shell and the sbatch script's own shell set SLURM_NTASKS: compare may run there."""
    from dpcompare.launch.env import under_launcher

    assert not under_launcher({"SLURM_JOB_ID": "5", "SLURM_NTASKS": "2"})
    assert not under_launcher({"SLURM_JOB_ID": "5", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_STEP_ID": "batch"})
    assert under_launcher({"SLURM_JOB_ID": "5", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0"})


def test_threads_are_shared_among_every_rank_on_the_cpus_in_a_lab():
    """A lab's hosts are namespaces of one machine: its mpirun line says how many ranks share the cores."""
    env = detect_launch_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
                             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"})
    assert ranks_sharing_cpus(env, {}) == 1  # one rank per host on a real cluster: all the host's cores
    assert ranks_sharing_cpus(env, {CPU_SHARERS: "4"}) == 4
    assert ranks_sharing_cpus(env, {CPU_SHARERS: "junk"}) == 1


@pytest.mark.parametrize("environ, cores, ranks, expected", [
    ({}, range(16), 2, 8),  # free on the whole machine: its cores shared among the host's ranks
    ({}, range(2), 2, 1),  # a cpuset or taskset of 2 cores for the job: those shared, not the machine's 16
    ({"OMPI_MCA_orte_bound_at_launch": "1"}, {5}, 2, 1),  # plain mpirun -np 2: a core each (was 8 threads on it)
    ({"DPCOMPARE_BIND": "core"}, range(4), 2, 4),  # --bind core with 4 cores a rank: all four
    ({"OMPI_MCA_orte_bound_at_launch": "1"}, range(8), 4, 4),  # bound to a socket of 8 with another rank
    ({"SLURM_CPU_BIND_TYPE": "mask_cpu:"}, range(3), 4, 3),  # srun --cpu-bind: the task's own cores
    ({"SLURM_CPU_BIND_TYPE": "none"}, range(4), 2, 2),  # srun that did not bind: the step's cores shared
    ({CPU_SHARERS: "4"}, range(16), 1, 4),  # a lab's 4 ranks on one machine's 16 cores
])
def test_default_threads_count_the_cores_a_rank_may_use(environ, cores, ranks, expected):
    env = LaunchEnv(0, ranks, 0, ranks, "openmpi")
    assert default_threads(env, environ, set(cores), machine=16) == expected


@pytest.mark.mpi
def test_mpirun_says_when_it_bound_the_ranks(tmp_path):
    """What default_threads reads from Open MPI: its default binding at np=2 (a core each) is seen as bound, and
    the --bind-to none of every dpcompare launch line is not."""
    def ranks(*flags: str) -> list[str]:  # each rank's answer in a file of its own (their stdout interleaves)
        folder = tmp_path / ("-".join(flags) or "plain")
        folder.mkdir()
        probe = ("import os; from dpcompare.launch.env import bound_by_launcher as b; "
                 f"open(os.path.join({str(folder)!r}, os.environ['OMPI_COMM_WORLD_RANK']), 'w')"
                 ".write(f'{b()} {len(os.sched_getaffinity(0))}')")
        p = subprocess.run(["mpirun", "-np", "2", *flags, sys.executable, "-c", probe], env=mpi_env(),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        return [(folder / r).read_text() for r in ("0", "1")]

    assert ranks() == ["True 1", "True 1"]
    assert [answer.split()[0] for answer in ranks("--bind-to", "none")] == ["False", "False"]
