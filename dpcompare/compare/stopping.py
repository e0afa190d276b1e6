"""When a comparison stops: a fixed number of blocks, or (``--repeats auto``) once every verdict is precise enough.

Looking after every block is a sequential design. The blocks go on until every interval is precise enough, by a
rule blind to where the intervals lie: 95 % half-width within --target-ci and the equivalence interval within
half the margin (:data:`RESOLUTION`), from :data:`PRECISION_MIN_BLOCKS` blocks on. A verdict settled at the
interim level (Haybittle–Peto, :data:`INTERIM_ALPHA`) may end it sooner, once within --target-ci. The verdict
is then drawn once, at the usual levels. Stopping as soon as a verdict is decided at 95 % would call identical
arms different far more often than 5 %.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpcompare.files import ACCURACY_EQUIVALENCE, EQUIVALENCE

if TYPE_CHECKING:  # numpy and scipy load with the first look, not with the parser
    from dpcompare.report.stats import Verdict


#: Haybittle–Peto: before the final look a verdict may end the comparison only at this error rate per look
#: (faster/slower: the 99.9 % interval excludes no difference; equal: two one-sided tests at 0.1 %, the
#: 99.8 % interval inside the margin), so looking after every block costs next to nothing of the 5 %.
INTERIM_ALPHA = 0.001
#: the precision stop (every 95 % half-width within --target-ci) is considered from this many blocks on: a
#: spread estimated from fewer blocks is often small by chance, and stopping on it would inflate the errors
PRECISION_MIN_BLOCKS = 10
#: ... and only once the equivalence test's interval is at most this share of the margin wide on either side:
#: an interval of ±E/2 around a true difference of zero lies inside ±E about nine times in ten, so a
#: comparison that stops there can call identical arms "equal". An interval merely within ±E must sit
#: near zero to fit: simulated A/A pairs stopped that way ended "undecided" a third of the time (tests).
RESOLUTION = 0.5


def resolves_equal(v: Verdict) -> bool:
    """Whether ``v``'s equivalence interval is narrow enough (half-width ≤ RESOLUTION × margin) to call no
    difference "equal"; a rule on the spread only, blind to where the interval lies."""
    if v.equivalence_ci is None:
        return False
    lo, hi = v.equivalence_ci
    return (hi - lo) / 2.0 <= RESOLUTION * v.equivalence


def settled_early(log_ratios: Sequence[float], equivalence: float = EQUIVALENCE,
                  alpha: float = INTERIM_ALPHA) -> str | None:
    """The outcome a verdict has already reached beyond reasonable doubt (an interim look), or None.

    Student t at the interim level ``alpha``: "faster"/"slower" when the (1 − alpha) interval of the mean
    log ratio excludes 0, "equal" when the (1 − 2·alpha) interval lies inside ±log(1 ± equivalence).
    Stopping on a decision at the nominal 5 % after every block would be optional stopping: an A/A pair
    would be called faster or slower about one time in four over 40 looks (see the tests).
    """
    import numpy as np  # here, not at the top: dpcompare --help loads this module

    # here, not at the top: it loads numpy and scipy
    from dpcompare.report.stats import decide, equivalence_confidence, t_half_width

    d = np.asarray(log_ratios, dtype=float)
    if d.size < 2:
        return None
    m, sd = float(d.mean()), float(d.std(ddof=1))
    h_diff = float(t_half_width(sd, d.size, 1.0 - alpha))
    h_eq = float(t_half_width(sd, d.size, equivalence_confidence(1.0 - alpha)))
    outcome = decide(math.exp(m - h_diff), math.exp(m + h_diff), equivalence, (math.exp(m - h_eq), math.exp(m + h_eq)))
    return None if outcome == "undecided" else outcome


@dataclass(frozen=True)
class StoppingRule:
    """How many blocks: ``repeats`` of them, or (``repeats`` None) blocks until every verdict is precise
    enough (:func:`stop_reason`: half-width within ``target_ci``, a fraction, and the equivalence interval
    within half of ``equivalence``), ``max_repeats`` blocks were run, or another block would overrun
    ``time_budget`` seconds."""

    repeats: int | None = 3
    target_ci: float = 0.05
    max_repeats: int = 100
    time_budget: float = 0.0
    equivalence: float = EQUIVALENCE
    # --repeats auto looks from this block on. Below it the sample spread is too unreliable on machines whose
    # noise is mostly small with rare large runs: a 4-block A/A whose ratios all fell within 1.04-1.06 passed
    # the 99.9 % interim test.
    min_blocks: int = 6
    seeds: tuple[int, ...] = ()  # --seeds: block k runs with seeds[k mod len]; a fixed plan runs repeats × seeds
    accuracy_equivalence: float = ACCURACY_EQUIVALENCE  # a fraction: 0.005 is ±0.5 points of accuracy

    def to_json(self) -> dict[str, Any]:
        return {"repeats": "auto" if self.repeats is None else self.repeats, "target_ci": self.target_ci,
                "max_repeats": self.max_repeats, "time_budget": self.time_budget or None,
                "equivalence": self.equivalence, "seeds": list(self.seeds) or None,
                "accuracy_equivalence": self.accuracy_equivalence}

    @property
    def blocks(self) -> int | None:
        """The fixed plan's number of blocks (None: --repeats auto)."""
        return None if self.repeats is None else self.repeats * max(1, len(self.seeds))


def stop_reason(results: dict[str, Any], schedule: StoppingRule, blocks: int, elapsed: float) -> str | None:
    """Why no further block should run, or None to run another."""
    if schedule.repeats is not None:
        seeds = f" × {len(schedule.seeds)} seeds" if schedule.seeds else ""
        return f"{schedule.repeats} repeat{'s' if schedule.repeats != 1 else ''}{seeds} as asked" if (
            blocks >= (schedule.blocks or 0)) else None
    from dpcompare.report import stats  # here, not at the top: it loads numpy and scipy

    if blocks >= schedule.min_blocks:  # the rule: see the module's docstring
        vs = [v for v in stats.verdicts(results, equivalence=schedule.equivalence) if v.metric == "throughput"]
        widths = [v.half_width for v in vs]
        if vs and all(w is not None and w <= schedule.target_ci for w in widths):
            within = (f"every verdict's 95 % interval is within ±{100 * schedule.target_ci:g} % "
                      f"(widest ±{100 * max(w for w in widths if w is not None):.1f} %; --target-ci)")
            if blocks >= PRECISION_MIN_BLOCKS and all(resolves_equal(v) for v in vs):
                half = 100 * RESOLUTION * schedule.equivalence
                return (f"{within} and every equivalence interval within ±{half:g} % (half of --equivalence): "
                        "precise enough to tell equal from different")
            if all(settled_early(v.unit_log_ratios, v.equivalence) for v in vs):
                return f"{within}, and settled beyond doubt (99.9 % interval, or the equivalence test at 0.1 %)"
    if blocks >= schedule.max_repeats:
        return (f"reached --max-repeats {schedule.max_repeats} before every verdict was precise enough "
                f"(--target-ci {100 * schedule.target_ci:g} %, equivalence interval within "
                f"±{100 * RESOLUTION * schedule.equivalence:g} %)")
    if schedule.time_budget and blocks and elapsed + elapsed / blocks > schedule.time_budget:
        return (f"another block (≈{elapsed / blocks:.0f} s) would overrun --time-budget "
                f"{schedule.time_budget:g} s")


def shortfall(verdicts: Sequence[Verdict], schedule: StoppingRule, blocks: int, elapsed: float) -> str | None:
    """When ``--repeats auto`` ended (budget or --max-repeats) before every throughput verdict of ``verdicts`` (the
    comparison's, as drawn at its end) was within --target-ci: about how many blocks, and how long, the target would
    take at the spread this comparison saw, and the flags that allow it (None otherwise). An estimate from the noise
    floor (:func:`noise.units_to`)."""
    vs = [v for v in verdicts if v.metric == "throughput"]
    if schedule.repeats is not None or blocks < 2 or not vs or all(
            v.half_width is not None and v.half_width <= schedule.target_ci for v in vs):
        return None
    from dpcompare.report import noise  # here, not at the top: it loads numpy and scipy

    needs = []
    for v in vs:
        sd = noise.block_spread(v.unit_log_ratios)
        n = None if sd is None else noise.units_to(schedule.target_ci, sd)
        needs.append(None if n is None else n * v.unit_blocks)
    target = f"±{100 * schedule.target_ci:g} % (--target-ci)"
    if None in needs:
        return f"{target} is out of reach at this spread: ask for a wider --target-ci"
    need = max(max(needs), blocks + 1)  # type: ignore[type-var]
    seconds = need * elapsed / blocks
    flags = ([f"--time-budget {60 * math.ceil(seconds / 60)}"] if schedule.time_budget else []) + (
        [f"--max-repeats {need}"] if need > schedule.max_repeats else [])
    return (f"{target} would take about {need} blocks, ≈{seconds / 60:.0f} min at this comparison's pace, by its "
            f"spread so far" + (f": run it again with {' '.join(flags)}" if flags else ""))
