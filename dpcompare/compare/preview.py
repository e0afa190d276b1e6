"""``dpcompare compare --plan``: the runs a comparison would start and what its time is known to be, before any.

A run's time is not known before one is timed: the estimate comes from runs already recorded in ``OUT/results.json``
(``--continue DIR``, or a folder run before), else the plan states its bounds (``--run-timeout`` per run,
``--time-budget``) and says that the first block measures it.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from dpcompare.compare.plan import Comparison, block
from dpcompare.files import RESULTS

#: blocks listed run by run; the others are alike (odd ones run in reverse order)
LISTED_BLOCKS = 2


def _recorded_seconds(c: Comparison) -> tuple[list[float], int]:
    """The wall times of the runs ``c.out/results.json`` records as ok, and how many runs it records."""
    try:
        runs = json.loads((c.out / RESULTS).read_text()).get("runs") or []
    except (OSError, ValueError, AttributeError):
        return [], 0
    ok = [float(r["wall_seconds"]) for r in runs if isinstance(r, dict) and r.get("status") == "ok"
          and isinstance(r.get("wall_seconds"), int | float)]
    return ok, len(runs)


def _duration(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m:02d} min" if hours else f"{m} min {s:02d} s" if m else f"{s} s"


def _time_lines(c: Comparison, runs: int) -> list[str]:
    rule = c.stopping
    ok, recorded = _recorded_seconds(c)
    lines = []
    if ok:
        left = max(runs - recorded, 0)
        median = statistics.median(ok)
        lines.append(f"time: about {_duration(left * median)} for the {left} runs left (the median of the {len(ok)} "
                     f"ok runs in {c.out / RESULTS}: {median:.1f} s a run)")
    else:
        lines.append("time: not known before a run is timed (the first block measures it: its runs print their "
                     "seconds)")
    timeout = c.options.run_timeout
    if timeout:
        lines.append(f"  at most {_duration(runs * timeout)}: {runs} runs × --run-timeout {timeout:g} s")
    if rule.time_budget:
        lines.append(f"  --time-budget {rule.time_budget:g} s: no block starts that would end after "
                     f"{_duration(rule.time_budget)}")
    return lines


def describe(c: Comparison) -> list[str]:
    """The lines ``compare --plan`` prints: arms, process counts, blocks and runs, then the time."""
    arms, rule = c.all_arms, c.stopping
    per_block = len(arms) * len(c.nps)
    blocks = rule.blocks if rule.blocks is not None else rule.max_repeats
    nps = ",".join(map(str, c.nps))
    lines = [f"compare plan: {len(arms)} arm{'s' if len(arms) != 1 else ''} × {len(c.nps)} process count"
             f"{'s' if len(c.nps) != 1 else ''} (np {nps}) = {per_block} runs a block, into {c.out}"]
    lines += [f"  arm {a.label}: {a.strategy}" + "".join(f", {k}={v}" for k, v in a.knobs) for a in arms]
    if rule.blocks is not None:
        seeds = f" × {len(rule.seeds)} seeds" if rule.seeds else ""
        lines.append(f"blocks: {rule.blocks} ({rule.repeats} repeat{'s' if rule.repeats != 1 else ''}{seeds}): "
                     f"{per_block * blocks} runs")
    else:
        lines.append(f"blocks: --repeats auto: until every verdict is precise enough, from {rule.min_blocks} to at "
                     f"most {rule.max_repeats} blocks ({per_block * rule.min_blocks} to {per_block * blocks} runs)")
    for r in range(min(blocks, LISTED_BLOCKS)):
        lines.append(f"  block {r + 1}: " + ", ".join(s.name for s in block(arms, c.nps, r, rule.seeds)))
    if blocks > LISTED_BLOCKS:
        lines.append(f"  ... {blocks - LISTED_BLOCKS} more block{'s' if blocks - LISTED_BLOCKS != 1 else ''} alike "
                     "(the odd ones in reverse order)")
    return lines + _time_lines(c, per_block * blocks)


def print_plan(c: Comparison, out: Any = None) -> int:
    """``compare --plan``: :func:`describe` on stdout; nothing runs and nothing is written."""
    (out or sys.stdout).write("\n".join(describe(c)) + "\n")
    return 0
