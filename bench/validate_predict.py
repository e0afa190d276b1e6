#!/usr/bin/env python
r"""Validate ``dpcompare predict`` in the lab on workloads it was not tuned on: predicted (with its band) against
measured step time.

    sudo PYTHONPATH=$PWD .venv/bin/python bench/validate_predict.py measure --out /tmp/validate      # root: namespaces
    .venv/bin/python bench/validate_predict.py analyse /tmp/validate --markdown table.md \
        --plot bench/data/predict-validation.png
    # minutes: the plumbing
    sudo PYTHONPATH=$PWD .venv/bin/python bench/validate_predict.py measure --quick --out /tmp/vq

``measure`` runs the whole procedure a user follows, ``--rounds`` times from the start (each round its own traces,
benches and measurements), per host count H (one lab of H hosts, one rank per host):

1. **compute**: a traced run of every strategy and workload on the UNSHAPED lab (``train --trace K``; with
   ``--trace-launches L``, L such runs, pooled as ``predict`` pools a comparison's traced repeats);
2. **overlap**: a short traced run of each on a link slow enough for communication to matter (``--overlap-link``,
   not one of the validated rates), for ``predict --overlap-from``;
3. per link rate: ``lab bench`` (gloo and/or Open MPI, ``--bench-repeats`` mpirun jobs: both of Open MPI's speeds;
   each size after the idle gap and back to back) and every strategy and workload run untraced ``--repeats`` times (the
   measured step: the median of the runs' ``step_ms_median``). The load average is recorded before every run.

Step 1 is interleaved with step 3 by default: each configuration traced right before its own measured runs
(``--no-interleave``: all traces first, as bench/predict-validation.md's runs 1-7); then a short step is traced and
timed for ``--min-seconds`` at least (more steps than ``--trace`` and ``--steps``; since run 11).

``analyse`` predicts every configuration in the code ``dpcompare predict`` runs (``sweep.curve``: the point, its
95 % bootstrap band, both modes), under each candidate calibration. The calibration is **chosen on the mlp family
alone** (the lowest median |error|); the other families (convnet, resnet18 with BatchNorm, gpt-tiny, the
squeezenet plug-in) are reported under that choice, untouched: per family and overall the median, worst and
signed mean error, how often the measured step fell inside the band, which figures came from the choosing set,
and in how many configurations the rounds' bands overlap. The same for the **interval**: each band widened by the
model's error measured on the choosing set's rows (:mod:`dpcompare.prediction.interval`; ``--model-error-out FILE``
writes it for ``predict --model-error``, ``--model-error-from FILE`` judges an earlier validation's figure on this
one's rows instead, all of them held out from it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dpcompare.lab import Lab, LabSpec, session
from dpcompare.lab import bench as labbench
from dpcompare.lab.spec import link_bps
from dpcompare.launch.jobs import log_tail
from dpcompare.launch.mpirun import dpcompare_argv
from dpcompare.prediction import interval, overlap, strategies, sweep
from dpcompare.prediction.network import Bench, Link, Network, load_bucket, load_calibration, load_profiles
from dpcompare.prediction.profile import (
    PROBE_MIN_STEPS,
    UNTRACED_MODES,
    Profile,
    launch_spread,
    pooled,
    with_spread,
)

ROOT = Path(__file__).resolve().parents[1]
#: workload → (family, its flags). mlp is the choosing set; every other family is held out.
WORKLOADS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mlp2048": ("mlp", ("--model", "mlp", "--width", "2048", "--dataset", "synthetic", "--input-shape", "1,28,28")),
    "mlp512": ("mlp", ("--model", "mlp", "--width", "512", "--dataset", "synthetic", "--input-shape", "1,28,28")),
    "convnet": ("convnet", ("--model", "convnet", "--dataset", "synthetic", "--input-shape", "1,28,28")),
    "resnet18": ("resnet18", ("--model", "resnet18", "--dataset", "synthetic", "--input-shape", "3,32,32")),
    "gpt-tiny": ("gpt", ("--model", "gpt-tiny", "--dataset", "tokens", "--seq-len", "128", "--batch-size", "8")),
    "squeezenet": ("plug-in", ("--workload", str(ROOT / "tests" / "zoo" / "squeezenet.py") + ":workload")),
}
CHOOSING = "mlp"
COMMON = ("--samples", "4096", "--epochs", "0", "--threads", "1", "--trackers", "none", "--progress", "none",
          "--overwrite")
RESULTS = "results.json"
#: candidate calibrations: name → (bench: none / the same H and rate / the same without its back-to-back sizes /
#: the 2-host bench at the first rate, --floor-from-trace, --overlap-from, --straggler-from-trace)
CALIBRATIONS: dict[str, tuple[str, bool, bool, bool]] = {
    "plain": ("none", False, False, False), "plainfloor": ("none", True, False, False),
    "profile": ("same", False, False, False), "profilefloor": ("same", True, False, False),
    "oneprofile": ("one", False, False, False), "profile+overlap": ("same", False, True, False),
    "profilefloor+overlap": ("same", True, True, False), "profilefloor+overlap+straggler": ("same", True, True, True),
    "idleprofilefloor+overlap+straggler": ("idle", True, True, True)}
QUICK = {"hosts": [2], "links": ["200mbit"], "strategies": ["ddp"], "workloads": ["mlp512", "convnet"], "rounds": 2,
         "repeats": 2, "steps": 4, "warmup": 2, "trace": 4, "overlap_steps": 3, "bench_sizes": "256K,1M,4M",
         "bench_repeats": 2, "min_seconds": 0}


def load() -> float:
    return os.getloadavg()[0]


def train_argv(strategy: str, workload: str, out: Path, steps: int, warmup: int, trace: int = 0) -> list[str]:
    """A run of ``steps`` timed steps; traced (``trace`` of them), as many more (8 at least) untraced after them,
    which tell what the tracing cost (``predict --untraced-compute``; since run 27)."""
    after = max(trace, PROBE_MIN_STEPS) if trace else 0
    argv = [*dpcompare_argv(), "train", "--strategy", strategy, *WORKLOADS[workload][1], *COMMON,
            "--warmup-steps", str(warmup), "--max-steps", str(warmup + steps + after), "--out", str(out)]
    return argv + (["--trace", str(trace)] if trace else [])


def run_train(lab: Lab, argv: list[str], timeout: float) -> float:
    """One run across the lab; its step_ms_median (the slowest rank's median timed step)."""
    out = Path(argv[argv.index("--out") + 1])
    rc, _ = lab.run(argv, out, per_host=1, timeout=timeout)
    if rc != 0:
        raise SystemExit(f"{' '.join(argv[-12:])}: exit {rc}\n{log_tail(out, 40)}")
    return float(json.loads((out / "summary.json").read_text())["timing"]["step_ms_median"])


def bench(lab: Lab, path: Path, a: argparse.Namespace) -> None:
    backends = tuple(dict.fromkeys("mpi" if s == "horovod" else "gloo" for s in a.strategies))
    doc = labbench.measure(lab, labbench.parse_sizes(a.bench_sizes), backends, ("all_reduce",), warmup=1, iters=3,
                           repeats=a.bench_repeats, logs=path.with_suffix(""))  # kept when the lab goes
    labbench.write(doc, path)
    for line in labbench.mode_lines(doc):
        print(f"  bench: {line}", flush=True)


def sized(steps: int, step_ms: float | None, min_seconds: float) -> int:
    """``steps``, or more where that few would time less than ``min_seconds`` at ``step_ms`` (at most 64): a 40 ms
    step timed 6 times is 0.24 s, too short for its median to hold on a shared machine."""
    if not step_ms or min_seconds <= 0:
        return steps
    return max(steps, min(64, math.ceil(min_seconds * 1e3 / step_ms)))


def traced_runs(lab: Lab, a: argparse.Namespace, base: Path, what: str, steps: int,
                step_ms: dict[tuple[str, str], float] | None = None) -> dict[tuple[str, str], str]:
    """A traced run of every strategy and workload on the lab's current link: (strategy, workload) → its folder
    (and its step in ``step_ms``)."""
    out = {}
    for s in a.strategies:
        for w in a.workloads:
            folder = base / what / f"{s}-{w}"
            ms = run_train(lab, train_argv(s, w, folder, steps, a.warmup, trace=steps), a.timeout)
            out[s, w] = str(folder)
            if step_ms is not None:
                step_ms[s, w] = ms
            print(f"{base.name} {what} {s} {w}: traced step {ms:.1f} ms (load {load():.2f})", flush=True)
    return out


def measured_dir(bench: Path, link: str, strategy: str, workload: str, k: int) -> Path:
    """The folder of a configuration's k-th measured run, beside its link's bench file."""
    return bench.parent / link / f"{strategy}-{workload}-r{k}"


def traced_now(lab: Lab, a: argparse.Namespace, folder: Path, s: str, w: str, bps: int | None,
               slow_ms: float | None) -> tuple[list[str], float]:
    """``--interleave``: the configuration's own traced launches on the unshaped lab, right before its measured runs
    (the link put back to ``bps`` after them), ``--trace`` steps or more to last ``--min-seconds`` at the overlap
    run's step ``slow_ms``; their folders and median step."""
    lab.set_link(None)
    out, ms = [], []
    steps = sized(a.trace, slow_ms, a.min_seconds)
    for k in range(a.trace_launches):
        ms.append(run_train(lab, train_argv(s, w, folder / f"traced-{k}", steps, a.warmup, trace=steps), a.timeout))
        out.append(str(folder / f"traced-{k}"))
    lab.set_link(bps)
    return out, statistics.median(ms)


def measure_hosts(rnd: int, h: int, a: argparse.Namespace, log: list[dict[str, Any]]) -> None:
    """Round ``rnd`` at ``h`` hosts, from the traces to the measurements, appended to ``log`` (saved after each)."""
    with session(LabSpec(hosts=h, name=f"val{h}{secrets.token_hex(2)}")) as lab:
        base = a.out / f"round{rnd}" / f"h{h}"
        launches = [] if a.interleave else [traced_runs(lab, a, base, "unshaped" + (f"-{k}" if k else ""), a.trace)
                                            for k in range(a.trace_launches)]  # each its own launch: pooled
        lab.set_link(link_bps(a.overlap_link))
        slow_ms: dict[tuple[str, str], float] = {}
        slow = traced_runs(lab, a, base, f"overlap-{a.overlap_link}", a.overlap_steps, slow_ms)
        for link in a.links:
            lab.set_link(link_bps(link))
            cal = base / f"bench-{link}.json"
            bench(lab, cal, a)
            for s in a.strategies:
                for w in a.workloads:
                    traced, traced_ms = (traced_now(lab, a, base / link / f"{s}-{w}-traced", s, w, link_bps(link),
                                                    slow_ms.get((s, w))) if a.interleave
                                         else ([t[s, w] for t in launches], None))
                    rec = {"round": rnd, "hosts": h, "link": link, "strategy": s, "workload": w,
                           "family": WORKLOADS[w][0], "trace": traced, "overlap_trace": slow[s, w],
                           "bench": str(cal), "measured_ms": [], "load": []}
                    for r in range(a.repeats):
                        rec["load"].append(round(load(), 2))
                        folder = measured_dir(cal, link, s, w, r)
                        steps = sized(a.steps, traced_ms, a.min_seconds)
                        rec["measured_ms"].append(run_train(lab, train_argv(s, w, folder, steps, a.warmup),
                                                            a.timeout))
                    print(f"round {rnd} h={h} {link} {s} {w}: {rec['measured_ms']} ms (load {rec['load']})",
                          flush=True)
                    log.append(rec)
                    (a.out / RESULTS).write_text(json.dumps(log, indent=1))  # not atomic: a progress log, rewritten


# -- analysis --------------------------------------------------------------------------------------------------------
def merged(folders: list[Path]) -> list[dict[str, Any]]:
    """The records of one or more measure runs, each run's rounds numbered after the previous run's."""
    log: list[dict[str, Any]] = []
    for folder in folders:
        last = max((r["round"] for r in log), default=0)
        log += [{**r, "round": r["round"] + last} for r in json.loads((folder / RESULTS).read_text())]
    return log


def traces(rec: dict[str, Any]) -> tuple[str, ...]:
    return tuple(rec["trace"] if isinstance(rec["trace"], list) else [rec["trace"]])  # runs before --trace-launches


def arms(log: list[dict[str, Any]], untraced: str = "auto") -> dict[tuple[str, ...], Profile]:
    """Every configuration's pooled profile (its traces), with the launches' spread of its round and host count:
    estimated, as `dpcompare predict` does from the arms of one comparison (:func:`.profile.launch_spread`), from
    every trace of each arm in that round (with ``--interleave``, one per link)."""
    out: dict[tuple[str, ...], Profile] = {}
    loaded: dict[str, Profile] = {}

    def one(t: str) -> Profile:
        return loaded.setdefault(t, strategies.profile(Path(t), untraced))

    for key in sorted({(r["round"], r["hosts"]) for r in log}):
        mine = [r for r in log if (r["round"], r["hosts"]) == key]
        by_arm: dict[tuple[str, str], list[str]] = {}
        for r in mine:
            by_arm.setdefault((r["strategy"], r["workload"]), []).extend(traces(r))
        spread = launch_spread([pooled([one(t) for t in dict.fromkeys(ts)]) for ts in by_arm.values()])
        for ts in dict.fromkeys(traces(r) for r in mine):
            out[ts] = with_spread([pooled([one(t) for t in ts])], spread)[0]
    return out


def predict(rec: dict[str, Any], how: str, one: str, replicates: int, p: Profile) -> dict[str, Any]:
    """The configuration, traced as ``p``, as `dpcompare predict` sees it under calibration ``how``: point, band,
    modes (ms)."""
    which, floor, with_overlap, straggler = CALIBRATIONS[how]
    knobs = sweep.knobs_of(p, {})
    cal = {"none": None, "same": rec["bench"], "idle": rec["bench"], "one": one}[which]
    b2b = which != "idle"  # "idle": the bench's sizes timed back to back left out
    burst, gap = load_bucket(cal) if cal else (0.0, None)
    net = Network(1, Link.of(0.0, link_bps(rec["link"]) or 0), 1, None, load_calibration(cal) if cal else {},
                  strategies.trace_floors(p) if floor else {}, load_profiles(cal, back_to_back=b2b) if cal else {},
                  burst, strategies.trace_waits(p) if straggler else {}, gap)
    ov = overlap.Overlap()
    if with_overlap:
        shaped = strategies.profile(Path(rec["overlap_trace"]), p.measured["probe"]["mode"])  # as the traced run
        ov = overlap.measure(shaped, p, strategies.schedule(rec["strategy"]), knobs)
    noise = sweep.Noise(Bench.load(cal, b2b) if cal else None, floor, replicates)
    c = sweep.curve(p, rec["strategy"], knobs, net, [rec["hosts"]], rec["workload"], noise, ov)
    lo, hi = c.band(0)
    return {
        "predicted_ms": c.steps[0].step * 1e3,
        "low_ms": lo * 1e3,
        "high_ms": hi * 1e3,
        "no_overlap_ms": c.steps[0].no_overlap * 1e3,
        "modes_ms": [x * 1e3 for x in c.modes[1]] if c.modes else None,
        "overlap": ov.as_dict(),
        "band_advice": c.band_advice,
    }


def first_bench(log: list[dict[str, Any]]) -> str:
    """The first round's first bench (calibration ``one``)."""
    return min(log, key=lambda r: (r["round"], r["hosts"], log.index(r)))["bench"]


def rows(log: list[dict[str, Any]], how: str, replicates: int, profiles: dict[tuple[str, ...], Profile]
         ) -> list[dict[str, Any]]:
    """Predicted against measured per configuration (traced as ``profiles``: :func:`arms`), the error in % of the
    measured, whether the band held it."""
    one, out = first_bench(log), []
    for rec in log:
        measured = statistics.median(rec["measured_ms"])
        pred = predict(rec, how, one, replicates, profiles[traces(rec)])
        out.append({**{k: rec[k] for k in ("round", "hosts", "link", "strategy", "workload", "family")}, **pred,
                    "measured_ms": measured, "measured_runs_ms": rec["measured_ms"], "load": rec.get("load"),
                    "error_pct": 100 * (pred["predicted_ms"] / measured - 1),
                    "in_band": pred["low_ms"] <= measured <= pred["high_ms"],
                    "choosing_set": rec["family"] == CHOOSING})
    return out


def measured_forward_ms(rec: dict[str, Any]) -> float | None:
    """The forward phase (ms, median over ranks and runs) of the configuration's own measured runs, which record
    their phases untraced (summary.json ``timing.phases_ms``); forward carries no gradient communication."""
    found = []
    for k in range(len(rec["measured_ms"])):
        path = measured_dir(Path(rec["bench"]), rec["link"], rec["strategy"], rec["workload"], k) / "summary.json"
        if path.is_file():
            found.append(json.loads(path.read_text()).get("timing", {}).get("phases_ms", {}).get("forward"))
    found = [x for x in found if x]
    return statistics.median(found) if found else None


def compute_matched(table: list[dict[str, Any]], log: list[dict[str, Any]], how: str,
                    profiles: dict[tuple[str, ...], Profile]) -> None:
    """A diagnostic beside every row: the prediction with the traced compute scaled to the measured runs' own
    forward (``matched_ms``, ``matched_error_pct``, ``forward_ratio``): the network model judged on the compute that
    really ran, apart from a machine whose speed moved between the traces and the measurements."""
    one = first_bench(log)
    for r, rec in zip(table, log, strict=True):
        p, fwd = profiles[traces(rec)], measured_forward_ms(rec)
        if not fwd or p.forward <= 0:
            continue
        r["forward_ratio"] = fwd / (p.forward * 1e3)
        pred = predict(rec, how, one, 0, p.scaled(r["forward_ratio"]))
        r["matched_ms"] = pred["predicted_ms"]
        r["matched_error_pct"] = 100 * (pred["predicted_ms"] / r["measured_ms"] - 1)


def stats(table: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [r["error_pct"] for r in table]
    if not errs:
        return {"n": 0}
    return {"n": len(errs), "median_abs_pct": statistics.median(map(abs, errs)), "worst_abs_pct": max(map(abs, errs)),
            "signed_mean_pct": statistics.fmean(errs), "in_band": sum(r["in_band"] for r in table),
            "in_interval": sum(r.get("in_interval", False) for r in table)}


def rounds_agree(table: list[dict[str, Any]], low: str = "low_ms", high: str = "high_ms") -> tuple[int, int]:
    """(configurations whose rounds' bands, or ``low``–``high``, all overlap, configurations measured in two rounds
    or more)."""
    by: dict[tuple, list[dict[str, Any]]] = {}
    for r in table:
        by.setdefault((r["hosts"], r["link"], r["strategy"], r["workload"]), []).append(r)
    many = [v for v in by.values() if len(v) > 1]
    agree = sum(max(r[low] for r in v) <= min(r[high] for r in v) for v in many)
    return agree, len(many)


def model_error(table: list[dict[str, Any]], given: Path | None) -> interval.ModelError:
    """The widening from the choosing set's rows of ``table`` (or ``given``, an earlier validation's file)."""
    if given is not None:
        return interval.load(str(given)) or interval.VALIDATED
    return interval.conformal([interval.score(r["predicted_ms"], r["low_ms"], r["high_ms"], r["measured_ms"])
                               for r in table if r["choosing_set"]], source=f"a validation's choosing set ({CHOOSING})")


def widen(table: list[dict[str, Any]], me: interval.ModelError) -> None:
    """Every row's interval (its band widened by ``me``) and whether the measured step fell inside it."""
    for r in table:
        s = r["predicted_ms"]
        r["interval_low_ms"], r["interval_high_ms"] = me.interval(s, (r["low_ms"], r["high_ms"]))
        r["in_interval"] = r["interval_low_ms"] <= r["measured_ms"] <= r["interval_high_ms"]


def choose(log: list[dict[str, Any]], replicates: int, profiles: dict[tuple[str, ...], Profile], only: str | None = None
           ) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """Every calibration's rows, and the one with the lowest median |error| on the choosing set alone (``only``:
    that calibration's rows alone, chosen before)."""
    tables = {how: rows(log, how, replicates, profiles) for how in ([only] if only else CALIBRATIONS)}
    scored = {how: stats([r for r in t if r["choosing_set"]]) for how, t in tables.items()}
    best = min((h for h in scored if scored[h]["n"]), key=lambda h: (scored[h]["median_abs_pct"],
                                                                    scored[h]["worst_abs_pct"]))
    return best, tables


def report(tables: dict[str, list[dict[str, Any]]], chosen: str, me: interval.ModelError) -> str:
    """Markdown: per family and overall under the chosen calibration, every calibration on the choosing set."""
    t = tables[chosen]
    fams = list(dict.fromkeys(r["family"] for r in t))
    loads = [x for r in t for x in (r["load"] or [])]
    out = [f"Calibration chosen on the {CHOOSING} family alone: **{chosen}**. Load average during the measured runs: "
           f"{min(loads, default=0):.2f}–{max(loads, default=0):.2f}.", "",
           f"Interval: {me.describe()}.", "",
           "| family | configurations | median \\|error\\| | worst \\|error\\| | signed mean | measured inside the "
           "band |"
           " inside the interval | from the choosing set |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    held = [r for r in t if not r["choosing_set"]]
    for name, part in [*((f, [r for r in t if r["family"] == f]) for f in fams), ("held out, all", held),
                       ("everything", t)]:
        s = stats(part)
        if s["n"]:
            mine = "yes" if all(r["choosing_set"] for r in part) else ("partly" if any(r["choosing_set"] for r in part)
                                                                       else "no")
            out.append(f"| {name} | {s['n']} | {s['median_abs_pct']:.1f} % | {s['worst_abs_pct']:.1f} % | "
                       f"{s['signed_mean_pct']:+.1f} % | {s['in_band']} of {s['n']} | {s['in_interval']} of {s['n']} | "
                       f"{mine} |")
    agree, many = rounds_agree(t)
    wide, _ = rounds_agree(t, "interval_low_ms", "interval_high_ms")
    out += ["", f"Rounds: the bands of every round overlap in {agree} of {many} configurations measured twice or more; "
            f"the intervals in {wide} of {many}.", *_matched_lines(t, fams),
            "", f"Every candidate on the choosing set ({CHOOSING}):", "",
            "| calibration | median \\|error\\| | worst | signed mean | inside the band |", "|---|---:|---:|---:|---:|"]
    for how, rows_ in tables.items():
        s = stats([r for r in rows_ if r["choosing_set"]])
        if s["n"]:
            out.append(f"| {how} | {s['median_abs_pct']:.1f} % | {s['worst_abs_pct']:.1f} % | "
                       f"{s['signed_mean_pct']:+.1f} % | {s['in_band']} of {s['n']} |")
    out += ["", "| round | hosts | link | strategy | workload | predicted ms (95 % band) | interval | measured ms | "
                "error "
            "| in band | in interval |", "|---:|---:|---|---|---|---:|---:|---:|---:|---|---|"]
    out += [f"| {r['round']} | {r['hosts']} | {r['link']} | {r['strategy']} | {r['workload']}"
            f"{' *' if r['choosing_set'] else ''} | {r['predicted_ms']:.0f} ({r['low_ms']:.0f}–{r['high_ms']:.0f}) | "
            f"{r['interval_low_ms']:.0f}–{r['interval_high_ms']:.0f} | {r['measured_ms']:.0f} | {r['error_pct']:+.1f} "
            "% "
            f"| {'yes' if r['in_band'] else 'no'} | {'yes' if r['in_interval'] else 'no'} |" for r in t]
    return "\n".join(out) + "\n\n\\* the choosing set\n"


def _matched_lines(t: list[dict[str, Any]], fams: list[str]) -> list[str]:
    """The compute-matched diagnostic (:func:`compute_matched`) per family: not a prediction, it reads the measured
    runs' own forward."""
    have = [r for r in t if "matched_error_pct" in r]
    if not have:
        return []
    out = ["", "Diagnostic, not a prediction: the same rows with the traced compute scaled to the measured runs' own "
           "forward phase (the network model judged on the compute that ran; `forward_ratio` is measured over traced "
           "forward):", "", "| family | configurations | median \\|error\\| | worst \\|error\\| | signed mean | "
           "forward ratio, median (range) |", "|---|---:|---:|---:|---:|---|"]
    for name, part in [*((f, [r for r in have if r["family"] == f]) for f in fams),
                       ("held out, all", [r for r in have if not r["choosing_set"]])]:
        if part:
            errs, ratios = [r["matched_error_pct"] for r in part], [r["forward_ratio"] for r in part]
            out.append(f"| {name} | {len(part)} | {statistics.median(map(abs, errs)):.1f} % | "
                       f"{max(map(abs, errs)):.1f} % | {statistics.fmean(errs):+.1f} % | "
                       f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |")
    return out


def plot(table: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.4, 5.8))
    ax = fig.subplots()
    colours = {"mlp": "tab:gray", "convnet": "tab:blue", "resnet18": "tab:red", "gpt": "tab:green",
               "plug-in": "tab:purple"}
    for r in table:
        ax.errorbar(r["measured_ms"], r["predicted_ms"], yerr=[[r["predicted_ms"] - r["low_ms"]],
                                                                 [r["high_ms"] - r["predicted_ms"]]],
                    fmt="o" if r["strategy"] == "ddp" else "s", color=colours.get(r["family"], "black"),
                    ms=3 + r["hosts"], alpha=0.8, lw=0.8)
        if "interval_low_ms" in r:
            ax.plot([r["measured_ms"]] * 2, [r["interval_low_ms"], r["interval_high_ms"]], color="gray", alpha=0.35,
                    lw=0.6)
    lo = min(min(r["measured_ms"], r.get("interval_low_ms", r["low_ms"])) for r in table) * 0.8
    hi = max(max(r["measured_ms"], r.get("interval_high_ms", r["high_ms"])) for r in table) * 1.25
    for f, style in ((1.0, "-"), (1.05, ":"), (0.95, ":"), (1.15, "--"), (0.85, "--")):
        ax.plot([lo, hi], [lo * f, hi * f], style, color="gray", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step (ms, median of runs)",
           ylabel="predicted step (ms, 95 % band; grey: interval)", title=title)
    for fam, c in colours.items():
        if any(r["family"] == fam for r in table):
            ax.scatter([], [], color=c, label=fam + (" (choosing set)" if fam == CHOOSING else ""))
    ax.legend(title="o ddp, □ horovod; size: hosts; dotted ±5 %, dashed ±15 %", fontsize=8, title_fontsize=8)
    fig.tight_layout()
    from dpcompare.files import atomic_write_figure

    atomic_write_figure(path, fig)


# -- the command line ------------------------------------------------------------------------------------------------
def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="run the lab configurations (root)")
    m.add_argument("--out", type=Path, default=Path("/tmp/dpcompare-validate"))
    m.add_argument("--quick", action="store_true", help="a tiny subset (2 hosts, 200mbit, ddp on mlp512 and "
                   "convnet, short runs): shows the procedure works, measures nothing worth reading")
    m.add_argument("--hosts", default="2,3,4")
    m.add_argument("--links", default="1gbit,500mbit,200mbit")
    m.add_argument("--overlap-link", default="100mbit", help="the slow link of the overlap runs")
    m.add_argument("--strategies", default="ddp,horovod")
    m.add_argument("--workloads", default=",".join(WORKLOADS))
    m.add_argument("--rounds", type=int, default=2, help="times the whole procedure runs, trace to measurement")
    m.add_argument("--interleave", action=argparse.BooleanOptionalAction, default=True,
                   help="trace each configuration on the unshaped lab right before its measured runs, so that the "
                   "machine's speed cannot move between them (the procedure of runs 8-10 in "
                   "bench/predict-validation.md); "
                   "--no-interleave: all traces first, as runs 1-7")
    m.add_argument("--steps", type=int, default=6, help="timed steps per measured run")
    m.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    m.add_argument("--trace", type=int, default=8, help="traced steps of the unshaped runs")
    m.add_argument("--trace-launches", type=int, default=1, help="traced runs (launches) of each strategy and "
                   "workload on the unshaped lab, pooled as predict pools a comparison's traced repeats")
    m.add_argument("--min-seconds", type=float, default=2.0, help="with --interleave, more traced and timed steps "
                   "than --trace and --steps where those would last less than this (a short step's median needs "
                   "more of them; at most 64); 0: exactly --trace and --steps (runs 1-10)")
    m.add_argument("--overlap-steps", type=int, default=4, help="traced steps of the overlap runs")
    m.add_argument("--repeats", type=int, default=2, help="untraced runs per configuration")
    m.add_argument("--bench-sizes", default="64K,256K,1M,2M,4M,8M,16M,32M")
    m.add_argument("--bench-repeats", type=int, default=2, help="lab bench --repeats")
    m.add_argument("--timeout", type=float, default=900)
    n = sub.add_parser("analyse", help="predict every measured configuration, choose on mlp, report the rest")
    n.add_argument("out", type=Path, nargs="+", help="a measure --out folder; several: runs of the same procedure, "
                   "their rounds numbered on (every round's band against every other's)")
    n.add_argument("--bootstrap", type=int, default=200, help="replicates per band")
    n.add_argument("--plot", type=Path, default=None, help="write the scatter plot")
    n.add_argument("--json", type=Path, default=None, help="write the chosen calibration's rows and every "
                   "candidate's figures as JSON")
    n.add_argument("--markdown", type=Path, default=None, help="write the tables as Markdown")
    n.add_argument("--calibration", choices=CALIBRATIONS, default=None, help="this calibration, chosen before "
                   "(e.g. on an earlier validation), instead of choosing one on this run's choosing set")
    n.add_argument("--untraced-compute", choices=UNTRACED_MODES, default="auto",
                   help="predict as `predict --untraced-compute MODE`: the traced compute scaled to the steps after "
                   "the traced window (recorded from run 27 on): auto where the tracing clearly slowed it (default)")
    n.add_argument("--model-error-out", type=Path, default=None, help="write the model error measured on the "
                   "choosing set, for `dpcompare predict --model-error`")
    n.add_argument("--model-error-from", type=Path, default=None, help="judge this model-error file (an earlier "
                   "validation's) on every row instead of measuring one on the choosing set")
    a = ap.parse_args()
    if a.cmd == "measure":
        for k in ("hosts", "links", "strategies", "workloads"):
            v = [x.strip() for x in getattr(a, k).split(",") if x.strip()]
            setattr(a, k, [int(x) for x in v] if k == "hosts" else v)
        if a.quick:
            for k, v in QUICK.items():
                setattr(a, k, v)
    return a


def main() -> None:
    a = parse()
    if a.cmd == "measure":
        if not a.quick:
            from quiet import wait_for_quiet

            wait_for_quiet()
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / RESULTS
        log = json.loads(path.read_text()) if path.is_file() else []
        t0, start = time.monotonic(), load()
        for rnd in range(1, a.rounds + 1):
            for h in a.hosts:
                measure_hosts(rnd, h, a, log)
        print(f"measured in {time.monotonic() - t0:.0f} s, load average {start:.2f} at the start"
              f"{' (--quick: taken as it came, not a result)' if a.quick else ''}; `analyse {a.out}` compares",
              flush=True)
        return
    log = merged(a.out)
    profiles = arms(log, a.untraced_compute)
    chosen, tables = choose(log, a.bootstrap, profiles, a.calibration)
    me = model_error(tables[chosen], a.model_error_from)
    widen(tables[chosen], me)
    compute_matched(tables[chosen], log, chosen, profiles)
    text = report(tables, chosen, me)
    print(text)
    if a.json:
        doc = {"chosen": chosen, "model_error": me.as_dict(), "rows": tables[chosen],
               "candidates": {how: {"choosing_set": stats([r for r in t if r["choosing_set"]]),
                                    "held_out": stats([r for r in t if not r["choosing_set"]])}
                              for how, t in tables.items()}}
        a.json.write_text(json.dumps(doc, indent=1) + "\n")  # not atomic: a bench script's output
    if a.markdown:
        a.markdown.write_text(text)  # not atomic: a bench script's output
    if a.model_error_out:
        interval.write(a.model_error_out, me)
    if a.plot:
        s = stats([r for r in tables[chosen] if not r["choosing_set"]])
        title = f"predicted vs measured, calibration '{chosen}' (chosen on {CHOOSING})"
        if s["n"]:
            title += f"\nheld out: median |error| {s['median_abs_pct']:.1f} %, worst {s['worst_abs_pct']:.1f} %"
        plot(tables[chosen], a.plot, title)


if __name__ == "__main__":
    try:
        main()
    except subprocess.TimeoutExpired as e:
        sys.exit(f"timed out: {e}")
