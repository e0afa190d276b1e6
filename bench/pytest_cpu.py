"""Where the suite's CPU goes: a pytest plugin that records each test's wall time and CPU, and a summary of them.

Run the suite with it (on each xdist worker it appends one JSON line per test: its worker, start and end, the
worker's own CPU and its waited-for children's CPU during the test; ranks started under Slurm's daemons or a lab
host's sshd are not children and are not counted):

    PYTHONPATH=bench DPCOMPARE_TEST_CPU=/tmp/cpu.jsonl .venv/bin/python -m pytest -n 2 -m 'not solitary' \\
        -p pytest_cpu tests
    .venv/bin/python bench/pytest_cpu.py /tmp/cpu.jsonl          # the largest tests and modules by CPU

Beside it, ``vmstat 2`` says how busy the cores were (on 2 cores, 94 % on 2026-11-27: only less CPU makes the
suite shorter; docs/measurements.md, "The test suite").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

OUT_VAR = "DPCOMPARE_TEST_CPU"


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    t0, (own0, children0) = time.time(), _cpu()
    yield
    t1, (own1, children1) = time.time(), _cpu()
    row = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"), "start": t0, "end": t1,
           "own_cpu_s": own1 - own0, "children_cpu_s": children1 - children0}
    with open(os.environ.get(OUT_VAR, "test-cpu.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def summary(rows: list[dict], most: int) -> str:
    """The ``most`` largest tests by CPU, then every module's wall and CPU, largest first."""
    cpu = {r["test"]: r["own_cpu_s"] + r["children_cpu_s"] for r in rows}
    lines = [f"{len(rows)} tests, {sum(cpu.values()):,.0f} CPU-s counted, "
             f"{max(r['end'] for r in rows) - min(r['start'] for r in rows):,.0f} s from first start to last end",
             "", f"{'CPU-s':>7} {'wall s':>7}  test"]
    for r in sorted(rows, key=lambda r: -cpu[r["test"]])[:most]:
        lines.append(f"{cpu[r['test']]:7.1f} {r['end'] - r['start']:7.1f}  {r['test']}")
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        m = modules[r["test"].split("::")[0]]
        m[0] += cpu[r["test"]]
        m[1] += r["end"] - r["start"]
    lines += ["", f"{'CPU-s':>7} {'wall s':>7}  module"]
    lines += [f"{c:7.1f} {w:7.1f}  {name}" for name, (c, w) in sorted(modules.items(), key=lambda kv: -kv[1][0])]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description="summarise a pytest_cpu record")
    p.add_argument("record", type=Path)
    p.add_argument("--most", type=int, default=30, help="how many tests to list")
    a = p.parse_args()
    print(summary([json.loads(line) for line in a.record.read_text().splitlines() if line.strip()], a.most))


if __name__ == "__main__":
    main()
