#!/usr/bin/env python
"""Validate ``dpcompare predict``'s network part in the lab: predicted against measured step time, side by side.

    sudo PYTHONPATH=$PWD .venv/bin/python bench/validate_predict.py measure --out /tmp/validate
    .venv/bin/python bench/validate_predict.py analyse /tmp/validate [--plot docs/predict-validation.png]

``measure``, per host count H (one lab of H hosts, one rank per host):
1. **compute**: a traced run of every strategy and workload on the UNSHAPED lab (``train --trace K``);
2. per link rate: the lab is reshaped, ``lab bench`` measures the all-reduce of each backend (gloo, mpi) at that
   rate (the calibration), and every strategy and workload is run untraced ``--repeats`` times (the measured step:
   the median of the runs' ``step_ms_median``, the slowest rank's median step); Horovod also once traced, since
   its timeline slows its steps (docs/predict.md), to show by how much.
``analyse`` predicts every shaped configuration from the unshaped trace at the same H, the link rate and a
calibration, and prints predicted against measured with the median and worst |error|. Four calibrations:
``plain`` (the nominal link, no α); ``bench`` (the bench at the same H and rate: α and B a least-squares line
through every size it measured); ``ends`` (the same bench, with its own fits: α from the smallest sizes, B from
the largest); ``one`` (one bench, H=2 at the first rate, its α and share of the link applied everywhere);
``floor`` (``bench``, and no all-reduce faster than the unshaped trace's own of that size: Network.floors);
``onefloor`` (``one`` with the floor); ``ddpcompute`` (``bench``, every strategy on the unshaped DDP trace's
compute); ``profile`` (``bench``, the share of the link read off the measured sizes: ``predict --calibration``'s
default); ``oneprofile`` (``one``, the same way). ``--plot`` draws the table.

Every number here was taken on a 2-core machine shared with other work: read the spread of the repeats.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from quiet import wait_for_quiet

from dpcompare.lab import Lab, LabSpec, session
from dpcompare.lab import bench as labbench
from dpcompare.lab.spec import link_bps
from dpcompare.launch.jobs import log_tail
from dpcompare.launch.mpirun import dpcompare_argv
from dpcompare.prediction import strategies
from dpcompare.prediction.network import Link, Network, load_calibration, load_profiles
from dpcompare.prediction.sweep import knobs_of

#: communication-heavy (23.3 MB of gradients a step) and light (2.7 MB): an mlp on 1×28×28 synthetic samples
WORKLOADS: dict[str, tuple[str, ...]] = {
    "mlp2048": ("--model", "mlp", "--width", "2048"),
    "mlp512": ("--model", "mlp", "--width", "512"),
}
COMMON = ("--dataset", "synthetic", "--input-shape", "1,28,28", "--samples", "4096", "--epochs", "0",
          "--threads", "1", "--no-tensorboard", "--progress", "none", "--overwrite")
RESULTS = "results.json"
#: Open MPI's session folders apart from other jobs' on this machine (they clashed once in /tmp/ompi.*)
OWN_TMP = ("--mca", "orte_tmpdir_base", "/tmp/dpcompare-validate-ompi")
CALIBRATIONS = ("plain", "ends", "bench", "one", "floor", "onefloor", "ddpcompute", "profile", "oneprofile",
                "plainfloor", "profilefloor")


def train_argv(strategy: str, workload: str, out: Path, steps: int, warmup: int, trace: int = 0) -> list[str]:
    argv = [*dpcompare_argv(), "train", "--strategy", strategy, *WORKLOADS[workload], *COMMON,
            "--warmup-steps", str(warmup), "--max-steps", str(warmup + steps), "--out", str(out)]
    return argv + (["--trace", str(trace)] if trace else [])


def run_train(lab: Lab, argv: list[str], timeout: float) -> float:
    """One run across the lab; its step_ms_median (the slowest rank's median timed step)."""
    out = Path(argv[argv.index("--out") + 1])
    for _ in range(2):  # once more when Open MPI's start-up fails (a session folder clash with another job)
        rc, _ = lab.run(argv, out, per_host=1, mpi_options=OWN_TMP, timeout=timeout)
        if rc == 0 or "orte" not in log_tail(out, 200).lower():
            break
    if rc != 0:
        raise SystemExit(f"{' '.join(argv[-12:])}: exit {rc}\n{log_tail(out, 40)}")
    summary = json.loads((out / "summary.json").read_text())
    return float(summary["timing"]["step_ms_median"])


def bench(lab: Lab, path: Path, sizes: str) -> None:
    doc = labbench.measure(lab, labbench.parse_sizes(sizes), ("gloo", "mpi"), ("allreduce",), warmup=1, iters=3)
    labbench.write(doc, path)


def measure_hosts(h: int, a: argparse.Namespace, out: Path, log: list[dict[str, Any]]) -> None:
    """Every configuration at ``h`` hosts, appended to ``log`` (and saved after each run)."""
    name = f"val{h}{secrets.token_hex(2)}"
    with session(LabSpec(hosts=h, name=name)) as lab:
        base = out / f"h{h}"
        traced = {}
        for s in a.strategies:
            for w in a.workloads:
                folder = base / "unshaped" / f"{s}-{w}"
                ms = run_train(lab, train_argv(s, w, folder, a.trace, a.warmup, trace=a.trace), a.timeout)
                traced[s, w] = str(folder)
                print(f"h={h} unshaped {s} {w}: traced step {ms:.1f} ms", flush=True)
        for link in a.links:
            lab.set_link(link_bps(link))
            cal = base / f"bench-{link}.json"
            bench(lab, cal, a.bench_sizes)
            for s in a.strategies:
                for w in a.workloads:
                    rec = {"hosts": h, "link": link, "strategy": s, "workload": w, "trace": traced[s, w],
                           "bench": str(cal), "measured_ms": [], "traced_ms": []}
                    for r in range(a.repeats):
                        folder = base / link / f"{s}-{w}-r{r}"
                        rec["measured_ms"].append(run_train(lab, train_argv(s, w, folder, a.steps, a.warmup),
                                                            a.timeout))
                    if s == "horovod" and a.trace_horovod:
                        folder = base / link / f"{s}-{w}-traced"
                        rec["traced_ms"].append(run_train(lab, train_argv(s, w, folder, a.steps, a.warmup,
                                                                          trace=a.steps), a.timeout))
                    print(f"h={h} {link} {s} {w}: {rec['measured_ms']} ms (traced {rec['traced_ms']})", flush=True)
                    log.append(rec)
                    (out / RESULTS).write_text(json.dumps(log, indent=1))


def rebench(a: argparse.Namespace, log: list[dict[str, Any]]) -> None:
    """Measure every (hosts, link) calibration of ``log`` again (the lab's current `lab bench`), keeping the
    earlier file beside it as ``bench-LINK-before.json``."""
    for h in sorted({r["hosts"] for r in log}):
        with session(LabSpec(hosts=h, name=f"reb{h}{secrets.token_hex(2)}")) as lab:
            for link in dict.fromkeys(r["link"] for r in log if r["hosts"] == h):
                path = Path(next(r["bench"] for r in log if r["hosts"] == h and r["link"] == link))
                before = path.with_name(path.stem + "-before.json")
                if path.is_file() and not before.is_file():
                    path.rename(before)
                lab.set_link(link_bps(link))
                bench(lab, path, a.bench_sizes)
                print(f"h={h} {link}: {path}", flush=True)


def predict(rec: dict[str, Any], how: str, one: dict[str, str]) -> float:
    """Predicted step (ms) of one configuration: the unshaped trace's compute, the shaped link, a calibration."""
    trace = Path(rec["trace"])
    if how == "ddpcompute":  # every strategy on the DDP run's compute (Horovod's timeline slows its own)
        trace = trace.with_name(trace.name.replace(rec["strategy"], "ddp", 1))
    p = strategies.profile(trace)
    sched = strategies.schedule(rec["strategy"])(p, knobs_of(p, {}))
    cal = {"plain": None, "ends": rec["bench"], "bench": rec["bench"], "floor": rec["bench"],
           "ddpcompute": rec["bench"], "one": one.get("path"), "onefloor": one.get("path"),
           "profile": rec["bench"], "oneprofile": one.get("path"), "plainfloor": None,
           "profilefloor": rec["bench"]}[how]
    calibrated = load_calibration(cal, fit="ends" if how == "ends" else "range") if cal else {}
    floors = strategies.trace_floors(p) if how.endswith("floor") else {}
    profiles = load_profiles(cal) if cal and "profile" in how else {}
    net = Network(rec["hosts"], Link.of(0.0, link_bps(rec["link"]) or 0), 1, None, calibrated, floors, profiles)
    return sched.run(net).step * 1e3


def drift(rec: dict[str, Any]) -> float | None:
    """ms by which the measured runs' phases without communication (data and forward; DDP's optimizer too:
    Horovod's holds its wait) exceeded the unshaped trace's: the compute the model could not know about."""
    p = strategies.profile(Path(rec["trace"]))
    runs = sorted((Path(rec["trace"]).parents[1] / rec["link"]).glob(f"{rec['strategy']}-{rec['workload']}-r*"))
    if not runs:
        return None
    keys = ("data", "forward", "optimizer") if rec["strategy"] == "ddp" else ("data", "forward")
    traced = sum(getattr(p, k) for k in keys) * 1e3
    measured = [sum(json.loads((r / "summary.json").read_text())["timing"]["phases_ms"][k] for k in keys)
                for r in runs]
    return statistics.median(measured) - traced


def rows(log: list[dict[str, Any]], how: str) -> list[dict[str, Any]]:
    """Predicted against measured per configuration, with the error in % of the measured."""
    first = min(log, key=lambda r: (r["hosts"], log.index(r)))
    one = {"path": first["bench"]}
    out = []
    for rec in log:
        measured = statistics.median(rec["measured_ms"])
        pred = predict(rec, how, one)
        spread = (max(rec["measured_ms"]) - min(rec["measured_ms"])) / measured if measured else 0.0
        out.append({**{k: rec[k] for k in ("hosts", "link", "strategy", "workload")}, "predicted_ms": pred,
                    "measured_ms": measured, "spread_pct": 100 * spread, "error_pct": 100 * (pred / measured - 1),
                    "traced_ms": statistics.median(rec["traced_ms"]) if rec["traced_ms"] else None,
                    "compute_drift_ms": drift(rec)})
    return out


def summary_line(table: list[dict[str, Any]]) -> str:
    errs = [abs(r["error_pct"]) for r in table]
    return (f"{len(errs)} configurations: median |error| {statistics.median(errs):.1f} %, worst {max(errs):.1f} %"
            if errs else "no configurations")


def show(table: list[dict[str, Any]], how: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"predicted vs measured step (calibration: {how})")
    for col in ("hosts", "link", "strategy", "workload", "predicted ms", "measured ms", "repeats spread",
                "error", "compute drift ms", "horovod traced ms"):
        t.add_column(col, justify="right")
    for r in table:
        t.add_row(str(r["hosts"]), r["link"], r["strategy"], r["workload"], f"{r['predicted_ms']:.1f}",
                  f"{r['measured_ms']:.1f}", f"{r['spread_pct']:.0f} %", f"{r['error_pct']:+.1f} %",
                  "" if r["compute_drift_ms"] is None else f"{r['compute_drift_ms']:+.0f}",
                  "" if r["traced_ms"] is None else f"{r['traced_ms']:.1f}")
    console = Console(width=160)
    console.print(t)
    console.print(summary_line(table))


def markdown(tables: dict[str, list[dict[str, Any]]], main: str) -> str:
    """The ``main`` calibration's rows as a Markdown table, and one summary line per calibration."""
    out = ["| hosts | link | strategy | workload | predicted ms | measured ms | error | compute drift ms |",
           "|---:|---|---|---|---:|---:|---:|---:|"]
    out += [f"| {r['hosts']} | {r['link']} | {r['strategy']} | {r['workload']} | {r['predicted_ms']:.0f} | "
            f"{r['measured_ms']:.0f} | {r['error_pct']:+.1f} % | {r['compute_drift_ms']:+.0f} |" for r in tables[main]]
    out += ["", "| calibration | median \\|error\\| | worst |", "|---|---:|---:|"]
    for how, t in tables.items():
        errs = [abs(r["error_pct"]) for r in t]
        out.append(f"| {how} | {statistics.median(errs):.1f} % | {max(errs):.1f} % |")
    return "\n".join(out) + "\n"


def plot(table: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    marks = {"ddp": "o", "horovod": "s", "zero": "^", "fsdp": "v"}
    colours = {"mlp2048": "tab:red", "mlp512": "tab:blue"}
    for r in table:
        ax.scatter(r["measured_ms"], r["predicted_ms"], marker=marks.get(r["strategy"], "x"),
                   color=colours.get(r["workload"], "gray"), s=18 + 10 * r["hosts"], alpha=0.8)
    lo = min(min(r["measured_ms"], r["predicted_ms"]) for r in table) * 0.8
    hi = max(max(r["measured_ms"], r["predicted_ms"]) for r in table) * 1.25
    for f, style in ((1.0, "-"), (1.1, ":"), (0.9, ":"), (1.25, "--"), (0.75, "--")):
        ax.plot([lo, hi], [lo * f, hi * f], style, color="gray", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step (ms, median of runs)",
           ylabel="predicted step (ms)", title=title)
    for s, m in marks.items():
        if any(r["strategy"] == s for r in table):
            ax.scatter([], [], marker=m, color="black", label=s)
    for w, c in colours.items():
        if any(r["workload"] == w for r in table):
            ax.scatter([], [], marker="o", color=c, label=w)
    ax.legend(title="marker size: hosts; dotted ±10 %, dashed ±25 %", fontsize=8, title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="run the lab configurations (root; minutes)")
    m.add_argument("--out", type=Path, default=Path("/tmp/dpcompare-validate"))
    m.add_argument("--hosts", default="2,3,4")
    m.add_argument("--links", default="1gbit,500mbit,200mbit")
    m.add_argument("--strategies", default="ddp,horovod")
    m.add_argument("--workloads", default=",".join(WORKLOADS))
    m.add_argument("--steps", type=int, default=6, help="timed steps per run")
    m.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    m.add_argument("--trace", type=int, default=5, help="traced steps of the unshaped runs")
    m.add_argument("--repeats", type=int, default=2, help="untraced runs per configuration")
    m.add_argument("--no-trace-horovod", dest="trace_horovod", action="store_false")
    m.add_argument("--bench-sizes", default="64K,256K,1M,2M,4M,8M,16M,32M")
    m.add_argument("--timeout", type=float, default=600)
    r = sub.add_parser("rebench", help="measure the calibrations of a finished `measure` again (root)")
    r.add_argument("out", type=Path)
    r.add_argument("--bench-sizes", default="64K,256K,1M,2M,4M,8M,16M,32M")
    n = sub.add_parser("analyse", help="predict every measured configuration and compare")
    n.add_argument("out", type=Path)
    n.add_argument("--calibration", choices=CALIBRATIONS, default=None, help="only this one (default: all)")
    n.add_argument("--plot", type=Path, default=None, help="write the scatter plot")
    n.add_argument("--json", type=Path, default=None, help="write the rows as JSON")
    n.add_argument("--markdown", type=Path, default=None, help="write the table as Markdown")
    n.add_argument("--main", choices=CALIBRATIONS, default="profilefloor", help="the calibration plotted and tabulated")
    a = ap.parse_args()
    for k in ("hosts", "links", "strategies", "workloads"):
        if hasattr(a, k):
            v = [x.strip() for x in getattr(a, k).split(",") if x.strip()]
            setattr(a, k, [int(x) for x in v] if k == "hosts" else v)
    return a


def main() -> None:
    a = parse()
    if a.cmd == "measure":
        wait_for_quiet()
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / RESULTS
        log = json.loads(path.read_text()) if path.is_file() else []
        t0 = time.monotonic()
        for h in a.hosts:
            measure_hosts(h, a, a.out, log)
        print(f"measured in {time.monotonic() - t0:.0f} s; `analyse {a.out}` compares", flush=True)
        return
    log = json.loads((a.out / RESULTS).read_text())
    if a.cmd == "rebench":
        rebench(a, log)
        return
    tables = {}
    for how in ([a.calibration] if a.calibration else CALIBRATIONS):
        tables[how] = rows(log, how)
        show(tables[how], how)
    if a.json:
        a.json.write_text(json.dumps(tables, indent=1) + "\n")
    how = a.calibration or a.main
    if a.markdown:
        a.markdown.write_text(markdown(tables, how))
    if a.plot:
        plot(tables[how], a.plot, f"predicted vs measured in the lab, calibration '{how}'\n{summary_line(tables[how])}")


if __name__ == "__main__":
    try:
        main()
    except subprocess.TimeoutExpired as e:
        sys.exit(f"timed out: {e}")
