"""Statistics of a comparison: per-arm aggregates, and paired verdicts with calibrated intervals.

Pure functions on plain data (the ``runs`` of results.json); no I/O, no plotting; distributions come
from :mod:`scipy.stats`.

The verdict rests on a *paired* design. A repeat is a block that runs every arm once, next to each
other in time, so the slow drift of a shared machine hits both arms of a block alike. The per-run
statistic is throughput from the slowest rank's median step time (global batch ÷ median step), which
ignores the odd slow step; the effect in a block is the log of the ratio other ÷ baseline; the
verdict is the mean over blocks with a 95 % Student-t interval on the log ratios, turned back into a
ratio. Unpaired per-arm figures (mean ± t-interval over repeats) remain for the table.

*faster*/*slower* need the 95 % interval to exclude no difference (a two-sided test at 5 %). *equal*
is an equivalence test: two one-sided tests at 5 % (Schuirmann's TOST), i.e. the 90 % interval lies
inside ±equivalence. Each claim is then wrong at most 5 % of the time; asking the 95 % interval to fit
inside the margin would test equivalence at 2.5 % and need about a third more blocks for nothing.

This module assembles the throughput verdicts (the rule that decides how many blocks to run is
:mod:`dpcompare.compare.stopping`'s); the pieces live in :mod:`~dpcompare.report.intervals` (intervals and decisions),
:mod:`~dpcompare.report.groups` (arms, aggregates, pairing) and :mod:`~dpcompare.report.verdicts` (Verdict, accuracy and
time to accuracy), and every name is importable from here too. :func:`report_verdicts` gives the report the verdicts
compare stored in results.json, recomputing them only when asked or when none were stored.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpcompare.report.groups import (  # noqa: F401  (re-exported: stats is the report's statistics in one name)
    MEMORY_KINDS,
    MEMORY_LABELS,
    WITHIN,
    Group,
    aggregate,
    arm_axes,
    arm_of,
    arm_order,
    arm_pairs,
    exact_by_construction,
    find,
    launch_note,
    measured_share,
    np_order,
    paired_blocks,
    per_seed,
    phase_shifts,
    recorded_axes,
    run_throughput,
    scaling_efficiency,
    shown_without,
    strategy_order,
    tta_target,
    unit_blocks,
)
from dpcompare.report.intervals import (  # noqa: F401
    CONFIDENCE,
    EQUIVALENCE,
    Interval,
    decide,
    decide_difference,
    equivalence_confidence,
    mean_ci,
    paired_diff_ci,
    paired_log_ratio_ci,
    t_half_width,
    unit_means,
    welch_diff_ci,
)
from dpcompare.report.verdicts import (  # noqa: F401
    ACCURACY_EQUIVALENCE,
    ACCURACY_OUTCOMES,
    METRICS,
    OUTCOMES,
    Verdict,
    accuracy_verdict,
    accuracy_verdicts,
    ratio_ci,
    throughput_verdict,
    time_to_accuracy_verdicts,
)


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
    if len(arm_order(results)) < 2:
        return []
    groups = aggregate(results, confidence) if groups is None else groups
    eq = float(equivalence if equivalence is not None
               else (results.get("config") or {}).get("equivalence", EQUIVALENCE))
    out: list[Verdict] = []
    for n, base, s in arm_pairs(results):
        b, o = find(groups, base, n), find(groups, s, n)
        if b is not None and o is not None:
            out.append(_throughput_pair(results, n, b, o, eq, confidence))
    return out


def _throughput_pair(results: dict[str, Any], n: int, b: Group, o: Group, eq: float, confidence: float) -> Verdict:
    """The throughput verdict of group ``o`` against the baseline's group ``b`` at np ``n``, paired over blocks."""
    base, s = b.arm, o.arm
    reps, xb, xo = paired_blocks(results, base, s, n)
    if not reps:
        failed = ", ".join(f"{g.arm}: {g.ok} of {g.runs} runs succeeded" for g in (b, o) if not g.ok)
        return Verdict(n, base, s, "undecided", None, None, None, 0, equivalence=eq,
                       text=f"{s} vs {base} at np={n}: no comparison ({failed or 'no common repeat'})")
    unit = unit_blocks(results)
    seeded = bool((results.get("config") or {}).get("seeds"))  # accuracy gets verdicts of its own over seeds
    # per unit (one block, or two neighbouring ones: unit_blocks): the geometric mean of each arm
    ub, uo = (np.exp(unit_means(np.log(x).tolist(), unit)).tolist() for x in (np.asarray(xb), np.asarray(xo)))
    log_iv, method = paired_log_ratio_ci(ub, uo, confidence)
    log_eq_iv, _ = paired_log_ratio_ci(ub, uo, equivalence_confidence(confidence))
    needed_units = blocks_needed([math.log(y / x) for x, y in zip(ub, uo, strict=True)], eq, confidence)
    needed = None if needed_units is None else needed_units * unit
    outcome, text = throughput_verdict(s, base, n, log_iv, eq, needed, confidence, log_eq_iv, len(reps))
    text = _at_value(results, text, base, s, n)
    _, sb, so = paired_blocks(results, base, s, n, statistic=lambda r: r.get("samples_per_sec"))
    sps_ratio = math.exp(statistics.fmean(math.log(y / x) for x, y in zip(sb, so, strict=True))) if sb else None
    assert log_iv is not None
    return Verdict(n, base, s, outcome, math.exp(log_iv.mean),
                   math.exp(log_iv.lo) if log_iv.has_ci else None,  # type: ignore[arg-type]
                   math.exp(log_iv.hi) if log_iv.has_ci else None,  # type: ignore[arg-type]
                   len(reps), text, "" if seeded else accuracy_verdict(s, base, b.accuracies, o.accuracies,
                                                                        confidence, b.metric),
                   method, [y / x for x, y in zip(xb, xo, strict=True)], reps, sps_ratio,
                   needed if outcome == "undecided" else None, eq, ratio_ci(log_eq_iv), unit_blocks=unit)


def _at_value(results: dict[str, Any], text: str, base: str, other: str, n: int) -> str:
    """A verdict between two arms at the same value of a swept axis in its words: "horovod X % slower than ddp
    at np=2 on 1gbit" (the link), "... at 2 thread(s) per rank" (the threads)."""
    axes, values = recorded_axes(results), arm_axes(results)
    shared = {k: v for k, v in values.get(base, {}).items()
              if values.get(other, {}).get(k) == v and (axes.get(k) or {}).get("pairs") == WITHIN}
    if not shared:
        return text
    for label in (other, base):
        text = text.replace(label, shown_without(results, label, shared), 1)
    words = ", ".join(str(axes[k].get("words") or "with {name}={value}").format(name=k, value=v)
                      for k, v in shared.items())
    return text.replace(f" at np={n}", f" at np={n} {words}", 1)


def stored_verdicts(results: dict[str, Any]) -> list[Verdict] | None:
    """The verdicts compare stored in results.json, or None when there are none to read: an unfinished
    comparison (``complete`` false), no ``verdicts``, or verdicts written before they could be read back."""
    stored = results.get("verdicts")
    if not results.get("complete", True) or not isinstance(stored, list) or not stored:
        return None
    try:
        return [Verdict.from_json(d) for d in stored]
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def report_verdicts(results: dict[str, Any], groups: Sequence[Group] | None = None,
                    recompute: bool = False) -> list[Verdict]:
    """The verdicts the report shows: those compare stored (one owner: the comparison that decided when to
    stop), recomputed from the runs only with ``recompute`` or when none can be read (see :func:`stored_verdicts`)."""
    stored = None if recompute else stored_verdicts(results)
    return stored if stored is not None else verdicts(results, groups)
