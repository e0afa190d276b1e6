"""A comparison's axes that are no train setting, each ONE declaration (:class:`Axis`) in :data:`AXES`.

An axis gives every arm a value: the lab link it runs on (``--sweep link=1gbit,200mbit``), the fault it meets
(``--fault host=2,at-step=40``), the torch threads per rank (``--sweep threads=1,2``). Its declaration says
everything the rest of the code asks of it: its name and how one value is read and written, how the arms
pair along it, how its values are checked against the comparison, and what it does to a run (its train
configuration, and what it does before the run starts). The plan crosses the arms with it
(:func:`dpcompare.compare.plan.cross_axes`), results.json records each arm's values apart from its train
settings (``arms[].axes``) and how the arms pair (``config.axes``), and the report pairs the arms from that
record, importing nothing from here.

How the arms pair along an axis (``pairs``):

- :data:`WITHIN` (``--sweep NAME=V1,V2``): every arm runs at every value, and the verdicts compare arms at the
  same value (per link: ddp against horovod on 1gbit, then on 200mbit).
- :data:`TWIN` (its own flag, ``--NAME VALUE``): every arm runs as it is and again with the value; an arm with
  the value is compared with its twin without it (what the fault cost), not in the verdicts between arms.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpcompare.argtypes import format_rate_bits, nonneg_int
from dpcompare.errors import ConfigError, DpcompareError
from dpcompare.files import FAULT, LINK
from dpcompare.lab.spec import link_bps
from dpcompare.launch.mpirun import BINDINGS
from dpcompare.versions import docs_page

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig

#: verdicts per value: arms are compared with the arms at the same value
WITHIN = "within"
#: every arm also runs with the value, and is compared with its twin without it
TWIN = "twin"


def _accept(c: Any, values: Sequence[Any]) -> None:
    """An axis with nothing to refuse."""


@dataclass(frozen=True)
class Axis:
    """One axis of a comparison that is no train setting: the one place that says what it is and does."""

    name: str  #: its word: on the command line, in arm labels and in results.json
    parse: Callable[[str], Any]  #: one value from its text (argparse.ArgumentTypeError when it is none)
    pairs: str  #: :data:`WITHIN` or :data:`TWIN`
    help: str  #: what it does, for --help
    metavar: str = "V1,V2"
    tag: Callable[[Any], str] = str  #: a value in arm labels (``str(value)``, which parse reads back, elsewhere)
    words: str = "with {name}={value}"  #: how a verdict at one value says it (``on {value}``)
    title: str = ""  #: its values in a plot's axis label
    note: str = ""  #: what to know when reading its plot
    order: Callable[[Any], Any] | None = None  #: how its values sort in a plot (None: as given)
    major: bool = False  #: the arms of one value run side by side (a change it makes is made once per value)
    check: Callable[[Any, Sequence[Any]], None] = _accept  #: (comparison, values): refuse in one line
    configure: Callable[[TrainConfig, Any], TrainConfig] | None = None  #: the run's train settings at a value
    before_run: Callable[[Any, Any], None] | None = None  #: (lab or None, value): before a run at the value
    #: what it does to the run's launch line at a value: options of :func:`dpcompare.launch.mpirun.job_command`
    launch: Callable[[Any], dict[str, Any]] | None = None

    def flags(self, values: Sequence[Any]) -> list[str]:
        """The values as compare's command line gives them (written back for --continue)."""
        if self.pairs == TWIN:
            return [f"--{self.name}", str(values[0])]
        return ["--sweep", f"{self.name}=" + ",".join(map(str, values))]

    def record(self, values: Sequence[Any]) -> dict[str, Any]:
        """What results.json keeps of the axis (``config.axes.NAME``): all the report needs to pair and show it."""
        shown = sorted(values, key=self.order) if self.order else list(values)
        return {"pairs": self.pairs, "words": self.words, "title": self.title or self.name, "note": self.note,
                "values": [str(v) for v in shown]}


# -- link: the lab's link rate -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LabLink:
    """The lab link an arm runs on (``--sweep link=...``): ``bps`` bits per second, None for an unshaped one."""

    bps: int | None

    def __str__(self) -> str:
        return format_rate_bits(self.bps)


def parse_link(text: str) -> LabLink:
    """A lab link's rate (``1Gbit`` → LabLink(1_000_000_000), ``unlimited`` → LabLink(None), unshaped)."""
    try:
        return LabLink(link_bps(text))
    except DpcompareError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _check_link(c: Any, values: Sequence[Any]) -> None:
    if c.lab is None:
        raise ConfigError("--sweep link=... shapes the link of a lab: add --lab hosts=2 (root, iproute2)")


def _reshape(lab: Any, link: LabLink) -> None:
    if lab is not None and lab.link_bps != link.bps:
        lab.set_link(link.bps)  # instant; the arms of one link run side by side (major)


# -- fault: a host dies at a step ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    """A host dies at a step (``--fault host=2,at-step=40[,back-at-step=80]``): when the run's step log reaches
    ``at_step`` (an elastic run that commits there: right after the commit) the lab takes ``host``'s link down and
    kills every process in it; with ``back_at_step`` the host comes back (link up, sshd started; torchrun's job
    gets an agent there) once the log reaches that step after the recovery. The run itself goes through
    :func:`dpcompare.compare.fault_runs.run_with_fault`."""

    host: int
    at_step: int
    back_at_step: int | None = None

    def __str__(self) -> str:
        return f"host={self.host},at-step={self.at_step}" + (
            f",back-at-step={self.back_at_step}" if self.back_at_step is not None else "")

    @property
    def tag(self) -> str:
        """Short, for arm labels: ``host2@40`` (``host2@40-80`` with a return)."""
        return f"host{self.host}@{self.at_step}" + (f"-{self.back_at_step}" if self.back_at_step is not None else "")

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "at_step": self.at_step, "back_at_step": self.back_at_step}


FAULT_KEYS = ("host", "at-step", "back-at-step")


def parse_fault(text: str) -> Fault:
    """``host=2,at-step=40[,back-at-step=80]`` → :class:`Fault`; anything else refused in one line."""
    fields: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in FAULT_KEYS or not value.isdigit():
            raise argparse.ArgumentTypeError(f"--fault {text!r}: {item!r} is not KEY=N with KEY one of "
                                             f"{', '.join(FAULT_KEYS)} (e.g. host=2,at-step=40)")
        fields[key] = int(value)
    if "host" not in fields or "at-step" not in fields:
        raise argparse.ArgumentTypeError(f"--fault {text!r}: give host= and at-step= (e.g. host=2,at-step=40)")
    fault = Fault(fields["host"], fields["at-step"], fields.get("back-at-step"))
    if fault.at_step < 1 or (fault.back_at_step is not None and fault.back_at_step <= fault.at_step):
        raise argparse.ArgumentTypeError(f"--fault {text!r}: at-step is at least 1 and back-at-step after it")
    return fault


def _check_fault(c: Any, values: Sequence[Fault]) -> None:
    if c.lab is None:
        raise ConfigError(f"--fault needs hosts to lose: add --lab hosts=3 (root, iproute2; {docs_page('elastic')})")
    fault = values[0]
    if not 1 <= fault.host < c.lab.hosts:
        raise ConfigError(f"--fault host={fault.host}: choose a host from 1 to {c.lab.hosts - 1} of --lab "
                          f"{c.lab.text()} (host 0 holds the rendezvous and horovodrun's driver)")


# -- threads: torch's intra-op threads per rank ----------------------------------------------------------------------
def _threads(cfg: TrainConfig, n: int) -> TrainConfig:
    return dataclasses.replace(cfg, threads=n)  # the run calls torch.set_num_threads(n) (training.loop, native)


def parse_threads(text: str) -> int:
    """A thread count as ``--threads`` takes it: 0 is its default, the cores a process may use ÷ the processes
    sharing them."""
    try:
        return nonneg_int(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"threads={text!r}: {e}") from None


# -- bind: where the ranks run ----------------------------------------------------------------------------------------
def parse_bind(text: str) -> str:
    if text not in BINDINGS:
        raise argparse.ArgumentTypeError(f"bind={text!r}: choose from {', '.join(BINDINGS)}")
    return text


def _check_bind(c: Any, values: Sequence[Any]) -> None:
    if c.lab is not None and any(v != "none" for v in values):
        bound = next(v for v in values if v != "none")
        raise ConfigError(f"bind={bound} places the ranks' threads on this machine's cores, which a lab's hosts "
                          "share; leave it out with --lab")


#: every axis, by name; results.json, the plan, compare's command line and the runner read them here
AXES: dict[str, Axis] = {a.name: a for a in (
    Axis(LINK, parse_link, WITHIN, "the lab's link rate (1gbit, 200mbit, unlimited): every arm runs on every link, "
         "with verdicts per link (needs --lab)", metavar="RATE1,RATE2", words="on {value}",
         title="link rate (each emulated host's link, both directions)",
         note="Emulated hosts (network namespaces) joined by tbf-shaped links; the unshaped veth ('unlimited') is "
              "CPU-bound, not a fast NIC.",
         order=lambda v: float("inf") if v.bps is None else v.bps, major=True, check=_check_link,
         before_run=_reshape),
    Axis(FAULT, parse_fault, TWIN,
         "with --lab: every arm runs twice per block, once as it is and once meeting this fault: when the run reaches "
         "step S (an elastic arm that commits at S: right after that commit), host I dies (its link goes down, then "
         "every process in it is killed), and with back-at-step it comes back at step B; records the pause, the "
         "steps redone, the world size over time, the wall time and the final metric against the run without the "
         "fault, and draws throughput over time. Compare elastic arms: --strategies ddp-elastic,horovod-elastic "
         f"({docs_page('elastic')})", metavar="host=I,at-step=S[,back-at-step=B]", tag=lambda f: f.tag,
         check=_check_fault),
    Axis("threads", parse_threads, WITHIN, "torch's intra-op threads per rank: every arm runs at every count, "
         "with verdicts per count (a --script run too); 0: --threads' own default, cores ÷ processes", metavar="N1,N2",
         words="at {value} thread(s) per rank",
         title="intra-op threads per rank", order=int, configure=_threads),
    Axis("bind", parse_bind, WITHIN, "where the ranks run: none (the scheduler's choice, mpirun --bind-to none), "
         "comm (as none, each rank's communication thread on a core of its own and MPI's waits yielding the core) "
         "or core (each rank bound to its own "
         "cores, as many as its threads): every arm runs at every binding, with verdicts per binding",
         metavar="none,comm,core", words="with ranks bound to {value}",
         title="binding of the ranks", check=_check_bind, launch=lambda v: {"bind": v}),
)}


def axis(name: str) -> Axis:
    return AXES[name]


def ordered(axes: Sequence[tuple[str, Sequence[Any]]]) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """The axes as the plan crosses them: the swept ones in the order given, the twin ones after them (an axis
    given twice: its first values)."""
    kept: dict[str, tuple[Any, ...]] = {}
    for name, values in axes:
        kept.setdefault(name, tuple(dict.fromkeys(values)))
    return tuple(sorted(kept.items(), key=lambda nv: AXES[nv[0]].pairs == TWIN))


def axes_of(sweeps: Sequence[tuple[str, Sequence[Any]]], args: Any = None) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """The axes a comparison's command line gives: those of ``--sweep`` and the twin axes' own flags in ``args``."""
    given = [(n, v) for n, v in sweeps if n in AXES]
    given += [(a.name, (getattr(args, a.name),)) for a in AXES.values()
              if a.pairs == TWIN and getattr(args, a.name, None) is not None]
    return ordered(given)
