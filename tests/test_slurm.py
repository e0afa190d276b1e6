"""Against a real one-node Slurm (scripts/slurm-local.sh): the generated sbatch script, compare inside an
allocation, and a task killed inside a job.

The cluster is started once for the session and stopped afterwards (left alone when it was already
running). Where it cannot start (not root, no apt-get) the tests skip with the reason; under CI they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dpcompare.launch import slurm

from conftest import DPCOMPARE, FAST, ROOT, dpcompare, missing, mpi_env, needs_horovod, summary

SCRIPT = ROOT / "scripts" / "slurm-local.sh"
JOB_LIMIT_S = 400


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[None]:
    if not shutil.which("bash"):
        missing("bash is needed to start a local Slurm")
    was_running = subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0 if shutil.which(
        "sinfo") else False
    p = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or ["no output"])[-1]
        missing(f"a local Slurm (scripts/slurm-local.sh) could not start: {why}")
    slurm._mpi_types.cache_clear()  # srun appeared after this process looked for it
    yield
    if not was_running:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)


def _write_script(tmp_path: Path, *command: str, name: str = "job.sbatch") -> Path:
    script = tmp_path / name
    dpcompare("slurm", "--nodes", "1", "--tasks-per-node", "2", "--time", "00:10:00", "--chdir", str(tmp_path),
              "--sbatch-output", str(tmp_path / "%x-%j.out"), "--out-file", str(script), "--", *command, cwd=tmp_path)
    return script


def _job_state(job_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout


def _run_batch_job(script: Path, cwd: Path) -> str:
    """Submit ``script`` and return ``scontrol show job`` once the job has ended.

    Not ``sbatch --wait``: it polls after 2, 8 and 32 s, so a 12 s job would take 42 s to be noticed.
    """
    p = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=mpi_env(),
                       cwd=cwd, check=True)
    return _ended_state(p.stdout.strip().split(";")[0], cwd)


def _ended_state(job_id: str, cwd: Path) -> str:
    """``scontrol show job`` once the job has left PENDING, RUNNING and COMPLETING (its epilogue: ``sbatch --wait``
    can return while the job is still COMPLETING)."""
    deadline = time.monotonic() + JOB_LIMIT_S
    while re.search(r"JobState=(PENDING|CONFIGURING|RUNNING|COMPLETING)\b", state := _job_state(job_id)):
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], capture_output=True)
            raise AssertionError(f"job {job_id} still running after {JOB_LIMIT_S} s:\n{_log(cwd)[-3000:]}")
        time.sleep(0.25)  # polling the job's state (there is no event to wait on)
    return state


def _log(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("dpcompare-*.out")))


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("horovod", marks=needs_horovod)])
def test_generated_sbatch_script_runs_two_tasks_with_srun(slurm_cluster: None, tmp_path: Path,
                                                          strategy: str) -> None:
    out = tmp_path / "run"
    script = _write_script(tmp_path, "train", "--strategy", strategy, *FAST, "--epochs", "1", "--out", str(out))
    text = script.read_text()
    if "pmix" in slurm.srun_mpi_types():  # Open MPI under srun needs a PMI plugin: pmix works here
        assert "--mpi=pmix" in text
    state = _run_batch_job(script, tmp_path)
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, f"{state}\n{_log(tmp_path)[-3000:]}"
    s = summary(out)
    assert (s["strategy"], s["world_size"], s["launcher"]) == (strategy, 2, "slurm")
    assert len(s["timing"]["per_rank"]) == 2 and s["final_test_accuracy"] > 0.2


def test_compare_inside_an_allocation_launches_with_srun(slurm_cluster: None, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    p = subprocess.run(["salloc", "-n", "2", DPCOMPARE, "compare", "--np", "2", "--strategies", "ddp",
                        "--repeats", "1", *(f for f in FAST if f != "--no-tensorboard"), "--epochs", "1", "--out",
                        str(out)],
                       capture_output=True, text=True, timeout=JOB_LIMIT_S, env=mpi_env(), cwd=tmp_path)
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["status"] == "ok" and Path(run["command"][0]).name == "srun" and "--ntasks=2" in run["command"]
    assert summary(out / run["dir"])["launcher"] == "slurm"


def _task_pid(job_id: str, task: int, deadline: float) -> int:
    while time.monotonic() < deadline:
        for proc in psutil.process_iter(["pid", "name"]):
            try:
                env = proc.environ()
            except (psutil.Error, OSError):
                continue
            if env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_PROCID") == str(task) and \
                    "python" in (proc.info["name"] or "") + " ".join(proc.cmdline()[:1]):
                return proc.pid
        time.sleep(0.5)
    raise AssertionError(f"task {task} of job {job_id} did not appear")


def test_killed_task_ends_the_job_non_zero_naming_the_task(slurm_cluster: None, tmp_path: Path) -> None:
    script = _write_script(tmp_path, "train", "--strategy", "ddp", *FAST, "--epochs", "500", "--progress", "lines",
                           "--out", str(tmp_path / "run"))
    job = subprocess.Popen(["sbatch", "--wait", "--parsable", str(script)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=mpi_env(), cwd=tmp_path)
    try:
        job_id = job.stdout.readline().strip().split(";")[0]  # type: ignore[union-attr]
        assert job_id.isdigit(), job_id
        deadline = time.monotonic() + 240
        while "epoch   1/" not in _log(tmp_path):  # training runs on both tasks
            assert time.monotonic() < deadline and job.poll() is None, _log(tmp_path)[-3000:]
            time.sleep(0.5)
        os.kill(_task_pid(job_id, 1, deadline), signal.SIGKILL)
        rc = job.wait(timeout=120)
    finally:
        if job.poll() is None:
            subprocess.run(["scancel", job_id], capture_output=True)
            job.kill()
    assert rc != 0
    state = _ended_state(job_id, tmp_path)
    assert re.search(r"JobState=(FAILED|CANCELLED|NODE_FAIL)", state), state
    assert re.search(r"task 1: Killed", _log(tmp_path)), _log(tmp_path)[-3000:]


# -- which --mpi the generated lines carry (a fake srun; no cluster needed) -------------------------------


def test_srun_mpi_defaults_to_pmix_where_srun_lists_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nprintf 'MPI plugin types are...\\n\\tpmix\\n\\tnone\\n\\tpmi2\\n"
                               "specific pmix plugin versions available: pmix_v4\\n'\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_MPI_TYPE", raising=False)
    assert slurm.srun_mpi_types() == ("pmix", "none", "pmi2")
    assert slurm.resolve_srun_mpi("auto") == "pmix" and slurm.resolve_srun_mpi("pmi2") == "pmi2"
    assert slurm.resolve_srun_mpi(slurm.CLUSTER_DEFAULT) is None
    from dpcompare.launch.mpirun import job_command

    cmd = job_command(2, ["x"], environ={**os.environ, "SLURM_JOB_ID": "1"})
    assert cmd[:4] == ["srun", "--ntasks=2", "--kill-on-bad-exit=1", "--mpi=pmix"]
    monkeypatch.setenv("SLURM_MPI_TYPE", "pmi2")  # the user's choice: srun reads it itself
    assert slurm.resolve_srun_mpi("auto") is None
