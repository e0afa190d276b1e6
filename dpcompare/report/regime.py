"""The regime a comparison measured: what its verdict speaks for, and what it does not.

A verdict from 3 ms steps of a 0.06 MB model on a 2-core VM is a fact about fixed per-step costs on that
machine, not about the strategies on a cluster. The regime card puts next to every verdict the step time,
the gradient bytes a step exchanges, the share of the step spent communicating or waiting for it (traced
runs), the link the ranks used and the threads per rank, the CPU other processes took while the runs ran
(each run's ``load``, :mod:`dpcompare.compare.load`), and one sentence on what the verdict generalises to.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

#: below these, fixed per-step costs (framework bookkeeping, thread wake-ups) decide the verdict
TINY_STEP_MS = 20.0
TINY_GRADIENT_MB = 1.0
#: other processes took at least this share of the machine's cores, on average over a run, in any run at a
#: process count: the verdict there describes a shared machine (a busy-polling rank loses whole time slices)
SHARED_SHARE = 0.10


@dataclass(frozen=True)
class Regime:
    np: int
    step_ms: float | None           # median over the arms' ok runs (the slowest rank's median step)
    gradient_mb: float | None       # gradient bytes one rank exchanges per step (the model's fp32 gradients)
    comm_share: float | None        # traced runs: share of the step communicating or waiting for it
    link: str                       # shared memory / loopback, an emulated link, a network
    threads: int | None             # intra-op threads per rank
    tiny: bool
    sentence: str
    others_cpu: float | None = None  # the largest share of the cores other processes took during a run
    loadavg: float | None = None     # the 1-minute load average when the first run started
    cores: int | None = None
    #: what the model made the strategies do (parameters without gradient, sparse gradients), one line each
    model: tuple[str, ...] = ()

    @property
    def shared(self) -> bool:
        """Whether other processes took a noticeable share of the cores (:data:`SHARED_SHARE`) in some run."""
        return self.others_cpu is not None and self.others_cpu >= SHARED_SHARE

    def to_json(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in ("np", "step_ms", "gradient_mb", "comm_share", "link", "threads",
                                                 "tiny", "sentence", "others_cpu", "loadavg", "cores", "model")},
                "shared": self.shared}


def _names(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def model_lines(runs: list[dict[str, Any]]) -> tuple[str, ...]:
    """What the runs' model made the strategies do, from their regime facts: the arms that ran DDP with
    ``find_unused_parameters`` (and which parameters get no gradient), and the sparse gradients."""
    facts = [(r.get("arm") or r.get("strategy"), r.get("regime") or {}) for r in runs]
    lines = []
    unused = next((f["unused_parameters"] for _, f in facts if f.get("unused_parameters")), None)
    if unused:
        finders = sorted({str(a) for a, f in facts if f.get("find_unused_parameters")})
        lines.append(f"{len(unused)} trainable parameter{'s' if len(unused) > 1 else ''} get no gradient "
                     f"({_names(unused)}): " + (f"{', '.join(finders)} ran DDP with find_unused_parameters=True (a "
                                                "traversal of the autograd graph every step); " if finders else "")
                     + "every strategy gives them a zero gradient")
    sparse = next((f["sparse_parameters"] for _, f in facts if f.get("sparse_parameters")), None)
    if sparse:
        lines.append(f"sparse gradients ({_names(sparse)}): DDP all-reduces them sparse (gloo all-gathers every "
                     "rank's rows and sums them), Horovod all-gathers their indices and values")
    return tuple(lines)


def _median(xs: list[float]) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _gradient_mb(runs: list[dict[str, Any]]) -> float | None:
    """The model's gradient MB: recorded by the run, else the largest rank's parameter MB of a replicated arm."""
    recorded = [(r.get("regime") or {}).get("gradient_mb") for r in runs]
    if any(x is not None for x in recorded):
        return _median([x for x in recorded if x is not None])
    return max(((r.get("memory_mb") or {}).get("params") or 0.0 for r in runs), default=None) or None


def _comm_share(runs: list[dict[str, Any]]) -> float | None:
    shares = []
    for r in runs:
        comm = (r.get("regime") or {}).get("communication") or {}
        step = (r.get("step_ms") or {}).get("median")
        exposed = comm.get("exposed_ms_per_step", comm.get("wait_ms_per_step"))
        if step and exposed is not None:
            shares.append(min(float(exposed) / float(step), 1.0))
    return _median(shares)


def _link(results: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    lab = (results.get("config") or {}).get("lab")
    if lab:
        return f"emulated hosts ({lab.get('hosts')} namespaces) on a {lab.get('link')} link"
    hosts = max(((r.get("regime") or {}).get("hosts") or 1 for r in runs), default=1)
    device = next((r.get("device") for r in runs if r.get("device")), "cpu") or "cpu"
    if hosts > 1:
        return f"a network between {hosts} hosts"
    return "one host: NVLink/PCIe and shared memory" if str(device).startswith("cuda") else \
        "one host: shared memory and loopback TCP (no network)"


def _threads(results: dict[str, Any], runs: list[dict[str, Any]], np_: int) -> int | None:
    recorded = [(r.get("regime") or {}).get("threads") for r in runs]
    if any(x is not None for x in recorded):
        return int(_median([x for x in recorded if x is not None]) or 0) or None
    train = (results.get("config") or {}).get("train") or {}
    if train.get("threads"):
        return int(train["threads"])
    cpus = (results.get("environment") or {}).get("cpus")
    return max(1, int(cpus) // np_) if cpus else None


def _sentence(step_ms: float | None, gradient_mb: float | None, link: str, tiny: bool) -> str:
    if tiny:
        return ("Fixed per-step costs decide this verdict: steps this short, or this few gradient bytes, "
                "measure framework bookkeeping and thread wake-ups on this machine, not communication. It does "
                "not generalise to larger models or to a cluster's network.")
    where = "over a real or emulated network" if "link" in link or "network" in link else "within one host"
    return (f"Steps of {step_ms:.0f} ms exchanging {gradient_mb:.1f} MB of gradients {where}: the verdict speaks for "
            "models and links of this size; on other links the communication share, and so the verdict, can change "
            "(dpcompare predict projects it).")


def _load(runs: list[dict[str, Any]]) -> tuple[float | None, float | None, int | None]:
    """(the largest share of the cores other processes took in a run, the 1-minute load average when the first
    run started, the cores) over the runs that recorded their ``load``. Only the first start says how busy the
    machine was before: a load average trails a minute, so every later start counts the comparison's own runs."""
    loads = [r["load"] for r in runs if isinstance(r.get("load"), dict)]
    shares = [x["others_cpu_share"] for x in loads if x.get("others_cpu_share") is not None]
    starts = [x["loadavg_start"][0] for x in loads if x.get("loadavg_start")]
    cores = next((int(x["cores"]) for x in loads if x.get("cores")), None)
    return max(shares, default=None), (starts[0] if starts else None), cores


def regime(results: dict[str, Any], np_: int) -> Regime:
    runs = [r for r in results.get("runs", []) if int(r["np"]) == np_ and r.get("status") == "ok"]
    step = _median([(r.get("step_ms") or {}).get("median") for r in runs])
    grad = _gradient_mb(runs)
    link = _link(results, runs)
    tiny = (step is not None and step < TINY_STEP_MS) or (grad is not None and grad < TINY_GRADIENT_MB)
    sentence = _sentence(step, grad, link, tiny) if step is not None and grad is not None else \
        "Too few successful runs to say what this verdict speaks for."
    return Regime(np_, step, grad, _comm_share(runs), link, _threads(results, runs, np_), tiny, sentence,
                  *_load(runs), model_lines(runs))


def regimes(results: dict[str, Any]) -> list[Regime]:
    return [regime(results, n) for n in sorted({int(r["np"]) for r in results.get("runs", [])})]


def tiny_warning(results: dict[str, Any]) -> str | None:
    """One line for the terminal table when fixed per-step costs decide any verdict."""
    tiny = [r for r in regimes(results) if r.tiny]
    if not tiny:
        return None
    r = tiny[0]
    what = " and ".join(x for x in (
        r.step_ms is not None and r.step_ms < TINY_STEP_MS and f"steps of {r.step_ms:.1f} ms",
        r.gradient_mb is not None and r.gradient_mb < TINY_GRADIENT_MB and f"{r.gradient_mb:.2f} MB of gradients")
        if x)
    return (f"note: {what} (np={r.np}) — fixed per-step costs decide this verdict, not communication; it does not "
            "generalise to larger models or clusters")


def others_text(r: Regime) -> str:
    """The CPU other processes took, for the regime card and the terminal: "3 % of the 2 cores at most in a run
    (load average 0.4 before)"; "not recorded" for runs from before dpcompare recorded it, or under Slurm."""
    if r.others_cpu is None:
        return "not recorded"
    cores = f" of the {r.cores} cores" if r.cores else " of the cores"
    load = f"; load average {r.loadavg:.2f} when the first run started" if r.loadavg is not None else ""
    return f"{100 * r.others_cpu:.0f} %{cores} at most in a run{load}"


def shared_line(r: Regime) -> str:
    """The line beside a verdict whose runs shared the machine with other work (:attr:`Regime.shared`)."""
    cores = f"the {r.cores} cores" if r.cores else "the cores"
    load = f", load average {r.loadavg:.1f} when it began" if r.loadavg is not None else ""
    return (f"shared machine: other processes took up to {100 * (r.others_cpu or 0):.0f} % of {cores} during a run"
            f"{load}. This verdict describes a shared machine; rerun with nothing else running.")
