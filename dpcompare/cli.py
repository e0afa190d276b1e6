"""The ``dpcompare`` command line: builds the parser from the command modules and dispatches."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from dpcompare import __version__
from dpcompare.errors import DpcompareError
from dpcompare.launch.env import reporting_rank

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
    "dpcompare.lab.command",       # dpcompare lab up|down|status|bench|set-link
    "dpcompare.prediction.command",  # dpcompare predict
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DpcompareError as e:
        # Every rank of a job meets the same refusal: one line, from the reporting rank (or from every
        # rank when the error is local to one, e.g. an inconsistent launch environment).
        if e.local or reporting_rank():
            sys.stderr.write(f"dpcompare {args.command}: error: {e}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"dpcompare {args.command}: interrupted; files already written are kept\n")
        return 130
    except Exception as e:  # a collective failed because another process died: one line, no traceback
        from dpcompare.launch.failures import LOST_PEER_EXIT, lost_peer_message

        msg = lost_peer_message(e)
        if msg is None:
            raise
        sys.stderr.write(f"dpcompare {args.command}: error: {msg}\n")
        return LOST_PEER_EXIT


def leave(code: int) -> None:
    """End the process with ``code``; after a successful command that loaded torch, skip Python's teardown.

    Every file a command writes is closed by the time it returns, and its strategy has left the process
    group. What remains is the interpreter unwinding torch, torch._dynamo and CUDA's libraries, about 1.4 s
    a process on a 2-core machine: a tenth of a short ``dpcompare compare`` run, for nothing. MPI, if
    mpi4py started it, is finalized first so that mpirun sees a clean exit. Failures take the normal path.
    """
    if code != 0 or "torch" not in sys.modules:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(code)


def entry() -> None:
    """The ``dpcompare`` console script and ``python -m dpcompare``."""
    leave(main())


if __name__ == "__main__":
    entry()
