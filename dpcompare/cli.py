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
    p.set_defaults(commands=sub.choices)
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
    "dpcompare.lab.command",       # dpcompare lab up|down|status|bench|set-link
    "dpcompare.prediction.command",  # dpcompare predict
    "dpcompare.api",               # dpcompare workloads
    "dpcompare.native.command",    # dpcompare script, dpcompare migrate
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if getattr(args, "config", None) is None:
        return run_command(args.command, args.func, _given(args, argv))
    return run_command(args.command, lambda a: (b := configured(parser, argv, a)).func(b), args)


def _given(a: argparse.Namespace, argv: list[str], raw: dict | None = None) -> argparse.Namespace:
    """``a`` with what the command was given, for its own config.toml (``options.given_settings``)."""
    a.argv, a.config_raw = argv[argv.index(a.command) + 1:], raw or {}
    return a


def configured(parser: argparse.ArgumentParser, argv: list[str], a: argparse.Namespace) -> argparse.Namespace:
    """``--config FILE``: the arguments again, with the file's settings as the command's defaults (flags given win)."""
    from dpcompare.options import read_config

    sub = a.commands[a.command]
    defaults, raw = read_config(sub, a.config)
    sub.set_defaults(**defaults)
    return _given(parser.parse_args(argv), argv, raw)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments ``dpcompare ARGV`` runs its command with (``--config`` applied)."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    return configured(parser, list(argv), args) if getattr(args, "config", None) else _given(args, list(argv))


def entry() -> None:
    """The ``dpcompare`` console script and ``python -m dpcompare``."""
    leave(main())


if __name__ == "__main__":
    entry()
