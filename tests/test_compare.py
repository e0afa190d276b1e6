"""``dpcompare compare``: flags round-trip, run order, results.json, failures, and one real A/B run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dpcompare import cli, compare
from dpcompare.config import TrainConfig
from dpcompare.options import config_from_args
from dpcompare.report import render

from conftest import dpcompare, needs_horovod, needs_mpi


def _parse_train(argv: list[str]) -> TrainConfig:
    return config_from_args(cli.build_parser().parse_args(["train", *argv]))


def test_child_command_is_mpirun_python_m_dpcompare_train(tmp_path: Path) -> None:
    cfg = TrainConfig(epochs=3, warmup_steps=2, tensorboard=False, seed=7)
    spec = compare.RunSpec("horovod", 1, 0)
    cmd = compare.child_command(cfg, spec, tmp_path / "runs" / spec.name)
    i = cmd.index(sys.executable)
    assert Path(cmd[0]).name in ("mpirun", "srun") and ("1" in cmd[:4] or "--ntasks=1" in cmd)
    assert cmd[i + 1:i + 4] == ["-m", "dpcompare", "train"]
    child = _parse_train(cmd[i + 4:])
    assert (child.strategy, child.out, child.epochs, child.seed, child.warmup_steps) == (
        "horovod", str(tmp_path / "runs" / "horovod-np1-r0"), 3, 7, 2)
    assert (child.tensorboard, child.progress, child.overwrite) == (False, "lines", True)


def test_python_m_dpcompare_works() -> None:
    from conftest import run

    p = run([sys.executable, "-m", "dpcompare", "--version"])
    assert p.stdout.startswith("dpcompare ")


def test_plan_is_repeat_major_and_alternates() -> None:
    names = [s.name for s in compare.plan(["ddp", "horovod"], [1, 2], 2)]
    assert names == ["ddp-np1-r0", "horovod-np1-r0", "ddp-np2-r0", "horovod-np2-r0",
                     "horovod-np2-r1", "ddp-np2-r1", "horovod-np1-r1", "ddp-np1-r1"]


@pytest.mark.parametrize(("args", "words"), [
    (["--np", "0"], "process counts"), (["--np", "1,x"], "process counts"),
    (["--strategies", "ddp,nccl"], "unknown strategy nccl"), (["--repeats", "0"], "at least 1"),
])
def test_bad_compare_flags_are_one_line(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and words in err and err.count("\n") == 1


def test_compare_defaults() -> None:
    a = cli.build_parser().parse_args(["compare"])
    assert (a.np, a.strategies, a.repeats, a.tensorboard, a.out) == ([2], ["ddp", "horovod"], 3, False, "runs/compare")
    assert cli.build_parser().parse_args(["compare", "--np", "2,1,2", "--tensorboard"]).np == [1, 2]


# -- results.json from what a run leaves behind (no training) ------------------------------------------


def fake_summary(sps: float = 5000.0, steps: int = 39) -> dict[str, Any]:
    return {"final_test_accuracy": 0.9639, "final_train_loss": 0.127, "samples_per_sec": sps,
            "timing": {"samples_per_sec": sps, "measured_steps": steps, "step_ms_median": 12.0, "step_ms_p95": 15.0,
                       "phases_ms": {"data": 0.2, "forward": 1.2, "backward": 1.0, "optimizer": 9.0},
                       "peak_rss_mb": 410.0}}


def test_run_record_ok() -> None:
    rec = compare.run_record(compare.RunSpec("ddp", 2, 1), "runs/ddp-np2-r1", 0, 9.87654, fake_summary(),
                             [{"epoch": 1}], "", command=["mpirun"])
    assert rec["status"] == "ok" and rec["error"] is None
    assert (rec["samples_per_sec"], rec["step_ms"], rec["peak_rss_mb"]) == (5000.0, {"median": 12.0, "p95": 15.0}, 410.0)
    assert rec["phases_ms"]["optimizer"] == 9.0 and rec["metrics"] == [{"epoch": 1}] and rec["wall_seconds"] == 9.877


def test_run_record_failures() -> None:
    spec = compare.RunSpec("ddp", 2, 0)
    err = "\n".join(f"line {i}" for i in range(100))
    rec = compare.run_record(spec, "d", 1, 1.0, None, [], err)
    assert rec["status"] == "failed" and rec["error"].startswith("line 60\n") and rec["error"].endswith("line 99")
    assert compare.run_record(spec, "d", 4, 1.0, None, [], "", stdout="oops")["error"] == "oops"
    assert "exited with code 4" in compare.run_record(spec, "d", 4, 1.0, None, [], "")["error"]
    diverged = compare.run_record(spec, "d", 3, 1.0, None, [], "dpcompare train: error: training diverged at step 3")
    assert diverged["status"] == "diverged" and "step 3" in diverged["error"]
    assert "timed out" in compare.run_record(spec, "d", None, 60.0, None, [], "")["error"]
    no_steps = compare.run_record(spec, "d", 0, 1.0, fake_summary(steps=0), [], "")
    assert no_steps["status"] == "failed" and "--warmup-steps" in no_steps["error"]


def fake_launch(cmd: list[str], run_dir: Path, env: dict[str, str], timeout: float | None) -> tuple[int, float]:
    """Stands in for mpirun: strategy 'single' at np>1 fails, the others write a run's files."""
    strategy = _parse_train(cmd[cmd.index("train") + 1:]).strategy
    np = int(run_dir.name.split("-np")[1].split("-r")[0])  # runs/<strategy>-np<N>-r<k>
    fake_launch.calls.append(f"{strategy}-np{np}")  # type: ignore[attr-defined]
    if strategy == "single" and np > 1:
        (run_dir / "stderr.log").write_text("dpcompare train: error: --strategy single runs one process\n" * 2
                                            + "-----\nmpirun detected that one or more processes exited\n")
        return 2, 0.5
    (run_dir / "summary.json").write_text(json.dumps(fake_summary(1000.0 * np)))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "train_loss": 0.5, "test_accuracy": 0.9}) + "\n")
    return 0, 1.0


def test_compare_records_failures_and_goes_on(tmp_path: Path) -> None:
    fake_launch.calls = []  # type: ignore[attr-defined]
    out = tmp_path / "cmp"
    rc = compare.run_compare(TrainConfig(epochs=1), ["ddp", "single"], [1, 2], 2, out, progress="none",
                             launch=fake_launch)
    assert rc == 1
    assert fake_launch.calls == ["ddp-np1", "single-np1", "ddp-np2", "single-np2",  # type: ignore[attr-defined]
                                 "single-np2", "ddp-np2", "single-np1", "ddp-np1"]
    res = json.loads((out / "results.json").read_text())
    assert res["schema"] == 1 and res["complete"] and res["config"]["strategies"] == ["ddp", "single"]
    assert len(res["runs"]) == 8 and {"torch", "python"} <= set(res["environment"])
    failed = [r for r in res["runs"] if r["status"] == "failed"]
    assert [(r["strategy"], r["np"]) for r in failed] == [("single", 2), ("single", 2)]
    assert "single runs one process" in failed[0]["error"] and failed[0]["dir"] == "runs/single-np2-r0"
    assert (out / "report.html").is_file()
    # a folder holding results is refused without --overwrite, replaced with it
    with pytest.raises(Exception, match="--overwrite"):
        compare.run_compare(TrainConfig(), ["ddp"], [1], 1, out, progress="none", launch=fake_launch)
    assert compare.run_compare(TrainConfig(), ["ddp"], [1], 1, out, overwrite=True, progress="none",
                               launch=fake_launch) == 0
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["ddp-np1-r0"]


def test_compare_refuses_existing_results_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "results.json").write_text("{}")
    assert cli.main(["compare", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpcompare compare: error: ") and "--overwrite" in err and err.count("\n") == 1


# -- real runs ---------------------------------------------------------------------------------------

FAST_COMPARE = ("--model", "convnet", "--dataset", "digits", "--threads", "1", "--warmup-steps", "2")


@needs_mpi
@needs_horovod
@pytest.mark.mpi
@pytest.mark.horovod
def test_compare_ddp_vs_horovod_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "ab"
    p = dpcompare("compare", "--np", "2", "--strategies", "ddp,horovod", "--repeats", "1", *FAST_COMPARE,
                  "--epochs", "2", "--out", str(out), timeout=400)
    res = json.loads((out / "results.json").read_text())
    assert [(r["strategy"], r["np"], r["status"]) for r in res["runs"]] == [("ddp", 2, "ok"), ("horovod", 2, "ok")]
    for r in res["runs"]:
        assert r["samples_per_sec"] > 0 and r["step_ms"]["median"] > 0 and r["peak_rss_mb"] > 0
        assert set(r["phases_ms"]) == {"data", "forward", "backward", "optimizer"}
        assert [m["epoch"] for m in r["metrics"]] == [1, 2] and r["final_test_accuracy"] > 0.9
        assert (out / r["dir"] / "summary.json").is_file() and not (out / r["dir"] / "tensorboard").exists()
    # same seed, same data order: the two strategies compute the same model
    a, b = res["runs"]
    assert abs(a["final_train_loss"] - b["final_train_loss"]) < 1e-5
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3  # throughput, breakdown, curves (one np: no scaling)
    assert "horovod" in p.stdout and "at np=2" in p.stdout and "report.html" in p.stdout
    assert "[2/2] horovod-np2-r0" in p.stdout  # a line per run when not on a terminal
    assert render(out, quiet=True).verdicts[0].startswith(("horovod ", "horovod vs ddp"))


@needs_mpi
@pytest.mark.mpi
def test_failed_run_is_recorded_and_exit_code_is_1(tmp_path: Path) -> None:
    out = tmp_path / "fail"
    p = dpcompare("compare", "--np", "2", "--strategies", "ddp,single", "--repeats", "1", *FAST_COMPARE,
                  "--epochs", "1", "--out", str(out), check=False, timeout=300)
    assert p.returncode == 1, p.stderr
    runs = {r["strategy"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert runs["ddp"]["status"] == "ok" and runs["ddp"]["error"] is None
    assert runs["single"]["status"] == "failed" and runs["single"]["samples_per_sec"] is None
    assert "--strategy single runs one process" in runs["single"]["error"]
    assert "FAILED" in p.stdout and "1 of 2 runs failed" in p.stdout
    assert "no comparison" in (out / "report.html").read_text()
