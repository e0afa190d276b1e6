"""``dpcompare script`` (run a Horovod PyTorch script, unchanged, on the native layer or on real Horovod) and
``dpcompare migrate`` (its calls, their native equivalents, a DDP port).

Without ``--np`` this process is one rank (start it with mpirun, srun or torchrun, as the script would be);
with ``--np N`` dpcompare starts the N ranks itself through the launch room's one command-line builder.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from dpcompare.argtypes import nonneg_float, nonneg_int, positive_int
from dpcompare.errors import ConfigError, LaunchError
from dpcompare.launch.jobs import dpcompare_command, leave, run_job
from dpcompare.launch.mpirun import job_env
from dpcompare.native.migrate import report, scan_script
from dpcompare.native.runner import add_run_arguments, check_out, parse_target, run_script, target_words
from dpcompare.native.summary import DEFAULT_WARMUP, write_summary

#: the exit code of a job stopped at ``--run-timeout`` (timeout(1)'s)
TIMED_OUT = 124

DESCRIPTION = """\
Run a Horovod PyTorch script (`import horovod.torch as hvd`) unchanged:

  --as native    on torch.distributed through dpcompare's Horovod layer (gloo on CPU, NCCL on GPU): Horovod
                 need not be installed, and is not used where it is
  --as horovod   on the real Horovod library
  --as ddp       a torchrun-style script (e.g. the DDP port `dpcompare migrate` writes) under mpirun or srun

Without --np this process is one rank: start it as you start the script (mpirun -np 2 dpcompare script ...).
With --np N dpcompare starts N ranks itself (mpirun, or srun inside a Slurm allocation). Calls the layer does
not support stop the script with one line naming the native replacement (exit code 2); `dpcompare migrate
SCRIPT` lists them beforehand. --out DIR records every optimizer.step() and the final weights (for parity
and compare --script).
"""

EPILOG = """\
examples:
  dpcompare script --np 2 -- python examples/horovod/mnist.py --epochs 1
  mpirun -np 2 dpcompare script --as native -- python train.py --lr 0.01
  mpirun -np 2 python -m dpcompare.native train.py --lr 0.01      # the same, for your own launch lines
  dpcompare script --np 2 --as horovod --out runs/hvd -- python train.py
  dpcompare migrate train.py                                        # the calls, and a DDP port beside it
"""


def _per_rank_words(a: argparse.Namespace) -> list[str]:
    """The ``dpcompare script`` each rank runs (the same command without ``--np`` and the launcher's flags)."""
    words = ["script", "--as", a.arm]
    if a.out:
        words += ["--out", str(a.out)]
    if a.seed is not None:
        words += ["--seed", str(a.seed)]
    if a.overwrite:
        words.append("--overwrite")
    if a.threads is not None:
        words += ["--threads", str(a.threads)]
    if a.step_log:
        words.append("--step-log")
    if a.timeout is not None:
        words += ["--timeout", str(a.timeout)]
    if a.commit_dir is not None:
        words += ["--commit-dir", str(a.commit_dir)]
    return [*words, "--", *a.target]  # the target as target_words read it


def _launch(a: argparse.Namespace) -> int:
    parse_target(a.target)  # refuse a missing script before starting anyone
    if a.out:
        check_out(a.out, a.overwrite)
    cmd = dpcompare_command(a.np, _per_rank_words(a), hosts=a.hosts, hostfile=a.hostfile, mpi_net=a.mpi_net,
                            iface=a.iface)
    sys.stderr.write(f"dpcompare script: {shlex.join(cmd)}\n")
    try:
        rc, _ = run_job(cmd, None, job_env(), a.run_timeout or None)  # its own session: Ctrl-C stops every rank
    except FileNotFoundError:
        raise LaunchError(f"{cmd[0]} not found on PATH") from None
    if rc is None:
        sys.stderr.write(f"dpcompare script: error: the job took longer than --run-timeout {a.run_timeout:g} s "
                         "and was stopped (all its processes)\n")
        return TIMED_OUT
    if a.out:
        _summarize(a)
    return rc if rc >= 0 else 128 - rc


def _summarize(a: argparse.Namespace) -> None:
    """OUT/summary.json from every rank's record, and one line about it."""
    summary = write_summary(a.out, a.warmup_steps, a.metric)
    if summary is None:
        sys.stderr.write(f"dpcompare script: no rank left a record in {a.out}\n")
        return
    t = summary["timing"]
    median = f"{t['step_ms_median']:.1f} ms" if t["step_ms_median"] is not None else "none timed"
    metric = f", {a.metric} {summary['final_metric']}" if a.metric else ""
    sys.stderr.write(f"dpcompare script: {summary['steps']} optimizer steps, median step {median} over "
                     f"{t['measured_steps']} (after {a.warmup_steps}){metric}; records in {a.out}\n")


def _cmd_script(a: argparse.Namespace) -> int:
    a.target = target_words(a)
    if not a.target:
        raise ConfigError("expected the script after --, e.g. `dpcompare script -- python train.py ARGS` "
                          "(or -m MODULE ARGS)")
    if a.np is not None:
        return _launch(a)

    code = run_script(a.arm, parse_target(a.target), a.out, a.seed, a.overwrite, a.threads, a.step_log, a.timeout,
                      a.commit_dir)
    leave(code, script=True)  # the script's threads and atexit handlers, not the interpreter's teardown
    return code


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:

    p = sub.add_parser("script", help="run a Horovod PyTorch script unchanged on native torch.distributed "
                                      "(or on real Horovod)", description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)  # the runner's own flags and target, read as `python -m dpcompare.native` reads them
    p.add_argument("--np", type=positive_int, help="start this many ranks (default: this process is one rank)")
    p.add_argument("--run-timeout", type=nonneg_float, default=0, metavar="SECONDS",
                   help=f"with --np: stop the job (all its processes) after this long, exit code {TIMED_OUT} "
                        "(default: 0, no limit)")
    p.add_argument("--warmup-steps", type=nonneg_int, default=DEFAULT_WARMUP,
                   help=f"with --np and --out: steps left out of OUT/summary.json's step times (default: "
                        f"{DEFAULT_WARMUP})")
    p.add_argument("--metric", metavar="NAME", help="with --np and --out: the value the script all-reduces with "
                                                    "hvd.allreduce(..., name=NAME), as the run's metric")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--hosts", metavar="H1:N,H2:N", help="with --np: hosts and their slots")
    where.add_argument("--hostfile", metavar="FILE", help="with --np: an MPI hostfile")
    p.add_argument("--mpi-net", metavar="SUBNET|IF", help="with --np: the network for MPI's own traffic")
    p.add_argument("--iface", help="with --np: the interface gloo/NCCL use on every rank")
    p.set_defaults(func=_cmd_script)
    _register_migrate(sub)


# -- dpcompare migrate -------------------------------------------------------------------------------------
def print_report(rep: dict[str, Any], port: dict[str, Any]) -> None:
    # lazy: rich loads only when this prints
    from rich.console import Console

    # lazy: rich loads only when this prints
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title=f"Horovod in {rep['script']}", title_justify="left")
    for col in ("line", "call", "layer", "native PyTorch"):
        table.add_column(col, overflow="fold")
    for c in rep["calls"]:
        native = c["native"] + (f" [dim]({c['note']})[/dim]" if c["note"] else "")
        table.add_row(str(c["line"]), c["source"], "runs" if c["supported"] else "[red]refused[/red]", native)
    console.print(table)
    n = rep["unsupported"]
    console.print(f"{len(rep['calls'])} uses; the native layer runs "
                  + ("all of them" if not n else f"all but {n} (they stop the script with one line, exit code 2)"))
    if rep["warnings"]:
        console.print("\nWhere a DDP port computes different numbers:")
        for w in rep["warnings"]:
            console.print(f"  - {w}")
    if port.get("notes"):
        console.print("\nWhat the port changed that computes or behaves otherwise:")
        for note in port["notes"]:
            console.print(f"  - {note}")
    console.print("\n" + port["message"])


def _cmd_migrate(a: argparse.Namespace) -> int:
    from dpcompare.native.port import write_port  # lazy: libcst is slow to import, and only migrate needs it

    scan = scan_script(Path(a.script))
    if not scan.uses:
        raise ConfigError(f"{a.script}: no `import horovod` and no Horovod call found")
    rep = report(scan)
    port = write_port(scan, Path(a.port) if a.port else None, dry_run=a.no_port or a.diff)
    if a.diff:  # the change alone, as code-rewriting tools print it (nothing written)
        if port["diff"] is None:
            raise ConfigError(port["message"])
        sys.stdout.write(port["diff"])
        return 0
    if a.json:
        print(json.dumps({**rep, "port": port}, indent=2))
    else:
        print_report(rep, port)
    return 0


def _register_migrate(sub: Any) -> None:
    p = sub.add_parser(
        "migrate", help="list a Horovod script's calls with their native PyTorch equivalents; write a DDP port",
        description="Read a Horovod PyTorch script (without running it) and list every `import horovod...` and "
                    "Horovod call with its line, whether dpcompare's native layer runs it (`dpcompare script`), "
                    "and its native PyTorch equivalent (DDP, torch.distributed, torchrun); say where an idiomatic "
                    "DDP port computes different numbers; and, when every call has a translation, write that "
                    "port beside it (SCRIPT_ddp.py, never over an existing file) for you to review: the script "
                    "with only what must change changed, its comments and layout kept. A branch taken only "
                    "under a flag that uses what DDP lacks (--use-adasum, horovod.run under --num-proc) keeps "
                    "the default path and stops the port at start with one line.",
        epilog="examples:\n  dpcompare migrate train.py\n  dpcompare migrate train.py --port ports/train_ddp.py\n"
               "  dpcompare migrate train.py --no-port --json\n  dpcompare migrate train.py --diff | less",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("script", help="the Horovod script")
    p.add_argument("--port", metavar="FILE", help="where to write the DDP port (default: SCRIPT_ddp.py beside it)")
    p.add_argument("--no-port", action="store_true", help="list only; write no port")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.add_argument("--diff", action="store_true",
                   help="print the port as a unified diff against SCRIPT (and write nothing)")
    p.set_defaults(func=_cmd_migrate)
