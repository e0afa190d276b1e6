"""The verdicts: :class:`Verdict` (results.json ``verdicts``, with its round trip) and the words and
outcomes of the accuracy and time-to-accuracy verdicts; the throughput verdict's words.

Each verdict compares one arm with the baseline (the first arm) at one np, over the pairs
:func:`~dpcompare.report.groups.arm_pairs` yields: throughput and time to accuracy as a paired ratio over
blocks, accuracy as a paired difference over seeds. The throughput verdicts themselves are assembled in
:mod:`dpcompare.report.stats` beside the rule that decides how many blocks to run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dpcompare.files import ACCURACY_EQUIVALENCE
from dpcompare.report.groups import (
    arm_of,
    arm_pairs,
    exact_by_construction,
    metric_of,
    paired_blocks,
    per_seed,
    tta_target,
)
from dpcompare.report.intervals import (
    CONFIDENCE,
    EQUIVALENCE,
    Interval,
    decide,
    decide_difference,
    equivalence_confidence,
    paired_diff_ci,
    paired_log_ratio_ci,
    unit_means,
    welch_diff_ci,
)

OUTCOMES = ("faster", "slower", "equal", "undecided")
METRICS = ("throughput", "accuracy", "time_to_accuracy")
ACCURACY_OUTCOMES = ("higher", "lower", "equal", "undecided", "mismatch")


def _pct(x: float, signed: bool = False, digits: int | None = None) -> str:
    v = round(100.0 * x, 9)
    digits = (0 if abs(v) >= 10 else 1) if digits is None else digits
    return f"{v:+.{digits}f}".replace("-", "−") if signed else f"{v:.{digits}f}"


def accuracy_verdict(other: str, baseline: str, base_acc: Sequence[float], other_acc: Sequence[float],
                     confidence: float = CONFIDENCE, metric: dict[str, Any] | None = None) -> str:
    """The workload's test metric (accuracy for classifiers): identical, equal within noise (Welch CI spans 0),
    or the difference stated."""
    name = f"test {(metric or {}).get('name', 'accuracy')}"
    pct = (metric or {}).get("unit", "%") == "%"

    def val(x: float) -> str:
        return f"{100 * x:.2f} %" if pct else f"{x:.4g}"

    if not base_acc or not other_acc:
        return f"{name} not compared"
    if len(set(base_acc) | set(other_acc)) == 1:
        return f"{name} identical ({val(base_acc[0])})"
    d = welch_diff_ci(base_acc, other_acc, confidence)
    assert d is not None
    if d.spans_zero():
        return f"{name} equal within noise"
    ma, mb = statistics.fmean(base_acc), statistics.fmean(other_acc)
    word = "higher" if d.mean > 0 else "lower"
    tail = "" if d.has_ci else f"; {min(len(base_acc), len(other_acc))} repeat: spread unknown"
    size = f"{100 * abs(d.mean):.2f} points" if pct else f"{abs(d.mean):.4g}"
    return f"{name} {size} {word} for {other} ({val(mb)} vs {val(ma)}{tail})"


def relative_half_width(lo: float, hi: float) -> float:
    """The half-width of a ratio's interval ``lo``–``hi`` as a fraction of the ratio: ``√(hi/lo) − 1``, the
    noise floor's measure (``exp(t·sd/√n) − 1`` for a t interval), and unchanged when the arms swap (the interval
    becomes 1/hi–1/lo). Half the width on the ratio's own scale would ask a 47 % faster arm for twice the blocks
    its slower twin needs with the arms swapped."""
    return math.sqrt(hi / lo) - 1.0


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
        """The interval's half-width as a fraction of the ratio (0.05: ±5 %), what --target-ci is held against:
        :func:`relative_half_width`, the same whichever arm is the baseline."""
        return None if self.ci_low is None or self.ci_high is None else relative_half_width(self.ci_low,
                                                                                           self.ci_high)

    @property
    def full_text(self) -> str:
        return self.text + (f"; {self.accuracy}" if self.accuracy else "")

    def to_json(self) -> dict[str, Any]:
        r = lambda v: None if v is None else round(v, 6)  # noqa: E731
        eq_ci = None if self.equivalence_ci is None else [r(x) for x in self.equivalence_ci]
        if self.metric != "throughput":
            return {"np": self.np, "baseline": self.baseline, "other": self.other, "metric": self.metric,
                    "outcome": self.outcome, "text": self.full_text, "ci_low": r(self.ci_low),
                    "ci_high": r(self.ci_high),
                    "blocks": self.blocks, "method": self.method, "equivalence": self.equivalence,
                    "equivalence_ci": eq_ci, **self.extra}
        return {"np": self.np, "baseline": self.baseline, "other": self.other, "metric": "throughput",
                "ratio": r(self.ratio), "ci_low": r(self.ci_low), "ci_high": r(self.ci_high), "blocks": self.blocks,
                "outcome": self.outcome, "text": self.full_text, "method": self.method,
                "equivalence": self.equivalence, "equivalence_ci": eq_ci,
                "block_ratios": [r(x) for x in self.block_ratios], "block_repeats": list(self.block_repeats),
                "unit_blocks": self.unit_blocks, "samples_per_sec_ratio": r(self.samples_per_sec_ratio),
                "blocks_needed": self.blocks_needed}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Verdict:
        """The verdict :meth:`to_json` wrote (``text`` holds the full text: the accuracy note is not split off).

        KeyError or TypeError when ``d`` is not one (a throughput verdict needs ``block_repeats``, which
        results.json has held since the report began reading stored verdicts)."""
        known = _JSON_KEYS_THROUGHPUT if d["metric"] == "throughput" else _JSON_KEYS_OTHER
        eq_ci = d["equivalence_ci"]
        v = cls(int(d["np"]), str(d["baseline"]), str(d["other"]), str(d["outcome"]), d.get("ratio"), d["ci_low"],
                d["ci_high"], int(d["blocks"]), str(d["text"]), method=str(d["method"]),
                equivalence=float(d["equivalence"]), metric=str(d["metric"]),
                equivalence_ci=None if eq_ci is None else (float(eq_ci[0]), float(eq_ci[1])),
                extra={k: x for k, x in d.items() if k not in known})
        if v.metric == "throughput":
            v.block_ratios = [float(x) for x in d["block_ratios"]]
            v.block_repeats = [int(x) for x in d["block_repeats"]]
            v.unit_blocks = int(d["unit_blocks"])
            v.samples_per_sec_ratio = d["samples_per_sec_ratio"]
            v.blocks_needed = d["blocks_needed"]
        return v


_JSON_KEYS_OTHER = {"np", "baseline", "other", "metric", "outcome", "text", "ci_low", "ci_high", "blocks", "method",
                    "equivalence", "equivalence_ci"}
_JSON_KEYS_THROUGHPUT = _JSON_KEYS_OTHER | {"ratio", "block_ratios", "block_repeats", "unit_blocks",
                                            "samples_per_sec_ratio", "blocks_needed"}


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
    eq_ci = ratio_ci(log_eq_iv)
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


def ratio_ci(log_iv: Interval | None) -> tuple[float, float] | None:
    return (math.exp(log_iv.lo), math.exp(log_iv.hi)) if log_iv is not None and log_iv.has_ci else None  # type: ignore[arg-type]



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
    exact = exact_by_construction(results)
    out: list[Verdict] = []
    for n, base, s in arm_pairs(results):
        v = _accuracy_pair(results, n, base, s, eq, exact, confidence)
        if v is not None:
            out.append(v)
    return out


def _accuracy_pair(results: dict[str, Any], n: int, base_arm: str, s: str, eq: float, exact: bool,
                   confidence: float) -> Verdict | None:
    """The accuracy verdict of arm ``s`` against ``base_arm`` at np ``n`` (None: neither has a seed)."""
    base = per_seed(results, base_arm, n, "final_test_accuracy")
    oth = per_seed(results, s, n, "final_test_accuracy")
    seeds = sorted(set(base) & set(oth))
    head = f"test {metric_of(results.get('runs', []))['name']} of {s} vs {base_arm} at np={n}"
    if not seeds:
        return Verdict(n, base_arm, s, "undecided", None, None, None, 0, f"{head}: no seed where both succeeded",
                       metric="accuracy", equivalence=eq) if base or oth else None
    xb, xo = [base[k] for k in seeds], [oth[k] for k in seeds]
    iv = paired_diff_ci(xb, xo, confidence)
    eq_iv = paired_diff_ci(xb, xo, equivalence_confidence(confidence))
    assert iv is not None and eq_iv is not None
    base_loss = per_seed(results, base_arm, n, "final_train_loss")
    oth_loss = per_seed(results, s, n, "final_train_loss")
    lseeds = sorted(set(base_loss) & set(oth_loss))
    liv = paired_diff_ci([base_loss[k] for k in lseeds], [oth_loss[k] for k in lseeds], confidence)
    diffs = [o - b for b, o in zip(xb, xo, strict=True)]
    outcome, text = _accuracy_words(head, xb, xo, iv, eq_iv, liv, eq, exact, confidence)
    return Verdict(n, base_arm, s, outcome, None, iv.lo, iv.hi, len(seeds), text, metric="accuracy",
                   method="exact" if iv.has_ci and iv.lo == iv.hi else "t" if iv.has_ci else "none",
                   equivalence=eq, equivalence_ci=(eq_iv.lo, eq_iv.hi) if eq_iv.has_ci else None,  # type: ignore[arg-type]
                   extra={
                       "difference": round(iv.mean, 6), "seeds": seeds, "exact_by_construction": exact,
                       "seed_differences": [round(d, 6) for d in diffs],
                       "train_loss_difference": None if liv is None else round(liv.mean, 6),
                       "train_loss_ci": None if liv is None or not liv.has_ci else
                       [round(liv.lo, 6), round(liv.hi, 6)]})  # type: ignore[arg-type]


def _accuracy_words(head: str, xb: list[float], xo: list[float], iv: Interval, eq_iv: Interval,
                    liv: Interval | None, eq: float, exact: bool, confidence: float) -> tuple[str, str]:
    """(outcome, words) of an accuracy verdict from its paired intervals (``liv``: the train loss's)."""
    diffs = [o - b for b, o in zip(xb, xo, strict=True)]
    ns = f"{len(xb)} seed{'s' if len(xb) != 1 else ''}"
    conf = f"{100 * confidence:g} % CI"
    span = ("" if not iv.has_ci else f" ({conf} {_points(iv.lo)} … {_points(iv.hi)} points)")  # type: ignore[arg-type]
    loss = ("" if liv is None else f"; final train loss {liv.mean:+.2g}".replace("-", "−")
            + ("" if not liv.has_ci or liv.lo == liv.hi else
               f" ({conf} {liv.lo:+.2g} … {liv.hi:+.2g})".replace("-", "−")))  # type: ignore[str-format]
    if exact and all(d == 0.0 for d in diffs) and (liv is None or liv.mean == 0.0 and liv.lo in (None, 0.0)):
        return "equal", (f"{head}: difference 0.00 points for every seed ({ns}; mean {100 * statistics.fmean(xb):.2f} "
                         "%) — zero by construction: the arms differ only in how the same gradient average is "
                         "exchanged, and checked: identical test accuracy and train loss")
    if exact:
        return "mismatch", (f"NOT IDENTICAL: {head} should be exactly equal (the arms differ only in how the same "
                            f"gradient average is exchanged) but differs by {_points(iv.mean)} points on average over "
                            f"{ns} (largest {_points(max(diffs, key=abs))}){loss}: the strategies did not compute the "
                            "same model (nondeterministic kernels, or a bug)")
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
    return outcome, text + loss


def time_to_accuracy_verdicts(results: dict[str, Any], equivalence: float | None = None,
                              confidence: float = CONFIDENCE) -> list[Verdict]:
    """Per np, every arm against the baseline: the paired ratio of training time until the test accuracy
    first reached the target (blocks where both reached it), and how many runs never did."""
    target = tta_target(results)
    if target is None:
        return []
    eq = float(equivalence if equivalence is not None
               else (results.get("config") or {}).get("equivalence", EQUIVALENCE))
    out: list[Verdict] = []
    for n, base, s in arm_pairs(results):
        oks = {a: [r for r in results.get("runs", []) if arm_of(r) == a and int(r["np"]) == n
                   and r.get("status") == "ok"] for a in (base, s)}
        if oks[base] and oks[s]:
            out.append(_time_to_accuracy_pair(results, n, base, s, oks, target, eq, confidence))
    return out


def _time_to_accuracy_pair(results: dict[str, Any], n: int, base: str, s: str, oks: dict[str, list[dict[str, Any]]],
                           target: float, eq: float, confidence: float) -> Verdict:
    """The time-to-accuracy verdict of arm ``s`` against ``base`` at np ``n`` (``oks``: each arm's ok runs)."""
    metric = metric_of(results.get("runs", []))
    tgt = (f"{100 * target:g} % test {metric['name']}" if metric.get("unit") == "%"
           else f"test {metric['name']} {target:g}")
    missed = {a: sum(r.get("time_to_accuracy_s") is None for r in rs) for a, rs in oks.items()}
    reps, xb, xo = paired_blocks(results, base, s, n, statistic=lambda r: r.get("time_to_accuracy_s"))
    _, sb, so = paired_blocks(results, base, s, n, statistic=lambda r: r.get("steps_to_accuracy"))
    never = "; ".join(f"{missed[a]} of {len(oks[a])} runs of {a} never reached it" for a in (base, s) if missed[a])
    never = f" ({never})" if never else " (every run reached it)"
    if not reps:
        return Verdict(n, base, s, "undecided", None, None, None, 0,
                       f"time to {tgt}, {s} vs {base} at np={n}: no block where both reached it{never}",
                       metric="time_to_accuracy", equivalence=eq,
                       extra={"target_accuracy": target, "reached": _reached(oks, base, s)})
    # the speed ratio baseline time ÷ other time: > 1 means the other arm got there sooner
    log_iv, method = paired_log_ratio_ci(xo, xb, confidence)
    log_eq_iv, _ = paired_log_ratio_ci(xo, xb, equivalence_confidence(confidence))
    assert log_iv is not None
    speed = math.exp(log_iv.mean)
    # the time ratio other ÷ baseline is 1/speed: its equivalence interval, for the "equal" outcome
    eq_speed = ratio_ci(log_eq_iv)
    eq_time = None if eq_speed is None else (1 / eq_speed[1], 1 / eq_speed[0])
    steps = (f"; steps to it: {statistics.fmean(so):.0f} vs {statistics.fmean(sb):.0f}" if sb and so else "")
    outcome, text = _time_to_accuracy_words(f"time to {tgt}", s, base, n, log_iv, eq_speed, eq_time, eq, len(reps),
                                            confidence)
    text += (f"{steps}{never}; training time only: start-up and evaluation excluded")
    return Verdict(n, base, s, outcome, 1 / speed,
                   None if not log_iv.has_ci else 1 / math.exp(log_iv.hi),  # type: ignore[arg-type]
                   None if not log_iv.has_ci else 1 / math.exp(log_iv.lo),  # type: ignore[arg-type]
                   len(reps), text, method=method, metric="time_to_accuracy", equivalence=eq,
                   equivalence_ci=eq_time, extra={"target_accuracy": target, "ratio": round(1 / speed, 6),
                                                  "block_ratios": [round(o / b, 6)
                                                                   for b, o in zip(xb, xo, strict=True)],
                                                  "reached": _reached(oks, base, s),
                                                  "mean_seconds": {base: round(statistics.fmean(xb), 6),
                                                                   s: round(statistics.fmean(xo), 6)}})


def _time_to_accuracy_words(label: str, s: str, base: str, n: int, log_iv: Interval,
                            eq_speed: tuple[float, float] | None, eq_time: tuple[float, float] | None, eq: float,
                            blocks: int, confidence: float) -> tuple[str, str]:
    """(outcome, words) of a time-to-accuracy verdict from the interval of the log speed ratio."""
    speed = math.exp(log_iv.mean)
    if not log_iv.has_ci:
        return "undecided", f"{label}: {s} {_pct(1 / speed - 1, True)} % vs {base} at np={n} from 1 block, no interval"
    lo, hi = math.exp(log_iv.lo), math.exp(log_iv.hi)  # type: ignore[arg-type]
    outcome = decide(lo, hi, eq, eq_speed)
    span = f"{_pct(1 / hi - 1, True, 1)} … {_pct(1 / lo - 1, True, 1)} %"
    if outcome == "faster":
        text = f"{label}: {s} gets there {_pct(1 - 1 / speed, digits=1)} % sooner than {base} at np={n}"
    elif outcome == "slower":
        text = f"{label}: {s} takes {_pct(1 / speed - 1, digits=1)} % longer than {base} at np={n}"
    elif outcome == "equal":
        assert eq_time is not None
        text = (f"{label}: {s} equal to {base} within ±{_pct(eq)} % at np={n} "
                f"({100 * equivalence_confidence(confidence):g} % CI {_pct(eq_time[0] - 1, True, 1)} … "
                f"{_pct(eq_time[1] - 1, True, 1)} %: two one-sided tests)")
    else:
        text = f"{label}: {s} vs {base} at np={n} undecided"
    return outcome, text + f" (time ratio {1 / speed:.3f}, {100 * confidence:g} % CI {span}, {blocks} blocks)"


def _reached(oks: dict[str, list[dict[str, Any]]], *arms: str) -> dict[str, list[int]]:
    """Per arm: [runs that reached the target, ok runs]."""
    return {a: [sum(r.get("time_to_accuracy_s") is not None for r in oks[a]), len(oks[a])] for a in arms}
