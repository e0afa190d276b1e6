"""Run a user's script, unchanged, in one of three arms, in this process (one rank of a job):

- ``native``: ``import horovod.torch`` resolves to the layer (:mod:`.hook`), even where Horovod is installed;
- ``horovod``: the real library;
- ``ddp``: a script written for torchrun (e.g. the port ``dpcompare migrate`` writes), with torchrun's variables
  (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) set from mpirun's or srun's.

The script runs as ``__main__`` with ``sys.argv`` set and its folder first on ``sys.path``, as ``python train.py``
would run it. With an output folder the run is recorded (:mod:`.record`). ``python -m dpcompare.native`` and
``dpcompare script`` both end here.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType

from dpcompare.argtypes import nonneg_int
from dpcompare.errors import ConfigError, DpcompareError
from dpcompare.launch import liveness
from dpcompare.launch.env import default_threads, detect_launch_env, reporting_rank
from dpcompare.native.calls import SCRIPT_ARMS, Unsupported
from dpcompare.native.record import ELASTIC_DIR_VAR, OUT_VAR, PARAMS, Recorder, rank_file

ARMS = SCRIPT_ARMS
_PYTHONS = ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}")


@dataclass(frozen=True)
class Target:
    """What to run: a script file or (``-m``) a module, and its arguments."""

    path: str | None
    module: str | None
    args: list[str]

    @property
    def shown(self) -> str:
        return self.path or f"-m {self.module}"


def parse_target(words: list[str]) -> Target:
    """``[python] train.py ARGS`` or ``[python] -m pkg.mod ARGS`` (the interpreter word is optional)."""
    words = list(words)
    if words[:1] == ["--"]:
        words = words[1:]
    if words and (Path(words[0]).name in _PYTHONS or words[0] == sys.executable):
        words = words[1:]
    if words[:1] == ["-m"] and len(words) > 1:
        return Target(None, words[1], words[2:])
    if not words or words[0].startswith("-"):
        raise ConfigError("expected the script to run, e.g. `-- python train.py --epochs 1` (got "
                          f"{' '.join(words) or 'nothing'})")
    if not Path(words[0]).is_file():
        raise ConfigError(f"{words[0]}: no such script")
    return Target(words[0], None, words[1:])


def _real_horovod() -> ModuleType:
    try:
        # lazy: an optional dependency, tried where it is used
        import horovod.torch as hvd
    except Exception as e:  # noqa: BLE001  (a broken build is an ImportError or an OSError)
        raise ConfigError(f"--as horovod needs Horovod, which does not import here ({type(e).__name__}: {e}); "
                          "`make setup` builds it, or run --as native") from None
    return hvd


def _torchrun_env() -> None:
    """torchrun's variables from the launcher that started this rank (a torchrun launch is left as it is)."""
    from dpcompare.launch.rendezvous import ensure_rendezvous  # here, not at the top: it loads psutil

    env = detect_launch_env()
    if env.launcher == "torchrun":
        return
    ensure_rendezvous(env)
    os.environ.update(RANK=str(env.rank), WORLD_SIZE=str(env.world_size), LOCAL_RANK=str(env.local_rank),
                      LOCAL_WORLD_SIZE=str(env.local_size))


def prepare(arm: str, recorder: Recorder | None) -> None:
    """Make ``import horovod`` mean what ``arm`` says, and wire the recorder in."""
    if arm == "native":
        # lazy: the native layer loads torch: imported only for the native arm
        from dpcompare.native import hook

        hook.install()
        import horovod.torch as hvd  # the layer, through the hook
    elif arm == "horovod":
        hvd = _real_horovod()
    else:
        _torchrun_env()
        if recorder is not None:
            recorder.watch_every_optimizer()
        return
    if recorder is not None:
        recorder.patch(hvd)


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse to write over an earlier run's records unless asked to."""
    if not overwrite and ((out / PARAMS).exists() or rank_file(out, 0).exists()):
        raise ConfigError(f"{out} already holds a script run; choose another --out or pass --overwrite")


def _execute(target: Target) -> int:
    """Run the target as ``__main__``; its exit code (1 and a traceback for an exception, as Python does)."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    try:
        if target.path:
            sys.argv = [target.path, *target.args]
            sys.path.insert(0, str(Path(target.path).resolve().parent))
            runpy.run_path(target.path, run_name="__main__")
        else:
            sys.argv = [target.module or "", *target.args]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(target.module or "", run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except DpcompareError:
        raise
    except Exception:  # noqa: BLE001  (the script's own failure: shown as Python shows it)
        traceback.print_exc()
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def set_threads(threads: int) -> None:
    """torch's CPU threads for this rank: ``threads``, or (0) the cores divided among the ranks sharing them."""
    import torch  # here, not at the top: dpcompare --help loads this module

    torch.set_num_threads(threads or default_threads(detect_launch_env()))


def run_script(arm: str, target: Target, out: Path | None = None, seed: int | None = None,
               overwrite: bool = False, threads: int | None = None, step_log: bool = False,
               timeout: float | None = None, commit_dir: Path | None = None) -> int:
    """Run ``target`` in ``arm`` in this process; the script's exit code (Unsupported: exit 2, one line).
    ``threads`` None leaves torch's CPU threads as they are (the script may set them itself). ``step_log``: write
    OUT/steps.jsonl from the first step (an elastic script writes it anyway). ``timeout``: seconds a collective
    waits for a lost peer, Horovod's gloo timeout (``HOROVOD_GLOO_TIMEOUT_SECONDS``, which the layer reads too)
    and torch's default process-group timeout (a DDP port's ``init_process_group`` takes it).
    ``commit_dir``: where the layer's ``hvd.elastic`` keeps its commits under torchrun."""
    if arm not in ARMS:
        raise ConfigError(f"--as {arm}: choose one of {', '.join(ARMS)}")
    out = out or (Path(os.environ[OUT_VAR]) if os.environ.get(OUT_VAR) else None)
    if out is not None:
        check_out(out, overwrite)
    if timeout is not None:
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(1, round(timeout)))
        _default_timeout(timeout)
    if commit_dir is not None:
        os.environ[ELASTIC_DIR_VAR] = str(commit_dir)
    env = detect_launch_env()
    recorder = Recorder(out, arm, env.rank, env.world_size, step_log) if out is not None else None
    prepare(arm, recorder)
    if seed is not None:  # the same random state in every arm (for scripts that do not seed)
        # lazy: it loads torch, numpy
        from dpcompare.checkpoint import seed_everything

        seed_everything(seed)
    if threads is not None:
        set_threads(threads)
    code = 1
    liveness.start()  # an elastic job's worker (torchrun): a lost peer noticed in seconds, not at --timeout
    try:
        code = _execute(target)
    except Unsupported:
        code = 2
        raise
    finally:
        if recorder is not None:
            recorder.write(code)
        _leave_group(arm)
        liveness.stop(clean=code == 0)
    return code


def _default_timeout(seconds: float) -> None:
    """torch's default process-group timeout, which ``init_process_group`` without ``timeout=`` reads when it
    runs (a module attribute: torch has no setting for it)."""
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = timedelta(seconds=seconds)


def _leave_group(arm: str) -> None:
    """The layer's process group ends with the script (Horovod's background thread does, too), the other ranks
    told, so that none waits forever for this one in a collective it will not reach."""
    if arm == "native":
        # lazy: the native layer loads torch: imported only for the native arm
        from dpcompare.native import negotiation, state

        if state.is_initialized():
            negotiation.leave()
            state.shutdown()


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The script runner's one command line (``python -m dpcompare.native`` and ``dpcompare script`` both read
    it): what ``import horovod`` means, the records, seed and threads, and the target, ``-m MODULE`` as Python
    takes it (everything after the module is the module's)."""
    p.add_argument("--as", dest="arm", choices=ARMS, default="native",
                   help="native: dpcompare's layer; horovod: the real library; ddp: a torchrun script "
                        "(default: native)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help=f"record optimizer steps and final weights here (or ${OUT_VAR}; never beside the script)")
    p.add_argument("--seed", type=int, help="seed Python's, NumPy's and torch's generators before the script starts "
                                            "(the same in every arm; for scripts that do not seed)")
    p.add_argument("--overwrite", action="store_true", help="replace the records of an earlier run in --out")
    p.add_argument("--threads", type=nonneg_int, metavar="N",
                   help="torch CPU threads per rank before the script starts; 0: the cores it may use ÷ the ranks "
                        "sharing them "
                        "(default: torch's own; a script's own torch.set_num_threads wins)")
    p.add_argument("--step-log", action="store_true",
                   help="with --out: write OUT/steps.jsonl, a line per optimizer step (an elastic script's run "
                        "writes it anyway)")
    p.add_argument("--timeout", type=float,
                   help="seconds a collective waits for a lost peer before failing (sets "
                        "HOROVOD_GLOO_TIMEOUT_SECONDS, read by Horovod's gloo and by the layer)")
    p.add_argument("--commit-dir", type=Path, metavar="DIR",
                   help=f"where the native layer's hvd.elastic keeps its commits under torchrun, shared by every "
                        f"host (sets {ELASTIC_DIR_VAR}; default: one folder per torchrun run id in the temporary "
                        "folder)")
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ARGS",
                   help="run a module as a script, as `python -m` does (e.g. -m pytest tests/test_x.py)")
    p.add_argument("target", nargs=argparse.REMAINDER, metavar="[--] [python] SCRIPT ARGS",
                   help="the script and its arguments")


def target_words(a: argparse.Namespace) -> list[str]:
    """The target :func:`add_run_arguments` read: ``[python] SCRIPT ARGS`` or ``-m MODULE ARGS``."""
    if a.module is not None:
        if a.target:
            raise ConfigError(f"-m {' '.join(a.module)}: give a module or a script, not both")
        return ["-m", *a.module]
    return a.target[1:] if a.target[:1] == ["--"] else list(a.target)


def main(argv: list[str] | None = None) -> int:
    """``python -m dpcompare.native [--as ARM] [--out DIR] [--seed N] [python] train.py ARGS`` (or ``-m MOD``)."""
    p = argparse.ArgumentParser(
        prog="python -m dpcompare.native",
        description="Run a Horovod PyTorch script unchanged on native torch.distributed (the default, --as "
                    "native), on real Horovod (--as horovod), or a torchrun script under mpirun/srun (--as ddp). "
                    "Launch it as you launch the script: mpirun -np 2 python -m dpcompare.native train.py ARGS")
    add_run_arguments(p)
    a = p.parse_args(argv)
    try:
        return run_script(a.arm, parse_target(target_words(a)), a.out, a.seed, a.overwrite, a.threads, a.step_log,
                          a.timeout, a.commit_dir)
    except DpcompareError as e:
        if e.local or reporting_rank():
            sys.stderr.write(f"python -m dpcompare.native: error: {e}\n")
        return e.exit_code
