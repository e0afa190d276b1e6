#!/usr/bin/env python
"""How fast is a Horovod script on the native layer? Against real Horovod and against its DDP port.

    python bench/native_speed.py [--np 2] [--repeats 5] [--models resnet18,gpt-mini] [--links unlimited,1gbit]
                                 [--out runs/native-speed] [--quick]

For each model and link it runs ``dpcompare compare --script examples/horovod/synthetic_benchmark.py
--strategies horovod,native,ddp`` (the ``ddp`` arm is the port ``dpcompare migrate`` writes of the same script),
``unlimited`` on this machine and any other rate across a 2-host lab (root, iproute2, tbf: docs/lab.md). Every
arm's step time is the time between two successive ``optimizer.step()`` ends of the script itself. Prints one
row per model and link: each arm's median step time over the runs, the layer against Horovod and against DDP
(the goal: within 5 % of DDP, which runs the same torch collectives) and the layer's own cost per step
(native − ddp). Take the figures on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "horovod" / "synthetic_benchmark.py"
ARMS = ("horovod", "native", "ddp")
#: the benchmark script's arguments per model (batch per rank)
MODEL_ARGS = {
    "resnet18": ["--batch-size", "16"],
    "gpt-mini": ["--batch-size", "4"],
    "gpt-tiny": ["--batch-size", "4"],
}


def steps(per_iter: int, iters: int) -> list[str]:
    """The benchmark script's step arguments: 3 warm-up steps, then ``iters`` × ``per_iter`` timed ones."""
    return ["--num-warmup-batches", "3", "--num-batches-per-iter", str(per_iter), "--num-iters", str(iters)]


#: --quick: does the benchmark run at all (a check, not a measurement)
QUICK_STEPS = steps(2, 2)


def compare_line(model: str, link: str, a: argparse.Namespace, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "dpcompare", "compare", "--script", str(SCRIPT), "--strategies", a.arms,
           "--np", str(a.np), "--repeats", str(a.repeats), "--warmup-steps", "3", "--out", str(out), "--overwrite"]
    if link != "unlimited":
        cmd += ["--lab", f"hosts=2,link={link},name=nspeed"]
    run_steps = QUICK_STEPS if a.quick else steps(a.per_iter, a.iters)
    return [*cmd, "--", "--model", model, *MODEL_ARGS.get(model, []), *run_steps]


def medians(results: dict) -> dict[str, float | None]:
    """Each arm's median over its runs of the run's median step time (ms)."""
    per_arm: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for run in results.get("runs", []):
        step = (run.get("step_ms") or {}).get("median")
        if run.get("status") == "ok" and step is not None and run.get("arm") in per_arm:
            per_arm[run["arm"]].append(step)
    return {arm: statistics.median(v) if v else None for arm, v in per_arm.items()}


def layer_vs_ddp(results: dict) -> str:
    """The comparison's own paired verdict of the layer against DDP: the step-time ratio native/ddp with its
    interval over the blocks, and the outcome against the 5 % equivalence margin."""
    for v in results.get("verdicts", []):
        if {v.get("baseline"), v.get("other")} == {"native", "ddp"} and v.get("metric") == "throughput":
            # ratio = other's throughput / baseline's, with its interval: as a step-time ratio native/ddp
            r, lo, hi = (v.get(k) for k in ("ratio", "ci_low", "ci_high"))
            if r is None:
                return "-"
            if v["baseline"] == "ddp":
                r, lo, hi = 1.0 / r, (None if hi is None else 1.0 / hi), (None if lo is None else 1.0 / lo)
            band = "" if lo is None or hi is None else f" [{_pct(lo, 1.0)}, {_pct(hi, 1.0)}]"
            return f"{_pct(r, 1.0)}{band} {v.get('outcome', '')} ({v.get('blocks')} blocks)"
    return "-"


def _pct(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{100.0 * (a / b - 1.0):+.1f} %"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="paired blocks per model and link (default: 5)")
    p.add_argument("--models", default="resnet18,gpt-mini")
    p.add_argument(
        "--arms",
        default=",".join(ARMS),
        help="the arms to run (default: horovod,native,ddp; native,ddp is the 5 %% goal alone, a third faster)",
    )
    p.add_argument("--per-iter", type=int, default=5, help="optimizer steps per iteration of the script (default: 5)")
    p.add_argument("--iters", type=int, default=4, help="iterations of the script per run (default: 4)")
    p.add_argument("--links", default="unlimited,1gbit", help="unlimited (this machine) and lab link rates")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "native-speed")
    p.add_argument("--quick", action="store_true",
                   help="check that it runs: gpt-tiny, 1 repeat, 7 steps per run (not a measurement)")
    a = p.parse_args()
    if a.quick:
        a.models, a.repeats = "gpt-tiny", 1
    rows = []
    for model in a.models.split(","):
        for link in a.links.split(","):
            out = a.out / f"{model}-{link}"
            cmd = compare_line(model, link, a, out)
            print("$", " ".join(cmd), flush=True)
            rc = subprocess.run(cmd).returncode
            results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
            m = medians(results)
            rows.append((model, link, m, rc, layer_vs_ddp(results)))
    print(f"\nmedian step time (ms) at np={a.np}; step = between two successive optimizer.step() ends")
    print(f"{'model':10} {'link':10} {'horovod':>9} {'native':>9} {'ddp':>9} {'native/horovod':>15} "
          f"{'native/ddp':>11} {'layer ms/step':>14}   paired verdict, native/ddp step time [interval]")
    for model, link, m, rc, verdict in rows:
        cost = None if m["native"] is None or m["ddp"] is None else m["native"] - m["ddp"]
        print(f"{model:10} {link:10} {_ms(m['horovod']):>9} {_ms(m['native']):>9} {_ms(m['ddp']):>9} "
              f"{_pct(m['native'], m['horovod']):>15} {_pct(m['native'], m['ddp']):>11} {_ms(cost):>14}   {verdict}"
              + ("" if rc == 0 else f"   (compare exited {rc})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
