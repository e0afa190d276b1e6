"""The plan of a comparison: its arms, the runs of a block, and the :class:`Comparison` that ``run_compare`` runs.

An *arm* is a label, a strategy (or its elastic mode: ``ddp-elastic``), train settings that differ from the shared
ones (``--strategies``, ``--variants``, ``--sweep``) and its values of the comparison's axes that are no train
setting (the lab link it runs on, the fault it meets, the threads per rank: each declared in :mod:`.axes`).
Every (arm, np, repeat) is its own run (:class:`RunSpec`) with the same
configuration and seed. Runs go in blocks: a block runs every (np, arm) once, with the order reversed on odd
repeats, so slow drifts of the machine hit every arm of a block alike. The parsers here turn the comparison's
flags into these objects; :mod:`.cmdline` writes them back.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcompare.argtypes import positive_int
from dpcompare.backends.catalog import ELASTIC_SUFFIX, check_arm_name, elastic_base
from dpcompare.compare.axes import AXES, FAULT, TWIN, Fault, axes_of, ordered
from dpcompare.compare.stopping import StoppingRule
from dpcompare.config import TrainConfig
from dpcompare.errors import ConfigError
from dpcompare.lab.spec import LabSpec
from dpcompare.launch.env import local_cores
from dpcompare.native.calls import SCRIPT_ARMS, script_elastic_base
from dpcompare.options import FIELDS, flag_of, setting_name
from dpcompare.versions import docs_page


@dataclass(frozen=True)
class Arm:
    """One side of a comparison: a label, a strategy (``elastic``: in its elastic mode, named ``NAME-elastic``),
    the train settings that differ from the shared ones (``knobs``: TrainConfig fields only), and its value of
    each axis (``axes``: :mod:`.axes`, name → value; ``base``: the label before the axes were added to it)."""

    label: str
    strategy: str
    knobs: tuple[tuple[str, Any], ...] = ()
    elastic: bool = False
    axes: tuple[tuple[str, Any], ...] = ()
    base: str = ""

    @classmethod
    def named(cls, name: str, label: str | None = None, knobs: tuple[tuple[str, Any], ...] = ()) -> Arm:
        """The arm of strategy ``name``, or of a strategy's elastic mode (``ddp-elastic``)."""
        base = elastic_base(name) or script_elastic_base(name)  # native-elastic: a script arm's (--script)
        return cls(label or name, base or name, knobs, elastic=base is not None)

    @property
    def name(self) -> str:
        """The strategy as ``--strategies`` names it: ``ddp``, or ``ddp-elastic`` for its elastic mode."""
        return self.strategy + (ELASTIC_SUFFIX if self.elastic else "")

    @property
    def slug(self) -> str:
        """The label as a folder name (``ddp#1`` → ``ddp-1``, ``ddp/k=v`` → ``ddp-k-v``)."""
        return re.sub(r"[^A-Za-z0-9_.]+", "-", self.label).strip("-") or "arm"

    def axis(self, name: str) -> Any:
        """The arm's value of axis ``name`` (None: it has none)."""
        return dict(self.axes).get(name)

    @property
    def fault(self) -> Fault | None:
        """The fault the arm meets (``--fault``), or None."""
        return self.axis(FAULT)

    def with_axis(self, name: str, value: Any) -> Arm:
        """This arm at ``value`` of axis ``name``, labelled for it (``ddp/link=1gbit``, ``ddp/k=v,link=1gbit``)."""
        piece = f"{name}={AXES[name].tag(value)}"
        return dataclasses.replace(self, label=f"{self.label}{',' if '/' in self.label else '/'}{piece}",
                                   axes=(*self.axes, (name, value)), base=self.base or self.label)

    def without_axes(self, *names: str) -> Arm:
        """This arm without its values of axes ``names`` (labelled as it was before them)."""
        arm = dataclasses.replace(self, label=self.base or self.label, axes=(), base="")
        for name, value in self.axes:
            if name not in names:
                arm = arm.with_axis(name, value)
        return arm

    def to_json(self) -> dict[str, Any]:
        """The arm as results.json keeps it: its train settings (``knobs``) apart from its axes (``axes``)."""
        return {"label": self.label, "strategy": self.strategy, "knobs": _jsonable(dict(self.knobs)),
                **({"axes": self.axes_json(), "base": self.base} if self.axes else {}),
                **({"elastic": True} if self.elastic else {})}

    def axes_json(self) -> dict[str, str]:
        return {name: str(value) for name, value in self.axes}


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


@dataclass(frozen=True)
class RunSpec:
    arm: Arm
    np: int
    repeat: int
    seed: int | None = None  # --seeds: this block's seed (None: the shared --seed)

    def __post_init__(self) -> None:
        if isinstance(self.arm, str):  # a bare strategy name is the arm of that strategy
            object.__setattr__(self, "arm", Arm.named(self.arm))

    @property
    def strategy(self) -> str:
        return self.arm.strategy

    @property
    def name(self) -> str:
        return f"{self.arm.slug}-np{self.np}-r{self.repeat}" + ("" if self.seed is None else f"-s{self.seed}")


def block(arms: Sequence[Arm], nps: Sequence[int], repeat: int, seeds: Sequence[int] = ()) -> list[RunSpec]:
    """One block: every (np, arm) once; odd repeats run it backwards. With ``seeds`` the blocks take them in
    turn (block k: seeds[k mod len(seeds)]), the same seed for every run of the block."""
    configs = [(n, a) for n in nps for a in arms]
    seed = seeds[repeat % len(seeds)] if seeds else None
    return [RunSpec(a, n, repeat, seed) for n, a in (reversed(configs) if repeat % 2 else configs)]


def plan(arms: Sequence[Arm | str], nps: Sequence[int], repeats: int) -> list[RunSpec]:
    """Repeat-major order: every (np, arm) once per repeat; odd repeats run it backwards."""
    arms_ = as_arms(arms)
    return [spec for r in range(repeats) for spec in block(arms_, nps, r)]


def parse_np(text: str) -> list[int]:
    """``1,2,4`` → [1, 2, 4] (duplicates dropped, ascending)."""
    try:
        nps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of process counts like 1,2,4") from None
    if not nps or min(nps) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of process counts like 1,2,4")
    return sorted(set(nps))


def _check_strategy(name: str) -> str:
    """A built-in strategy's name (or its elastic mode, ``ddp-elastic``) or a plug-in's ``MODULE:CLASS`` /
    ``path/to/file.py:CLASS``."""
    if name in SCRIPT_ARMS or script_elastic_base(name):
        return name  # native (native-elastic) is no strategy: an arm of a script comparison (--script)
    try:
        return check_arm_name(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_arm_strategies(text: str) -> list[str]:
    """``ddp,horovod`` → ['ddp', 'horovod'] (order kept; a repeated name is an A/A control, kept too)."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"unknown strategy {text!r}; give names like ddp,horovod")
    return [_check_strategy(n) for n in names]


def parse_strategies(text: str) -> list[str]:
    """``ddp,horovod`` → ['ddp', 'horovod'], checked against the registered strategies (order kept, no repeats)."""
    return list(dict.fromkeys(parse_arm_strategies(text)))


#: train settings an arm may not change: compare sets them for every run itself
NOT_ARM_SETTINGS = ("strategy", "out", "overwrite", "progress", "resume")


def parse_setting(name: str, text: str) -> Any:
    """``text`` as the value of the train setting ``name`` (a flag without its dashes, or TrainConfig's field name),
    with the field's own type and choices."""
    word, name = name, setting_name(name) or ""
    f = FIELDS.get(name)
    if f is None or name in NOT_ARM_SETTINGS:
        known = ", ".join(n if flag_of(n).startswith("--no-") else flag_of(n)[2:] for n, g in FIELDS.items()
                          if n not in NOT_ARM_SETTINGS and not g.metadata.get("hidden"))
        raise argparse.ArgumentTypeError(f"unknown train setting {word!r}; choose from {known} (the flags without "
                                         "their dashes; TrainConfig's field names work too)")
    md = f.metadata
    if isinstance(f.default, bool):
        low = text.strip().lower()
        if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise argparse.ArgumentTypeError(f"{name}={text!r}: expected true or false")
        return low in ("true", "1", "yes", "on")
    conv = md.get("type") or (type(f.default) if isinstance(f.default, int | float) else str)
    try:
        value = conv(text)
    except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"{name} ({flag_of(name)}) {text!r}: {e}") from None
    choices = md.get("choices")
    choices = choices() if callable(choices) else choices
    if choices is not None and value not in choices:
        raise argparse.ArgumentTypeError(f"{name}={text!r} is not one of {', '.join(map(str, choices))}")
    return value


def _pairs(text: str) -> list[tuple[str, str]]:
    """``a=1,b=x,y`` → [('a', '1'), ('b', 'x,y')]: a piece without ``=`` continues the previous value."""
    out: list[tuple[str, str]] = []
    for piece in text.split(","):
        if "=" in piece:
            k, v = piece.split("=", 1)
            out.append((k.strip(), v.strip()))
        elif out:
            out[-1] = (out[-1][0], f"{out[-1][1]},{piece.strip()}")
        elif piece.strip():
            raise argparse.ArgumentTypeError(f"{text!r}: expected KNOB=VALUE pairs")
    return out


def parse_variant(text: str) -> Arm:
    """``NAME=STRATEGY[:knob=value,...]`` → an arm labelled NAME (STRATEGY may be a plug-in's ``FILE.py:CLASS``)."""
    label, sep, rest = text.partition("=")
    if not sep or not label.strip() or not rest.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=STRATEGY[:knob=value,...]")
    # a plug-in strategy has a ":" of its own (path/to/file.py:CLASS): the settings start at the first "=" part
    parts = rest.split(":")
    first = next((i for i, part in enumerate(parts) if "=" in part), len(parts))
    strategy, knobs = ":".join(parts[:first]), ":".join(parts[first:])
    _check_strategy(strategy.strip())
    values = tuple((setting_name(k) or k, parse_setting(k, v)) for k, v in _pairs(knobs))
    return Arm.named(strategy.strip(), label.strip(), values)


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """``KNOB=v1,v2`` → ('knob', [v1, v2]), each value parsed with the field's own type; an axis's name
    (:data:`.axes.AXES`: ``link=RATE,...``, ``threads=1,2``) sweeps that axis instead of a train setting."""
    name, sep, values = text.partition("=")
    name = name.strip().lstrip("-")
    if not sep or not values.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KNOB=VALUE1,VALUE2")
    if not (name in AXES and AXES[name].pairs != TWIN):
        parse_setting(name, values.split(",")[0].strip())  # an unknown name: one line naming the known ones
        name = setting_name(name) or name
    parse = AXES[name].parse if name in AXES and AXES[name].pairs != TWIN else lambda v: parse_setting(name, v)
    vals = [parse(v.strip()) for v in values.split(",") if v.strip()]
    return name, list(dict.fromkeys(vals))


def value_text(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, tuple | list) else str(v).lower() if isinstance(v, bool) else str(v)


def as_arms(arms: Sequence[Arm | str]) -> list[Arm]:
    return [a if isinstance(a, Arm) else Arm.named(a) for a in arms]


def build_arms(strategies: Sequence[str], variants: Sequence[Arm] = (),
               sweeps: Sequence[tuple[str, list[Any]]] = (),
               axes: Sequence[tuple[str, Sequence[Any]]] = ()) -> list[Arm]:
    """The arms of a comparison: the variants (else one per strategy), crossed with every swept train setting,
    then with every axis (:func:`cross_axes`).

    A label that occurs more than once (``--strategies ddp,ddp``, the A/A control) gets ``#1``, ``#2``...
    """
    base = list(variants) or [Arm.named(s) for s in strategies]
    for name, values in sweeps:
        base = [_crossed(a, name, v) for a in base for v in values]
    counts: dict[str, int] = {}
    for a in base:
        counts[a.label] = counts.get(a.label, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for a in base:
        if counts[a.label] > 1:
            seen[a.label] = seen.get(a.label, 0) + 1
            a = dataclasses.replace(a, label=f"{a.label}#{seen[a.label]}")
        out.append(a)
    out = cross_axes(out, axes)
    slugs = [a.slug for a in out]
    clash = next((a.label for a in out if slugs.count(a.slug) > 1), None)
    if clash:
        raise ConfigError(f"arm labels {', '.join(a.label for a in out if a.slug == Arm(clash, '').slug)} "
                          "would share a run folder; give them labels that differ in letters or digits")
    return out


def cross_axes(arms: Sequence[Arm], axes: Sequence[tuple[str, Sequence[Any]]]) -> list[Arm]:
    """The arms crossed with every axis (:mod:`.axes`), in order: a swept axis gives every arm every value (a
    ``major`` one value-major: the arms of one value side by side); a twin axis keeps every arm as it is and adds
    it again at the value (``ARM/fault=host2@40``)."""
    out = list(arms)
    for name, values in ordered(axes):
        ax = AXES[name]
        if ax.pairs == TWIN:
            out = [*out, *(a.with_axis(name, v) for v in values for a in out)]
        elif ax.major:
            out = [a.with_axis(name, v) for v in values for a in out]
        else:
            out = [a.with_axis(name, v) for a in out for v in values]
    return out


def _crossed(a: Arm, name: str, value: Any) -> Arm:
    """Arm ``a`` with swept train setting ``name`` at ``value``, labelled for it."""
    label = f"{a.label}/{name}={value_text(value)}" if "/" not in a.label else f"{a.label},{name}={value_text(value)}"
    return dataclasses.replace(a, label=label, knobs=(*[kv for kv in a.knobs if kv[0] != name], (name, value)))


#: the commit interval of an elastic arm when --commit-every is not given
DEFAULT_COMMIT_EVERY = 10


def child_config(cfg: TrainConfig, spec: RunSpec, run_dir: Path, step_log: bool = False,
                 replay: bool = False) -> TrainConfig:
    """The run's own configuration: the shared one with its arm's strategy and settings, and its folder. An
    elastic arm commits every --commit-every steps (default :data:`DEFAULT_COMMIT_EVERY`) and resumes from its
    newest checkpoint when restarted; the others never commit. ``step_log``: it writes OUT/steps.jsonl;
    ``replay`` (an elastic arm meeting the fault, ``--replay``): it also writes a checkpoint at every commit and
    after its last step, for the replay to start from and compare with."""
    seed = {} if spec.seed is None else {"seed": spec.seed}
    arm = spec.arm
    every = cfg.commit_every or DEFAULT_COMMIT_EVERY
    elastic = {"commit_every": every, "resume": "auto"} if arm.elastic else {"commit_every": 0}
    if replay and arm.elastic and arm.fault is not None:
        elastic.update(checkpoint_steps=cfg.checkpoint_steps or every, save_final=True)
    child = dataclasses.replace(cfg, **{**elastic, **dict(arm.knobs)}, **seed, strategy=spec.strategy,
                                out=str(run_dir), overwrite=True, progress="lines", step_log=step_log or cfg.step_log)
    return with_arm(child, arm)


def launch_options(cfg: TrainConfig, arm: Arm, bind: str = "none", np: int = 1) -> dict[str, Any]:
    """How the run's job is launched (:func:`dpcompare.launch.mpirun.job_command`'s options): the comparison's
    ``bind``, or the arm's ``bind`` axis; a bound rank gets as many cores as it runs threads (``cfg``: the run's own
    settings; ``--threads 0``: the cores ÷ ``np``, as the run itself counts them)."""
    options: dict[str, Any] = {"bind": bind}
    for name, value in arm.axes:
        if AXES[name].launch is not None:
            options.update(AXES[name].launch(value))
    threads = cfg.threads or max(1, local_cores() // max(np, 1))
    if options["bind"] == "core" and threads > 1:
        options["cores_per_rank"] = threads
    return options


def with_arm(cfg: TrainConfig, arm: Arm) -> TrainConfig:
    """``cfg`` with what the arm's axes set in a run's train settings (``threads``: its thread count)."""
    for name, value in arm.axes:
        if AXES[name].configure is not None:
            cfg = AXES[name].configure(cfg, value)
    return cfg




def parse_seeds(text: str) -> int | list[int]:
    """``3`` → 3 (seeds --seed … --seed+2), ``1,7,9`` → [1, 7, 9] (these seeds)."""
    if "," not in text:
        try:
            return positive_int(text)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e}: give a number of seeds (3) or a list of seeds (1,7,9)") from None
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seeds (3) or a list of seeds (1,7,9)") from None
    if len(set(seeds)) != len(seeds) or not seeds:
        raise argparse.ArgumentTypeError(f"{text!r}: every seed once, e.g. 1,7,9")
    return seeds


def seed_list(seeds: int | list[int] | None, base: int) -> list[int]:
    """The seeds of the blocks: N of them counted from ``base`` (--seed), or the ones given."""
    if not seeds:
        return []
    return list(range(base, base + seeds)) if isinstance(seeds, int) else list(seeds)


def parse_repeats(text: str) -> int | None:
    """A number of blocks, or ``auto`` (None): add blocks until the verdicts are precise enough."""
    if text.strip().lower() == "auto":
        return None

    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (or auto)") from None



@dataclass(frozen=True)
class RunOptions:
    """How a comparison runs, as opposed to what it compares (none of it is part of the plan)."""

    overwrite: bool = False  # replace a comparison in ``out``
    progress: str = "auto"
    run_timeout: float | None = None  # seconds; a run past it is stopped and recorded failed
    resume: bool = False  # continue the comparison in ``out``: its ok runs are kept
    workers: str = "fresh"  # fresh: a job per run; persistent: one job per process count
    # traced runs: predict them onto a cluster on this link, bits/s (None: do not)
    project_link: int | None = 25 * 10**9
    bind: str = "none"  # where the ranks run (launch.mpirun.BINDINGS); an arm's ``bind`` axis overrides it
    disturbed: float = 0.0  # others' CPU or steal share above which a block is run again (0: never)
    disturbed_tries: int = 3  # tries of a block before a disturbed one is counted anyway


@dataclass(frozen=True)
class Comparison:
    """What ``run_compare`` runs: the shared train ``config``, the ``arms`` (variants or one per strategy)
    crossed with ``sweeps`` (of train settings) and ``axes`` (:mod:`.axes`; an axis named in ``sweeps`` moves
    there), at every process count of ``nps``, in the blocks the ``stopping`` rule decides, into
    ``out``."""

    config: TrainConfig
    arms: tuple[Arm, ...]
    nps: tuple[int, ...]
    stopping: StoppingRule = field(default_factory=StoppingRule)
    out: Path = Path("runs/compare")
    options: RunOptions = field(default_factory=RunOptions)
    sweeps: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    lab: LabSpec | None = None  # run every job across emulated hosts made for the comparison (``--lab``)
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # (name, values): the link, the fault (``--fault``)...
    replay: bool = False  # check an elastic run that met the fault against a clean one from its checkpoint
    script: Any = None  # a Horovod script's comparison (``--script``: a compare.script.ScriptPlan), else training

    def __post_init__(self) -> None:
        object.__setattr__(self, "arms", tuple(as_arms(self.arms)))
        object.__setattr__(self, "nps", tuple(self.nps))
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "axes", ordered([*self.axes, *axes_of(self.sweeps)]))
        object.__setattr__(self, "sweeps", tuple((n, tuple(v)) for n, v in self.sweeps if n not in AXES))
        if isinstance(self.stopping, int | type(None)):
            object.__setattr__(self, "stopping", StoppingRule(repeats=self.stopping))
        for name, values in self.axes:
            AXES[name].check(self, values)
        self._check_lab()

    def _check_lab(self) -> None:
        """Refuse, in one line, what a lab cannot run (before anything starts); each axis checks its own values."""
        if self.lab is not None and self.options.bind != "none":
            raise ConfigError(f"--bind {self.options.bind} places the ranks' threads on this machine's cores, which a "
                              "lab's hosts share; leave --bind out with --lab")
        if self.lab is None:
            what = next((f"--strategies {a.name}" for a in self.arms if a.elastic), None)
            what = what or ("--replay" if self.replay else None)
            if what:
                raise ConfigError(
                    f"{what} needs hosts to lose: add --lab hosts=3 (root, iproute2; {docs_page('elastic')})"
                )
            return
        if self.options.workers == "persistent":
            raise ConfigError("--workers persistent does not run across a lab (its job would outlive the link "
                              "changes); leave --workers out with --lab")
        self.lab.check_np(max(self.nps))
        if self.replay and self.fault is None:
            raise ConfigError("--replay checks the elastic runs that met a fault: add --fault host=I,at-step=S")
        if any(a.elastic for a in self.arms) and min(self.nps) <= self.lab.slots:
            raise ConfigError(f"an elastic arm at --np {min(self.nps)} runs on one host of --lab {self.lab.text()}, "
                              "with none to lose: raise --np to span two hosts or more")

    def values(self, name: str) -> tuple[Any, ...]:
        """The values of axis ``name`` every arm runs at, in order (none when the comparison has no such axis)."""
        return dict(self.axes).get(name, ())

    @property
    def fault(self) -> Fault | None:
        """The fault every arm also meets (``--fault``), or None."""
        return next(iter(self.values(FAULT)), None)

    @property
    def all_arms(self) -> list[Arm]:
        """Every arm that runs: the arms crossed with the sweeps and the axes, a label given twice (A/A) labelled
        apart."""
        if not self.sweeps and len({a.label for a in self.arms}) == len(self.arms):
            return cross_axes(self.arms, self.axes)
        return build_arms([], self.arms, self.sweeps, self.axes)
