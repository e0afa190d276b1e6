#!/usr/bin/env python
"""Is this machine's own speed steady? What its drift leaves under every comparison's interval, no dpcompare in it.

    python bench/steadiness.py [--seconds 120] [--procs N] [--window 1] [--chunks 0.5,1,2] [--budget 300]
                               [--out runs/steadiness] [--quick]

A load average below 0.5 (bench/quiet.sh) says no other process runs here; it does not say the machine runs at
one speed. On a cloud VM the host's other tenants, its clock and its caches can move a core's speed by tens of
per cent over seconds, and no placement of ranks or threads removes that. This bench times one fixed workload —
the demo's convnet, one rank's batch of digits-shaped inputs (32), forward, backward and an SGD step, one
intra-op thread — in ``--procs`` processes at once (default: one per usable core, each pinned to its core, as
the ranks of an np=cores comparison keep every core busy), for ``--seconds``, every step timed. It reports:

- per process: the median step, and over ``--window``-second windows the log standard deviation of the
  windows' median steps, their lag-1 autocorrelation (how long a slow spell lasts) and slowest ÷ fastest window;
- the correlation of the processes' windows (the whole machine slowing, or one core);
- what an ideal A/A comparison could do here: the same workload against itself, alternating chunks of
  ``--chunks`` seconds (A, B, A, B, ...) with no start-up cost between them, paired by neighbours: the per-pair
  log-ratio spread and the 95 % half-width (±%) its mean reaches in ``--budget`` seconds. A comparison's runs are
  chunks with a start-up between them (compare's A/A at the demo's settings: about 2 s a run), so expect its floor
  at the same budget near this one or wider, for the next minutes: an estimate from ``--seconds`` of steps, on a
  machine that may move within minutes.

Writes OUT/steadiness.json and prints ``figure:`` lines (bench/figures.py records them). It waits for a quiet
machine first (bench/quiet.sh), except with --quick (3 s, for the tests: the figures mean nothing).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpcompare.files import atomic_write_json  # noqa: E402
from dpcompare.report import noise  # noqa: E402
from dpcompare.report.intervals import t_half_width  # noqa: E402

#: one rank's batch at the demo's settings (--batch-size 32, digits: 1×8×8 images, 10 classes)
BATCH, SHAPE, CLASSES = 32, (1, 8, 8), 10


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/steadiness.py", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=120.0, help="how long each process times steps (default: 120)")
    p.add_argument("--procs", type=int, default=0, help="processes, each pinned to a core (default: one per core)")
    p.add_argument("--window", type=float, default=1.0, help="seconds per window of the drift figures (default: 1)")
    p.add_argument("--chunks", default="0.5,1,2", help="A/A chunk lengths in seconds (default: 0.5,1,2)")
    p.add_argument("--budget", type=float, default=300.0, help="an A/A's time budget in seconds (default: 300)")
    p.add_argument("--out", default="runs/steadiness", help="folder for steadiness.json")
    p.add_argument("--quick", action="store_true", help="3 s, no wait for a quiet machine (tests)")
    a = p.parse_args(argv)
    try:
        a.chunk_list = [float(c) for c in a.chunks.split(",")]
    except ValueError:
        p.error(f"--chunks {a.chunks!r}: seconds, comma-separated (e.g. 0.5,1,2)")
    if a.quick:
        a.seconds, a.window, a.chunk_list = 3.0, 0.5, [0.25, 0.5]
    if a.seconds <= 0 or a.window <= 0 or min(a.chunk_list) <= 0 or a.seconds < 4 * max(a.window, *a.chunk_list):
        p.error("--seconds must cover at least four windows and four of the longest chunk; all must be positive")
    return a


def time_steps(core: int, seconds: float, ready: Any, out: Any) -> None:
    """In a process of its own, pinned to ``core``: once every process is ready, (start, duration) of every
    step for ``seconds``, put on ``out`` as (core, steps)."""
    import torch

    from dpcompare.models import build_model

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("convnet", SHAPE, CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(BATCH, *SHAPE), torch.randint(0, CLASSES, (BATCH,))
    steps: list[tuple[float, float]] = []
    ready.wait()  # imports and builds take each process its own time: the timing starts together
    end = time.perf_counter() + seconds  # CLOCK_MONOTONIC: one clock for every process
    while (t0 := time.perf_counter()) < end:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps.append((t0, time.perf_counter() - t0))
    out.put((core, np.array(steps)))


def window_medians(steps: np.ndarray, start: float, width: float) -> dict[int, float]:
    """Window index (``width`` seconds from ``start``) → the log of that window's median step."""
    idx = ((steps[:, 0] - start) // width).astype(int)
    return {int(i): float(np.log(np.median(steps[idx == i, 1]))) for i in np.unique(idx)}


def drift(meds: dict[int, float]) -> dict[str, float]:
    """How a process's windows move: their log s.d., lag-1 autocorrelation, slowest ÷ fastest."""
    v = np.array([meds[i] for i in sorted(meds)])
    return {"log_sd": float(v.std(ddof=1)), "lag1": float(np.corrcoef(v[:-1], v[1:])[0, 1]),
            "slowest_over_fastest": float(np.exp(v.max() - v.min())), "windows": len(v)}


def ideal_aa(steps: np.ndarray, start: float, chunk: float, budget: float) -> dict[str, float]:
    """The same steps as an A/A with no start-up cost: chunks of ``chunk`` s alternate A, B; each (A, B)
    neighbour pair gives a log ratio of medians; the half-width (±%) a 95 % interval on their mean reaches with
    the pairs ``budget`` seconds hold, as if the pairs were independent (compare's noise floor at as many units)."""
    meds = window_medians(steps, start, chunk)
    ratios = [meds[i + 1] - meds[i] for i in sorted(meds) if i % 2 == 0 and i + 1 in meds]
    sd = noise.block_spread(ratios) or 0.0  # compare's own spread and interval: its noise floor's definition
    pairs = max(2, int(budget / (2 * chunk)))
    return {"pairs_measured": len(ratios), "pair_sd": sd, "pairs_in_budget": pairs,
            "half_width_pct": 100 * float(np.expm1(t_half_width(sd, pairs)))}


def measure(a: argparse.Namespace) -> list[np.ndarray]:
    cores = sorted(os.sched_getaffinity(0))
    procs = a.procs or len(cores)
    ctx = mp.get_context("spawn")
    ready, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=time_steps, args=(cores[i % len(cores)], a.seconds, ready, out))
               for i in range(procs)]
    for w in workers:
        w.start()
    got = [out.get(timeout=a.seconds + 300) for _ in workers]  # before join: a full queue blocks its writer
    for w in workers:
        w.join()
    return [steps for _, steps in sorted(got, key=lambda x: x[0])]


def analyse(a: argparse.Namespace, series: list[np.ndarray]) -> dict[str, Any]:
    start = max(s[0, 0] for s in series)  # the windows every process covers
    series = [s[s[:, 0] >= start] for s in series]
    meds = [window_medians(s, start, a.window) for s in series]
    common = sorted(set.intersection(*(set(m) for m in meds)))
    cross = (float(np.corrcoef([[m[i] for i in common] for m in meds])[0, 1:].mean())
             if len(series) > 1 and len(common) > 2 else None)
    return {"processes": [{"steps": len(s), "median_step_ms": 1e3 * float(np.median(s[:, 1])),
                           "drift": drift(m),
                           "ideal_aa": {str(c): ideal_aa(s, start, c, a.budget) for c in a.chunk_list}}
                          for s, m in zip(series, meds, strict=True)],
            "cross_process_correlation": cross}


def span(values: list[float], fmt: str) -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo} to {hi}" if min(values) < 0 else f"{lo}–{hi}"


def report(a: argparse.Namespace, res: dict[str, Any]) -> None:
    procs = res["processes"]
    n = len(procs)
    print(f"{n} process(es), each pinned to a core, {a.seconds:g} s of convnet steps (batch {BATCH}, 1 thread):")
    for i, p in enumerate(procs):
        d = p["drift"]
        print(f"  process {i}: median step {p['median_step_ms']:.2f} ms; {d['windows']} windows of {a.window:g} s: "
              f"log s.d. {d['log_sd']:.3f}, lag-1 autocorrelation {d['lag1']:.2f}, "
              f"slowest ÷ fastest {d['slowest_over_fastest']:.2f}")
    if res["cross_process_correlation"] is not None:
        print(f"  the processes' windows correlate {res['cross_process_correlation']:.2f} (1: the whole machine moves)")
    print(f"an ideal A/A here (no start-up between chunks; 95 % half-width in {a.budget:g} s):")
    for c in a.chunk_list:
        aa = [p["ideal_aa"][str(c)] for p in procs]
        print(f"  chunks of {c:g} s: pair log-ratio s.d. {span([x['pair_sd'] for x in aa], '{:.3f}')} → "
              f"±{span([x['half_width_pct'] for x in aa], '{:.1f}')} % ({aa[0]['pairs_in_budget']:.0f} pairs)")
    print(f"figure: window_sd = {span([p['drift']['log_sd'] for p in procs], '{:.2f}')}")
    print(f"figure: lag1 = {span([p['drift']['lag1'] for p in procs], '{:.2f}')}")
    print(f"figure: slowest_over_fastest = {span([p['drift']['slowest_over_fastest'] for p in procs], '{:.2f}')}")
    if res["cross_process_correlation"] is not None:
        print(f"figure: cross_core = {res['cross_process_correlation']:.2f}")
    for c in a.chunk_list:
        key = f"{c:g}".replace(".", "_")
        widths = [p["ideal_aa"][str(c)]["half_width_pct"] for p in procs]
        print(f"figure: ideal_aa_{key}s = ±{span(widths, '{:.1f}')} %")
    print(f"figure: command = python bench/steadiness.py --seconds {a.seconds:g}")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if not a.quick:
        from quiet import wait_for_quiet

        wait_for_quiet()
    res = analyse(a, measure(a))
    res["settings"] = {k: v for k, v in vars(a).items() if k != "chunk_list"} | {"chunks": a.chunk_list}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "steadiness.json", res)
    report(a, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
