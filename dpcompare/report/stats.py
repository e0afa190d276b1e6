"""Statistics of a comparison: per-arm aggregates, and paired verdicts with calibrated intervals.

Pure functions on plain data (the ``runs`` of results.json); no I/O, no plotting; distributions come
from :mod:`scipy.stats`.

The verdict rests on a *paired* design. A repeat is a block that runs every arm once, next to each
other in time, so the slow drift of a shared machine hits both arms of a block alike. The per-run
statistic is throughput from the slowest rank's median step time (global batch ÷ median step), which
ignores the odd slow step; the effect in a block is the log of the ratio other ÷ baseline; the
verdict is the mean over blocks with a 95 % interval (Student t on the log ratios, BCa bootstrap once
there are :data:`BOOTSTRAP_MIN_BLOCKS` blocks), turned back into a ratio. Unpaired per-arm figures
(mean ± t-interval over repeats) remain for the table.

*faster*/*slower* need the 95 % interval to exclude no difference (a two-sided test at 5 %). *equal*
is an equivalence test: two one-sided tests at 5 % (Schuirmann's TOST), i.e. the 90 % interval lies
inside ±equivalence. Each claim is then wrong at most 5 % of the time; asking the 95 % interval to fit
inside the margin would test equivalence at 2.5 % and need about a third more blocks for nothing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats as sps

from dpcompare.files import PHASES

CONFIDENCE = 0.95


def equivalence_confidence(confidence: float = CONFIDENCE) -> float:
    """The interval of two one-sided tests at the level of a two-sided ``confidence`` interval: 0.95 → 0.90."""
    return 1.0 - 2.0 * (1.0 - confidence)


#: default equivalence margin: two arms whose throughput ratio lies inside 1 ± this are "equal"
EQUIVALENCE = 0.05
#: from this many blocks on the verdict's interval is a BCa bootstrap of the mean log ratio
BOOTSTRAP_MIN_BLOCKS = 10
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 0  # fixed: the same results.json always renders the same verdict
OUTCOMES = ("faster", "slower", "equal", "undecided")


# -- intervals ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    """A mean with its confidence interval; ``lo``/``hi`` are None when there is no CI (fewer than 2 values)."""

    mean: float
    lo: float | None
    hi: float | None
    n: int

    @property
    def has_ci(self) -> bool:
        return self.lo is not None and self.hi is not None

    @property
    def half_width(self) -> float | None:
        return (self.hi - self.lo) / 2.0 if self.has_ci else None  # type: ignore[operator]

    def spans_zero(self) -> bool:
        return self.has_ci and self.lo <= 0.0 <= self.hi  # type: ignore[operator]


def t_half_width(sd: float, n: int | np.ndarray, confidence: float = CONFIDENCE) -> Any:
    """Half-width of the two-sided Student-t interval of a mean of ``n`` values with spread ``sd``."""
    return sps.t.ppf(0.5 + confidence / 2.0, np.asarray(n) - 1) * sd / np.sqrt(n)


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """Mean and two-sided t-interval of ``values``; no CI with one value, None with none."""
    xs = [float(v) for v in values]
    if not xs:
        return None
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return Interval(m, None, None, len(xs))
    half = float(t_half_width(statistics.stdev(xs), len(xs), confidence))
    return Interval(m, m - half, m + half, len(xs))


def welch_diff_ci(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """mean(b) − mean(a) with Welch's t-interval (unequal variances); no CI unless both have ≥ 2 values."""
    if not a or not b:
        return None
    d = statistics.fmean(b) - statistics.fmean(a)
    n = min(len(a), len(b))
    if len(a) < 2 or len(b) < 2:
        return Interval(d, None, None, n)
    if statistics.variance(a) == 0.0 and statistics.variance(b) == 0.0:  # no spread: the difference is exact
        return Interval(d, d, d, n)
    ci = sps.ttest_ind(b, a, equal_var=False).confidence_interval(confidence)
    return Interval(d, float(ci.low), float(ci.high), n)


def paired_log_ratio_ci(baseline: Sequence[float], other: Sequence[float],
                        confidence: float = CONFIDENCE) -> tuple[Interval | None, str]:
    """Mean of log(other/baseline) over paired blocks with its interval, and the method that made it.

    Student t below :data:`BOOTSTRAP_MIN_BLOCKS` blocks, a seeded BCa bootstrap of the mean from there
    on; no CI with one block; exact when every block has the same ratio.
    """
    d = np.log(np.asarray(other, dtype=float) / np.asarray(baseline, dtype=float))
    if d.size == 0:
        return None, "none"
    m = float(d.mean())
    if d.size < 2:
        return Interval(m, None, None, 1), "none"
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return Interval(m, m, m, int(d.size)), "exact"
    if d.size < BOOTSTRAP_MIN_BLOCKS:
        h = float(t_half_width(sd, d.size, confidence))
        return Interval(m, m - h, m + h, int(d.size)), "t"
    res = sps.bootstrap((d,), np.mean, confidence_level=confidence, method="BCa", n_resamples=BOOTSTRAP_RESAMPLES,
                        rng=np.random.default_rng(BOOTSTRAP_SEED))
    return Interval(m, float(res.confidence_interval.low), float(res.confidence_interval.high), int(d.size)), "bootstrap"


def blocks_needed(log_ratios: Sequence[float], equivalence: float = EQUIVALENCE, confidence: float = CONFIDENCE,
                  limit: int = 10_000) -> int | None:
    """About how many blocks in all would decide, if the spread and the mean stayed as observed.

    Deciding means the ``confidence`` interval leaves 0 (half-width < |mean|) or the equivalence test's
    interval fits inside ±equivalence; whichever needs fewer blocks. None with fewer than 2 blocks (no
    spread known) or beyond ``limit``.
    """
    d = np.asarray(log_ratios, dtype=float)
    if d.size < 2:
        return None
    m, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        return int(d.size)
    inside = min(math.log1p(equivalence) - m, m - math.log1p(-equivalence))
    ns = np.arange(2, limit + 1)
    ok = np.nonzero((t_half_width(sd, ns, confidence) < abs(m))
                    | (t_half_width(sd, ns, equivalence_confidence(confidence)) < inside))[0]
    return int(ns[ok[0]]) if ok.size else None


def unit_blocks(results: dict[str, Any]) -> int:
    """Blocks per independent unit of the throughput interval: 2 when persistent workers ran the blocks.

    A persistent worker runs the blocks seconds apart, and neighbouring blocks share the machine's state:
    their log ratios correlated (lag-1 Spearman 0.07–0.42 in 6 of 7 measured comparisons), which an
    interval for independent blocks does not see. Each two neighbouring blocks (one in each order) then
    count as one unit: batch means of two.
    """
    return 2 if (results.get("config") or {}).get("workers") == "persistent" else 1


def unit_means(values: Sequence[float], size: int) -> list[float]:
    """Means of ``values`` over consecutive units of ``size`` (an odd remainder joins the last unit)."""
    if size <= 1:
        return [float(v) for v in values]
    cuts = list(range(0, len(values) - size + 1, size)) or [0]
    return [float(np.mean(values[a:b])) for a, b in zip(cuts, [*cuts[1:], len(values)], strict=True)]


def scaling_efficiency(throughput_np: float, np_: int, throughput_1: float) -> float:
    """throughput(np) / (np · throughput(1)): 1.0 is perfect linear scaling."""
    return throughput_np / (np_ * throughput_1) if throughput_1 > 0 and np_ > 0 else float("nan")


# -- runs and arms -----------------------------------------------------------------------------------
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


MEMORY_KINDS = ("params", "grads", "optimizer_state", "total")
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
    accuracy: Interval | None = None
    accuracies: list[float] = field(default_factory=list)
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
            g.accuracies = [float(r["final_test_accuracy"]) for r in ok if r.get("final_test_accuracy") is not None]
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


# -- verdicts ----------------------------------------------------------------------------------------
def _pct(x: float, signed: bool = False, digits: int | None = None) -> str:
    v = round(100.0 * x, 9)
    digits = (0 if abs(v) >= 10 else 1) if digits is None else digits
    return f"{v:+.{digits}f}".replace("-", "−") if signed else f"{v:.{digits}f}"


def accuracy_verdict(other: str, baseline: str, base_acc: Sequence[float], other_acc: Sequence[float],
                     confidence: float = CONFIDENCE) -> str:
    """Test accuracy: identical, equal within noise (Welch CI spans 0), or the difference stated."""
    if not base_acc or not other_acc:
        return "test accuracy not compared"
    if len(set(base_acc) | set(other_acc)) == 1:
        return f"test accuracy identical ({100 * base_acc[0]:.2f} %)"
    d = welch_diff_ci(base_acc, other_acc, confidence)
    assert d is not None
    if d.spans_zero():
        return "test accuracy equal within noise"
    ma, mb = statistics.fmean(base_acc), statistics.fmean(other_acc)
    word = "higher" if d.mean > 0 else "lower"
    tail = "" if d.has_ci else f"; {min(len(base_acc), len(other_acc))} repeat: spread unknown"
    return (f"test accuracy {100 * abs(d.mean):.2f} points {word} for {other} "
            f"({100 * mb:.2f} % vs {100 * ma:.2f} %{tail})")


@dataclass
class Verdict:
    """The paired throughput verdict of ``other`` against ``baseline`` at one np (results.json ``verdicts``)."""

    np: int
    baseline: str
    other: str
    outcome: str  # one of OUTCOMES
    ratio: float | None  # other's throughput / baseline's (geometric mean over blocks)
    ci_low: float | None
    ci_high: float | None
    blocks: int
    text: str  # the throughput verdict in words
    accuracy: str = ""
    method: str = "none"  # t, bootstrap, exact, none
    block_ratios: list[float] = field(default_factory=list)
    block_repeats: list[int] = field(default_factory=list)
    samples_per_sec_ratio: float | None = None  # the same, from each run's samples/s (timed steps ÷ seconds)
    blocks_needed: int | None = None  # undecided: about how many blocks in all would decide
    equivalence: float = EQUIVALENCE
    #: the equivalence test's interval (90 % for a 95 % verdict) on the same scale as ci_low/ci_high
    equivalence_ci: tuple[float, float] | None = None
    metric: str = "throughput"  # throughput, accuracy or time_to_accuracy (METRICS)
    extra: dict[str, Any] = field(default_factory=dict)  # the metric's own fields in results.json
    unit_blocks: int = 1  # blocks per unit of the interval (2: persistent workers, see unit_blocks())

    @property
    def unit_log_ratios(self) -> list[float]:
        """The log ratios the interval is built on: per block, or per unit of neighbouring blocks."""
        return unit_means([math.log(x) for x in self.block_ratios], self.unit_blocks)

    @property
    def half_width(self) -> float | None:
        """Half the interval's width, as a fraction of the ratio (0.05: ±5 %)."""
        return None if self.ci_low is None or self.ci_high is None else (self.ci_high - self.ci_low) / 2.0

    @property
    def full_text(self) -> str:
        return self.text + (f"; {self.accuracy}" if self.accuracy else "")

    def to_json(self) -> dict[str, Any]:
        r = lambda v: None if v is None else round(v, 6)  # noqa: E731
        eq_ci = None if self.equivalence_ci is None else [r(x) for x in self.equivalence_ci]
        if self.metric != "throughput":
            return {"np": self.np, "baseline": self.baseline, "other": self.other, "metric": self.metric,
                    "outcome": self.outcome, "text": self.full_text, "ci_low": r(self.ci_low), "ci_high": r(self.ci_high),
                    "blocks": self.blocks, "method": self.method, "equivalence": self.equivalence,
                    "equivalence_ci": eq_ci, **self.extra}
        return {"np": self.np, "baseline": self.baseline, "other": self.other, "metric": "throughput",
                "ratio": r(self.ratio), "ci_low": r(self.ci_low), "ci_high": r(self.ci_high), "blocks": self.blocks,
                "outcome": self.outcome, "text": self.full_text, "method": self.method,
                "equivalence": self.equivalence, "equivalence_ci": eq_ci,
                "block_ratios": [r(x) for x in self.block_ratios], "unit_blocks": self.unit_blocks,
                "samples_per_sec_ratio": r(self.samples_per_sec_ratio), "blocks_needed": self.blocks_needed}


def decide(lo: float, hi: float, equivalence: float, eq_ci: tuple[float, float] | None = None) -> str:
    """equal when the equivalence test's ratio interval ``eq_ci`` (default: ``lo``, ``hi``) lies inside
    1 ± equivalence; else faster/slower when the interval lo … hi leaves 1."""
    elo, ehi = eq_ci or (lo, hi)
    if 1.0 - equivalence <= elo and ehi <= 1.0 + equivalence:
        return "equal"
    if lo > 1.0:
        return "faster"
    if hi < 1.0:
        return "slower"
    return "undecided"


def throughput_verdict(other: str, baseline: str, np_: int, log_iv: Interval | None, equivalence: float = EQUIVALENCE,
                       needed: int | None = None, confidence: float = CONFIDENCE,
                       log_eq_iv: Interval | None = None, blocks: int | None = None) -> tuple[str, str]:
    """(outcome, words) for a paired interval on the mean log ratio other/baseline; ``log_eq_iv`` is the
    equivalence test's interval (the 90 % one for a 95 % verdict), by default the same interval. ``blocks``:
    how many blocks ran (default: the interval's count), against which ``needed`` blocks are weighed."""
    conf = f"{100 * confidence:g} % CI"
    if log_iv is None:
        return "undecided", f"{other} vs {baseline} at np={np_}: no comparison (no block where both succeeded)"
    ratio = math.exp(log_iv.mean)
    if not log_iv.has_ci:
        return "undecided", (f"{other} vs {baseline} at np={np_} undecided: {_pct(ratio - 1, True)} % from 1 block, "
                             "no interval; run at least 3 repeats")
    lo, hi = math.exp(log_iv.lo), math.exp(log_iv.hi)  # type: ignore[arg-type]
    eq_ci = _ratio_ci(log_eq_iv)
    outcome = decide(lo, hi, equivalence, eq_ci)
    dg = 1 if hi - lo < 0.1 else 0  # one decimal for the whole verdict when the interval is narrower than 10 %
    if outcome == "faster":
        return outcome, (f"{other} {_pct(ratio - 1, digits=dg)} % faster than {baseline} at np={np_} "
                         f"({conf} {_pct(lo - 1, digits=dg)}–{_pct(hi - 1, digits=dg)} %)")
    if outcome == "slower":
        return outcome, (f"{other} {_pct(1 - ratio, digits=dg)} % slower than {baseline} at np={np_} "
                         f"({conf} {_pct(1 - hi, digits=dg)}–{_pct(1 - lo, digits=dg)} %)")
    # from 2 or 3 blocks an interval can reach absurd sizes (t with 1 degree of freedom is 12.7): cap the words
    span = f"{_pct(lo - 1, True, dg)} … {_pct(hi - 1, True, dg) if hi < 10.0 else 'over +900'} %"
    if outcome == "equal":
        elo, ehi = eq_ci or (lo, hi)
        how = (f"{100 * equivalence_confidence(confidence):g} % CI", ": two one-sided tests") if eq_ci else (conf, "")
        return outcome, (f"{other} equal to {baseline} within ±{_pct(equivalence)} % at np={np_} "
                         f"({_pct(ratio - 1, True, 1)} %, {how[0]} {_pct(elo - 1, True, 1)} … "
                         f"{_pct(ehi - 1, True, 1)} %{how[1]})")
    have = log_iv.n if blocks is None else blocks
    more = ("needs more repeats than is practical: quiet the machine or time more steps per run" if needed is None
            else f"needs about {max(needed - have, 1)} more repeat{'s' if needed - have > 1 else ''}")
    return outcome, f"{other} vs {baseline} at np={np_} undecided: interval {span}, {more}"


def _ratio_ci(log_iv: Interval | None) -> tuple[float, float] | None:
    return (math.exp(log_iv.lo), math.exp(log_iv.hi)) if log_iv is not None and log_iv.has_ci else None  # type: ignore[arg-type]


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


def verdicts(results: dict[str, Any], groups: Sequence[Group] | None = None, equivalence: float | None = None,
             confidence: float = CONFIDENCE, accuracy_equivalence: float | None = None) -> list[Verdict]:
    """Every arm after the first against the first (the baseline), at every np both ran: paired over blocks.

    Throughput verdicts always; with --seeds also accuracy verdicts, and with --target-accuracy
    time-to-accuracy verdicts (see :func:`accuracy_verdicts`).
    """
    out = throughput_verdicts(results, groups, equivalence, confidence)
    return [*out, *accuracy_verdicts(results, accuracy_equivalence, confidence),
            *time_to_accuracy_verdicts(results, equivalence, confidence)]


def throughput_verdicts(results: dict[str, Any], groups: Sequence[Group] | None = None,
                        equivalence: float | None = None, confidence: float = CONFIDENCE) -> list[Verdict]:
    """The paired throughput verdicts (results.json ``verdicts`` with metric ``throughput``)."""
    arms = arm_order(results)
    if len(arms) < 2:
        return []
    groups = aggregate(results, confidence) if groups is None else groups
    eq = float(equivalence if equivalence is not None
               else (results.get("config") or {}).get("equivalence", EQUIVALENCE))
    base = arms[0]
    unit = unit_blocks(results)
    seeded = bool((results.get("config") or {}).get("seeds"))  # accuracy gets verdicts of its own over seeds
    out: list[Verdict] = []
    for n in np_order(results):
        b = find(groups, base, n)
        for s in arms[1:]:
            o = find(groups, s, n)
            if b is None or o is None:
                continue
            reps, xb, xo = paired_blocks(results, base, s, n)
            if not reps:
                failed = ", ".join(f"{g.arm}: {g.ok} of {g.runs} runs succeeded" for g in (b, o) if not g.ok)
                out.append(Verdict(n, base, s, "undecided", None, None, None, 0, equivalence=eq,
                                   text=f"{s} vs {base} at np={n}: no comparison ({failed or 'no common repeat'})"))
                continue
            # per unit (one block, or two neighbouring ones: unit_blocks): the geometric mean of each arm
            ub, uo = (np.exp(unit_means(np.log(x).tolist(), unit)).tolist() for x in (np.asarray(xb), np.asarray(xo)))
            log_iv, method = paired_log_ratio_ci(ub, uo, confidence)
            log_eq_iv, _ = paired_log_ratio_ci(ub, uo, equivalence_confidence(confidence))
            needed_units = blocks_needed([math.log(y / x) for x, y in zip(ub, uo, strict=True)], eq, confidence)
            needed = None if needed_units is None else needed_units * unit
            outcome, text = throughput_verdict(s, base, n, log_iv, eq, needed, confidence, log_eq_iv, len(reps))
            _, sb, so = paired_blocks(results, base, s, n, statistic=lambda r: r.get("samples_per_sec"))
            sps_ratio = math.exp(statistics.fmean(math.log(y / x) for x, y in zip(sb, so, strict=True))) if sb else None
            assert log_iv is not None
            v = Verdict(n, base, s, outcome, math.exp(log_iv.mean),
                        math.exp(log_iv.lo) if log_iv.has_ci else None,  # type: ignore[arg-type]
                        math.exp(log_iv.hi) if log_iv.has_ci else None,  # type: ignore[arg-type]
                        len(reps), text, "" if seeded else accuracy_verdict(s, base, b.accuracies, o.accuracies,
                                                                             confidence),
                        method, [y / x for x, y in zip(xb, xo, strict=True)], reps, sps_ratio,
                        needed if outcome == "undecided" else None, eq, _ratio_ci(log_eq_iv), unit_blocks=unit)
            out.append(v)
    return out


def phase_shifts(groups: Sequence[Group], arm: str) -> dict[int, dict[str, float]]:
    """Per np > 1: how much each phase's time per step grew against the same arm at np=1 (ms)."""
    one = find(groups, arm, 1)
    if one is None or not one.phases_ms:
        return {}
    return {g.np: {p: g.phases_ms[p] - one.phases_ms.get(p, 0.0) for p in g.phases_ms}
            for g in groups if g.arm == arm and g.np > 1 and g.phases_ms}


# -- accuracy and time to accuracy (--seeds, --target-accuracy) ---------------------------------------
METRICS = ("throughput", "accuracy", "time_to_accuracy")
#: default margin of the accuracy verdict: a difference inside ±0.5 percentage points is "equal"
ACCURACY_EQUIVALENCE = 0.005
ACCURACY_OUTCOMES = ("higher", "lower", "equal", "undecided", "mismatch")


def paired_diff_ci(baseline: Sequence[float], other: Sequence[float],
                   confidence: float = CONFIDENCE) -> Interval | None:
    """Mean of other − baseline over pairs with its two-sided Student-t interval (scipy's one-sample t test);
    no CI with one pair, exact (zero width) when every pair differs by the same amount."""
    d = np.asarray(other, dtype=float) - np.asarray(baseline, dtype=float)
    if d.size == 0:
        return None
    m = float(d.mean())
    if d.size < 2:
        return Interval(m, None, None, 1)
    if float(d.std(ddof=1)) == 0.0:
        return Interval(m, m, m, int(d.size))
    ci = sps.ttest_1samp(d, 0.0).confidence_interval(confidence)
    return Interval(m, float(ci.low), float(ci.high), int(d.size))


def decide_difference(iv: Interval, equivalence: float, eq_iv: Interval | None = None) -> str:
    """equal when the equivalence test's interval ``eq_iv`` (default ``iv``) lies inside ±equivalence;
    higher/lower when ``iv`` leaves 0; else undecided."""
    if not iv.has_ci:
        return "undecided"
    e = eq_iv if eq_iv is not None and eq_iv.has_ci else iv
    if -equivalence <= e.lo and e.hi <= equivalence:  # type: ignore[operator]
        return "equal"
    if iv.lo > 0.0:  # type: ignore[operator]
        return "higher"
    if iv.hi < 0.0:  # type: ignore[operator]
        return "lower"
    return "undecided"


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
    from dpcompare.knobs import exact_equivalents

    arms = (results.get("config") or {}).get("arms") or []
    return bool(arms) and exact_equivalents([dict(a.get("knobs") or {}) for a in arms])


def _points(x: float, signed: bool = True) -> str:
    v = round(100.0 * x, 9)
    return (f"{v:+.2f}" if signed else f"{v:.2f}").replace("-", "−")


def accuracy_verdicts(results: dict[str, Any], equivalence: float | None = None,
                      confidence: float = CONFIDENCE) -> list[Verdict]:
    """Per np, every arm against the baseline: the paired difference of final test accuracy (and of final
    train loss) over seeds with a t interval. Only for comparisons run with --seeds."""
    cfg = results.get("config") or {}
    if not cfg.get("seeds"):
        return []
    eq = float(equivalence if equivalence is not None else cfg.get("accuracy_equivalence", ACCURACY_EQUIVALENCE))
    arms = arm_order(results)
    exact = exact_by_construction(results)
    out: list[Verdict] = []
    for n in np_order(results):
        base = per_seed(results, arms[0], n, "final_test_accuracy")
        base_loss = per_seed(results, arms[0], n, "final_train_loss")
        for s in arms[1:]:
            oth = per_seed(results, s, n, "final_test_accuracy")
            oth_loss = per_seed(results, s, n, "final_train_loss")
            seeds = sorted(set(base) & set(oth))
            head = f"test accuracy of {s} vs {arms[0]} at np={n}"
            if not seeds:
                if base or oth:
                    out.append(Verdict(n, arms[0], s, "undecided", None, None, None, 0, f"{head}: no seed where "
                                       "both succeeded", metric="accuracy", equivalence=eq))
                continue
            xb, xo = [base[k] for k in seeds], [oth[k] for k in seeds]
            iv = paired_diff_ci(xb, xo, confidence)
            eq_iv = paired_diff_ci(xb, xo, equivalence_confidence(confidence))
            assert iv is not None and eq_iv is not None
            lseeds = sorted(set(base_loss) & set(oth_loss))
            liv = paired_diff_ci([base_loss[k] for k in lseeds], [oth_loss[k] for k in lseeds], confidence)
            diffs = [o - b for b, o in zip(xb, xo, strict=True)]
            ns = f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}"
            conf = f"{100 * confidence:g} % CI"
            span = ("" if not iv.has_ci else f" ({conf} {_points(iv.lo)} … {_points(iv.hi)} points)")  # type: ignore[arg-type]
            loss = ("" if liv is None else f"; final train loss {liv.mean:+.2g}".replace("-", "−")
                    + ("" if not liv.has_ci or liv.lo == liv.hi else
                       f" ({conf} {liv.lo:+.2g} … {liv.hi:+.2g})".replace("-", "−")))  # type: ignore[str-format]
            if exact and all(d == 0.0 for d in diffs) and (liv is None or liv.mean == 0.0 and liv.lo in (None, 0.0)):
                outcome = "equal"
                text = (f"{head}: difference 0.00 points for every seed ({ns}; mean {100 * statistics.fmean(xb):.2f} "
                        "%) — zero by construction: the arms differ only in how the same gradient average is "
                        "exchanged, and checked: identical test accuracy and train loss")
            elif exact:
                outcome = "mismatch"
                text = (f"NOT IDENTICAL: {head} should be exactly equal (the arms differ only in how the same "
                        f"gradient average is exchanged) but differs by {_points(iv.mean)} points on average over "
                        f"{ns} (largest {_points(max(diffs, key=abs))}){loss}: the strategies did not compute the "
                        "same model (nondeterministic kernels, or a bug)")
            else:
                outcome = decide_difference(iv, eq, eq_iv)
                mean = f"{_points(iv.mean)} points ({100 * statistics.fmean(xo):.2f} % vs {100 * statistics.fmean(xb):.2f} %)"
                if outcome == "equal":
                    eq_span = (f" ({100 * equivalence_confidence(confidence):g} % CI {_points(eq_iv.lo)} … "  # type: ignore[arg-type]
                               f"{_points(eq_iv.hi)} points: two one-sided tests)")  # type: ignore[arg-type]
                    text = f"{head}: equal within ±{_points(eq, False)} points, {mean}{eq_span} over {ns}"
                elif outcome in ("higher", "lower"):
                    text = f"{head}: {outcome} by {mean}{span} over {ns}"
                else:
                    why = ("one seed, no interval: use --seeds 3 or more" if not iv.has_ci else
                           f"the interval is wider than ±{_points(eq, False)} points: more seeds would narrow it")
                    text = f"{head}: undecided, {mean}{span} over {ns}; {why}"
                text += loss
            out.append(Verdict(n, arms[0], s, outcome, None, iv.lo, iv.hi, len(seeds), text, metric="accuracy",
                               method="exact" if iv.has_ci and iv.lo == iv.hi else "t" if iv.has_ci else "none",
                               equivalence=eq, equivalence_ci=(eq_iv.lo, eq_iv.hi) if eq_iv.has_ci else None,  # type: ignore[arg-type]
                               extra={
                                   "difference": round(iv.mean, 6), "seeds": seeds, "exact_by_construction": exact,
                                   "seed_differences": [round(d, 6) for d in diffs],
                                   "train_loss_difference": None if liv is None else round(liv.mean, 6),
                                   "train_loss_ci": None if liv is None or not liv.has_ci else
                                   [round(liv.lo, 6), round(liv.hi, 6)]}))  # type: ignore[arg-type]
    return out


def tta_target(results: dict[str, Any]) -> float | None:
    t = ((results.get("config") or {}).get("train") or {}).get("target_accuracy")
    if not t:
        t = next((r.get("target_accuracy") for r in results.get("runs", []) if r.get("target_accuracy")), None)
    return float(t) if t else None


def time_to_accuracy_verdicts(results: dict[str, Any], equivalence: float | None = None,
                              confidence: float = CONFIDENCE) -> list[Verdict]:
    """Per np, every arm against the baseline: the paired ratio of training time until the test accuracy
    first reached the target (blocks where both reached it), and how many runs never did."""
    target = tta_target(results)
    if target is None:
        return []
    eq = float(equivalence if equivalence is not None
               else (results.get("config") or {}).get("equivalence", EQUIVALENCE))
    arms = arm_order(results)
    out: list[Verdict] = []
    tgt = f"{100 * target:g} % test accuracy"
    for n in np_order(results):
        oks = {a: [r for r in results.get("runs", []) if arm_of(r) == a and int(r["np"]) == n
                   and r.get("status") == "ok"] for a in arms}
        if not oks[arms[0]]:
            continue
        missed = {a: sum(r.get("time_to_accuracy_s") is None for r in rs) for a, rs in oks.items()}
        for s in arms[1:]:
            if not oks[s]:
                continue
            reps, xb, xo = paired_blocks(results, arms[0], s, n, statistic=lambda r: r.get("time_to_accuracy_s"))
            _, sb, so = paired_blocks(results, arms[0], s, n, statistic=lambda r: r.get("steps_to_accuracy"))
            never = "; ".join(f"{missed[a]} of {len(oks[a])} runs of {a} never reached it"
                              for a in (arms[0], s) if missed[a])
            never = f" ({never})" if never else " (every run reached it)"
            if not reps:
                out.append(Verdict(n, arms[0], s, "undecided", None, None, None, 0,
                                   f"time to {tgt}, {s} vs {arms[0]} at np={n}: no block where both reached it{never}",
                                   metric="time_to_accuracy", equivalence=eq,
                                   extra={"target_accuracy": target, "reached": _reached(oks, arms[0], s)}))
                continue
            # the speed ratio baseline time ÷ other time: > 1 means the other arm got there sooner
            log_iv, method = paired_log_ratio_ci(xo, xb, confidence)
            log_eq_iv, _ = paired_log_ratio_ci(xo, xb, equivalence_confidence(confidence))
            assert log_iv is not None
            speed = math.exp(log_iv.mean)
            # the time ratio other ÷ baseline is 1/speed: its equivalence interval, for the "equal" outcome
            eq_speed = _ratio_ci(log_eq_iv)
            eq_time = None if eq_speed is None else (1 / eq_speed[1], 1 / eq_speed[0])
            steps = (f"; steps to it: {statistics.fmean(so):.0f} vs {statistics.fmean(sb):.0f}" if sb and so else "")
            label = f"time to {tgt}"
            if not log_iv.has_ci:
                outcome, text = "undecided", (f"{label}: {s} {_pct(1 / speed - 1, True)} % vs {arms[0]} at np={n} "
                                              "from 1 block, no interval")
            else:
                lo, hi = math.exp(log_iv.lo), math.exp(log_iv.hi)  # type: ignore[arg-type]
                outcome = decide(lo, hi, eq, eq_speed)
                span = f"{_pct(1 / hi - 1, True, 1)} … {_pct(1 / lo - 1, True, 1)} %"
                if outcome == "faster":
                    text = f"{label}: {s} gets there {_pct(1 - 1 / speed, digits=1)} % sooner than {arms[0]} at np={n}"
                elif outcome == "slower":
                    text = f"{label}: {s} takes {_pct(1 / speed - 1, digits=1)} % longer than {arms[0]} at np={n}"
                elif outcome == "equal":
                    assert eq_time is not None
                    text = (f"{label}: {s} equal to {arms[0]} within ±{_pct(eq)} % at np={n} "
                            f"({100 * equivalence_confidence(confidence):g} % CI {_pct(eq_time[0] - 1, True, 1)} … "
                            f"{_pct(eq_time[1] - 1, True, 1)} %: two one-sided tests)")
                else:
                    text = f"{label}: {s} vs {arms[0]} at np={n} undecided"
                text += f" (time ratio {1 / speed:.3f}, {100 * confidence:g} % CI {span}, {len(reps)} blocks)"
            text += (f"{steps}{never}; training time only: start-up and evaluation excluded")
            out.append(Verdict(n, arms[0], s, outcome, 1 / speed,
                               None if not log_iv.has_ci else 1 / math.exp(log_iv.hi),  # type: ignore[arg-type]
                               None if not log_iv.has_ci else 1 / math.exp(log_iv.lo),  # type: ignore[arg-type]
                               len(reps), text, method=method, metric="time_to_accuracy", equivalence=eq,
                               equivalence_ci=eq_time, extra={"target_accuracy": target, "ratio": round(1 / speed, 6),
                                      "block_ratios": [round(o / b, 6) for b, o in zip(xb, xo, strict=True)],
                                      "reached": _reached(oks, arms[0], s),
                                      "mean_seconds": {arms[0]: round(statistics.fmean(xb), 6),
                                                       s: round(statistics.fmean(xo), 6)}}))
    return out


def _reached(oks: dict[str, list[dict[str, Any]]], *arms: str) -> dict[str, list[int]]:
    """Per arm: [runs that reached the target, ok runs]."""
    return {a: [sum(r.get("time_to_accuracy_s") is not None for r in oks[a]), len(oks[a])] for a in arms}
