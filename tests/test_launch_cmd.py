"""``dpcompare launch`` and ``dpcompare slurm``: the lines and scripts they build (no MPI is started)."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dpcompare.cli import main
from dpcompare.launch import mpirun
from dpcompare.launch.slurm import parse_time

OPENMPI_VERSION = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
HYDRA_VERSION = (
    "HYDRA build details:\n    Version:                                 4.0.2\n    Release Date: unreleased\n"
)
INTEL_VERSION = "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
TRAIN = ["train", "--strategy", "horovod", "--dataset", "digits"]


def _script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def fake_mpi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Put a fake ``mpirun`` printing the given ``--version`` text first on PATH; no Slurm allocation."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    def install(version_text: str, exit_code: int = 0) -> Path:
        folder = tmp_path / f"bin{abs(hash(version_text))}"
        body = (f'if [ "$1" = --version ]; then printf %s {shlex.quote(version_text)}; exit 0; fi\n'
                f'echo "fake mpirun ran: $*"\nexit {exit_code}\n')
        _script(folder, "mpirun", body)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        return folder

    return install


def _launch(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    rc = main(["launch", *args])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.strip().splitlines()
    assert len(lines) == 1, out  # one shell-quoted line
    return shlex.split(lines[0])


def _after(cmd: list[str], flag: str) -> str:
    assert flag in cmd, cmd
    return cmd[cmd.index(flag) + 1]


def _errors(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        rc = main(list(argv))
        raise SystemExit(rc)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


# -- mpirun lines -----------------------------------------------------------------------------------------
def test_openmpi_line_with_hosts_and_forwarding(fake_mpi, monkeypatch, capsys) -> None:
    fake_mpi(OPENMPI_VERSION)
    for k, v in {"LD_LIBRARY_PATH": "/opt/lib", "HOROVOD_FUSION_THRESHOLD": "0", "NCCL_DEBUG": "INFO",
                 "OMP_NUM_THREADS": "1", "GLOO_TIMEOUT": "9", "UNRELATED_SECRET": "x"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    cmd = _launch(capsys, "--np", "4", "--hosts", "nodeA:2,nodeB:2", "--dry-run", "--", *TRAIN)
    assert cmd[:3] == ["mpirun", "-np", "4"]
    assert _after(cmd, "-H") == "nodeA:2,nodeB:2"
    assert _after(cmd, "--bind-to") == "none" and _after(cmd, "--map-by") == "slot"
    forwarded = [cmd[i + 1] for i, w in enumerate(cmd) if w == "-x"]
    for name in ("PATH", "LD_LIBRARY_PATH", "HOROVOD_FUSION_THRESHOLD", "NCCL_DEBUG", "OMP_NUM_THREADS",
                 "GLOO_TIMEOUT"):
        assert name in forwarded
    if sys.prefix != sys.base_prefix:  # this venv reaches every rank: by value, or by name when already set to it
        assert f"VIRTUAL_ENV={sys.prefix}" in forwarded or (
            "VIRTUAL_ENV" in forwarded and os.environ.get("VIRTUAL_ENV") == sys.prefix)
    assert not any("UNRELATED" in w or w.startswith("MASTER_") for w in forwarded)
    assert "--oversubscribe" not in cmd  # hosts are named: their slots decide
    # the command: this Python's dpcompare, then the user's words unchanged
    assert cmd[-len(TRAIN):] == TRAIN
    exe = mpirun.dpcompare_argv()
    assert cmd[-len(TRAIN) - len(exe):-len(TRAIN)] == exe
    assert Path(exe[0]).is_absolute() and Path(exe[0]).parent == Path(sys.executable).parent


def test_line_is_the_same_for_every_strategy(fake_mpi, capsys) -> None:
    fake_mpi(OPENMPI_VERSION)
    ddp = _launch(capsys, "--np", "2", "--dry-run", "--", "train", "--strategy", "ddp")
    hvd = _launch(capsys, "--np", "2", "--dry-run", "--", "train", "--strategy", "horovod")
    assert ddp[:-1] == hvd[:-1] and (ddp[-1], hvd[-1]) == ("ddp", "horovod")


def test_oversubscribe_only_beyond_local_cores_without_hosts() -> None:
    env = {"PATH": "/usr/bin"}
    line = lambda np, **kw: mpirun.job_command(np, ["prog"], flavor="openmpi", environ=env, cores=2,  # noqa: E731
                                               use_srun=False, **kw)
    assert "--oversubscribe" in line(3)
    assert "--oversubscribe" not in line(2)
    assert "--oversubscribe" not in line(3, hosts="a:2,b:2")


def test_iface_and_mpi_net(fake_mpi, capsys) -> None:
    fake_mpi(OPENMPI_VERSION)
    cmd = _launch(capsys, "--np", "2", "--hosts", "10.1.0.1:1,10.1.0.2:1", "--iface", "eth7",
                  "--mpi-net", "10.1.0.0/16", "--dry-run", "--", "train", "--strategy", "ddp")
    pairs = list(zip(cmd, cmd[1:], cmd[2:], strict=False))
    assert ("--mca", "btl_tcp_if_include", "10.1.0.0/16") in pairs
    assert ("--mca", "oob_tcp_if_include", "10.1.0.0/16") in pairs
    assert ("-x", "GLOO_SOCKET_IFNAME=eth7") in zip(cmd, cmd[1:], strict=False)
    assert ("-x", "NCCL_SOCKET_IFNAME=eth7") in zip(cmd, cmd[1:], strict=False)


@pytest.mark.parametrize(("text", "flavor"), [
    (OPENMPI_VERSION, "openmpi"), ("mpirun (OpenRTE) 1.10.7\n", "openmpi"),
    ("mpirun (IBM Spectrum MPI) 10.4.0.0\n", "openmpi"), (HYDRA_VERSION, "mpich"), (INTEL_VERSION, "mpich"),
    ("HYDRA build details:\n    Version: 2.3.7 (MVAPICH2)\n", "mpich"), ("usage: mpirun [options]\n", None), ("", None),
])
def test_flavor_from_version_text(text: str, flavor: str | None) -> None:
    assert mpirun.flavor_from_version(text) == flavor


def test_mpich_line_detected_from_version(fake_mpi, monkeypatch, capsys) -> None:
    fake_mpi(HYDRA_VERSION)
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "1")
    cmd = _launch(capsys, "--np", "4", "--hosts", "nodeA:2,nodeB:2", "--dry-run", "--", *TRAIN)
    assert cmd[:3] == ["mpirun", "-n", "4"]
    assert _after(cmd, "-ppn") == "2" and _after(cmd, "-hosts") == "nodeA,nodeB"
    genv = {cmd[i + 1]: cmd[i + 2] for i, w in enumerate(cmd) if w == "-genv"}
    assert genv["PATH"] == os.environ["PATH"] and genv["HOROVOD_CYCLE_TIME"] == "1"
    assert "-x" not in cmd and "--bind-to" not in cmd and "-np" not in cmd
    assert cmd[-len(TRAIN):] == TRAIN


def test_mpi_override_and_uneven_hosts(fake_mpi, capsys) -> None:
    fake_mpi(OPENMPI_VERSION)  # detection would say Open MPI; --mpi wins
    cmd = _launch(capsys, "--np", "4", "--mpi", "mpich", "--hosts", "a:1,b:3", "--dry-run", "--", *TRAIN)
    assert cmd[:3] == ["mpirun", "-n", "4"] and _after(cmd, "-hosts") == "a:1,b:3" and "-ppn" not in cmd
    cmd = _launch(capsys, "--np", "2", "--mpi", "mpich", "--hostfile", "hosts.txt", "--dry-run", "--", *TRAIN)
    assert _after(cmd, "-f") == "hosts.txt"
    err = _errors(capsys, "launch", "--np", "2", "--mpi", "mpich", "--mpi-net", "10.0.0.0/24", "--dry-run",
                  "--", *TRAIN)
    assert "interface" in err


def test_unknown_mpi_asks_for_mpi_flag(fake_mpi, capsys) -> None:
    fake_mpi("some launcher 1.0\n")
    err = _errors(capsys, "launch", "--np", "2", "--dry-run", "--", *TRAIN)
    assert "--mpi openmpi|mpich" in err


def test_srun_inside_a_slurm_allocation(tmp_path, monkeypatch, capsys) -> None:
    fake = tmp_path / "slurmbin"
    _script(fake, "srun", "exit 0\n")
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    cmd = _launch(capsys, "--np", "8", "--dry-run", "--", *TRAIN)
    assert cmd[:3] == ["srun", "--ntasks=8", "--kill-on-bad-exit=1"] and "mpirun" not in cmd
    assert cmd[-len(TRAIN):] == TRAIN
    cmd = _launch(capsys, "--np", "8", "--iface", "ib0", "--dry-run", "--", *TRAIN)
    export = _after(cmd, "--kill-on-bad-exit=1").split(",")
    assert export[0] == "--export=ALL" and {"GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME=ib0"} <= set(export)
    # the API other commands use (compare, parity) keeps its signature and takes srun too
    argv = [sys.executable, "-m", "dpcompare", "train"]
    assert mpirun.job_command(2, argv)[:2] == ["srun", "--ntasks=2"]
    assert mpirun.job_command(2, argv)[-4:] == argv
    assert mpirun.job_command(2, argv, use_srun=False, hosts="a:1,b:1")[0] == "mpirun"
    assert _launch(capsys, "--np", "2", "--launcher", "mpirun", "--mpi", "openmpi", "--dry-run", "--",
                   *TRAIN)[0] == "mpirun"
    _errors(capsys, "launch", "--np", "2", "--launcher", "srun", "--hosts", "a:2", "--dry-run", "--", *TRAIN)
    monkeypatch.delenv("SLURM_JOB_ID")
    assert not mpirun.in_slurm_allocation()


def test_job_command_signature_outside_slurm(fake_mpi) -> None:
    fake_mpi(OPENMPI_VERSION)
    argv = [sys.executable, "-m", "dpcompare", "train", "--strategy", "ddp"]
    cmd = mpirun.job_command(2, argv, hosts="a:1,b:1")
    assert cmd[:3] == ["mpirun", "-np", "2"] and _after(cmd, "-H") == "a:1,b:1" and cmd[-len(argv):] == argv
    cmd = mpirun.job_command(2, argv, hostfile="hf")
    assert _after(cmd, "-hostfile") == "hf"


@pytest.mark.parametrize(("args", "says"), [
    (["--np", "2", "--hosts", "nodeA:x", "--", *TRAIN], "launch: error: --hosts 'nodeA:x': 'nodeA:x' is not HOST or "
                                                         "HOST:SLOTS"),
    (["--np", "5", "--hosts", "a:2,b:2", "--", *TRAIN], "launch: error: --np 5 but --hosts gives 4 slots"),
    (["--np", "0", "--", *TRAIN], "launch: error: argument --np: '0' must be at least 1"),
    (["--np", "2"], "launch: error: expected a dpcompare command after -- (got nothing;"),
    (["--np", "2", "--", "launch", "--np", "2"], "launch: error: expected a dpcompare command after -- (got 'launch';"),
    (["--np", "2", "--", "train", "--strategy", "nope"], "train: error: argument --strategy: unknown strategy nope; "
                                                         "choose from ddp"),
    (["--np", "2", "--hosts", "a", "--hostfile", "f", "--", *TRAIN], "launch: error: argument --hostfile: not allowed "
                                                                     "with argument --hosts"),
    (["--np", "2", "--hostfile", "/nonexistent/hosts", "--", *TRAIN], "launch: error: --hostfile /nonexistent/hosts: "
                                                                      "no such file"),
])
def test_launch_refuses_with_one_line(fake_mpi, capsys, args: list[str], says: str) -> None:
    """Each refusal is its own: exit 2, one line, naming what is wrong (not some other check that fired first)."""
    fake_mpi(OPENMPI_VERSION)
    err = _errors(capsys, "launch", *args).replace(", e.g. `-- train --strategy ddp`", "")
    assert err.startswith("dpcompare ") and says in err, err


def test_launch_runs_the_line_and_returns_its_exit_code(fake_mpi, capfd) -> None:
    fake_mpi(OPENMPI_VERSION, exit_code=3)
    assert main(["launch", "--np", "2", "--", *TRAIN]) == 3
    out = capfd.readouterr().out.splitlines()
    assert out[0].startswith("mpirun -np 2 ")
    assert out[1].startswith("fake mpirun ran: -np 2 ") and out[1].endswith(" ".join(TRAIN))


def test_help_has_examples(capsys) -> None:
    for cmd in ("launch", "slurm"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert "examples:" in out and f"dpcompare {cmd} --" in out


# -- sbatch scripts ---------------------------------------------------------------------------------------
SLURM_ARGS = ["slurm", "--nodes", "2", "--gpus-per-node", "4", "--tasks-per-node", "4", "--cpus-per-task", "8",
              "--time", "00:30:00"]
SLURM_TRAIN = ["train", "--strategy", "ddp", "--dataset", "digits"]


def test_slurm_script(tmp_path, capsys) -> None:
    job = tmp_path / "job.sbatch"
    assert main([*SLURM_ARGS, "--partition", "gpu", "--account", "proj42", "--out-file", str(job), "--",
                 *SLURM_TRAIN]) == 0
    out = capsys.readouterr().out
    assert f"sbatch {job}" in out
    text = job.read_text()
    directives = [ln.split(None, 1)[1] for ln in text.splitlines() if ln.startswith("#SBATCH ")]
    for d in ("--nodes=2", "--ntasks-per-node=4", "--cpus-per-task=8", "--gpus-per-node=4", "--time=00:30:00",
              "--partition=gpu", "--account=proj42", "--job-name=dpcompare", "--output=%x-%j.out"):
        assert d in directives
    assert text.startswith("#!/bin/bash\n")
    assert 'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"' in text
    if sys.prefix != sys.base_prefix:
        assert f"source {shlex.quote(str(Path(sys.prefix) / 'bin' / 'activate'))}" in text
    srun = [ln for ln in text.splitlines() if ln.startswith("srun ")]
    assert len(srun) == 1 and srun[0].endswith(" ".join(SLURM_TRAIN)) and "--kill-on-bad-exit=1" in srun[0]
    if shutil.which("bash"):
        p = subprocess.run(["bash", "-n", str(job)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr


def test_slurm_script_runs_srun_with_the_allocation(tmp_path, capsys) -> None:
    """Run the script with a fake srun: it gets the command, the CPUs per task and OMP_NUM_THREADS."""
    if not shutil.which("bash"):
        pytest.skip("bash is not installed")
    job = tmp_path / "job.sbatch"
    assert main([*SLURM_ARGS, "--out-file", str(job), "--", *SLURM_TRAIN]) == 0
    fake = _script(tmp_path / "fakebin", "srun", 'echo "OMP=$OMP_NUM_THREADS VENV=${VIRTUAL_ENV:-}"\necho "$@"\n')
    env = {"PATH": f"{fake.parent}{os.pathsep}/usr/bin:/bin", "SLURM_CPUS_PER_TASK": "8", "HOME": str(tmp_path)}
    p = subprocess.run(["bash", str(job)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    first, args = p.stdout.splitlines()[:2]
    assert first.startswith("OMP=8 ")
    if sys.prefix != sys.base_prefix:
        assert first == f"OMP=8 VENV={sys.prefix}"
    assert args.startswith("--kill-on-bad-exit=1 --cpus-per-task=8 ") and args.endswith(" ".join(SLURM_TRAIN))


def test_slurm_without_gpus_and_refusing_to_overwrite(tmp_path, capsys) -> None:
    job = tmp_path / "cpu.sbatch"
    args = ["slurm", "--nodes", "1", "--time", "1-00:00:00", "--out-file", str(job), "--", *SLURM_TRAIN]
    assert main(args) == 0
    first = job.read_text()
    assert "--gpus-per-node" not in first and "#SBATCH --time=1-00:00:00" in first
    assert "--partition" not in first and "--account" not in first
    job.write_text("keep me")
    err = _errors(capsys, *args)
    assert "--overwrite" in err and job.read_text() == "keep me"
    assert main([*args[:-len(SLURM_TRAIN) - 1], "--overwrite", "--", *SLURM_TRAIN]) == 0
    assert job.read_text() == first


@pytest.mark.parametrize("bad", [
    ["--time", "30:00"], ["--time", "00:61:00"], ["--time", "00:00:00"], ["--time", "2-25:00:00"],
    ["--time", "soon"], ["--nodes", "0"], ["--tasks-per-node", "-1"], ["--cpus-per-task", "x"],
    ["--gpus-per-node", "-2"], ["--partition", "a b"],
])
def test_slurm_refuses_bad_values_with_one_line(tmp_path, capsys, bad: list[str]) -> None:
    args = {"--nodes": "2", "--time": "00:30:00", "--out-file": str(tmp_path / "j.sbatch")}
    args.update(dict(zip(bad[::2], bad[1::2], strict=True)))
    _errors(capsys, "slurm", *[x for kv in args.items() for x in kv], "--", *SLURM_TRAIN)
    assert not (tmp_path / "j.sbatch").exists()


def test_parse_time_accepts_slurm_forms() -> None:
    for ok in ("00:30:00", "48:00:00", "0-12:00:00", "7-00:00:01"):
        assert parse_time(ok) == ok
