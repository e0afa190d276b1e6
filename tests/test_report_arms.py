"""The report follows its arms: a "why" card for each strategy that ran and none for one that did not; what took
the cores (each rank's main and other threads' CPU per step) in the why, the tables and results.json; the terminal
table never breaks a cell; a fault's cost first; no scipy warning on data equal but for rounding; a setting an
arm cannot run under compare's launcher refused before the first run; the job's processes outside its tree
counted as its own. Everything here is hand-made results or in-process: no job is launched but one busy child."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console
from test_report import make_results

from dpcompare import cli
from dpcompare.compare.load import LoadWatch
from dpcompare.native.calls import SCRIPT_ARM_FACTS
from dpcompare.report import attribution, html, render, stats, table
from dpcompare.report.intervals import mean_ci, paired_diff_ci, paired_log_ratio_ci, welch_diff_ci
from dpcompare.trace import CpuClock


def _with_cpu(results: dict[str, Any], cpu: dict[str, tuple[float, float]], forward_gap: float = 0.0) -> dict:
    """Each run gets its arm's (main, helpers) CPU ms per step; ``forward_gap`` ms more forward for horovod."""
    for r in results["runs"]:
        main, helpers = cpu[r["strategy"]]
        r["cpu_ms"] = {"main": main, "helpers": helpers, "per_rank": [{"rank": 0, "main": main, "helpers": helpers}],
                       "threads": [{"name": "unnamed", "tid": 7, "ms": helpers * 0.9}]}
        if r["strategy"] == "horovod":
            r["phases_ms"] = {**r["phases_ms"], "forward": r["phases_ms"]["forward"] + forward_gap
                              + 0.01 * r["repeat"]}
            r["step_ms"] = {"median": r["step_ms"]["median"] + forward_gap, "p95": r["step_ms"]["p95"]}
    return results


def _cpu_results() -> dict[str, Any]:
    """The issue's resnet18 case in miniature: horovod's forward slower, where nobody communicates; its
    background thread took the cores."""
    res = make_results({("ddp", 2): [4000, 4100, 3900, 4050], ("horovod", 2): [3000, 3100, 2950, 3050]})
    for r in res["runs"]:
        r["regime"] = {"buffer_mb": 0.0}  # an mlp-like model: DDP broadcasts nothing in forward
        if r["strategy"] == "horovod":  # its gap all in forward: the optimizer's communication is ddp's backward's
            r["phases_ms"] = {"data": 0.3, "forward": 1.2, "backward": 2.0 + 0.01 * r["repeat"], "optimizer": 0.3}
        else:
            r["phases_ms"] = {"data": 0.3, "forward": 1.2, "backward": 2.0, "optimizer": 0.3}
        r["step_ms"] = {"median": 3.8 + 0.01 * r["repeat"], "p95": 4.0}
    return _with_cpu(res, {"ddp": (946.0, 20.0), "horovod": (1430.0, 480.0)}, forward_gap=5.0)


def test_the_why_names_the_threads_that_took_the_cores() -> None:
    res = _cpu_results()
    a = attribution.attribute(res, "ddp", "horovod", 2)
    assert a is not None and a.main == ["forward"]
    assert "Neither strategy communicates in forward" in a.text
    assert "horovod ran 480 ms of CPU per step on other threads (Horovod's background thread" in a.text
    assert "ddp 20.0 ms (gloo's threads)" in a.text and "1430 ms (horovod)" in a.text and "946 ms (ddp)" in a.text
    assert a.lines[1].startswith("in forward neither communicates; other threads' CPU per step: horovod 480 ms, ddp")
    stored = a.to_json()
    assert stored["cpu_ms"]["horovod"]["helpers"] == 480.0 and stored["cpu_ms"]["ddp"]["main"] == 946.0
    json.dumps(stored)  # results.json keeps it as it is


def test_the_threads_are_named_where_the_longer_arm_communicates_nothing_though_the_other_does() -> None:
    """resnet18's case: BatchNorm buffers, so DDP broadcasts in forward; Horovod's forward is the longer one and
    Horovod communicates nothing there: the why still says what took the cores."""
    res = _cpu_results()
    for r in res["runs"]:
        r["regime"] = {"buffer_mb": 0.01}
    a = attribution.attribute(res, "ddp", "horovod", 2)
    assert a is not None and a.main == ["forward"] and "broadcast of rank 0's buffers" in a.text
    assert "In forward the arm that took longer communicates nothing." in a.text
    assert "horovod ran 480 ms of CPU per step on other threads (Horovod's background thread" in a.text
    assert a.lines[2] == ("in forward the longer arm communicates nothing; other threads' CPU per step: horovod "
                          "480 ms, ddp 20.0 ms (Horovod's background thread)")


def test_the_cpu_is_in_both_tables_and_the_terminal_fits_100_columns(tmp_path: Path) -> None:
    res = _cpu_results()
    (tmp_path / "results.json").write_text(json.dumps(res))
    console = Console(record=True, width=150)
    render(tmp_path, console=console)
    text = console.export_text()
    table_lines = text[:text.index("times are per step")].splitlines()
    assert max(len(x.rstrip()) for x in table_lines) <= 100
    assert "main / other" in text and "1430 / 480" in text.replace(",", "")
    page = (tmp_path / "report.html").read_text()
    assert "CPU ms/step<br>main / other threads" in page and "Horovod&#x27;s background thread" in page


def _demo_groups() -> tuple[list[Any], dict[str, Any]]:
    """make demo's shape: large throughputs with intervals, memory columns, others' CPU, two process counts."""
    res = make_results({("ddp", 1): [10375, 10815, 9935], ("horovod", 1): [10100, 10500, 9800],
                        ("ddp", 2): [17375, 18815, 16935], ("horovod", 2): [16100, 16500, 16800]})
    for r in res["runs"]:
        r["memory_mb"] = {"params": 1.0, "grads": 1.0, "optimizer_state": 2.0, "total": 4.0}
        r["load"] = {"others_cpu_share": 0.04}
    _with_cpu(res, {"ddp": (4.1, 1.0), "horovod": (5.4, 16.4)})
    return stats.aggregate(res), res


@pytest.mark.parametrize("width", [150, 100, 80])
def test_the_terminal_table_never_breaks_a_cell(width: int) -> None:
    groups, res = _demo_groups()
    console = Console(record=True, width=width)
    cpu = {(g.arm, g.np): attribution.thread_cpu(res, g.arm, g.np) for g in groups}
    t, dropped = table.fitted_table(console, groups, "Comparison", table.others_by_group(res), cpu)
    console.print(t)
    lines = console.export_text().splitlines()
    assert max(len(x.rstrip()) for x in lines) <= min(width, table.TABLE_COLUMNS)
    rows = [x for x in lines if x.strip().startswith(("ddp", "horovod"))]
    assert len(rows) == 2 and all("±" in r for r in rows)  # "10,375 ± 440" whole, on one line
    assert all(d in table.DROP_ORDER for d in dropped) and (width >= 150 or dropped)
    if width == 80:
        assert "memory" in dropped and "scaling eff." not in dropped


def test_the_report_has_cards_for_the_arms_that_ran_only() -> None:
    script = make_results({("horovod", 2): [5.0, 5.1], ("horovod#2", 2): [5.2, 5.3]})
    for r in script["runs"]:  # compare --script's arms: the real Horovod and the native layer
        r["strategy"] = r["arm"] = "native" if r["strategy"] == "horovod#2" else "horovod"
    script["config"]["strategies"] = ["horovod", "native"]
    # what compare records about the native layer (no catalog strategy): its facts, its card included
    script["environment"]["strategies"] = json.loads(json.dumps({"native": SCRIPT_ARM_FACTS["native"]}))
    page = html.render_html(script, stats.aggregate(script), [], [])
    assert (
        "The native layer: Horovod&#x27;s API on torch.distributed" in page
        and "Horovod: hooks in the optimizer" in page
    )
    assert "PyTorch DDP" not in page and "DistributedDataParallel" not in page
    elastic = make_results({("ddp", 3): [5.0, 5.1], ("horovod", 3): [5.2, 5.3]})
    for r in elastic["runs"]:
        r["elastic"] = True
        r["arm"] = r["strategy"] + "-elastic"
    page = html.render_html(elastic, stats.aggregate(elastic), [], [])
    assert "PyTorch DDP: hooks on the model · ddp-elastic" in page and "torchrun" in page
    assert "Horovod: hooks in the optimizer · horovod-elastic" in page and "in-memory commit" in page
    assert "ZeRO" not in page and "FSDP2" not in page


def test_a_fault_leads_with_what_it_cost() -> None:
    res = make_results({("ddp", 2): [4000, 4100], ("horovod", 2): [3600, 3700]})
    lead = ["Fault host=2,at-step=40: what a lost host cost", "  • horovod-elastic: 1.34× slower with the fault"]
    page = html.render_html(res, stats.aggregate(res), stats.verdicts(res), [], lead=lead)
    assert page.index("what a lost host cost") < page.index("<strong>Verdict</strong>")
    assert "<li>horovod-elastic: 1.34× slower with the fault</li>" in page


def test_data_equal_but_for_rounding_makes_no_scipy_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat = [0.9, 0.9, 0.9 + 1e-16]
        assert welch_diff_ci(flat, [0.9 + 3e-16, 0.9, 0.9]).hi == pytest.approx(0.0, abs=1e-12)
        iv = welch_diff_ci(flat, [1.0, 2.0, 3.0])
        assert iv.lo < iv.mean < iv.hi and iv.mean == pytest.approx(1.1)
        half = iv.hi - iv.mean  # Welch's interval with no spread on one side: the other side's t-interval
        assert half == pytest.approx(mean_ci([1.0, 2.0, 3.0]).hi - 2.0)
        assert paired_diff_ci(flat, [0.9, 0.9, 0.9 + 2e-16]).lo == pytest.approx(0.0, abs=1e-12)
        assert paired_log_ratio_ci([3.0, 3.0, 3.0], [3.0 + 4e-16, 3.0, 3.0])[1] == "exact"


def test_a_setting_the_launcher_cannot_run_is_refused_before_the_first_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    code = cli.main(["compare", "--np", "2", "--variants", "base=horovod", "hvd-gloo=horovod:horovod_ops=gloo",
                     "--model", "mlp", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "arm hvd-gloo at np=2: --horovod-ops gloo needs Horovod's gloo controller" in err
    assert not out.exists()  # nothing ran, nothing was written


def test_the_cpu_clock_splits_the_main_thread_from_the_others() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    helper = threading.Thread(target=spin, daemon=True)
    helper.start()
    clock = CpuClock()
    try:
        for _ in range(3):
            clock.begin()
            end = time.process_time() + 0.05  # the main thread's own work: at least 50 ms of process CPU
            while time.process_time() < end:
                pass
            clock.end()
        figures = clock.figures()
    finally:
        stop.set()
        helper.join()
    assert figures is not None and figures["main"] > 0 and figures["helpers"] > 0
    assert figures["threads"] and figures["threads"][0]["tid"] == helper.native_id
    assert CpuClock().figures() is None  # no timed step


def test_the_jobs_processes_started_outside_its_tree_are_its_own(tmp_path: Path) -> None:
    """A rank started through ssh is no descendant of the comparing process; its command line names the run's
    folder, and that makes it the job's. The stand-in, reparented away before the watch (which adopts orphans)
    starts, spins for 1 s of CPU when told, says so, and stays until told."""
    marker, go, stop = str(tmp_path / "runs" / "horovod-elastic-np3-r0"), tmp_path / "go", tmp_path / "stop"
    rank = ("import os, sys, time\nprint(os.getpid(), flush=True)\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
            "end = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"
            "print('spun', flush=True)\nwhile not os.path.exists(sys.argv[2]): time.sleep(0.02)\n")
    p = subprocess.Popen(["setsid", "-f", sys.executable, "-c", rank, str(go), str(stop), "--out", marker],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        pid = int(p.stdout.readline())
        p.wait(timeout=30)  # setsid -f's own process has ended: the stand-in is nobody's child here
        assert pid not in {c.pid for c in psutil.Process().children(recursive=True)}
        watch = LoadWatch(marker)
        go.touch()
        assert p.stdout.readline().strip() == "spun"
        load = watch.result()
    finally:
        go.touch()
        stop.touch()
    assert 0.95 <= load["job_cpu_outside_s"] <= 1.5, load  # its second of CPU, not what it took before
    assert load["job_cpu_s"] >= load["job_cpu_outside_s"]
