#!/usr/bin/env python
"""What the trackers cost a run (docs/trackers.md): import, start and finish, each in a fresh Python.

    .venv/bin/python bench/trackers_cost.py [--repeats 3]

Prints the median seconds of: importing wandb; an offline wandb run started, logged to 10 times and finished;
importing mlflow; an MLflow run in a fresh sqlite store (its schema migrations included), the same logging.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile

from quiet import wait_for_quiet

LOG = "for i in range(10):\n    {}\n"
CASES = {
    "import wandb": "import wandb",
    "wandb offline run: start, 10 epochs logged, finish": (
        "import os, wandb\nos.environ['WANDB_MODE'] = 'offline'\nr = wandb.init(project='cost', dir=DIR)\n"
        + LOG.format("r.log({'loss': 1.0 / (i + 1)})") + "r.finish()"),
    "import mlflow": "import mlflow",
    "mlflow run in a fresh sqlite store: create, 10 epochs logged, end": (
        "import mlflow\nmlflow.set_tracking_uri(f'sqlite:///{DIR}/m.db')\nmlflow.start_run()\n"
        + LOG.format("mlflow.log_metric('loss', 1.0 / (i + 1), step=i)") + "mlflow.end_run()"),
}
TIMED = "import time\nt0 = time.perf_counter()\n"


def seconds(code: str) -> float:
    with tempfile.TemporaryDirectory() as d:
        run = f"DIR = {d!r}\n" + TIMED + code + "\nprint(time.perf_counter() - t0)"
        out = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, check=True,
                             timeout=300).stdout
    return float(out.split()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    wait_for_quiet()
    for name, code in CASES.items():
        xs = [seconds(code) for _ in range(a.repeats)]
        print(f"{name}: {statistics.median(xs):.1f} s (median of {a.repeats}; {min(xs):.1f}–{max(xs):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
