"""The ``dpcompare`` command line: builds the parser from the command modules and dispatches."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence

from dpcompare.config import HOW_LONG, KNOBS, OUTPUT, TRAINING, WHERE
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
    for name, sp in sub.choices.items():
        arrange(sp, FIRST.get(name, ()), MOVES.get(name, {}))
    p.set_defaults(commands=sub.choices)
    return p


#: the options a first user needs, shown first in each command's --help (and docs/cli.md)
START = "start here"
FIRST = {
    "train": ("--config", "--strategy", "--model", "--dataset", "--epochs", "--max-steps", "--batch-size", "--lr",
              "--out", "--overwrite", "--resume", "--trace"),
    "compare": ("--config", "--strategies", "--np", "--model", "--dataset", "--epochs", "--batch-size", "--repeats",
                "--target-ci", "--lab", "--out", "--overwrite"),
    "parity": ("--config", "--strategies", "--np", "--steps", "--model", "--dataset", "--batch-size", "--tolerance",
               "--script", "--out", "--overwrite"),
    "predict": ("--config", "--link", "--hosts", "--strategies", "--latency", "--threshold", "--out"),
}
WHAT_IF = "communication knobs, what if (each replaces the traced run's own)"
#: the groups of --help in their order: what to compare, how long, where it runs, the training job, the knobs, output
GROUPS = (START, "positional arguments", "what to compare", "verdicts", HOW_LONG, WHERE, "a Horovod script", TRAINING, KNOBS,
          WHAT_IF, "the network model", OUTPUT)
#: a command's own options, to the group of their concern (the train settings' groups come from TrainConfig)
MOVES = {
    "compare": {"--variants": "what to compare", "--sweep": "what to compare", "--seeds": "what to compare",
                "--fault": "what to compare", "--replay": "what to compare", "--max-repeats": HOW_LONG,
                "--time-budget": HOW_LONG, "--equivalence": "verdicts", "--accuracy-equivalence": "verdicts",
                "--run-timeout": HOW_LONG,
                "--workers": WHERE, "--project-link": OUTPUT, "--continue": OUTPUT},
    "parity": {"--single-tolerance": "what to compare", "--no-single": "what to compare", "--lab": WHERE,
               "--run-timeout": HOW_LONG},
    "predict": {"--ranks-per-host": "the network model", "--intra-link": "the network model",
                "--intra-latency": "the network model", "--calibration": "the network model",
                "--floor-from-trace": "the network model", "--straggler-from-trace": "the network model",
                "--untraced-compute": "the network model",
                "--cycle-ms": WHAT_IF, "--fp16": WHAT_IF, "--quiet": OUTPUT, "--bucket-mb": WHAT_IF, "--fusion-mb": WHAT_IF},
}


def arrange(p: argparse.ArgumentParser, first: Sequence[str], moves: dict[str, str]) -> None:
    """``p``'s --help by concern: ``first`` in a group of its own at the top, ``moves`` to their groups, groups
    of one title merged and in the order of :data:`GROUPS` (any other group after them, as it was)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for g in list(p._action_groups):
        title = str(g.title).split(" (")[0] if str(g.title).startswith("a Horovod script") else str(g.title)
        if title in groups:  # the same concern twice: one group
            groups[title]._group_actions += g._group_actions
            p._action_groups.remove(g)
        else:
            groups[title] = g
    wanted = {**moves, **dict.fromkeys(first, START)}
    for flag, title in wanted.items():
        act = p._option_string_actions.get(flag)
        if act is None:
            continue
        target = groups.get(title) or groups.setdefault(title, p.add_argument_group(title))
        for g in groups.values():
            if act in g._group_actions:
                g._group_actions.remove(act)
        target._group_actions.append(act)
    groups[START]._group_actions.sort(key=lambda a: list(first).index(a.option_strings[0])) if START in groups else None
    if first:  # the full list is below, by concern: the usage line names only what must be given
        pos = [a.metavar or a.dest for a in p._actions if not a.option_strings and a.help != argparse.SUPPRESS]
        p.usage = " ".join(["%(prog)s [options]", *(f"{m} [{m} ...]" for m in pos)])
    rank = {t: i for i, t in enumerate(GROUPS)}
    p._action_groups.sort(key=lambda g: rank.get(g.title, rank.get(str(g.title).split(" (")[0], len(GROUPS))))


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


# -- docs/cli.md, generated from the parsers (scripts/cli_doc.py writes it; tests/test_cli_doc.py checks it) ----

CLI_DOC_HEAD = """\
# Command-line reference

<!-- generated by `python scripts/cli_doc.py` from dpcompare's own parsers: do not edit by hand -->

Every command, every flag and its default, as `--help` prints them, grouped the same way. A run's options can
also come from a TOML file: `--config FILE.toml` on `train`, `compare`, `parity` and `predict` (keys are the flags
without their dashes, e.g. `batch-size = 64`; flags given on the command line win, and a repeatable flag such
as `--sweep` adds to the file's), and every run writes the
`config.toml` that reruns it beside its results (`predict`: `prediction.toml`), e.g.
`dpcompare compare --config runs/ab/config.toml --out runs/ab-again`.

## One name, one meaning

A flag name means one thing in every command. `--out` is a folder (`slurm`, `lab bench` and `timeline` write one
file: `--out-file`); `--overwrite` replaces what a folder or file held; `--continue DIR` continues an interrupted
comparison and `train --resume` a checkpoint; `--hosts` lists hosts with their slots (`launch`, `script`), while
counts are `lab up --host-count` and `predict --host-counts`; `--timeout` bounds one collective (`train`) and
`--run-timeout` a whole run or job (`compare`, `parity`: 1800 s by default in both; `lab bench`); `--trackers`
names the experiment trackers and `slurm --sbatch-output` the job's log; `--warmup-steps` is what is left out of
timing; `--bucket-mb`, `--horovod-cycle-ms` and `--grad-compression` are the same knobs in `train` and `predict`.

Two names stay apart on purpose. A link rate is written the same everywhere (`1gbit`, `200mbit`, `25gbit`) but
names three links: the lab's own (`--lab hosts=2,link=1gbit`, `lab up --link`), the cluster `predict` models
(`predict --link`), and the cluster `compare` projects its traced runs onto (`compare --project-link`). `--seed` is
42 for `train`, `compare` and `parity`, which seed every process alike; `script` leaves a Horovod script's own
seeding alone unless given one.
"""


def _commands(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``p``'s sub-commands, depth first (each once: aliases are one parser)."""
    found: list[argparse.ArgumentParser] = []
    for act in p._actions:
        if isinstance(act, argparse._SubParsersAction):
            for sp in dict.fromkeys(act.choices.values()):
                found += [sp, *_commands(sp)]
    return found


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _option_row(p: argparse.ArgumentParser, act: argparse.Action) -> str | None:
    if act.help == argparse.SUPPRESS or isinstance(act, argparse._HelpAction | argparse._SubParsersAction):
        return None
    fmt = p._get_formatter()
    metavar = fmt._format_args(act, act.dest.upper()) if act.nargs != 0 else ""
    name = ", ".join(act.option_strings) + (" " if act.option_strings and metavar else "") + metavar
    default = act.default
    shown = "" if default in (None, False, argparse.SUPPRESS) or act.nargs == 0 or default == [] else \
        ",".join(map(str, default)) if isinstance(default, list | tuple) else default
    text = re.sub(r"\s*\(default:? [^()]*\)$", "", fmt._expand_help(act).strip()) if shown != "" else \
        fmt._expand_help(act)
    return f"| `{_cell(name)}` | {f'`{_cell(shown)}`' if shown != '' else ''} | {_cell(text)} |"


def _command_doc(p: argparse.ArgumentParser) -> list[str]:
    lines = [f"## {p.prog}", "", _cell(p.description or ""), "", f"```text\n{p.format_usage().strip()}\n```", ""]
    if not p._actions[1:]:
        lines[-2:] = []
    for group in p._action_groups:
        rows = [r for r in (_option_row(p, a) for a in group._group_actions) if r]
        if rows:
            lines += [f"**{group.title}**", "", "| option | default | what it does |", "|---|---|---|", *rows, ""]
    if p.epilog:
        lines += [f"```text\n{p.epilog.strip()}\n```", ""]
    return lines


def _renamed(p: argparse.ArgumentParser) -> list[str]:
    """The table of old spellings that still work for one release."""
    from dpcompare.options import Deprecated

    rows = [f"| {sp.prog} | `{a.option_strings[0]}` | `{a.spelt}` |" for sp in _commands(p) for a in sp._actions
            if isinstance(a, Deprecated)]
    if not rows:
        return []
    return ["## Renamed flags", "", "These old spellings still work in this release, each with a one-line warning "
            "naming the new one; they go in the next.", "", "| command | old | new |", "|---|---|---|", *rows, ""]


def markdown() -> str:
    """docs/cli.md: every command's flags with their defaults and help, from the parsers themselves."""
    import os

    width = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal: the page, to one width
    try:
        p = build_parser()
        lines = [CLI_DOC_HEAD, *_renamed(p)]
        for sp in _commands(p):
            lines += _command_doc(sp)
    finally:
        if width is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = width
    return "\n".join(lines).rstrip() + "\n"


def entry() -> None:
    """The ``dpcompare`` console script and ``python -m dpcompare``."""
    leave(main())


if __name__ == "__main__":
    entry()
