"""Shared fixtures: run dpcompare as a user would, one process or under ``mpirun -np N``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def dpcompare(*args: str, np: int = 0, own_process: bool = False, **kw: object) -> subprocess.CompletedProcess[str]:
    """``dpcompare ARGS`` under ``mpirun -np NP``, or as one process (np=0).

    One process runs inside this one (``cli.main`` with the same environment, working folder and captured
    output a child would get): it saves the 3-5 s of importing torch a child spends. ``own_process=True``
    starts a real child instead, for tests about the process itself (its exit status, what it imports).
    """
    if np or own_process:
        return run(mpirun_cmd(np, *args) if np else [DPCOMPARE, *args], **kw)  # type: ignore[arg-type]
    return in_process(list(args), **kw)  # type: ignore[arg-type]


@contextlib.contextmanager
def _as_a_child(env: dict[str, str], cwd: str | Path | None) -> Iterator[None]:
    saved, here = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        os.chdir(here)


def in_process(args: list[str], timeout: float = 300, env: dict[str, str] | None = None, check: bool = True,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """``dpcompare ARGS`` run by ``cli.main`` in this process, answered as :func:`run` answers."""
    from dpcompare import cli

    out, err = io.StringIO(), io.StringIO()
    with _as_a_child(env or mpi_env(), cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(args)
        except SystemExit as e:  # argparse: --help, --version, a bad flag
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    p = subprocess.CompletedProcess(["dpcompare", *args], rc, out.getvalue(), err.getvalue())
    if check and rc != 0:
        raise AssertionError(f"dpcompare {' '.join(args)} exited {rc}\nstdout:\n{p.stdout[-3000:]}\n"
                             f"stderr:\n{p.stderr[-3000:]}")
    return p


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# Under CI (CI=true, as `.ci/run` is run) what the suite is supposed to test must be there: a missing or
# broken Horovod, Open MPI or network namespaces fail the run instead of skipping. Locally they skip and
# say why. DPCOMPARE_REQUIRE_ALL=1 asks for the CI behaviour anywhere.
STRICT = os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.environ.get("DPCOMPARE_REQUIRE_ALL") == "1"


def horovod_problem() -> str | None:
    """None when ``horovod.torch`` imports; else what went wrong, with the real exception."""
    try:
        import horovod.torch  # noqa: F401
    except ModuleNotFoundError as e:
        return f"Horovod is not installed ({e}); `make setup` builds it"
    except Exception as e:  # noqa: BLE001  (an undefined symbol after a torch upgrade is an ImportError/OSError)
        return f"Horovod is installed but does not import: {type(e).__name__}: {e}; re-run `make setup`"
    return None


def mpi_problem() -> str | None:
    return None if shutil.which("mpirun") else "Open MPI's mpirun is not installed (make setup installs it)"


def missing(reason: str) -> None:
    """A requirement of this test is missing: fail under CI, skip (saying why) elsewhere."""
    if STRICT:
        pytest.fail(f"required under CI: {reason}", pytrace=False)
    pytest.skip(reason)


_REQUIREMENTS = {"horovod": horovod_problem, "mpi": mpi_problem}


# torchrun's agents (a log folder each) and wandb's offline runs leave folders in the temporary directory that
# nothing reads after the run: the suite removes the ones that appeared while it ran (controller only, at its end).
_LITTER = ("torchelastic_*", "tmp*wandb*")  # wandb: tmp…wandb-media, tmp…wandb-artifacts
_BEFORE = pytest.StashKey[set[Path]]()


def _litter() -> set[Path]:
    import tempfile

    return {p for pattern in _LITTER for p in Path(tempfile.gettempdir()).glob(pattern)}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = _litter()
    if STRICT:
        problems = [p for check in _REQUIREMENTS.values() if (p := check())]
        if problems:
            pytest.exit("CI needs the whole stack: " + "; ".join(problems), returncode=1)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller cleans up once every worker is done
    for p in _litter() - session.config.stash.get(_BEFORE, set()):
        shutil.rmtree(p, ignore_errors=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark, check in _REQUIREMENTS.items():
        if item.get_closest_marker(mark) and (problem := check()):
            missing(problem)


# -- running the suite on several cores (pytest-xdist: `make test TEST_WORKERS=2` runs `pytest -n 2`) -------
# Each worker takes whole modules (their module-scoped fixtures are built once); the modules below that share
# something only one test may hold at a time go to one worker together, and run one after the other:
#   slurm    the machine's one-node Slurm cluster (scripts/slurm-local.sh writes /etc/slurm, starts slurmctld/d)
#   lab      emulated hosts: Lab.up picks the first free 10.250.X.0/24 before it records it (two at once could
#            take the same one), and these tests hold the suite's tightest timings (a lost host's 5 s timeout,
#            the watchdog's end, the predict bound): one lab job at a time, not two on 2 cores
#   convnet  the session's trained convnet (ConvnetNp2): trained once, not once per worker
# Everything else is safe side by side: namespace and lab names carry secrets.token_hex, ports are ephemeral
# (free_port, bind 0; a lab's fixed rendezvous port is inside its own namespace), files live under tmp_path,
# torchrun's commit folders are per run id, and mpirun jobs run --oversubscribe.
XDIST_GROUPS = {
    "slurm": ("test_slurm.py", "test_submit.py"),
    "lab": ("test_lab.py", "test_lab_run.py", "test_elastic_lab.py", "test_faults_lab.py", "test_predict_lab.py",
            "test_comm.py"),
    "convnet": ("test_distributed.py", "test_trace.py", "test_multihost.py"),
}
_GROUP_OF = {module: group for group, modules in XDIST_GROUPS.items() for module in modules}


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without it, never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whatever --dist asks, a module is one unit of work and XDIST_GROUPS' modules one unit each (the largest
    units first). ``--dist each`` (every test on every worker) is left to xdist."""
    if config.getvalue("dist") == "each":
        return None
    if gone := sorted(m for m in _GROUP_OF if not (ROOT / "tests" / m).is_file()):
        raise pytest.UsageError(f"tests/conftest.py's XDIST_GROUPS names {', '.join(gone)}, not in tests/: "
                                "rename it there too (else its module runs beside the ones it must not)")
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return _GROUP_OF.get(Path(module).name, module)

    config.option.loadscopereorder = True
    return ByModule(config, log)


needs_mpi = pytest.mark.mpi
needs_horovod = pytest.mark.horovod

# Small, fast training flags shared by the distributed tests.
FAST = ("--model", "convnet", "--dataset", "digits", "--trackers", "none", "--threads", "1", "--warmup-steps", "2")


def load_ckpt(out: Path, epoch: int) -> dict:
    import torch

    return torch.load(out / "checkpoints" / f"epoch-{epoch}.pt", weights_only=True)


def ckpt_tensors(ck: dict) -> dict:
    """Every tensor of a checkpoint's model and optimizer state, by a stable name."""
    import torch

    out = {f"model.{k}": v for k, v in ck["model"].items()}
    for pid, state in ck["optimizer"]["state"].items():
        out.update({f"opt.{pid}.{k}": v for k, v in state.items() if isinstance(v, torch.Tensor)})
    return out


def lab_of(prefix: str, link: str) -> Iterator[Any]:
    """A 2-host emulated lab at ``link`` for one test module (as a fixture's body), removed afterwards; a
    machine that cannot make one (not Linux, no iproute2, not root) skips locally and fails under CI."""
    from dpcompare.errors import LaunchError
    from dpcompare.lab import Lab, hosts, parse_lab_spec

    if not sys.platform.startswith("linux") or shutil.which("ip") is None or os.geteuid() != 0:
        missing("a lab needs Linux, iproute2 and root")
    name = f"{prefix}{secrets.token_hex(3)}"
    try:
        the_lab = Lab.up(parse_lab_spec(f"hosts=2,link={link},name={name}"))
    except LaunchError as e:
        missing(f"cannot make a lab here: {e}")
    yield the_lab
    hosts.sweep(name)


class ConvnetNp2:
    """The suite's trained convnet: one np=2 run per strategy for the whole session, trained the first time a
    test asks for it (so a missing Horovod skips, or under CI fails, only the tests that need Horovod). FAST, 4
    epochs with a checkpoint after epochs 2 and 4, and the 3 steps after the warm-up traced: test_distributed
    resumes and compares it, test_trace reads its trace. Each run's folder is BASE/runs/STRATEGY-np2-r0, as a
    comparison lays its runs out."""

    TRACED = 3
    TRAIN = ("train", *FAST, "--epochs", "4", "--checkpoint-every", "2", "--trace", str(TRACED))

    def __init__(self, base: Path) -> None:
        self.base = base
        self.stdout: dict[str, str] = {}

    def __call__(self, strategy: str) -> Path:
        out = self.base / "runs" / f"{strategy}-np2-r0"
        if strategy not in self.stdout:
            self.stdout[strategy] = dpcompare(*self.TRAIN, "--strategy", strategy, "--out", str(out), np=2).stdout
        return out


@pytest.fixture(scope="session")
def convnet_np2(tmp_path_factory: pytest.TempPathFactory) -> ConvnetNp2:
    return ConvnetNp2(tmp_path_factory.mktemp("convnet"))
