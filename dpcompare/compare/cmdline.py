"""The comparison's command line, with one owner: the options ``dpcompare compare`` reads and the flags it writes.

results.json keeps the plan's flags (``config.cli``) and the shared train settings' (``config.train_flags``);
``--continue`` reads them back with the parser these same definitions build (:func:`stored_args`), so what
compare writes it can always read.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from dpcompare.argtypes import format_rate_bits, nonneg_float, parse_rate_bits, positive_float, positive_int
from dpcompare.compare.axes import AXES, TWIN
from dpcompare.compare.plan import (
    Arm,
    Comparison,
    RunOptions,
    parse_arm_strategies,
    parse_np,
    parse_repeats,
    parse_seeds,
    parse_sweep,
    parse_variant,
    value_text,
)
from dpcompare.compare.script import add_script_arguments
from dpcompare.compare.stopping import StoppingRule
from dpcompare.config import TrainConfig
from dpcompare.errors import ConfigError
from dpcompare.lab.spec import lab_spec_arg
from dpcompare.launch.mpirun import BINDINGS
from dpcompare.options import (
    CONFIG_FILE,
    Parser,
    Renamed,
    add_config_options,
    config_settings,
    deprecate,
    train_argv,
    write_config,
)
from dpcompare.versions import docs_page

#: seconds a run may take before it is stopped (``--run-timeout``, as parity's): a run that hangs ends
DEFAULT_RUN_TIMEOUT = 1800.0
#: compare's default --min-steps: about 1 s of timed steps for the demo's few-ms steps
DEFAULT_MIN_STEPS = 200
#: train settings compare sets for every run itself: not options of compare
NOT_OPTIONS = ("strategy", "resume")
#: ... and the options a stored comparison does not keep (each invocation's own choice)
NOT_STORED = (*NOT_OPTIONS, "out", "overwrite", "progress")
#: compare's defaults for train settings, where they differ from ``dpcompare train``'s
TRAIN_DEFAULTS: dict[str, Any] = {"out": "runs/compare", "min_timed_steps": DEFAULT_MIN_STEPS, "log": "none"}
TRAIN_HELPS = {"out": "output folder (default: runs/compare)"}
#: the section of compare's --help for a Horovod script
SCRIPT = "a Horovod script (dpcompare compare --script train.py -- ARGS)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every option of ``dpcompare compare``: the comparison's own, then every train setting's."""
    g = p.add_argument_group("comparison")
    g.add_argument("--np", type=parse_np, default=[2], metavar="N[,N2,...]",
                   help="process counts to run every arm at (default: 2); include 1 for scaling efficiency")
    g.add_argument("--strategies", type=parse_arm_strategies, default=["ddp", "horovod"], metavar="A,B[,...]",
                   help="strategies to compare, one arm each; the first is the baseline of the verdicts; the same "
                        "one twice (ddp,ddp) is an A/A control whose verdict should be equal (default: ddp,horovod)")
    g.add_argument("--variants", type=parse_variant, nargs="+", metavar="NAME=STRATEGY[:KNOB=V,...]",
                   help="arms with their own train settings instead of --strategies, e.g. base=ddp "
                        "fp16=horovod:grad-compression=fp16 (knobs: train's flags without their dashes, e.g. "
                        "batch-size, min-steps, trackers; TrainConfig's field names work too)")
    swept = "; ".join(f"{a.name}={a.metavar}: {a.help}" for a in AXES.values() if a.pairs != TWIN)
    g.add_argument("--sweep", type=parse_sweep, action="append", metavar="KNOB=V1,V2[,...]",
                   help="cross every arm with every value of a train setting (labels like ddp/batch_size=64); "
                        f"repeat the flag to cross several (KNOB: a train flag without its dashes, e.g. min-steps, or "
                        f"TrainConfig's field name). Or of an axis: {swept}".replace("%", "%%"))
    _add_stopping_rule(g)
    g.add_argument("--workers", choices=("fresh", "persistent"), metavar="fresh|persistent",
                   help="how runs start. fresh: every run is its own mpirun/srun job, as a user would start it. "
                        "persistent: one long-lived job per process count runs them one after another, each run "
                        "still building its data, model and optimizer and joining and leaving its strategy's "
                        "process group; a demo run then takes ~3 s instead of ~8 s (Python, torch and MPI start "
                        "once), so the same time buys about three times the blocks, and the verdict's interval "
                        "counts each two neighbouring blocks as one unit (they run seconds apart). A failed run "
                        "ends its job and the next run starts a new one (default: fresh)")
    _add_placement(g)
    g.add_argument("--lab", type=lab_spec_arg, metavar="hosts=N,link=RATE[,slots=K]",
                   help="run every job across an emulated cluster made for this comparison and removed after it: N "
                        "network namespaces on a link shaped to RATE (1gbit, 200mbit, unlimited), K ranks per host "
                        "(default 1); with --sweep link=R1,R2 every arm runs on every link and each link gets its "
                        f"own verdicts. Needs root, iproute2 and the tbf qdisc (see {docs_page('lab')})")
    for a in AXES.values():
        if a.pairs == TWIN:
            g.add_argument(f"--{a.name}", type=a.parse, metavar=a.metavar, help=a.help.replace("%", "%%"))
    g.add_argument("--replay", action="store_true",
                   help="with --fault: after every elastic run that recovered, start a clean run (no fault, not "
                        "elastic) from the checkpoint it rolled back to, at the world size it carried on with, and "
                        "compare the final weights tensor by tensor (recorded as `replay`; the elastic runs also "
                        "write a checkpoint at every commit and after the last step)")
    g.add_argument("--run-timeout", type=nonneg_float, default=DEFAULT_RUN_TIMEOUT, metavar="SECONDS",
                   help="stop a run that takes longer (all its processes) and record it as failed; each run's "
                        f"output is in OUT/runs/<run>/ (default: {DEFAULT_RUN_TIMEOUT:g}; 0: no limit)")
    g.add_argument("--project-link", type=project_link_arg, default="25gbit", metavar="RATE|none",
                   help="with --trace N: project the traced runs to 2-1024 hosts on this inter-host link with "
                        "`dpcompare predict` (OUT/projected, the report's \"Projected to a cluster\" section); "
                        "none: do not (default: 25gbit)")
    g.add_argument("--continue", dest="resume_dir", metavar="DIR",
                   help="continue the interrupted comparison in DIR: runs recorded ok are kept, missing and "
                        "failed ones run; its plan and options are reused (any given must match them)")

    add_script_arguments(p.add_argument_group(SCRIPT), compare=True)
    add_config_options(p, exclude=NOT_OPTIONS, defaults=TRAIN_DEFAULTS, helps=TRAIN_HELPS)
    deprecate(p, "--resume", "--continue")
    # compare's TensorBoard switch until 0.3 (off by default, as --trackers is now): comparisons stored with it
    p.add_argument("--tensorboard", dest="log", action=Renamed, nargs=0, const="tensorboard",
                   new="--trackers tensorboard")


def _add_placement(g: Any) -> None:
    """Where the ranks run (--bind), and what happens to a block that other work disturbed."""
    g.add_argument("--bind", choices=BINDINGS, default="none", metavar="|".join(BINDINGS),
                   help="where the ranks run. none: wherever the scheduler puts them and their threads, launch by "
                        "launch (mpirun --bind-to none, Horovod's advice for its background thread); comm: the "
                        "ranks as with none, each rank's communication thread on a core of its own (Horovod's "
                        "background thread: HOROVOD_THREAD_AFFINITY from the local rank; gloo's threads, under DDP, "
                        "ZeRO, FSDP and the native layer, wait in the kernel and stay the scheduler's) and MPI's "
                        "waits yielding the core instead of spinning on it (Open MPI's mpi_yield_when_idle=1); "
                        "core: each rank bound to its own cores, as many "
                        "as --threads (mpirun --bind-to core --map-by core or slot:PE=N; srun --cpu-bind=cores). "
                        "Recorded in results.json and shown in the report; --sweep bind=none,comm,core compares "
                        "them. A HOROVOD_THREAD_AFFINITY or OMPI_MCA_mpi_yield_when_idle set here wins (forwarded to "
                        "every rank, recorded) "
                        "(default: none)")
    g.add_argument("--rerun-disturbed", type=nonneg_float, default=0.0, metavar="PCT",
                   help="run a block again, not counting it, when during one of its runs other processes took more "
                        "than PCT %% of the cores or the hypervisor stole more than PCT/4 %% of them (/proc/stat); "
                        "at most 3 tries, after which it is counted and said so; the report says how many blocks "
                        "were run again and why (default: 0, never)")


def _add_stopping_rule(g: Any) -> None:
    """How many blocks a comparison runs, and the margins its verdicts are drawn with."""
    g.add_argument("--repeats", type=parse_repeats, default=0, metavar="N|auto",
                   help="blocks to run (a block runs every arm once at every np), per seed with --seeds; auto: add "
                        "blocks until every throughput verdict is precise enough to decide: from 10 blocks on, its "
                        "95 %% interval within ±--target-ci and its equivalence interval within half of "
                        "±--equivalence (so that no difference can come out equal); sooner once within ±--target-ci "
                        "if settled beyond doubt at 99.9 %% (from 6 blocks on). A rule on the spread only, so looking "
                        "after every block keeps the verdicts' 5 %% error rate (default: 3, or 1 per seed with "
                        "--seeds)")
    g.add_argument("--seeds", type=parse_seeds, metavar="N|S1,S2,...",
                   help="run every block under another seed (initial weights and sampling), the same for every arm "
                        "of the block: N seeds counted from --seed, or these seeds; adds accuracy verdicts over "
                        "the seeds (with --target-accuracy also time-to-accuracy verdicts)")
    g.add_argument("--accuracy-equivalence", type=positive_float, default=0.5, metavar="POINTS",
                   help="arms whose paired difference of final test accuracy has its 95 %% interval inside "
                        "±POINTS percentage points are reported equal (its 90 %% interval: two one-sided tests at 5 "
                        "%%) (default: 0.5)")
    g.add_argument("--target-ci", type=positive_float, default=5.0, metavar="PCT",
                   help="with --repeats auto: the 95 %% interval half-width to reach, in %% of the ratio (the same "
                        "whichever arm is the baseline); the equivalence interval must also reach half of "
                        "--equivalence (default: 5)")
    g.add_argument("--max-repeats", type=positive_int, default=100, metavar="N",
                   help="with --repeats auto: stop after this many blocks (default: 100)")
    g.add_argument("--time-budget", type=nonneg_float, default=0, metavar="SECONDS",
                   help="with --repeats auto: start no block that would end after this many seconds "
                        "(default: 0, no limit)")
    g.add_argument("--equivalence", type=positive_float, default=5.0, metavar="PCT",
                   help="arms whose throughput ratio lies inside ±PCT %% by an equivalence test (two one-sided tests "
                        "at 5 %%: the 90 %% interval inside the margin) are reported equal (default: 5)")


def project_link_arg(text: str) -> int | None:
    """``--project-link``: the link rate (bits/s) ``dpcompare predict --link`` projects onto, or ``none`` (None)."""
    if text == "none":
        return None
    try:
        return parse_rate_bits(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a link rate (e.g. 25gbit, 200gbit, 10gbit) or none"
        ) from None


def train_flags(cfg: TrainConfig) -> list[str]:
    """The shared train settings as compare's own flags (relative to its defaults), as results.json keeps them."""
    return train_argv(cfg, skip=NOT_STORED, defaults=TRAIN_DEFAULTS)


def _variant(a: Arm) -> str:
    label = a.label if "=" not in a.label else a.slug  # a label with "=" (a swept arm's) would not parse back
    return f"{label}={a.name}" + (":" + ",".join(f"{k}={value_text(v)}" for k, v in a.knobs) if a.knobs else "")


def plan_flags(c: Comparison) -> list[str]:
    """The comparison's own flags (not the train settings) that rebuild its plan: to print how to reproduce it,
    and for --continue."""
    s, default = c.stopping, StoppingRule()
    flags = ["--np", ",".join(map(str, c.nps))]
    if any(a.knobs or a.label != a.name for a in c.arms):
        flags += ["--variants", *map(_variant, c.arms)]
    else:
        flags += ["--strategies", ",".join(a.name for a in c.arms)]
    for name, values in c.sweeps:
        flags += ["--sweep", f"{name}={','.join(map(value_text, values))}"]
    flags += ["--repeats", "auto" if s.repeats is None else str(s.repeats)]
    if s.seeds:
        flags += ["--seeds", ",".join(map(str, s.seeds)) + ("," if len(s.seeds) == 1 else "")]
    if s.repeats is None:
        flags += ["--target-ci", f"{100 * s.target_ci:g}", "--max-repeats", str(s.max_repeats)]
        if s.time_budget:
            flags += ["--time-budget", f"{s.time_budget:g}"]
    if s.equivalence != default.equivalence:
        flags += ["--equivalence", f"{100 * s.equivalence:g}"]
    if s.accuracy_equivalence != default.accuracy_equivalence:
        flags += ["--accuracy-equivalence", f"{100 * s.accuracy_equivalence:g}"]
    if c.lab is not None:
        flags += ["--lab", c.lab.text()]
    for name, values in c.axes:
        flags += AXES[name].flags(values)
    if c.replay:
        flags += ["--replay"]
    if c.options.workers != "fresh":
        flags += ["--workers", c.options.workers]
    if c.options.bind != RunOptions().bind:
        flags += ["--bind", c.options.bind]
    if c.options.disturbed:
        flags += ["--rerun-disturbed", f"{100 * c.options.disturbed:g}"]
    if c.options.project_link != RunOptions().project_link:
        link = c.options.project_link
        flags += ["--project-link", "none" if link is None else format_rate_bits(link)]
    if c.script is not None:
        flags += c.script.flags()
    return flags


class _StoredParser(Parser):
    """compare's options, for flags compare wrote itself: an error is the stored file's, one line."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise ConfigError(f"the stored comparison's flags cannot be read back ({message}); start a new "
                          "comparison with another --out")


def stored_args(argv: Sequence[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """``argv`` (stored flags) read by compare's own options, and those options' defaults."""
    p = _StoredParser(prog="dpcompare compare", add_help=False)
    add_arguments(p)
    return p.parse_args(list(argv)), p.parse_args([])


def write_comparison_config(c: Comparison) -> None:
    """OUT/config.toml: the comparison's plan and train settings (what --continue reads from results.json), which
    rerun it with ``dpcompare compare --config OUT/config.toml --out NEW``."""

    p = Parser(prog="dpcompare compare", add_help=False)
    add_arguments(p)
    write_config(c.out / CONFIG_FILE, p, config_settings(p, [*plan_flags(c), *train_flags(c.config)]))
