"""The noise numerics (dpcompare.report.noise): variance components on synthetic data with known components,
the noise floor and the blocks a target needs."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpcompare.report import noise


def _nested(rng: np.random.Generator, sds: tuple[float, float, float], launches: int,
            runs: list[int] | int, steps: list[list[int]] | int) -> list[list[list[float]]]:
    """data[launch][run][step] = 1 + a + b + e with the given standard deviations."""
    data = []
    for i in range(launches):
        a = rng.normal(0, sds[0])
        nr = runs if isinstance(runs, int) else runs[i]
        launch = []
        for j in range(nr):
            b = rng.normal(0, sds[1])
            ns = steps if isinstance(steps, int) else steps[i][j]
            launch.append((1.0 + a + b + rng.normal(0, sds[2], ns)).tolist())
        data.append(launch)
    return data


def test_components_recover_known_sds_balanced() -> None:
    rng = np.random.default_rng(1)
    c = noise.variance_components(_nested(rng, (0.10, 0.05, 0.02), 300, 8, 40))
    assert c.counts == (300, 2400, 96000)
    assert math.sqrt(c.steps) == pytest.approx(0.02, rel=0.02)
    assert math.sqrt(c.runs) == pytest.approx(0.05, rel=0.06)
    assert math.sqrt(c.launches) == pytest.approx(0.10, rel=0.12)
    shares = c.to_json()
    assert sum(shares[level]["share"] for level in noise.LEVELS) == pytest.approx(1.0, abs=1e-3)
    assert shares["launches"]["share"] > shares["runs"]["share"] > shares["steps"]["share"]


def test_components_unbalanced_and_a_level_without_variance() -> None:
    rng = np.random.default_rng(2)
    runs = [int(x) for x in rng.integers(2, 9, 300)]
    steps = [[int(x) for x in rng.integers(5, 60, r)] for r in runs]
    c = noise.variance_components(_nested(rng, (0.0, 0.08, 0.03), 300, runs, steps))
    assert math.sqrt(c.runs) == pytest.approx(0.08, rel=0.08)
    assert math.sqrt(c.steps) == pytest.approx(0.03, rel=0.03)
    assert c.launches < 0.1 * c.runs  # none put in: at most a trace by sampling


def test_components_refuse_a_design_without_spread() -> None:
    with pytest.raises(ValueError, match="2 launches"):
        noise.variance_components([[[1.0, 2.0], [1.5, 1.7]]])


def test_floor_and_units_to() -> None:
    d = [0.05, -0.05] * 10  # sd 0.0513 over 20 units
    floor = noise.noise_floor(d)
    assert floor is not None and 0.02 < floor < 0.03
    assert noise.noise_floor([0.1]) is None
    n2 = noise.units_to(0.02, 0.17)
    assert n2 is not None and 283 <= n2 <= 290  # (1.96 · 0.17 / log 1.02)² = 283 by the normal, t a few more
    assert noise.units_to(0.05, 0.17) < n2
    rec = noise.floor_record(d, unit=2)
    assert rec["units"] == 20 and rec["unit_blocks"] == 2 and rec["blocks_to_2pct"] % 2 == 0
    assert "noise floor ±2." in noise.floor_words(rec)


def test_the_floor_is_the_verdicts_own_interval_at_every_size() -> None:
    """The noise floor a verdict prints and the half-width --target-ci holds it to are one figure, however many
    units (with the bootstrap from 30 units on, an A/A stopped "within ±2.0 %" under a floor of ±2.1 %)."""
    from dpcompare.report import stats
    from dpcompare.report.verdicts import relative_half_width

    rng = np.random.default_rng(11)
    for n in (8, 30, 50, 120):
        d = (np.where(rng.random(n) < 0.2, 0.1, 0.0) + 0.05 * rng.standard_normal(n)).tolist()  # skewed, two modes
        iv, method = stats.paired_log_ratio_ci([1.0] * n, np.exp(d).tolist())
        assert method == "t" and iv is not None
        assert relative_half_width(math.exp(iv.lo), math.exp(iv.hi)) == pytest.approx(noise.noise_floor(d))


# -- steal time and disturbed blocks ---------------------------------------------------------------------------------
STAT = """cpu  1000 20 300 5000 40 5 6 70 0 0
cpu0 500 10 150 2500 20 2 3 35 0 0
intr 12345
"""
STAT_LATER = """cpu  1100 20 350 5200 40 5 6 170 0 0
cpu0 550 10 175 2600 20 2 3 85 0 0
"""


def test_modes_found_only_where_runs_fall_in_two_clusters() -> None:
    rng = np.random.default_rng(7)
    slow, fast = 6500 * np.exp(rng.normal(0, 0.03, 11)), 14000 * np.exp(rng.normal(0, 0.03, 17))
    found = noise.modes([*fast, *slow])
    assert [m.runs for m in found] == [11, 17]
    assert 6000 < found[0].centre < 7000 and 13000 < found[1].centre < 15000
    assert len(noise.modes(10000 * np.exp(rng.normal(0, 0.1, 40)))) == 1  # one broad mode is one mode
    assert len(noise.modes([*10000 * np.exp(rng.normal(0, 0.1, 20)), 10800, 10900])) == 1  # two neighbours: no mode
    assert noise.modes([6500, 6600, 14000, 14100, 6550]) == []  # too few runs to tell
    runs = [{"arm": "horovod", "strategy": "horovod", "np": 2, "status": "ok", "samples_per_sec": float(t)}
            for t in [*fast, *slow]] + [{"arm": "ddp", "strategy": "ddp", "np": 2, "status": "ok",
                                         "samples_per_sec": float(t)} for t in 9000 * np.exp(rng.normal(0, .05, 28))]
    (line,) = noise.setting_lines({"config": {"arms": [{"label": "ddp"}, {"label": "horovod"}]}, "runs": runs})
    assert line.startswith("horovod at np=2 ran in two modes: 6,") and "(11 of 28 runs)" in line


def test_stalled_runs_are_counted_and_named_not_dropped() -> None:
    """One run at a tenth of its arm's median throughput is no mode (too rare) but is named, with how slow it was."""
    rng = np.random.default_rng(3)
    hvd = [*19000 * np.exp(rng.normal(0, 0.03, 63)), 1900.0]
    assert noise.stalls(hvd) == [pytest.approx(0.1, abs=0.01)] and noise.stalls([*hvd[:63], 9000.0]) == []
    assert noise.stalls([]) == []
    runs = [{"arm": "horovod", "strategy": "horovod", "np": 2, "status": "ok", "samples_per_sec": float(t)}
            for t in hvd] + [{"arm": "ddp", "strategy": "ddp", "np": 2, "status": "ok", "samples_per_sec": 14000.0}
                             for _ in hvd]
    (line,) = noise.setting_lines({"config": {"arms": [{"label": "ddp"}, {"label": "horovod"}]}, "runs": runs})
    assert line.startswith("horovod at np=2: 1 of 64 runs stalled (at 10 % of the arm's median")
    assert "--bind comm" in line


def test_steal_is_read_from_proc_stat_text() -> None:
    from dpcompare.compare.load import proc_stat_times, steal_share, why_disturbed

    before, after = proc_stat_times(STAT), proc_stat_times(STAT_LATER)
    assert before["steal"] == 70 and before["user"] == 1000 and before["guest_nice"] == 0
    assert proc_stat_times("cpu  1 2 3 4\n")["steal"] == 0  # an old kernel's short line
    assert steal_share(before, after) == pytest.approx(100 / 450, abs=1e-4)  # Δ: 100+50+200+100 ticks
    assert steal_share(None, after) is None
    with pytest.raises(ValueError):
        proc_stat_times("intr 1\n")
    quiet, busy, robbed = {"others_cpu_share": 0.05}, {"others_cpu_share": 0.4}, {"steal_share": 0.08}
    assert why_disturbed([quiet, None], 0.25) is None
    assert "other processes took 40 %" in (why_disturbed([quiet, busy], 0.25) or "")
    assert "stole 8 %" in (why_disturbed([robbed], 0.25) or "")  # over 0.25 / 4
    assert why_disturbed([busy, robbed], 0.0) is None  # 0: the rule is off


# -- binding in the launch line ------------------------------------------------------------------------------------
def test_binding_in_the_mpirun_line() -> None:
    from dpcompare.errors import ConfigError
    from dpcompare.launch import mpirun

    env: dict[str, str] = {}
    line = mpirun.openmpi_command(2, ["x"], environ=env)
    assert line[3:7] == ["--bind-to", "none", "--map-by", "slot"]  # today's default, unchanged
    assert mpirun.openmpi_command(2, ["x"], environ=env, bind="core")[3:7] == ["--bind-to", "core", "--map-by", "core"]
    assert mpirun.openmpi_command(2, ["x"], environ=env, bind="core", cores_per_rank=2)[3:7] == [
        "--bind-to", "core", "--map-by", "slot:PE=2"]
    assert mpirun.mpich_command(2, ["x"], bind="core")[3:5] == ["-bind-to", "core"]
    assert "--cpu-bind=cores" in mpirun.srun_command(2, ["x"], environ=env, bind="core")
    with pytest.raises(ConfigError, match="--bind"):
        mpirun.openmpi_command(2, ["x"], environ=env, bind="socket")
    with pytest.raises(ConfigError, match="4 ranks × 1 core"):
        mpirun.job_command(4, ["x"], flavor="openmpi", environ=env, cores=2, bind="core", use_srun=False)
    over = mpirun.job_command(4, ["x"], flavor="openmpi", environ=env, cores=2, use_srun=False)
    assert "--oversubscribe" in over and over[over.index("--bind-to") + 1] == "none"


def test_bind_comm_pins_each_ranks_communication_thread() -> None:
    """--bind comm: the ranks float as with none, the launch line tells every rank, and Horovod's strategy turns
    that into a HOROVOD_THREAD_AFFINITY spreading the local ranks' background threads over the cores; the line
    also makes MPI's waits yield (Open MPI's mpi_yield_when_idle), unless the user set that."""
    from dpcompare.launch import mpirun
    from dpcompare.launch.env import BIND_VAR, LaunchEnv, comm_thread_cores
    from dpcompare.launch.openmpi import YIELD_VAR

    env: dict[str, str] = {}
    line = mpirun.job_command(4, ["x"], flavor="openmpi", environ=env, cores=2, bind="comm", use_srun=False)
    assert line[line.index("--bind-to") + 1] == "none" and "--oversubscribe" in line  # no cores are claimed
    assert line[line.index(f"{BIND_VAR}=comm") - 1] == "-x" and line[line.index(f"{YIELD_VAR}=1") - 1] == "-x"
    plain = mpirun.job_command(2, ["x"], flavor="openmpi", environ=env, use_srun=False)
    assert f"{BIND_VAR}=comm" not in plain and not any(YIELD_VAR in a for a in plain)
    own = mpirun.job_command(2, ["x"], flavor="openmpi", environ={YIELD_VAR: "0"}, bind="comm", use_srun=False)
    assert own[own.index(YIELD_VAR) - 1] == "-x" and f"{YIELD_VAR}=1" not in own  # the user's 0, by name
    srun = mpirun.job_command(2, ["x"], environ={"SLURM_JOB_ID": "1"}, bind="comm", use_srun=True)
    assert "--cpu-bind=cores" not in srun and any(BIND_VAR + "=comm" in a and f"{YIELD_VAR}=1" in a for a in srun)
    cores = sorted(os.sched_getaffinity(0))
    two = comm_thread_cores(LaunchEnv(local_size=2), {BIND_VAR: "comm"})
    assert two == f"{cores[0]},{cores[len(cores) // 2]}"  # 2 cores: "0,1"; 4: "0,2"
    assert len((comm_thread_cores(LaunchEnv(local_size=5), {BIND_VAR: "comm"}) or "").split(",")) == 5
    assert comm_thread_cores(LaunchEnv(local_size=2), {}) is None
    assert comm_thread_cores(LaunchEnv(local_size=2), {BIND_VAR: "core"}) is None


@pytest.mark.mpi
@pytest.mark.horovod
def test_bind_comm_puts_horovods_background_threads_on_cores_of_their_own(tmp_path: Path) -> None:
    """For real: under the variable --bind comm's launch line sets, each rank's Horovod background thread is pinned
    to the core comm_thread_cores names for its local rank (Horovod's own log says where), and the run records it
    and MPI's yield setting."""
    from dpcompare.launch.env import BIND_VAR, LaunchEnv, comm_thread_cores
    from dpcompare.launch.openmpi import YIELD_VAR

    from conftest import FAST, dpcompare, mpi_env, summary

    out = tmp_path / "h"
    env = mpi_env({BIND_VAR: "comm", YIELD_VAR: "1", "HOROVOD_LOG_LEVEL": "info"})
    env.pop("HOROVOD_THREAD_AFFINITY", None)
    p = dpcompare("train", "--strategy", "horovod", *FAST, "--epochs", "1", "--out", str(out), np=2, env=env)
    expected = comm_thread_cores(LaunchEnv(local_size=2), {BIND_VAR: "comm"}) or ""
    comm = summary(out)["comm"]
    assert comm["HOROVOD_THREAD_AFFINITY"] == expected and comm[YIELD_VAR] == "1"
    # the whole text, not line by line: Horovod's logger writes a line in pieces to unbuffered stderr (the "[", the
    # time, the file, the message, the newline), so the two ranks' lines, logged in the same microsecond,
    # interleave piece by piece; the message itself is one piece (seen once under the whole suite: one line read)
    said = p.stdout + p.stderr
    pinned = sorted(re.findall(r"Background thread affinity (\d+)", said))
    assert pinned == sorted(expected.split(",")), [x for x in said.splitlines() if "thread affinity" in x]


# -- a comparison: the rerun rule, the binding and the floor in results.json and the report ---------------------------
def _load(share: float) -> dict[str, Any]:
    return {"others_cpu_share": share, "steal_share": 0.0, "others_cpu_s": 0.0, "job_cpu_s": 1.0, "busy_cpu_s": 1.0,
            "job_cpu_outside_s": 0.0, "cores": 2, "wall_s": 1.0, "loadavg_start": [0, 0, 0], "loadavg_end": [0, 0, 0]}


def test_a_disturbed_block_runs_again_and_the_report_shows_floor_and_binding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console
    from test_compare import fake_launch, run_compare

    from dpcompare.compare import runner as runner_m
    from dpcompare.config import TrainConfig
    from dpcompare.launch.openmpi import YIELD_VAR

    watches: list[int] = []

    class Watch:  # the third run (block 1's first) saw others take 60 % of the cores; every other run none
        def __init__(self, marker: str | None = None) -> None:
            watches.append(len(watches) + 1)
            self.n = len(watches)

        def result(self) -> dict[str, Any]:
            return _load(0.6 if self.n == 3 else 0.0)

    monkeypatch.setattr(runner_m, "LoadWatch", Watch)
    lines: list[list[str]] = []

    def launch(cmd: list[str], run_dir: Path, env: dict[str, str], timeout: float | None) -> tuple[int, float]:
        lines.append(cmd)
        return fake_launch(cmd, run_dir, env, timeout)

    fake_launch.calls = []  # type: ignore[attr-defined]
    monkeypatch.setattr(fake_launch, "sps", lambda child, n, d: 1000.0 * (
        1.0 if child.strategy == "ddp" else 1.1 + 0.02 * (int(d.name.split("-r")[1]) % 3)), raising=False)
    console = Console(record=True, width=250)
    out = tmp_path / "cmp"
    assert run_compare(TrainConfig(epochs=1), ["ddp", "horovod"], [1], 3, out, launch=launch, console=console,
                       progress="none", disturbed=0.25, bind="core") == 0
    res = json.loads((out / "results.json").read_text())
    assert len(lines) == 8 and all(c[c.index("--bind-to") + 1] == "core" for c in lines)
    assert [r["repeat"] for r in res["runs"]] == [0, 0, 1, 1, 2, 2]
    assert [r["repeat"] for r in res["disturbed_runs"]] == [1, 1]
    (entry,) = res["disturbed"]
    assert entry["block"] == 1 and entry["try"] == 1 and not entry["counted"] and "60 %" in entry["why"]
    assert res["config"]["binding"] == {"bind": "core", "threads": TrainConfig().threads,
                                        "horovod_thread_affinity": os.environ.get("HOROVOD_THREAD_AFFINITY"),
                                        "mpi_yield_when_idle": os.environ.get(YIELD_VAR)}
    (floor,) = res["noise"]
    assert floor["other"] == "horovod" and floor["units"] == 3 and floor["floor"] > 0.01
    text = console.export_text()
    assert f"noise floor ±{100 * floor['floor']:.1f} %" in text
    assert "1 disturbed block run again, not counted" in text and "bound to its own core" in text
    page = (out / "report.html").read_text()
    assert "noise floor ±" in page and "run again, not counted" in page and "--bind core" in page


def test_bind_as_an_axis_and_a_flag_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_compare import _parse_train, fake_launch

    from dpcompare import cli
    from dpcompare.compare import records
    from dpcompare.compare import runner as runner_m
    from dpcompare.compare.cmdline import plan_flags
    from dpcompare.compare.command import comparison_of
    from dpcompare.errors import ConfigError
    from dpcompare.launch.openmpi import YIELD_VAR

    out = tmp_path / "b"
    c = comparison_of(cli.build_parser().parse_args(
        ["compare", "--np", "1", "--strategies", "ddp,horovod", "--sweep", "bind=none,core", "--repeats", "1",
         "--threads", "1", "--progress", "none", "--out", str(out)]))
    assert [a.label for a in c.all_arms] == ["ddp/bind=none", "ddp/bind=core", "horovod/bind=none", "horovod/bind=core"]
    again = comparison_of(cli.build_parser().parse_args(["compare", *plan_flags(c), "--out", str(out)]))
    assert again.all_arms == c.all_arms and again.options.bind == "none"
    seen: dict[str, str] = {}

    def launch(cmd: list[str], run_dir: Path, env: dict[str, str], timeout: float | None) -> tuple[int, float]:
        assert _parse_train(cmd[cmd.index("train") + 1:]).threads == 1
        seen[run_dir.name] = cmd[cmd.index("--bind-to") + 1]
        return fake_launch(cmd, run_dir, env, timeout)

    fake_launch.calls = []  # type: ignore[attr-defined]
    assert runner_m.run_compare(c, launch=launch) == 0
    assert seen == {"ddp-bind-none-np1-r0": "none", "ddp-bind-core-np1-r0": "core",
                    "horovod-bind-none-np1-r0": "none", "horovod-bind-core-np1-r0": "core"}
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["binding"]["bind"] == "by arm" and res["config"]["axes"]["bind"]["values"] == ["none", "core"]
    monkeypatch.delenv("HOROVOD_THREAD_AFFINITY", raising=False)
    monkeypatch.delenv(YIELD_VAR, raising=False)
    swept = records.binding(comparison_of(cli.build_parser().parse_args(
        ["compare", "--strategies", "ddp,horovod", "--sweep", "bind=none,comm", "--out", str(tmp_path / "s")])))
    assert swept["horovod_thread_affinity"] == "from the local rank (the bind=comm arms)"  # not the bind=none ones'
    assert swept["mpi_yield_when_idle"] == "1 (the bind=comm arms)"
    assert records.binding(comparison_of(cli.build_parser().parse_args(
        ["compare", "--bind", "comm", "--out", str(tmp_path / "c")])))["mpi_yield_when_idle"] == "1"
    monkeypatch.setenv(YIELD_VAR, "0")  # the user's own value reached every arm
    assert records.binding(comparison_of(cli.build_parser().parse_args(
        ["compare", "--sweep", "bind=none,comm", "--out", str(tmp_path / "s")])))["mpi_yield_when_idle"] == "0"
    flag = comparison_of(cli.build_parser().parse_args(
        ["compare", "--bind", "core", "--rerun-disturbed", "20", "--out", str(tmp_path / "f")]))
    assert flag.options.bind == "core" and flag.options.disturbed == pytest.approx(0.2)
    assert plan_flags(flag)[-4:] == ["--bind", "core", "--rerun-disturbed", "20"]
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["compare", "--bind", "socket"])
    with pytest.raises(ConfigError, match="leave --bind out with --lab"):
        comparison_of(cli.build_parser().parse_args(["compare", "--bind", "core", "--lab", "hosts=2"]))
    with pytest.raises(ConfigError, match="--bind comm .* leave --bind out with --lab"):
        comparison_of(cli.build_parser().parse_args(["compare", "--bind", "comm", "--lab", "hosts=2"]))


def test_the_binding_line_says_how_mpi_waited() -> None:
    """The binding line names Open MPI's yield setting where the comparison recorded it (a comparison from before
    it was recorded says nothing of it, rather than "unset")."""
    comm = {"bind": "comm", "threads": 0, "horovod_thread_affinity": "from the local rank", "mpi_yield_when_idle": "1"}
    line = noise.binding_words(comm) or ""
    assert "MPI's waits yielding the core (--bind comm" in line and line.endswith("mpi_yield_when_idle: 1")
    old = noise.binding_words({k: v for k, v in comm.items() if k != "mpi_yield_when_idle"}) or ""
    assert "own (--bind comm" in old and "yield" not in old  # a file from before --bind comm yielded: it did not
    assert "yield" not in (noise.binding_words({**comm, "mpi_yield_when_idle": "0"}) or "").split(";")[0]
    assert (noise.binding_words({**comm, "bind": "none", "mpi_yield_when_idle": None}) or "").endswith(
        "mpi_yield_when_idle: unset")
    old = noise.binding_words({"bind": "none", "threads": 1, "horovod_thread_affinity": None}) or ""
    assert "yield" not in old and old.endswith("HOROVOD_THREAD_AFFINITY: unset")
    # what --threads 0 came to, as the runs recorded it; an explicit count is said as given
    assert "threads per rank: 1, the cores a rank may use ÷ the ranks sharing them (--threads 0);" in (
        noise.binding_words(comm, [1, 1]) or "")
    assert "threads per rank: 1–2, the cores" in (noise.binding_words(comm, [2, 1]) or "")
    assert "threads per rank: 3;" in (noise.binding_words({**comm, "threads": 3}, [3]) or "")


# -- the bench ---------------------------------------------------------------------------------------------------------
@pytest.mark.mpi
def test_the_noise_bench_quick_writes_every_figure(tmp_path: Path) -> None:
    """bench/noise.py --quick for real (2 launches × 4 blocks of ddp vs ddp, np=2, persistent workers): the
    structure of noise.json; the figures of so tiny a run mean nothing."""
    from conftest import ROOT, mpi_env, run

    bind = "core" if (os.cpu_count() or 1) >= 2 else "none"  # a core per rank
    p = run([sys.executable, str(ROOT / "bench" / "noise.py"), "--quick", "--bind", bind, "--out", str(tmp_path)],
            timeout=900, env=mpi_env())
    summary = json.loads((tmp_path / "noise.json").read_text())
    aa = summary["pairs"]["aa"]
    assert set(summary["pairs"]) == {"aa"} and summary["settings"]["quick"]
    assert (aa["launches"], aa["blocks"], aa["arms"]) == (2, 8, ["ddp", "ddp"])
    assert aa["block_sd"] is not None and aa["blocks_to_2pct"] >= aa["blocks_to_5pct"] >= 2
    assert aa["minutes_to_2pct"] > 0 and aa["block_seconds"] > 0
    for arm in ("ddp#1", "ddp#2"):
        c = aa["components"][arm]
        assert c["counts"] == {"launches": 2, "runs": 8, "steps": c["counts"]["steps"]} and c["counts"]["steps"] > 40
        assert sum(c[level]["share"] for level in noise.LEVELS) == pytest.approx(1.0, abs=1e-3)
    cov = aa["coverage"]
    assert cov["intervals"] == 2 and 0 <= cov["contain_equality"] <= 2 and len(cov["share_ci95"]) == 2
    assert "intervals containing equality" in p.stdout and "ddp#1: launches" in p.stdout
    launch0 = tmp_path / "aa" / "launch0"
    assert json.loads((launch0 / "results.json").read_text())["config"]["binding"]["bind"] == bind
    (log,) = (launch0 / "runs").glob("worker-np2-*.log")  # one worker job ran every run of the launch
    line = log.read_text().splitlines()[0].split()
    assert line[line.index("--bind-to") + 1] == bind
    assert len(aa["stalled_runs"]) == 2 and all(set(x) == {"ddp#1", "ddp#2"} for x in aa["stalled_runs"])
    assert len(aa["launch_floors"]) == len(aa["launch_minutes"]) == 2 and all(m > 0 for m in aa["launch_minutes"])
    assert run([sys.executable, str(ROOT / "bench" / "noise.py"), "--pairs", "xy", "--out", str(tmp_path)],
               check=False).returncode == 2


def test_the_noise_benchs_target_mode_and_alternating_bindings() -> None:
    """--target-ci PCT (compare's flag; --target, its abbreviation, as the figures ran it): compare's stopping rule
    asked for ±PCT % within the time budget, up to 200 blocks; --bind takes a list the launches alternate over; an
    unknown binding is refused."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("bench_noise", ROOT / "bench" / "noise.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    a = bench.parse_args(["--pairs", "dh", "--target", "2", "--bind", "none,comm", "--launches", "3"])
    assert bench.parse_args(["--target-ci", "2"]).target == a.target == 2.0
    assert a.bind == ["none", "comm"] and a.blocks == "auto"  # noise.json's settings: the rule decided, not 10
    rule = bench.schedule(a)
    assert (rule.repeats, rule.target_ci, rule.max_repeats, rule.time_budget) == (None, 0.02, 200, 300.0)
    assert bench.schedule(bench.parse_args(["--blocks", "7"])).repeats == 7
    with pytest.raises(SystemExit):
        bench.parse_args(["--bind", "none,socket"])
    runs = [{"arm": "horovod", "np": 2, "status": "ok", "samples_per_sec": x}
            for x in (18e3, 19e3, 17e3, 2.4e3, 18.5e3)]
    res = {"config": {"arms": [{"label": "horovod"}]}, "runs": runs}
    assert bench.stalled_runs(res) == {"horovod": 1}


def test_the_steadiness_bench_quick_writes_every_figure(tmp_path: Path) -> None:
    """bench/steadiness.py --quick for real (3 s of convnet steps, a process per core, started together): the
    structure of steadiness.json and its figure lines; a bad --chunks is refused with exit 2."""
    from conftest import ROOT, run

    bench = str(ROOT / "bench" / "steadiness.py")
    p = run([sys.executable, bench, "--quick", "--out", str(tmp_path)], timeout=300)
    res = json.loads((tmp_path / "steadiness.json").read_text())
    assert len(res["processes"]) == len(os.sched_getaffinity(0))
    for proc in res["processes"]:
        assert proc["steps"] > 50 and proc["median_step_ms"] > 0
        assert proc["drift"]["windows"] >= 5 and proc["drift"]["slowest_over_fastest"] >= 1
        assert set(proc["ideal_aa"]) == {"0.25", "0.5"}
        aa = proc["ideal_aa"]["0.5"]
        assert aa["pairs_in_budget"] == 300 and aa["pairs_measured"] >= 2 and aa["half_width_pct"] > 0
    assert res["settings"]["quick"] and res["settings"]["chunks"] == [0.25, 0.5]
    for key in ("window_sd", "lag1", "slowest_over_fastest", "ideal_aa_0_5s", "command"):
        assert f"figure: {key} = " in p.stdout
    bad = run([sys.executable, bench, "--chunks", "1,x", "--out", str(tmp_path)], check=False)
    assert bad.returncode == 2 and "--chunks" in bad.stderr


def test_the_coverage_bench_counts_how_often_each_interval_leaves_out_no_effect(tmp_path: Path) -> None:
    """bench/coverage.py on a comparison whose units are skewed A/A noise: t's interval leaves out the true mean
    near 5 % of the time, and the bootstrap's is the narrower (z's quantile below t's); a file without a verdict
    is refused with a line that says what to give."""
    from conftest import ROOT, run

    rng = np.random.default_rng(0)
    ratios = np.exp(np.where(rng.random(60) < 0.2, 0.08, 0.0) + 0.03 * rng.standard_normal(60)).tolist()
    good = tmp_path / "results.json"
    good.write_text(json.dumps({"verdicts": [{"metric": "throughput", "block_ratios": ratios, "unit_blocks": 2}]}))
    bench = str(ROOT / "bench" / "coverage.py")
    p = run([sys.executable, bench, str(good), "--sizes", "12", "--sims", "300"], timeout=300)
    figures = dict(re.findall(r"^figure: (\w+) = (.+)$", p.stdout, re.M))
    assert f"{good}: 30 units" in p.stdout  # 60 blocks in units of 2
    miss_t = [float(x) for x in figures["miss_t_12"].rstrip(" %").split("–")]
    width = [float(x) for x in figures["width_bca_12"].split("–")]
    assert all(1.5 <= x <= 10 for x in miss_t) and all(x < 1 for x in width)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"verdicts": []}))
    bad = run([sys.executable, bench, str(empty)], check=False)
    assert bad.returncode == 2 and "no throughput verdict" in bad.stderr
