#!/usr/bin/env python
"""Where the run-to-run noise of a comparison comes from, and how long a ±2 % verdict takes (issue 67).

    python bench/noise.py [--pairs aa,dh] [--launches 4] [--blocks 10] [--bind none|comm|core] [--threads N]
                          [--hvd-affinity CORES] [--rerun-disturbed PCT] [--out runs/noise] [--quick]
    python bench/noise.py --honest [N] [--blocks auto] [--out runs/noise-honest]
    python bench/noise.py --pairs dh --target-ci 2 --bind none,comm --launches 3 [--time-budget 300]

Runs ``dpcompare compare`` on convnet/digits at np=2 with persistent workers, for the A/A pair (``aa``: ddp
against ddp) and ddp against horovod (``dh``), ``--launches`` times each: every launch is its own comparison (its
own worker job, so its own placement of the ranks and their threads) of ``--blocks`` blocks, every run writing
its step log. For each pair it reports:

- the per-block spread: the standard deviation of the per-block log ratio over every block of every launch, and
  the blocks (and minutes, at the median block's pace) a 95 % interval within ±2 % and ±5 % would take at it, as
  if the blocks were independent (compare's units of two neighbouring blocks, with persistent workers, need as
  many blocks when they are);
- where the variance sits, per arm (Kalibera & Jones' levels, :func:`dpcompare.report.noise.variance_components`
  on the log step times): between launches, between the runs of one launch, between the steps of one run;
- every launch's verdict, and for the A/A pair how many intervals contain equality (``--honest N``: N A/A
  comparisons at compare's own stopping rule, ``--blocks auto`` by default: the check that the intervals keep
  their promise, with its 95 % binomial interval).

``--target-ci PCT`` runs every launch at compare's stopping rule asked for ±PCT % (``--repeats auto --target-ci PCT
--time-budget 300 --max-repeats 200``), each after a wait for a quiet machine, and says per launch how many
minutes it took, its noise floor (did it get there?) and how many runs stalled
(:func:`dpcompare.report.noise.stalls`: below a third of the arm's median, what widens most wide intervals here).
``--bind`` takes a list: the launches alternate over the bindings (none, comm, none, comm, ...), so that the
machine's drift meets each.

Writes OUT/noise.json (everything above, plus each launch's results.json folder) and prints a summary. It waits
for a quiet machine first (bench/quiet.sh), except with --quick: a tiny run (2 launches × 4 blocks of 12-step
runs, A/A only) whose figures mean nothing, for the tests to check the output's structure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from dpcompare.compare.plan import Comparison, RunOptions
from dpcompare.compare.runner import run_compare
from dpcompare.compare.stopping import StoppingRule
from dpcompare.config import TrainConfig
from dpcompare.files import atomic_write_json
from dpcompare.launch.mpirun import BINDINGS
from dpcompare.report import noise

PAIRS = {"aa": ("ddp", "ddp"), "dh": ("ddp", "horovod")}
#: a gap between two step-log lines this many times the run's median is an evaluation or an epoch's end: left out
GAP = 10.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/noise.py", description=__doc__.split("\n\n")[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", default="aa,dh", help="aa (ddp vs ddp), dh (ddp vs horovod) (default: aa,dh)")
    p.add_argument("--launches", type=int, default=4, help="comparisons (worker jobs) per pair (default: 4)")
    p.add_argument("--blocks", default="10", help="blocks per launch, or auto: compare's stopping rule (default: 10)")
    p.add_argument("--honest", type=int, nargs="?", const=20, metavar="N",
                   help="N A/A comparisons (default N: 20) at compare's stopping rule (--pairs aa --launches N, "
                        "--blocks auto unless given): how many intervals contain equality")
    p.add_argument("--bind", default="none", type=_bindings,
                   help=f"compare --bind, or a list ({','.join(BINDINGS)}) the launches alternate over (default: none)")
    p.add_argument("--target-ci", dest="target", type=float, metavar="PCT",
                   help="every launch at compare's stopping rule asked for ±PCT %% (see above)")
    p.add_argument("--time-budget", type=float, default=300.0, help="with --target-ci: seconds a launch may take")
    p.add_argument("--steps", type=int, default=200, help="timed steps per run (default: 200)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads per rank (default: 0, cores ÷ ranks)")
    p.add_argument("--hvd-affinity", metavar="CORES",
                   help="HOROVOD_THREAD_AFFINITY for every rank (e.g. 0,1: rank i's background thread on core i)")
    p.add_argument("--rerun-disturbed", type=float, default=0.0, metavar="PCT", help="compare --rerun-disturbed")
    p.add_argument("--out", default="runs/noise", help="folder for the comparisons and noise.json")
    p.add_argument("--quick", action="store_true", help="tiny settings, no wait for a quiet machine (tests)")
    a = p.parse_args(argv)
    if a.honest:
        a.pairs, a.launches = "aa", a.honest
        a.blocks = a.blocks if "--blocks" in (argv or sys.argv[1:]) else "auto"
    if a.quick:
        a.launches, a.blocks = (a.honest or 2), "4"  # 4 blocks: 2 units of 2 with persistent workers, an interval
        a.pairs = "aa" if "--pairs" not in (argv or sys.argv[1:]) else a.pairs
    if a.target:
        a.blocks = "auto"  # compare's stopping rule at --target-ci decides (schedule), and noise.json says so
    return a


def _bindings(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in BINDINGS for v in values):
        raise argparse.ArgumentTypeError(f"--bind {text!r}: give one or more of {', '.join(BINDINGS)}")
    return values


def train_config(a: argparse.Namespace) -> TrainConfig:
    """convnet/digits, every step in the step log (not with --target-ci: compare's own runs, so no variance
    components); --quick: 12 steps per run, 2 of them warm-up."""
    if a.quick:
        return TrainConfig(model="convnet", dataset="digits", epochs=0, max_steps=12, warmup_steps=2,
                           min_timed_steps=0, threads=a.threads, step_log=True, tensorboard=False)
    return TrainConfig(model="convnet", dataset="digits", epochs=3, min_timed_steps=a.steps, threads=a.threads,
                       step_log=not a.target, tensorboard=False)  # --target-ci: the runs compare itself makes


def schedule(a: argparse.Namespace) -> StoppingRule:
    if a.target:
        return StoppingRule(repeats=None, target_ci=a.target / 100, max_repeats=200, time_budget=a.time_budget)
    blocks = a.blocks
    if blocks == "auto":
        return StoppingRule(repeats=None)  # compare's defaults: ±5 %, at most 100 blocks
    return StoppingRule(repeats=int(blocks))


def launch(a: argparse.Namespace, pair: str, i: int, bind: str) -> tuple[Path, dict[str, Any]]:
    """One comparison of the pair (its own worker job) placed as ``bind``; its folder, and with --target-ci the
    load average at its start and its wall seconds."""
    out = Path(a.out) / pair / (f"launch{i}" if len(a.bind) == 1 else f"{bind}-launch{i}")
    c = Comparison(train_config(a), PAIRS[pair], (2,), schedule(a), out,
                   RunOptions(overwrite=True, progress="none", workers="persistent", bind=bind,
                              disturbed=a.rerun_disturbed / 100.0))
    timing: dict[str, Any] = {}
    if a.target and not a.quick:
        from quiet import wait_for_quiet

        wait_for_quiet()
        timing["load"] = Path("/proc/loadavg").read_text().split()[0]
    start = time.monotonic()
    run_compare(c, console=_quiet_console())
    timing["seconds"] = round(time.monotonic() - start, 1)
    return out, timing


def _quiet_console() -> Any:
    from rich.console import Console

    return Console(quiet=True)


def step_times(run_dir: Path, warmup: int) -> list[float]:
    """Seconds of each step after ``warmup`` from RUN/steps.jsonl, gaps of evaluations left out (:data:`GAP`)."""
    path = run_dir / "steps.jsonl"
    if not path.is_file():
        return []
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    t = [x["t"] for x in lines if "event" not in x and "step" in x]
    gaps = [b - a for a, b in zip(t, t[1:], strict=False)][warmup:]
    gaps = [g for g in gaps if g > 0]
    if not gaps:
        return []
    med = statistics.median(gaps)
    return [g for g in gaps if g <= GAP * med]


def launch_data(launched: tuple[Path, dict[str, Any]], warmup: int) -> dict[str, Any]:
    """What one launch gives: its verdict, each arm's runs' log step times, the block log ratios and seconds, its
    noise floor, its stalled runs, and its timing (:func:`launch`)."""
    folder, timing = launched
    res = json.loads((folder / "results.json").read_text())
    arms = [a["label"] for a in res["config"]["arms"]]
    runs: dict[str, list[list[float]]] = {a: [] for a in arms}
    block_s: dict[int, float] = {}
    for r in res["runs"]:
        if r["status"] == "ok":
            runs[r["arm"]].append([math.log(s) for s in step_times(folder / r["dir"], warmup)])
        block_s[r["repeat"]] = block_s.get(r["repeat"], 0.0) + float(r["wall_seconds"])
    v = next((v for v in res.get("verdicts", []) if v.get("metric", "throughput") == "throughput"), None)
    floors = [f["floor"] for f in res.get("noise") or [] if f.get("floor") is not None]
    return {"folder": str(folder), "arms": arms, "runs": runs, "verdict": v,
            "log_ratios": [math.log(x) for x in (v or {}).get("block_ratios", [])],
            "block_seconds": list(block_s.values()), "disturbed": len(res.get("disturbed") or []),
            "floor": max(floors) if floors else None, "stalled": stalled_runs(res), **timing}


def stalled_runs(res: dict[str, Any]) -> dict[str, int]:
    """Per arm, how many runs stalled (:func:`dpcompare.report.noise.stalls`)."""
    return {arm: len(noise.stalls(throughputs)) for arm, _, throughputs in noise.arm_throughputs(res)}


def components(launches: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm, the variance components of its log step times over launches, runs and steps (or why none)."""
    out: dict[str, Any] = {}
    if not any(run for launch in launches for runs in launch["runs"].values() for run in runs):
        return {arm: {"error": "no step logs (--target-ci times compare's own runs)"} for arm in launches[0]["arms"]}
    for arm in launches[0]["arms"]:
        try:
            out[arm] = noise.variance_components([d["runs"][arm] for d in launches]).to_json()
        except ValueError as e:
            out[arm] = {"error": str(e)}
    return out


def coverage(verdicts: list[dict[str, Any] | None]) -> dict[str, Any]:
    """How many of the A/A intervals contain equality (ratio 1), with the 95 % Clopper-Pearson interval."""
    from scipy.stats import binomtest

    ivs = [v for v in verdicts if v and v.get("ci_low") is not None]
    k = sum(v["ci_low"] <= 1.0 <= v["ci_high"] for v in ivs)
    ci = binomtest(k, len(ivs)).proportion_ci() if ivs else None
    return {"contain_equality": k, "intervals": len(ivs), "share": round(k / len(ivs), 4) if ivs else None,
            "share_ci95": None if ci is None else [round(ci.low, 4), round(ci.high, 4)],
            "outcomes": {o: sum(v["outcome"] == o for v in ivs) for o in ("equal", "faster", "slower", "undecided")}}


def pair_summary(pair: str, launches: list[dict[str, Any]]) -> dict[str, Any]:
    """noise.json's entry of one pair (see the module's docstring)."""
    d = [x for launch in launches for x in launch["log_ratios"]]
    sd = noise.block_spread(d)
    block_s = [s for launch in launches for s in launch["block_seconds"]]
    per_block = statistics.median(block_s) if block_s else None  # the median: a launch's first block starts its job
    to = {p: None if sd is None else noise.units_to(p / 100, sd) for p in (2, 5)}
    return {
        "arms": list(PAIRS[pair]), "launches": len(launches), "blocks": len(d),
        "block_sd": None if sd is None else round(sd, 6), "floor": noise.noise_floor(d),
        "block_seconds": None if per_block is None else round(per_block, 3),
        **{f"blocks_to_{p}pct": n for p, n in to.items()},
        **{f"minutes_to_{p}pct": None if n is None or per_block is None else round(n * per_block / 60, 2)
           for p, n in to.items()},
        "components": components(launches),
        "verdicts": [launch["verdict"] and {k: launch["verdict"].get(k) for k in
                                            ("outcome", "ratio", "ci_low", "ci_high",
                                             "blocks")} for launch in launches],
        "disturbed_blocks": sum(launch["disturbed"] for launch in launches),
        "launch_floors": [launch["floor"] for launch in launches],
        "launch_minutes": [round(launch["seconds"] / 60, 2) for launch in launches],
        "launch_loads": [launch.get("load") for launch in launches],
        "stalled_runs": [launch["stalled"] for launch in launches],
        "folders": [launch["folder"] for launch in launches],
        **({"coverage": coverage([launch["verdict"] for launch in launches])} if PAIRS[pair][0] == PAIRS[pair][1]
           else {}),
    }


def print_summary(summary: dict[str, Any]) -> None:
    for pair, s in summary["pairs"].items():
        print(f"{pair} ({' vs '.join(s['arms'])}): {s['launches']} launches, {s['blocks']} blocks; per-block spread "
              f"{s['block_sd']}; ±2 %: {s['blocks_to_2pct']} blocks ({s['minutes_to_2pct']} min), ±5 %: "
              f"{s['blocks_to_5pct']} blocks ({s['minutes_to_5pct']} min)")
        for arm, c in s["components"].items():
            shares = ", ".join(f"{lv} {c[lv]['share']:.0%} (sd {c[lv]['sd']:.4f})" for lv in noise.LEVELS) \
                if "error" not in c else c["error"]
            print(f"  {arm}: {shares}")
        for f, m, st in zip(s["launch_floors"], s["launch_minutes"], s["stalled_runs"], strict=True):
            print(f"  launch: floor ±{100 * f:.1f} %, {m} min, stalled runs {st}" if f is not None else
                  f"  launch: no floor, {m} min, stalled runs {st}")
        if "coverage" in s:
            cv = s["coverage"]
            print(f"  intervals containing equality: {cv['contain_equality']} of {cv['intervals']} "
                  f"(95 % CI {cv['share_ci95']}); outcomes {cv['outcomes']}")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    names = [p.strip() for p in a.pairs.split(",") if p.strip()]
    if any(p not in PAIRS for p in names) or not names or a.launches < 1:
        print(f"bench/noise.py: --pairs {a.pairs!r} --launches {a.launches}: give pairs from {', '.join(PAIRS)} and "
              "at least 1 launch", file=sys.stderr)
        return 2
    if a.hvd_affinity:
        os.environ["HOROVOD_THREAD_AFFINITY"] = a.hvd_affinity  # forwarded to the ranks, recorded in config.binding
    if not a.quick:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from quiet import wait_for_quiet

        wait_for_quiet()
    warmup = train_config(a).warmup_steps
    pairs: dict[str, Any] = {}
    for pair in names:
        per: dict[str, list[dict[str, Any]]] = {b: [] for b in a.bind}
        for i in range(a.launches):
            for b in a.bind:  # alternating: the machine's drift meets every binding
                per[b].append(launch_data(launch(a, pair, i, b), warmup))
        pairs.update({pair if len(a.bind) == 1 else f"{pair} bind={b}": pair_summary(pair, per[b]) for b in a.bind})
    kept = ("launches", "blocks", "bind", "target", "steps", "threads", "hvd_affinity", "rerun_disturbed", "quick",
            "honest")
    summary = {"settings": {k: getattr(a, k) for k in kept}, "pairs": pairs}
    atomic_write_json(Path(a.out) / "noise.json", summary)
    print_summary(summary)
    print(f"written: {Path(a.out) / 'noise.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
