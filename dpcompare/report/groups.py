"""The runs of results.json, grouped: arms and process counts, per-arm aggregates, and the pairing of runs.

Pure functions on the ``runs`` of results.json (unpaired figures for the table and plots), and the two
pairings every verdict is built on: :func:`arm_pairs` (every arm after the first against the first, at
every np) and :func:`paired_blocks` (the repeats where both arms of a pair succeeded).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpcompare.files import FAULT, LINK, MEMORY_KINDS, PHASES
from dpcompare.knobs import exact_equivalents
from dpcompare.report.intervals import CONFIDENCE, Interval, mean_ci


def scaling_efficiency(throughput_np: float, np_: int, throughput_1: float) -> float:
    """throughput(np) / (np · throughput(1)): 1.0 is perfect linear scaling."""
    return throughput_np / (np_ * throughput_1) if throughput_1 > 0 and np_ > 0 else float("nan")


# -- runs and arms -----------------------------------------------------------------------------------
#: what runs recorded before workloads declared their metric were measured in
ACCURACY_METRIC = {"name": "accuracy", "higher_is_better": True, "unit": "%"}


def final_metric(run: dict[str, Any]) -> float | None:
    """A run's final value of its workload's metric (older records: the test accuracy)."""
    v = run.get("final_metric", run.get("final_test_accuracy"))
    return None if v is None else float(v)


def metric_of(runs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The metric the runs' workload declares: name, direction and unit."""
    return next((dict(r["metric"]) for r in runs if r.get("metric")), dict(ACCURACY_METRIC))


def workload_label(results: dict[str, Any]) -> str:
    """What the runs trained, in words: the label their summaries recorded (``convnet · digits`` for a built-in
    workload, a plug-in's own name); older results: the plug-in's path, else the model and dataset settings."""
    label = next((str(r["workload"]["label"]) for r in results.get("runs", [])
                  if (r.get("workload") or {}).get("label")), None)
    if label:
        return label
    train = (results.get("config") or {}).get("train") or {}
    if train.get("workload"):
        return str(train["workload"])
    return " · ".join(str(train[k]) for k in ("model", "dataset") if train.get(k))


def arm_of(run: dict[str, Any]) -> str:
    """The arm a run belongs to (its label); results without arms use the strategy name."""
    return str(run.get("arm") or run["strategy"])


def run_throughput(run: dict[str, Any]) -> float | None:
    """The per-run statistic of the verdicts: global batch ÷ the slowest rank's median step time (samples/s).

    Falls back to the run's samples/s (timed steps ÷ timed seconds) when the global batch is not recorded.
    """
    step = (run.get("step_ms") or {}).get("median")
    batch = run.get("global_batch")
    if step and batch:
        return float(batch) * 1000.0 / float(step)
    v = run.get("samples_per_sec")
    return None if v is None else float(v)


def arm_order(results: dict[str, Any]) -> list[str]:
    """Arm labels in the order given (the first is the baseline), then any other arm the runs name."""
    cfg = results.get("config") or {}
    given = [a["label"] for a in cfg.get("arms") or []] or list(cfg.get("strategies") or [])
    return list(dict.fromkeys([*given, *(arm_of(r) for r in results.get("runs", []))]))


strategy_order = arm_order  # the name the report used before runs were generalised to arms


def np_order(results: dict[str, Any]) -> list[int]:
    given = [int(n) for n in (results.get("config") or {}).get("np") or []]
    return sorted(set(given) | {int(r["np"]) for r in results.get("runs", [])})


MEMORY_LABELS = {"params": "params", "grads": "grads", "optimizer_state": "opt state", "total": "total"}


# -- per-arm aggregates ------------------------------------------------------------------------------
@dataclass
class Group:
    """All repeats of one (arm, np)."""

    arm: str
    np: int
    runs: int
    ok: int
    strategy: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)
    samples_per_sec: Interval | None = None
    throughputs: list[float] = field(default_factory=list)
    step_ms_median: float | None = None
    step_ms_p95: float | None = None
    phases_ms: dict[str, float] = field(default_factory=dict)
    accuracy: Interval | None = None  # the workload's metric (accuracy for the built-in classifiers)
    accuracies: list[float] = field(default_factory=list)
    metric: dict[str, Any] = field(default_factory=lambda: dict(ACCURACY_METRIC))
    final_train_loss: float | None = None
    peak_rss_mb: float | None = None
    #: MB of parameters / gradients / optimizer state (and their total) on the largest rank, mean over repeats
    memory_mb: dict[str, float] = field(default_factory=dict)
    wall_seconds: float | None = None
    efficiency: float | None = None  # scaling efficiency against the same arm at np=1


def _mean(xs: Iterable[Any]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


def aggregate(results: dict[str, Any], confidence: float = CONFIDENCE) -> list[Group]:
    """One :class:`Group` per (arm, np), arms in the given order, np ascending (unpaired figures)."""
    runs = results.get("runs", [])
    groups: list[Group] = []
    for s in arm_order(results):
        for n in np_order(results):
            rs = [r for r in runs if arm_of(r) == s and int(r["np"]) == n]
            if not rs:
                continue
            ok = [r for r in rs if r.get("status") == "ok"]
            g = Group(s, n, len(rs), len(ok), strategy=str(rs[0]["strategy"]), knobs=dict(rs[0].get("knobs") or {}))
            g.throughputs = [float(r["samples_per_sec"]) for r in ok if r.get("samples_per_sec") is not None]
            g.samples_per_sec = mean_ci(g.throughputs, confidence)
            g.step_ms_median = _mean((r.get("step_ms") or {}).get("median") for r in ok)
            g.step_ms_p95 = _mean((r.get("step_ms") or {}).get("p95") for r in ok)
            for p in PHASES:
                v = _mean((r.get("phases_ms") or {}).get(p) for r in ok)
                if v is not None:
                    g.phases_ms[p] = v
            g.accuracies = [v for r in ok if (v := final_metric(r)) is not None]
            g.metric = metric_of(ok)
            g.accuracy = mean_ci(g.accuracies, confidence)
            g.final_train_loss = _mean(r.get("final_train_loss") for r in ok)
            rss = [float(r["peak_rss_mb"]) for r in ok if r.get("peak_rss_mb") is not None]
            g.peak_rss_mb = max(rss) if rss else None
            for k in MEMORY_KINDS:
                v = _mean((r.get("memory_mb") or {}).get(k) for r in ok)
                if v is not None:
                    g.memory_mb[k] = v
            g.wall_seconds = _mean(r.get("wall_seconds") for r in ok)
            groups.append(g)
    for g in groups:
        one = find(groups, g.arm, 1)
        if one and one.samples_per_sec and g.samples_per_sec:
            g.efficiency = scaling_efficiency(g.samples_per_sec.mean, g.np, one.samples_per_sec.mean)
    return groups


def find(groups: Sequence[Group], arm: str, np_: int) -> Group | None:
    return next((g for g in groups if g.arm == arm and g.np == np_), None)


def measured_share(results: dict[str, Any]) -> float | None:
    """Share of the runs' wall time (launcher start-up included) spent in timed steps."""
    ok = [r for r in results.get("runs", []) if r.get("status") == "ok" and r.get("measured_seconds")]
    wall = sum(float(r.get("wall_seconds") or 0.0) for r in ok)
    return sum(float(r["measured_seconds"]) for r in ok) / wall if wall > 0 else None


def launch_note(results: dict[str, Any]) -> str:
    """How the comparison started its runs (``compare --workers``), in a sentence's words."""
    if (results.get("config") or {}).get("workers") == "persistent":
        return ("runs ran one after another in a persistent job per process count (started once; each run builds "
                "its data, model and optimizer and joins and leaves its strategy's process group itself), so "
                "the interval counts each two neighbouring blocks as one unit")
    return "every run was a job of its own (a fresh launch)"


def unit_blocks(results: dict[str, Any]) -> int:
    """Blocks per independent unit of the throughput interval: 2 when persistent workers ran the blocks.

    A persistent worker runs the blocks seconds apart, and neighbouring blocks share the machine's state:
    their log ratios correlated (lag-1 Spearman 0.07–0.42 in 6 of 7 measured comparisons), which an
    interval for independent blocks does not see. Each two neighbouring blocks (one in each order) then
    count as one unit: batch means of two.
    """
    return 2 if (results.get("config") or {}).get("workers") == "persistent" else 1



def paired_blocks(results: dict[str, Any], baseline: str, other: str, np_: int,
                  statistic: Any = run_throughput) -> tuple[list[int], list[float], list[float]]:
    """Repeats where both arms succeeded at ``np_``, with each arm's per-run statistic."""
    per: dict[str, dict[int, float]] = {baseline: {}, other: {}}
    for r in results.get("runs", []):
        a = arm_of(r)
        if a in per and int(r["np"]) == np_ and r.get("status") == "ok" and (v := statistic(r)):
            per[a][int(r["repeat"])] = float(v)
    reps = sorted(set(per[baseline]) & set(per[other]))
    return reps, [per[baseline][k] for k in reps], [per[other][k] for k in reps]


# -- axes (compare --sweep link=..., --fault, --sweep threads=...: compare/axes.py) -------------------------------
#: how arms pair along an axis: verdicts per value, or against the twin without the value
WITHIN, TWIN = "within", "twin"
_LINK_NOTE = ("Emulated hosts (network namespaces) joined by tbf-shaped links; the unshaped veth ('unlimited') is "
              "CPU-bound, not a fast NIC.")
#: results.json from before arms recorded their axes apart (``arms[].axes``): the link and the fault were kept
#: under ``knobs``, and the report paired them so
OLD_AXES = {LINK: {"pairs": WITHIN, "words": "on {value}", "title": "link rate", "note": _LINK_NOTE},
            FAULT: {"pairs": TWIN, "words": "with {name}={value}", "title": FAULT}}


def recorded_axes(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Axis name → how its arms pair (``pairs``), how a verdict says its value (``words``), its ``title`` and
    its ``values`` in order, as compare recorded them (``config.axes``); older results: the link and the fault."""
    cfg = results.get("config") or {}
    if "axes" in cfg:
        return {n: dict(d) for n, d in (cfg["axes"] or {}).items()}
    values = _old_axes(results)
    return {n: {**d, "values": list(dict.fromkeys(v[n] for v in values.values() if n in v))}
            for n, d in OLD_AXES.items() if any(n in v for v in values.values())}


def _old_axes(results: dict[str, Any]) -> dict[str, dict[str, str]]:
    arms = (results.get("config") or {}).get("arms") or []
    return {a["label"]: {k: str(v) for k, v in (a.get("knobs") or {}).items() if k in OLD_AXES} for a in arms}


def arm_axes(results: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Arm label → its value of each axis (``config.arms[].axes``; older results: link and fault in ``knobs``)."""
    arms = (results.get("config") or {}).get("arms") or []
    if "axes" in (results.get("config") or {}):
        return {a["label"]: {k: str(v) for k, v in (a.get("axes") or {}).items()} for a in arms}
    return _old_axes(results)


def arm_base(results: dict[str, Any], label: str) -> str:
    """The arm's label before its axes were added to it (``ddp/batch_size=8,link=1gbit`` → ``ddp/batch_size=8``)."""
    arm = next((a for a in (results.get("config") or {}).get("arms") or [] if a["label"] == label), {})
    if "base" in arm or "axes" in (results.get("config") or {}):
        return str(arm.get("base") or label)
    for name in OLD_AXES:  # older results: the pieces NAME=VALUE the plan added to the label, taken off
        label = re.sub(rf"([/,]){name}=[^,/]*,", r"\1", re.sub(rf"[/,]{name}=[^,/]*$", "", label))
    return label


def valued(results: dict[str, Any], axis: str) -> dict[str, str]:
    """Arm label → its value of ``axis``, for the arms that have one."""
    return {a: v[axis] for a, v in arm_axes(results).items() if axis in v}


def twins(results: dict[str, Any], axis: str) -> dict[str, str]:
    """Arm label → its twin without ``axis``: the arm of the same base with the same other values."""
    axes = arm_axes(results)
    key = {a: (arm_base(results, a), tuple(sorted((k, v) for k, v in vals.items() if k != axis)))
           for a, vals in axes.items()}
    plain = {key[a]: a for a, vals in axes.items() if axis not in vals}
    return {a: plain[key[a]] for a, vals in axes.items() if axis in vals and key[a] in plain}


def shown_without(results: dict[str, Any], label: str, names: Iterable[str]) -> str:
    """The arm's label without its values of axes ``names`` (its base, then its other values)."""
    rest = [f"{k}={v}" for k, v in arm_axes(results).get(label, {}).items() if k not in set(names)]
    base = arm_base(results, label)
    return base + (("," if "/" in base else "/") + ",".join(rest) if rest else "")


def arm_pairs(results: dict[str, Any]) -> Iterator[tuple[int, str, str]]:
    """``(np, baseline, other)``: every arm after the first against the first (the baseline), np ascending;
    along an axis whose arms pair within a value (a link sweep): every arm at that value against the first arm
    at it. Arms at a value of a twin axis (``--fault``) are left out: their report compares them with their
    twins without it.

    The one pairing every verdict (throughput, accuracy, time to accuracy) iterates over.
    """
    kinds, axes = {n: d.get("pairs") for n, d in recorded_axes(results).items()}, arm_axes(results)
    by_value: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for a in arm_order(results):
        vals = axes.get(a, {})
        if any(kinds.get(k) == TWIN for k in vals):
            continue
        by_value.setdefault(tuple(sorted((k, v) for k, v in vals.items() if kinds.get(k) == WITHIN)), []).append(a)
    for n in np_order(results):
        for same in by_value.values():
            for other in same[1:]:
                yield n, same[0], other


def phase_shifts(groups: Sequence[Group], arm: str) -> dict[int, dict[str, float]]:
    """Per np > 1: how much each phase's time per step grew against the same arm at np=1 (ms)."""
    one = find(groups, arm, 1)
    if one is None or not one.phases_ms:
        return {}
    return {g.np: {p: g.phases_ms[p] - one.phases_ms.get(p, 0.0) for p in g.phases_ms}
            for g in groups if g.arm == arm and g.np > 1 and g.phases_ms}


def per_seed(results: dict[str, Any], arm: str, np_: int, key: str) -> dict[int, float]:
    """Seed → the mean of ``key`` over the arm's ok runs at ``np_`` with that seed (repeats of a seed averaged)."""
    vals: dict[int, list[float]] = {}
    for r in results.get("runs", []):
        if arm_of(r) == arm and int(r["np"]) == np_ and r.get("status") == "ok" and r.get(key) is not None \
                and r.get("seed") is not None:
            vals.setdefault(int(r["seed"]), []).append(float(r[key]))
    return {k: statistics.fmean(v) for k, v in vals.items()}


def exact_by_construction(results: dict[str, Any]) -> bool:
    """Every arm trains the same model bit for bit: they differ only in strategy and exact knobs."""
    arms = (results.get("config") or {}).get("arms") or []
    return bool(arms) and exact_equivalents([dict(a.get("knobs") or {}) for a in arms])


def tta_target(results: dict[str, Any]) -> float | None:
    t = ((results.get("config") or {}).get("train") or {}).get("target_accuracy")
    if not t:
        t = next((r.get("target_accuracy") for r in results.get("runs", []) if r.get("target_accuracy")), None)
    return float(t) if t else None

