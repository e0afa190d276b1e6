"""The ``dpcompare`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Sequence

from dpcompare import __version__
from dpcompare.config import TrainConfig
from dpcompare.errors import ConfigError, DpcompareError

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


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 3,32,32") from None
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 3,32,32")
    return dims


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return v


def _nonneg(text: str) -> int:
    return 0 if text.strip() == "0" else _positive(text)


def add_train_options(p: argparse.ArgumentParser, strategy: bool = True, out_default: str | None = None) -> None:
    from dpcompare import backends, data, models

    d = TrainConfig()
    g = p.add_argument_group("training")
    if strategy:
        g.add_argument("--strategy", choices=backends.names(), default="single",
                       help="how gradients are synchronised: " + "; ".join(
                           f"{n}: {backends.get(n).summary}" for n in backends.names()) + " (default: single)")
    g.add_argument("--model", choices=models.names(), default=d.model,
                   help="; ".join(f"{n}: {h}" for n, (_, h) in models.MODELS.items()) + f" (default: {d.model})")
    g.add_argument("--dataset", choices=data.names(), default=d.dataset,
                   help="; ".join(f"{n}: {h}" for n, (_, h) in data.DATASETS.items()) + f" (default: {d.dataset})")
    g.add_argument("--data-dir", help="folder holding mnist/cifar10 in torchvision's layout, or imagefolder's "
                                      "train/<class>/ and val/<class>/ image folders (never downloaded)")
    g.add_argument("--epochs", type=_nonneg, default=d.epochs, help=f"epochs to train (default: {d.epochs})")
    g.add_argument("--batch-size", type=_positive, default=d.batch_size,
                   help=f"batch size PER PROCESS; the global batch is this × processes (default: {d.batch_size})")
    g.add_argument("--lr", type=float, default=d.lr, help=f"learning rate (default: {d.lr})")
    g.add_argument("--scale-lr", action="store_true",
                   help="multiply --lr by the number of processes (linear scaling), the same for every strategy")
    g.add_argument("--optimizer", choices=["sgd", "adam"], default=d.optimizer, help="(default: sgd)")
    g.add_argument("--momentum", type=float, default=d.momentum, help=f"SGD momentum (default: {d.momentum})")
    g.add_argument("--weight-decay", type=float, default=d.weight_decay, help="(default: 0)")
    g.add_argument("--seed", type=int, default=d.seed, help=f"seeds weights and sampling (default: {d.seed})")
    g.add_argument("--width", type=_positive, default=d.width, help=f"hidden units of mlp (default: {d.width})")
    g.add_argument("--input-shape", type=_shape, default=d.input_shape,
                   help="C,H,W of synthetic samples; imagefolder resizes images to H,W, C 1 (grayscale) or 3 "
                        "(RGB) (default: 3,32,32)")
    g.add_argument("--samples", type=_positive, default=d.samples, help="synthetic dataset size (default: 1024)")
    g.add_argument("--augment", action="store_true", help="cifar10/imagefolder: random crop (pad 4) + horizontal "
                   "flip, the same for every strategy (seeded by --seed, epoch and sample)")
    g.add_argument("--sync-bn", action="store_true",
                   help="synchronise BatchNorm statistics across processes (torch.nn.SyncBatchNorm / hvd.SyncBatchNorm)")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: one GPU per process when CUDA is available, else CPU (default: auto)")
    g.add_argument("--threads", type=_nonneg, default=0,
                   help="torch CPU threads per process; 0: cores ÷ processes on the host (default: 0)")
    g.add_argument("--max-steps", type=_nonneg, default=0,
                   help="stop after this many optimizer steps (0: run every epoch; with --epochs 0: only this)")
    g.add_argument("--record-step-loss", action="store_true", help=argparse.SUPPRESS)
    g.add_argument("--warmup-steps", type=_nonneg, default=d.warmup_steps,
                   help=f"first steps left out of timing (default: {d.warmup_steps})")
    c = p.add_argument_group("output and checkpoints")
    c.add_argument("--out", default=out_default, help="output folder" + (f" (default: {out_default})" if out_default
                                                                          else " (default: runs/<strategy>-np<N>)"))
    c.add_argument("--checkpoint-every", type=_nonneg, default=0, metavar="N",
                   help="write OUT/checkpoints/epoch-<N>.pt every N epochs and at the end (default: 0, never)")
    c.add_argument("--save-final", action="store_true",
                   help="write a checkpoint after the last step even without --checkpoint-every")
    c.add_argument("--resume", metavar="PATH|auto",
                   help="continue from a checkpoint of any strategy and world size; auto: newest in OUT")
    c.add_argument("--init-from", metavar="PATH",
                   help="start from a state_dict (plain, or DDP's module.-prefixed keys) instead of random weights")
    c.add_argument("--overwrite", action="store_true", help="replace an earlier run's files in OUT")
    c.add_argument("--no-tensorboard", dest="tensorboard", action="store_false",
                   help="do not write TensorBoard events to OUT/tensorboard")
    c.add_argument("--progress", choices=["auto", "bar", "lines", "none"], default="auto",
                   help="auto: a progress bar on a terminal, one line per epoch otherwise")
    n = p.add_argument_group("network")
    n.add_argument("--iface", help="network interface for gloo/NCCL (sets GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME); "
                                   "default: the one that reaches rank 0")
    n.add_argument("--timeout", type=float, default=d.timeout,
                   help=f"seconds a collective may wait for a lost process before failing (default: {d.timeout:g})")


def config_from_args(a: argparse.Namespace, **override: object) -> TrainConfig:
    from dataclasses import fields

    kw = {f.name: getattr(a, f.name) for f in fields(TrainConfig) if hasattr(a, f.name)}
    kw.update(override)
    return TrainConfig(**kw)


def train_argv(cfg: TrainConfig, skip: Sequence[str] = ()) -> list[str]:
    """``dpcompare train`` flags that rebuild ``cfg`` exactly (flags at the parser's default are left out).

    The inverse of :func:`config_from_args`, driven by the train parser itself, so a flag added to ``cli.add_train_options`` is carried along.
    """
    parser = argparse.ArgumentParser(add_help=False)
    add_train_options(parser)
    names = {f.name for f in dataclasses.fields(cfg)}
    argv: list[str] = []
    covered = set()
    for action in parser._actions:
        if action.dest not in names or not action.option_strings:
            continue
        covered.add(action.dest)
        value = getattr(cfg, action.dest)
        if action.dest in skip or value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            if bool(value) != (not action.default):
                raise ValueError(f"{action.dest}={value!r} cannot be written as {flag}")
            argv.append(flag)
        elif value is None:
            raise ValueError(f"{action.dest}=None cannot be written as {flag}")
        else:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, tuple | list) else str(value)]
    default = TrainConfig()
    stray = [n for n in names - covered if n not in skip and getattr(cfg, n) != getattr(default, n)]
    if stray:
        raise ValueError(f"no `dpcompare train` flag for {', '.join(sorted(stray))}")
    return argv


def _cmd_train(a: argparse.Namespace) -> int:
    from dpcompare.launch.env import detect_launch_env
    from dpcompare.trainer import train

    env = detect_launch_env()
    if a.out is None:
        a.out = f"runs/{a.strategy}-np{env.world_size}"
    train(config_from_args(a), env)
    return 0


def _cmd_doctor(a: argparse.Namespace) -> int:
    from dpcompare import doctor

    if a.short:
        print(doctor.short())
        return 0
    info = doctor.report()
    if a.json:
        print(json.dumps(info, indent=2))
    else:
        doctor.render(info)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dpcompare", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"dpcompare {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    t = sub.add_parser("train", help="train one model under one strategy (run it under mpirun/srun/torchrun)",
                       description="Train one model under one strategy. Every process runs this same command; "
                                   "the launcher (mpirun, srun, torchrun) decides how many there are.",
                       epilog="examples:\n  dpcompare train --strategy single --epochs 5\n"
                              "  mpirun -np 2 dpcompare train --strategy ddp --out runs/ddp\n"
                              "  mpirun -np 2 dpcompare train --strategy horovod --out runs/hvd\n"
                              "  mpirun -np 2 dpcompare train --strategy ddp --resume auto --out runs/ddp",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_options(t)
    t.set_defaults(func=_cmd_train)

    d = sub.add_parser("doctor", help="show what this machine can run: torch, MPI, mpi4py, Horovod's build, GPUs")
    d.add_argument("--json", action="store_true", help="print machine-readable JSON")
    d.add_argument("--short", action="store_true", help="one line of versions")
    d.set_defaults(func=_cmd_doctor)

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, _Parser)
    return p


# Each module defines ``register(subparsers, parser_class)`` adding its sub-command(s).
COMMAND_MODULES = (
    "dpcompare.parity",          # dpcompare parity
    "dpcompare.compare",         # dpcompare compare
    "dpcompare.report.command",  # dpcompare report
    "dpcompare.launch.commands", # dpcompare launch, dpcompare slurm
)


def _is_reporting_rank() -> bool:
    """Errors every rank hits alike are printed once, by rank 0."""
    for var in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return os.environ[var] == "0"
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        if _is_reporting_rank():
            sys.stderr.write(f"dpcompare {args.command}: error: {e}\n")
        return e.exit_code
    except DpcompareError as e:
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


if __name__ == "__main__":
    sys.exit(main())
