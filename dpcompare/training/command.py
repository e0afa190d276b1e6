"""``dpcompare train``: one training job under one strategy, in every process the launcher starts."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from dpcompare.config import HOW_LONG, KNOBS, OUTPUT, TRAINING, WHERE
from dpcompare.data.plugins import resolve_workload
from dpcompare.launch.env import detect_launch_env
from dpcompare.launch.jobs import run_command
from dpcompare.options import START, add_config_file_option, add_config_options, config_from_args

EPILOG = """examples:
  dpcompare train --strategy single --epochs 5
  mpirun -np 2 dpcompare train --strategy ddp --out runs/ddp
  mpirun -np 2 dpcompare train --strategy horovod --out runs/hvd
  mpirun -np 2 dpcompare train --strategy ddp --resume auto --out runs/ddp
  mpirun -np 2 dpcompare train --strategy ddp --model gpt-tiny --dataset pydoc --seq-len 128
your own job (a plug-in; `dpcompare workloads` explains them):
  mpirun -np 2 dpcompare train --strategy horovod --workload my_pkg.bench:workload
  mpirun -np 2 dpcompare train --strategy ddp --workload path/to/bench.py:workload
  mpirun -np 2 dpcompare train --strategy ddp --model my_pkg.models:build --dataset digits"""


def _cmd_train(a: argparse.Namespace) -> int:
    job = resolve_workload(config_from_args(a))  # a plug-in that does not import or fit: one line, before any group
    # imported after: a plug-in that does not import is refused without the cost of importing torch
    from dpcompare.training.loop import train

    train(job.cfg, detect_launch_env(), workload=job.workload)  # train() names the default --out
    return 0


#: train's --help by concern: what a first user needs first
SECTIONS = {START: ("--config", "--strategy", "--model", "--dataset", "--epochs", "--max-steps", "--batch-size", "--lr",
                    "--out", "--overwrite", "--resume", "--trace"),
            HOW_LONG: (), WHERE: (), TRAINING: (), KNOBS: (), OUTPUT: ()}


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    t = sub.add_parser("train", help="train one model under one strategy (run it under mpirun/srun/torchrun)",
                       description="Train one model under one strategy. Every process runs this same command; "
                                   "the launcher (mpirun, srun, torchrun) decides how many there are.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, sections=SECTIONS)
    add_config_file_option(t)
    add_config_options(t)
    t.set_defaults(func=_cmd_train)


def main(argv: Sequence[str]) -> int:
    """``dpcompare train ARGV`` in this process (how a persistent compare worker runs a run); its exit code."""
    p = argparse.ArgumentParser(prog="dpcompare train")
    add_config_options(p)
    return run_command("train", _cmd_train, p.parse_args(list(argv)))
