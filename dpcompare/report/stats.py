"""Statistics of a comparison: confidence intervals, per-configuration aggregates and verdicts.

Pure functions on plain data (the ``runs`` of results.json); no I/O, no plotting. Intervals are
Student-t intervals over repeats; the relative difference of two strategies uses Welch's t-interval
on the difference of mean throughputs, divided by the baseline's mean (the baseline mean's own
uncertainty is left out of the denominator, a small effect next to the difference's).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpcompare.files import PHASES

CONFIDENCE = 0.95


# -- Student t ---------------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` (possibly fractional) degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (e.g. p=0.975 for a two-sided 95 % interval)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0 (got p={p}, df={df})")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


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


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """Mean and two-sided t-interval of ``values``; no CI with one value, None with none."""
    xs = [float(v) for v in values]
    if not xs:
        return None
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return Interval(m, None, None, len(xs))
    half = t_quantile(0.5 + confidence / 2.0, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return Interval(m, m - half, m + half, len(xs))


def welch_diff_ci(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """mean(b) − mean(a) with Welch's t-interval (unequal variances); no CI unless both have ≥ 2 values."""
    if not a or not b:
        return None
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    d = mb - ma
    if len(a) < 2 or len(b) < 2:
        return Interval(d, None, None, min(len(a), len(b)))
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0.0:  # identical values within each group: the difference is exact
        return Interval(d, d, d, min(len(a), len(b)))
    df = (va + vb) ** 2 / ((va * va / (len(a) - 1) if va else 0.0) + (vb * vb / (len(b) - 1) if vb else 0.0))
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    return Interval(d, d - half, d + half, min(len(a), len(b)))


def relative_diff_ci(baseline: Sequence[float], other: Sequence[float],
                     confidence: float = CONFIDENCE) -> Interval | None:
    """(mean(other) − mean(baseline)) / mean(baseline), with the Welch interval scaled the same way."""
    d = welch_diff_ci(baseline, other, confidence)
    if d is None:
        return None
    base = statistics.fmean(baseline)
    if base == 0.0:
        return None
    s = lambda v: None if v is None else v / base  # noqa: E731
    return Interval(d.mean / base, s(d.lo), s(d.hi), d.n)


def scaling_efficiency(throughput_np: float, np: int, throughput_1: float) -> float:
    """throughput(np) / (np · throughput(1)): 1.0 is perfect linear scaling."""
    return throughput_np / (np * throughput_1) if throughput_1 > 0 and np > 0 else float("nan")


# -- per-configuration aggregates ----------------------------------------------------------------------
MEMORY_KINDS = ("params", "grads", "optimizer_state", "total")
MEMORY_LABELS = {"params": "params", "grads": "grads", "optimizer_state": "opt state", "total": "total"}


@dataclass
class Group:
    """All repeats of one (strategy, np)."""

    strategy: str
    np: int
    runs: int
    ok: int
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
    efficiency: float | None = None  # scaling efficiency against the same strategy at np=1


def _mean(xs: Iterable[Any]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


def strategy_order(results: dict[str, Any]) -> list[str]:
    """Strategies in the order the user gave them (the first is the baseline)."""
    given = list((results.get("config") or {}).get("strategies") or [])
    seen = [r["strategy"] for r in results.get("runs", [])]
    return list(dict.fromkeys([*given, *seen]))


def np_order(results: dict[str, Any]) -> list[int]:
    given = [int(n) for n in (results.get("config") or {}).get("np") or []]
    return sorted(set(given) | {int(r["np"]) for r in results.get("runs", [])})


def aggregate(results: dict[str, Any], confidence: float = CONFIDENCE) -> list[Group]:
    """One :class:`Group` per (strategy, np), strategies in the given order, np ascending."""
    runs = results.get("runs", [])
    groups: list[Group] = []
    for s in strategy_order(results):
        for n in np_order(results):
            rs = [r for r in runs if r["strategy"] == s and int(r["np"]) == n]
            if not rs:
                continue
            ok = [r for r in rs if r.get("status") == "ok"]
            g = Group(s, n, len(rs), len(ok))
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
        one = find(groups, g.strategy, 1)
        if one and one.samples_per_sec and g.samples_per_sec:
            g.efficiency = scaling_efficiency(g.samples_per_sec.mean, g.np, one.samples_per_sec.mean)
    return groups


def find(groups: Sequence[Group], strategy: str, np: int) -> Group | None:
    return next((g for g in groups if g.strategy == strategy and g.np == np), None)


# -- verdicts ----------------------------------------------------------------------------------------
NOISY_HALF_WIDTH = 0.5  # a relative CI wider than ±50 % says more about the machine than the strategies


def _pct(x: float, signed: bool = False) -> str:
    v = 100.0 * x
    digits = 0 if abs(v) >= 100 else 1
    return f"{v:+.{digits}f}".replace("-", "−") if signed else f"{v:.{digits}f}"


def throughput_verdict(strategy: str, baseline: str, np: int, rel: Interval | None,
                       confidence: float = CONFIDENCE) -> str:
    """Plain words for the relative throughput of ``strategy`` against ``baseline`` at one np."""
    conf = f"{100 * confidence:g} % CI"
    if rel is None:
        return f"{strategy} vs {baseline} at np={np}: no comparison (a side has no successful run)"
    if rel.has_ci and rel.spans_zero():
        noisy = ": too noisy to tell, add --repeats or quiet the machine" if (
            rel.half_width or 0.0) > NOISY_HALF_WIDTH else ""
        return (f"{strategy} vs {baseline} at np={np}: no significant difference in throughput "
                f"({_pct(rel.mean, True)} %, {conf} {_pct(rel.lo, True)} to {_pct(rel.hi, True)} %{noisy})")  # type: ignore[arg-type]
    word = "slower" if rel.mean < 0 else "faster"
    sign = -1.0 if rel.mean < 0 else 1.0
    head = f"{strategy} {_pct(sign * rel.mean)} % {word} than {baseline} at np={np}"
    if not rel.has_ci:
        return f"{head} ({rel.n} repeat{'s' if rel.n != 1 else ''}: no CI, noise unknown)"
    lo, hi = sorted((sign * rel.lo, sign * rel.hi))  # type: ignore[operator]
    return f"{head} ({conf} {_pct(lo)}–{_pct(hi)} %)"


def accuracy_verdict(strategy: str, baseline: str, base_acc: Sequence[float], other_acc: Sequence[float],
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
    return (f"test accuracy {100 * abs(d.mean):.2f} points {word} for {strategy} "
            f"({100 * mb:.2f} % vs {100 * ma:.2f} %{tail})")


@dataclass
class Verdict:
    strategy: str
    baseline: str
    np: int
    throughput: Interval | None  # relative difference, other vs baseline
    text: str


def verdicts(groups: Sequence[Group], strategies: Sequence[str], confidence: float = CONFIDENCE) -> list[Verdict]:
    """Every strategy after the first against the first (the baseline), at every np both ran."""
    if not strategies:
        return []
    base = strategies[0]
    out: list[Verdict] = []
    for n in sorted({g.np for g in groups}):
        b = find(groups, base, n)
        for s in strategies[1:]:
            o = find(groups, s, n)
            if b is None or o is None:
                continue
            if not b.ok or not o.ok:
                failed = ", ".join(f"{g.strategy}: {g.ok} of {g.runs} runs succeeded" for g in (b, o) if not g.ok)
                out.append(Verdict(s, base, n, None, f"{s} vs {base} at np={n}: no comparison ({failed})"))
                continue
            rel = relative_diff_ci(b.throughputs, o.throughputs, confidence)
            text = (throughput_verdict(s, base, n, rel, confidence) + "; "
                    + accuracy_verdict(s, base, b.accuracies, o.accuracies, confidence))
            out.append(Verdict(s, base, n, rel, text))
    return out


def phase_shifts(groups: Sequence[Group], strategy: str) -> dict[int, dict[str, float]]:
    """Per np > 1: how much each phase's time per step grew against the same strategy at np=1 (ms)."""
    one = find(groups, strategy, 1)
    if one is None or not one.phases_ms:
        return {}
    return {g.np: {p: g.phases_ms[p] - one.phases_ms.get(p, 0.0) for p in g.phases_ms}
            for g in groups if g.strategy == strategy and g.np > 1 and g.phases_ms}
