"""The ``dpcompare`` command line: builds the parser from the command modules and dispatches."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from dpcompare.launch.jobs import leave, run_command
from dpcompare.versions import __version__

__all__ = ["build_parser", "entry", "leave", "main"]

DESCRIPTION = """\
Run one training job under PyTorch DDP and under Horovod, and compare them honestly.

Launch any command the way clusters do:  mpirun -np 2 dpcompare train --strategy ddp ...
(srun, torchrun, horovodrun and plain one-process `python` work too).
"""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block), exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dpcompare", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"dpcompare {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, _Parser)
    return p


# Each module defines ``register(subparsers, parser_class)`` adding its sub-command(s).
COMMAND_MODULES = (
    "dpcompare.training.command",  # dpcompare train
    "dpcompare.doctor",            # dpcompare doctor
    "dpcompare.compare.parity",    # dpcompare parity
    "dpcompare.compare.command",   # dpcompare compare
    "dpcompare.report.command",    # dpcompare report
    "dpcompare.report.timeline",   # dpcompare timeline
    "dpcompare.launch.commands",   # dpcompare launch, dpcompare slurm
    "dpcompare.launch.submission",  # dpcompare submit (submitit)
    "dpcompare.lab.command",       # dpcompare lab up|down|status|bench|set-link
    "dpcompare.prediction.command",  # dpcompare predict
    "dpcompare.api",               # dpcompare workloads
    "dpcompare.native.command",    # dpcompare script, dpcompare migrate
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_command(args.command, args.func, args)


def entry() -> None:
    """The ``dpcompare`` console script and ``python -m dpcompare``."""
    leave(main())


if __name__ == "__main__":
    entry()
