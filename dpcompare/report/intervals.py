"""Intervals and the decisions drawn from them: pure numerics on lists of numbers (:mod:`scipy.stats`).

A mean with its t interval, Welch's difference, the paired log-ratio interval of the throughput verdicts
(Student t), the paired difference of the accuracy verdicts, and the outcome an interval implies
(:func:`decide`, :func:`decide_difference`): *faster*/*slower* (*higher*/*lower*) when the 95 % interval leaves
no difference, *equal* when the equivalence test's interval (two one-sided tests: the 90 % one) lies inside the
margin.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from dpcompare.files import EQUIVALENCE as EQUIVALENCE

CONFIDENCE = 0.95


def equivalence_confidence(confidence: float = CONFIDENCE) -> float:
    """The interval of two one-sided tests at the level of a two-sided ``confidence`` interval: 0.95 → 0.90."""
    return 1.0 - 2.0 * (1.0 - confidence)


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
    if _flat(a) and _flat(b):  # no spread (or only rounding's): the difference is exact
        return Interval(d, d, d, n)
    if _flat(a) or _flat(b):  # one side without spread: Welch's interval is the other side's own t-interval
        spread = b if _flat(a) else a  # (scipy would compute it too, warning of precision loss on the flat side)
        h = float(t_half_width(statistics.stdev(spread), len(spread), confidence))
        return Interval(d, d - h, d + h, n)
    ci = sps.ttest_ind(b, a, equal_var=False).confidence_interval(confidence)
    return Interval(d, float(ci.low), float(ci.high), n)


#: a sample whose spread is below this share of its size differs only by floating-point rounding
ROUNDING = 1e-12


def _flat(values: Sequence[float]) -> bool:
    """Whether ``values`` are equal but for rounding: scipy's moments would lose all precision on them (its
    "Precision loss occurred in moment calculation" warning), and the exact answer is no spread at all."""
    x = np.asarray(values, dtype=float)
    return x.size > 0 and float(np.ptp(x)) <= ROUNDING * max(float(np.abs(x).max()), np.finfo(float).tiny)


def paired_log_ratio_ci(baseline: Sequence[float], other: Sequence[float],
                        confidence: float = CONFIDENCE) -> tuple[Interval | None, str]:
    """Mean of log(other/baseline) over paired blocks with its interval, and the method that made it.

    Student t at every size; no CI with one block; exact when every block has the same ratio. A BCa bootstrap
    (once from 10 units on, later from 30) was narrower than t by about what z is narrower than t, and missed more
    often than it promised: A/A units measured here, resampled with their mean taken away, fell outside its 95 %
    interval more often than outside t's (``bench/coverage.py``; docs/measurements.md, "Do the intervals keep
    their promise?").
    """
    d = np.log(np.asarray(other, dtype=float) / np.asarray(baseline, dtype=float))
    if d.size == 0:
        return None, "none"
    m = float(d.mean())
    if d.size < 2:
        return Interval(m, None, None, 1), "none"
    sd = float(d.std(ddof=1))
    if sd == 0.0 or float(np.ptp(d)) <= ROUNDING:  # log ratios: a spread that small is rounding's
        return Interval(m, m, m, int(d.size)), "exact"
    h = float(t_half_width(sd, d.size, confidence))
    return Interval(m, m - h, m + h, int(d.size)), "t"


def unit_means(values: Sequence[float], size: int) -> list[float]:
    """Means of ``values`` over consecutive units of ``size`` (an odd remainder joins the last unit)."""
    if size <= 1:
        return [float(v) for v in values]
    cuts = list(range(0, len(values) - size + 1, size)) or [0]
    return [float(np.mean(values[a:b])) for a, b in zip(cuts, [*cuts[1:], len(values)], strict=True)]



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
    if float(d.std(ddof=1)) == 0.0 or _flat(d):
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

