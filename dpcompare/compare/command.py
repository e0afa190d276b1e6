"""``dpcompare compare``: the same training job under several arms and process counts, repeated.

Every (arm, np, repeat) is its own job (``mpirun -np N python -m dpcompare train ...``, or srun inside a
Slurm allocation) with the same configuration and seed, written to ``OUT/runs/<arm>-np<N>-r<k>/``, in blocks
(:mod:`.plan`); ``--repeats auto`` adds blocks until the verdicts' intervals are narrow enough
(:mod:`.stopping`). ``OUT/results.json`` collects the runs (:mod:`.records`; schema: docs/results-schema.md)
and is rewritten after each run (:mod:`.runner`); the report is rendered from it at the end. This module is
the command-line surface: the sub-command, and reading an interrupted comparison's flags back for --continue.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dpcompare.backends import registry
from dpcompare.compare.axes import AXES, axes_of
from dpcompare.compare.cmdline import SCRIPT, add_arguments, stored_args
from dpcompare.compare.plan import Arm, Comparison, RunOptions, RunSpec, child_config, seed_list
from dpcompare.compare.preview import print_plan
from dpcompare.compare.records import short
from dpcompare.compare.runner import run_compare
from dpcompare.compare.script import check_elastic_arms, script_plan
from dpcompare.compare.stopping import StoppingRule
from dpcompare.config import HOW_LONG, KNOBS, OUTPUT, TRAINING, WHERE
from dpcompare.errors import ConfigError
from dpcompare.files import RESULTS
from dpcompare.options import START, add_config_file_option, config_from_args

#: options that are this invocation's own choice, never taken from or checked against a stored comparison
OWN_OPTIONS = ("out", "overwrite", "progress", "resume_dir", "func", "workers", "plan", "print_config")


def resumed_args(a: argparse.Namespace) -> argparse.Namespace:
    """The stored comparison's arguments (its plan and train flags, re-parsed), checked against ``a``.

    Options left at their default take the stored value; an option given here that differs from the
    stored one is refused with one line.
    """
    out = Path(a.resume_dir)
    try:
        stored = json.loads((out / RESULTS).read_text())["config"]
        argv = [*stored["cli"], *stored["train_flags"]]
    except FileNotFoundError:
        raise ConfigError(f"--continue {out}: no {RESULTS} there; start the comparison with --out {out}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--continue {out}: {out / RESULTS} holds no comparison plan ({e})") from None
    try:
        merged, defaults = stored_args(argv)
    except ConfigError as e:
        raise ConfigError(f"--continue {out}: {e}") from None
    for name, given in vars(a).items():
        if name in OWN_OPTIONS or not hasattr(defaults, name):
            continue  # not a comparison setting (e.g. the top-level parser's `command`)
        value = getattr(merged, name, None)
        if given != getattr(defaults, name, None) and given != value:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"--continue {out}: {flag} {short(given)} differs from the stored comparison's "
                              f"{short(value)}; leave it out to continue, or start a new comparison with another --out")
    for name, value in vars(a).items():  # what the comparison's own parser does not set
        if not hasattr(merged, name):
            setattr(merged, name, value)
    merged.out, merged.progress, merged.resume_dir, merged.overwrite = str(out), a.progress, a.resume_dir, False
    merged.workers = a.workers or merged.workers  # how runs start is this invocation's choice
    return merged


def comparison_of(a: argparse.Namespace) -> Comparison:
    """The comparison that compare's parsed arguments ask for."""
    base = list(a.variants or ()) or [Arm.named(s) for s in a.strategies]
    script = _script_of(a, base)
    cfg = config_from_args(a, strategy="horovod" if script else base[0].strategy, out=a.out)
    repeats = a.repeats if a.repeats != 0 else (1 if a.seeds else 3)  # 0: not given
    stopping = StoppingRule(repeats=repeats, target_ci=a.target_ci / 100.0, max_repeats=a.max_repeats,
                        time_budget=a.time_budget, equivalence=a.equivalence / 100.0,
                        seeds=tuple(seed_list(a.seeds, cfg.seed)), accuracy_equivalence=a.accuracy_equivalence / 100.0)
    options = RunOptions(overwrite=a.overwrite, progress=a.progress, run_timeout=a.run_timeout or None,
                         resume=bool(a.resume_dir), workers=a.workers or "fresh",
                         project_link=a.project_link, bind=a.bind, disturbed=a.rerun_disturbed / 100.0)
    c = Comparison(cfg, tuple(base), tuple(a.np), stopping, Path(a.out), options, tuple(a.sweep or ()),
                   lab=getattr(a, "lab", None), axes=axes_of(a.sweep or (), a), replay=a.replay, script=script)
    c.all_arms  # noqa: B018  (labels that would share a run folder: refused before anything runs)
    refuse_unrunnable(c)
    return c


def refuse_unrunnable(c: Comparison) -> None:
    """A setting an arm's strategy cannot run with under compare's launcher (mpirun or srun: Horovod's gloo
    operations need horovodrun's gloo controller), refused once, before the first run, in the line each of its
    runs would fail with. The elastic arms are left to their launchers (torchrun, horovodrun), a script's arms
    to the script."""
    if c.script is not None:
        return
    for arm in c.all_arms:
        if arm.elastic:
            continue
        for n in c.nps:
            try:
                registry.check_config(arm.strategy, child_config(c.config, RunSpec(arm, n, 0), c.out), n)
            except ConfigError as e:
                raise ConfigError(f"arm {arm.label} at np={n}: {e}") from None


def _script_of(a: argparse.Namespace, arms: list[Arm]) -> Any:
    """The Horovod script this comparison runs (``--script``), checked against the rest of the plan; else None."""
    if a.script is not None:
        check_elastic_arms(arms)
    plan = script_plan(a, [x.strategy for x in arms], Path(a.out))
    if plan is None:
        return None
    if a.replay:
        raise ConfigError("--replay resumes dpcompare's own checkpoints; a script's runs have none: leave --replay "
                          "out with --script")
    if a.variants or any(name not in AXES for name, _ in a.sweep or ()):
        raise ConfigError("--script compares the arms horovod, native and ddp of one script: --variants and "
                          "--sweep of train settings do not apply (--sweep of an axis, link=... or threads=..., does)")
    if a.workers == "persistent":
        raise ConfigError("--script runs every run as its own job: leave --workers persistent out")
    return plan


def _cmd_compare(a: argparse.Namespace) -> int:
    if a.resume_dir:
        if a.overwrite:
            raise ConfigError("--continue continues a comparison and --overwrite replaces it; pass one of them")
        a = resumed_args(a)
    if a.plan:
        return print_plan(comparison_of(a))
    return run_compare(comparison_of(a))


#: compare's --help by concern: what a first user needs first, then what to compare, how long, where...
SECTIONS = {START: ("--config", "--strategies", "--np", "--model", "--dataset", "--epochs", "--batch-size", "--repeats",
                    "--target-ci", "--lab", "--out", "--overwrite"),
            "what to compare": ("--variants", "--sweep", "--seeds", "--fault", "--replay"),
            "verdicts": ("--equivalence", "--accuracy-equivalence"),
            HOW_LONG: ("--plan", "--max-repeats", "--time-budget", "--run-timeout"), WHERE: ("--workers",),
            SCRIPT: (), TRAINING: (), KNOBS: (), OUTPUT: ("--project-link", "--continue"), "comparison": ()}


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compare", help="A/B comparison: every arm (strategy or variant) at every process count, in paired blocks",
        description="Run the same training job under each arm (a strategy, or a labelled strategy with its own "
                    "train settings) at each process count, in blocks: a block runs every arm once, side by side, "
                    "and the verdict pairs the arms within blocks so the machine's drift cancels. Prints a table "
                    "and a verdict per process count (faster, slower, equal within ±--equivalence, or undecided "
                    "with the repeats it would need) and writes OUT/results.json, plots and a self-contained "
                    "OUT/report.html. Every `dpcompare train` option applies to every run. Exit code 0 only when "
                    "every run succeeded.",
        epilog="examples:\n"
               "  dpcompare compare --np 2 --strategies ddp,horovod --repeats auto --target-ci 5 --out runs/ab\n"
               "  dpcompare compare --np 2 --strategies ddp,ddp --repeats auto --out runs/aa   # A/A control\n"
               "  dpcompare compare --variants base=ddp small=ddp:batch_size=16 --out runs/batch\n"
               "  dpcompare compare --strategies ddp,horovod --sweep batch_size=16,64 --out runs/sweep\n"
               "  dpcompare report runs/ab      # re-render the report from results.json\n"
               "  dpcompare compare --continue runs/ab   # continue an interrupted comparison\n"
               "  dpcompare compare --sweep batch-size=16,64 --repeats 5 --plan   # the runs it would start, then "
               "exit\n"
               "  dpcompare compare --config runs/ab/config.toml --out runs/ab2   # rerun it\n"
               "  # --lab needs root; sudo resets PATH, so: sudo -E env PATH=$PATH dpcompare ...\n"
               "  sudo -E env PATH=$PATH dpcompare compare --lab hosts=2 --sweep link=unlimited,1gbit,200mbit --model "
               "mlp --out runs/links\n"
               "  sudo -E env PATH=$PATH dpcompare compare --lab hosts=3 --np 3 --fault host=2,at-step=40 "
               "--strategies ddp-elastic,horovod-elastic --out runs/fault",
        formatter_class=argparse.RawDescriptionHelpFormatter, sections=SECTIONS)
    add_config_file_option(p)
    add_arguments(p)
    p.add_argument("--plan", action="store_true",
                   help="print the runs this comparison would start (arms × process counts × blocks, up to "
                        "--max-repeats with --repeats auto) and what its time is known to be, then exit without "
                        "running anything")
    p.set_defaults(func=_cmd_compare)
