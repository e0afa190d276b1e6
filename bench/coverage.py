#!/usr/bin/env python
"""Does a verdict's 95 % interval keep its promise on units like the ones measured here? No training in it.

    python bench/coverage.py RESULTS.json [RESULTS.json ...] [--sizes 30,50,100] [--sims 2000] [--seed 1]

Each RESULTS.json is a finished comparison (``dpcompare compare``, best an A/A one). Its first throughput
verdict's units (the per-block log ratios, or their means over neighbouring blocks with persistent workers: the
numbers the interval is built on) are taken as a population, with their mean taken away so that the true effect is
none. ``--sims`` times per size in ``--sizes``, that many units are drawn with replacement, and two 95 % intervals
of their mean are made: Student t (what ``compare`` uses) and scipy's BCa bootstrap (what it used from 30 units
on until 2026-12-05). An interval that keeps its promise leaves out the true mean (0) about 5 % of the time;
each share printed is over ``--sims`` draws (its own 95 % margin about ±1 point at 2,000). Also printed: the
bootstrap interval's mean width as a share of t's.

The same draws for every file, one pooled population of all files' units (each scaled to unit spread) as well.
Prints ``figure:`` lines (bench/figures.py records them).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats as sps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpcompare.report.intervals import t_half_width, unit_means  # noqa: E402


def centred_units(path: Path) -> np.ndarray | None:
    """The first throughput verdict's units of a results.json, as log ratios with their mean taken away (None:
    no verdict of 4 blocks or more)."""
    verdicts = [v for v in json.loads(path.read_text()).get("verdicts", []) if v.get("metric", "throughput")
                == "throughput" and len(v.get("block_ratios") or []) >= 4]
    if not verdicts:
        return None
    v = verdicts[0]
    u = np.array(unit_means([math.log(x) for x in v["block_ratios"]], v.get("unit_blocks", 1)))
    return u - u.mean()


def misses(pool: np.ndarray, n: int, sims: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Over ``sims`` draws of ``n`` units: the share t's interval left 0 out, BCa's share, BCa's width ÷ t's."""
    miss_t = miss_b = 0
    width_t = width_b = 0.0
    for _ in range(sims):
        d = rng.choice(pool, n)
        m, h = float(d.mean()), float(t_half_width(float(d.std(ddof=1)), n))
        ci = sps.bootstrap((d,), np.mean, method="BCa", n_resamples=1999, rng=rng).confidence_interval
        miss_t += not (m - h <= 0.0 <= m + h)
        miss_b += not (ci.low <= 0.0 <= ci.high)
        width_t, width_b = width_t + 2 * h, width_b + float(ci.high - ci.low)
    return miss_t / sims, miss_b / sims, width_b / width_t


def span(xs: list[float] | tuple[float, ...], fmt: str) -> str:
    """``lo–hi`` in ``fmt``, or one value when both read the same."""
    lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage=__doc__.split("\n\n")[1].strip())
    p.add_argument("results", nargs="+", type=Path, help="finished comparisons' results.json")
    p.add_argument("--sizes", default="30,50,100", help="units per draw, comma-separated (default: 30,50,100)")
    p.add_argument("--sims", type=int, default=2000, help="draws per size (default: 2000)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes {a.sizes!r}: give whole numbers, comma-separated (30,50,100)")
    pools = {}
    for path in a.results:
        units = centred_units(path) if path.is_file() else None
        if units is None:
            p.error(f"{path} has no throughput verdict with 4 blocks or more: give a finished comparison's "
                    "results.json")
        pools[str(path)] = units
    for name, u in pools.items():
        print(f"{name}: {u.size} units, spread {u.std(ddof=1):.4f}, skewness {sps.skew(u):+.2f}")
    pools["pooled"] = np.concatenate([u / u.std() for u in list(pools.values())])
    rng = np.random.default_rng(a.seed)
    rows: dict[int, list[tuple[float, float, float]]] = {n: [] for n in sizes}
    for name, pool in pools.items():
        for n in sizes:
            t, b, w = misses(pool, n, a.sims, rng)
            rows[n].append((t, b, w))
            print(f"  {name} at {n} units: left 0 out: t {100 * t:.1f} %, BCa {100 * b:.1f} %; BCa width ÷ t's {w:.3f}")
    for n, r in rows.items():
        t, b, w = zip(*r, strict=True)
        print(f"figure: miss_t_{n} = {span([100 * x for x in t], '{:.1f}')} %")
        print(f"figure: miss_bca_{n} = {span([100 * x for x in b], '{:.1f}')} %")
        print(f"figure: width_bca_{n} = {span(w, '{:.2f}')}")
    print(f"figure: sims = {a.sims:,}")
    print(f"figure: command = python bench/coverage.py RESULTS... --sizes {a.sizes} --sims {a.sims}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
