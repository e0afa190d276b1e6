"""Other work on the machine: each compare run records the CPU other processes took while it ran, and a verdict
from a shared machine says so in the terminal and in the report.

The "other work" is two busy Python processes that are not this test's descendants (started through
``setsid -f``, so they belong to nobody's process tree here) and stop by themselves after a bounded time. The
job's own CPU is a busy child of the comparing process: it must count as the job's, not as others'.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console
from test_compare import fake_launch, run_compare

from dpcompare.compare.load import LoadWatch
from dpcompare.config import TrainConfig
from dpcompare.report.regime import SHARED_SHARE

from conftest import run

#: these tests count every other process's CPU: `make test` runs them after the rest, with nothing beside them
pytestmark = pytest.mark.solitary

#: a busy loop: prints its pid, then spins until its time is up or the stop file appears
BUSY = ("import os, sys, time\nprint(os.getpid(), flush=True)\nend = time.monotonic() + float(sys.argv[1])\n"
        "while time.monotonic() < end and not os.path.exists(sys.argv[2]):\n    pass\n")


@contextlib.contextmanager
def others_busy(n: int, tmp: Path, seconds: float = 90.0) -> Iterator[list[int]]:
    """``n`` busy processes outside this process's tree (reparented away by ``setsid -f``), stopped on exit."""
    stop = tmp / "stop-busy"
    pids = []
    try:
        for _ in range(n):
            p = subprocess.Popen(["setsid", "-f", sys.executable, "-c", BUSY, str(seconds), str(stop)],
                                 stdout=subprocess.PIPE, text=True)
            assert p.stdout is not None
            pids.append(int(p.stdout.readline()))  # the busy process's own line: it is running
            p.stdout.close()
            p.wait(timeout=30)
        mine = {c.pid for c in psutil.Process().children(recursive=True)}
        assert not mine & set(pids), "the busy processes must not be this test's descendants"
        yield pids
    finally:
        stop.touch()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def busy_child(seconds: float) -> None:
    """CPU time of this process's own tree: a child that spins for ``seconds``."""
    run([sys.executable, "-c", f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"])


def busy_launch(cmd: list[str], run_dir: Path, env: dict[str, str], timeout: float | None) -> tuple[int, float]:
    """A stand-in for mpirun whose "ranks" are one busy child (the job's CPU), then a run's files."""
    busy_child(0.8)
    return fake_launch(cmd, run_dir, env, timeout)


def test_the_jobs_own_cpu_is_not_counted_as_others() -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    watch = LoadWatch()
    busy_child(1.0)
    load = watch.result()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # what the child really got
    assert child > 0.1 and load["job_cpu_s"] >= child - 0.02, (child, load)
    assert load["wall_s"] >= 1.0 and load["cores"] == psutil.cpu_count()
    assert 0.0 <= load["others_cpu_share"] <= 1.0 and len(load["loadavg_start"]) == 3
    assert load["busy_cpu_s"] >= load["job_cpu_s"] - 0.3  # /proc/stat saw the child's work too (tick rounding)


def _compare(out: Path) -> tuple[dict[str, Any], str, str]:
    fake_launch.calls = []  # type: ignore[attr-defined]
    console = Console(record=True, width=200)
    run_compare(TrainConfig(epochs=1), ["ddp", "horovod"], [2], 2, out, progress="none", launch=busy_launch,
                console=console)
    return json.loads((out / "results.json").read_text()), console.export_text(), (out / "report.html").read_text()


def test_a_verdict_from_a_shared_machine_says_so(tmp_path: Path) -> None:
    with others_busy(2, tmp_path):
        results, text, page = _compare(tmp_path / "shared")
    shares = [r["load"]["others_cpu_share"] for r in results["runs"]]
    assert len(shares) == 4 and min(shares) >= SHARED_SHARE, shares  # two busy processes on the cores
    assert "shared machine: other processes took up to" in text and "This verdict describes a shared machine" in text
    assert text.index("• horovod equal to ddp") < text.index("shared machine:")  # the verdict line stays first
    assert (
        "Shared machine:" in page and "other processes&#x27; CPU" in page and "shared machine: other processes" in page
    )


def test_the_jobs_own_runs_do_not_make_a_shared_machine(tmp_path: Path) -> None:
    """With nothing started beside it, each run's own busy child is the job's CPU: others' time stays below it
    (counting the job as others would leave the job next to nothing), and the verdict calls the machine shared
    exactly when a recorded share reached the threshold. A CI machine's own background work may cross the
    threshold now and then; the report then says so, and that is what this asserts."""
    results, text, page = _compare(tmp_path / "quiet")
    runs = results["runs"]
    assert all(r["load"]["others_cpu_s"] < r["load"]["job_cpu_s"] for r in runs), [r["load"] for r in runs]
    shared = max(r["load"]["others_cpu_share"] for r in runs) >= SHARED_SHARE
    assert ("shared machine" in text.lower()) is shared and ("Shared machine" in page) is shared
    assert "other processes&#x27; CPU" in page  # the regime card states the figure either way
