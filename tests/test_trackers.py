"""Experiment trackers (``--trackers``): what each tool wrote, read back with the tool's own reader.

W&B runs offline and is read with ``wandb leet inspect --json`` (wandb's reader of its .wandb transaction
log); MLflow with ``MlflowClient`` on the sqlite store; TensorBoard with its EventAccumulator; CSV with csv.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpcompare.cli import main
from dpcompare.compare.trackers import open_group
from dpcompare.config import TrainConfig
from dpcompare.errors import ConfigError
from dpcompare.options import config_from_args, train_argv
from dpcompare.training import trackers

from conftest import missing

WANDB = str(Path(sys.executable).parent / "wandb")
ROWS = [{"epoch": e, "step": 10 * e, "train_loss": 1.0 / e, "test_accuracy": 0.5 + 0.1 * e,
         "samples_per_sec": 900.0 + e, "epoch_seconds": 1.5} for e in (1, 2)]
TIMING = {"samples_per_sec": 950.0, "measured_steps": 15, "step_ms_median": 3.25,
          "phases_ms": {"data": 0.25, "forward": 1.0, "backward": 1.5, "optimizer": 0.5}, "per_rank": [{"rank": 0}]}


def _need(*modules: str) -> None:
    import importlib.util

    for m in modules:
        if importlib.util.find_spec(m) is None:
            missing(f"{m} is not installed (make setup-dev installs the dev extra, which has it)")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """W&B offline, no project/group/store from the caller's environment."""
    for var in ("WANDB_MODE", "WANDB_RUN_GROUP", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID",
                "MLFLOW_EXPERIMENT_NAME", trackers.MLFLOW_PARENT_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)


def _summary(out: Path) -> dict:
    return {"strategy": "ddp", "world_size": 2, "steps": 20, "final_test_accuracy": 0.7, "final_train_loss": 0.5,
            "samples_per_sec": 950.0, "timing": TIMING, "memory": {"total_mb": 3.0, "per_rank": []},
            "config": {"out": str(out)}, "versions": {"torch": "x"}}


def _run(out: Path, log: str, **kw) -> None:
    """One run's worth of tracker calls, as the loop makes them on the reporting rank."""
    cfg = TrainConfig(strategy="ddp", log=log, out=str(out), **kw)
    out.mkdir(parents=True, exist_ok=True)
    with trackers.open_trackers(cfg, {**cfg.to_dict(), "world_size": 2, "effective_lr": 0.05}, out, True) as tr:
        for row in ROWS:
            tr.log_epoch(row["step"], row)
        tr.log_timing(TIMING)
        tr.finish(_summary(out))


def wandb_records(out: Path) -> list[dict]:
    """Every record of the one offline W&B run under ``out`` (wandb's own reader)."""
    [run_dir] = (out / "wandb").glob("offline-run-*")
    p = subprocess.run([WANDB, "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def _mlflow_runs(uri: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    return client, {r.info.run_name: r for r in client.search_runs(ids)}


# -- the option ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, words", [
    ("tensorboard,nope", "unknown tracker 'nope'; choose from tensorboard, csv, wandb, mlflow"),
    ("wandb", "wandb is not installed: pip install -e '.[wandb]'"),
])
def test_log_refuses_unknown_or_absent_tracker_before_training(tmp_path, monkeypatch, capsys, value, words):
    # wandb is installed here: make it look absent, as it is where the extra was not installed
    monkeypatch.setitem(trackers.TRACKERS, "wandb", ("wandb_not_installed_here", "wandb", "W&B"))
    try:
        code = main(["train", "--trackers", value, "--out", str(tmp_path / "o")])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "o").exists()


def test_log_default_no_tensorboard_and_child_flags():
    from dpcompare.cli import build_parser

    p = build_parser()
    assert trackers.selected(config_from_args(p.parse_args(["train"]))) == ["tensorboard"]
    assert trackers.selected(config_from_args(p.parse_args(["train", "--no-tensorboard"]))) == []
    cfg = config_from_args(p.parse_args(["train", "--trackers", "csv, tensorboard,csv", "--no-tensorboard"]))
    assert cfg.log == "csv,tensorboard" and trackers.selected(cfg) == ["csv"]
    assert train_argv(cfg)[-3:] == ["--no-tensorboard", "--trackers", "csv,tensorboard"]
    assert trackers.selected(config_from_args(p.parse_args(["compare"]), strategy="ddp")) == []  # compare: none
    assert trackers.selected(config_from_args(p.parse_args(["compare", "--trackers", "tensorboard"]),
                                              strategy="ddp")) == ["tensorboard"]
    assert trackers.selected(config_from_args(p.parse_args(["train", "--trackers", "none"]))) == []
    assert trackers.mlflow_store("some/dir", Path("/x")) == f"sqlite:///{Path('some/dir').resolve()}/mlflow.db"
    assert trackers.mlflow_store(None, Path("/x/run")) == "sqlite:////x/run/mlflow.db"


def test_require_names_the_extra(monkeypatch):
    monkeypatch.setitem(trackers.TRACKERS, "mlflow", ("mlflow_not_installed_here", "mlflow", "MLflow"))
    with pytest.raises(ConfigError, match=r"pip install -e '.\[mlflow\]'"):
        trackers.check(TrainConfig(log="csv,mlflow"))


def test_other_ranks_log_nothing(tmp_path):
    tr = trackers.open_trackers(TrainConfig(log="tensorboard,csv"), {}, tmp_path, is_main=False)
    tr.log_epoch(1, ROWS[0])
    tr.finish({})
    assert tr.names == [] and list(tmp_path.iterdir()) == []


# -- what each tool wrote --------------------------------------------------------------------------------
def test_every_tracker_reads_back(tmp_path, offline):
    _need("wandb", "mlflow", "tensorboard")
    out = tmp_path / "ddp-np2"
    _run(out, "tensorboard,wandb,mlflow,csv")

    # W&B: config with versions, metrics by optimizer step, timing and final figures in the summary
    recs = wandb_records(out)
    run = next(r["run"] for r in recs if r["type"] == "run")
    cfg = run["config"]["update"]
    assert cfg["strategy"] == "ddp" and cfg["world_size"] == 2 and "torch" in cfg["versions"]
    assert run["display_name"] == "ddp-np2" and run["job_type"] == "ddp"
    history = [r["history"]["item"] for r in recs if r["type"] == "history"]
    assert [(h["step"], h["test_accuracy"]) for h in history] == [(10, 0.6), (20, 0.7)]
    summary = {k: v for r in recs if r["type"] == "summary" for k, v in r["summary"]["update"].items()}
    assert summary["timing/phases_ms/backward"] == 1.5 and summary["final_test_accuracy"] == 0.7
    assert next(r["exit"]["exit_code"] for r in recs if r["type"] == "exit") == 0

    # MLflow: params, version tags, metric history by step, final metrics, summary.json artifact
    client, runs = _mlflow_runs(f"sqlite:///{out}/mlflow.db")
    r = runs["ddp-np2"]
    assert r.info.status == "FINISHED" and r.data.params["strategy"] == "ddp" and r.data.params["world_size"] == "2"
    assert r.data.tags["versions.dpcompare"] and "versions.torch" in r.data.tags
    assert [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, "test_accuracy")] == [
        (10, 0.6), (20, 0.7)]
    assert r.data.metrics["timing/phases_ms/forward"] == 1.0 and r.data.metrics["final/final_test_accuracy"] == 0.7
    assert [a.path for a in client.list_artifacts(r.info.run_id)] == ["summary.json"]

    # CSV and TensorBoard
    with open(out / "metrics.csv") as f:
        assert [(int(x["step"]), float(x["test_accuracy"])) for x in csv.DictReader(f)] == [(10, 0.6), (20, 0.7)]
    assert ["timing/step_ms_median", "3.25"] in list(csv.reader((out / "timing.csv").read_text().splitlines()))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ev = EventAccumulator(str(out / "tensorboard")).Reload()
    assert [(s.step, round(s.value, 6)) for s in ev.Scalars("test_accuracy")] == [(1, 0.6), (2, 0.7)]
    assert "config/text_summary" in ev.Tags()["tensors"]


def test_a_comparison_groups_its_runs(tmp_path, offline, monkeypatch):
    _need("wandb", "mlflow")
    out = tmp_path / "cmp"
    group = open_group("ab-test", out, "wandb,mlflow")
    assert group.env["WANDB_RUN_GROUP"] == "ab-test" and group.env["MLFLOW_TRACKING_URI"].endswith("cmp/mlflow.db")
    for k, v in group.env.items():  # what the comparing process hands to every child job
        monkeypatch.setenv(k, v)
    _run(out / "runs" / "ddp-np2-r0", "wandb,mlflow")
    _run(out / "runs" / "horovod-np2-r0", "wandb,mlflow")
    verdicts = [{"np": 2, "baseline": "ddp", "other": "horovod", "metric": "throughput", "ratio": 1.2,
                 "ci_low": 1.1, "ci_high": 1.3, "blocks": 10, "outcome": "faster",
                 "text": "horovod 20 % faster than ddp at np=2"}]
    group.finish(verdicts)

    client, runs = _mlflow_runs(group.env["MLFLOW_TRACKING_URI"])
    parent = runs["ab-test"]
    assert parent.info.status == "FINISHED"
    for name in ("ddp-np2-r0", "horovod-np2-r0"):
        assert runs[name].data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert runs[name].info.experiment_id == parent.info.experiment_id
    key = "throughput.horovod_vs_ddp.np2"
    assert parent.data.tags[f"verdict.{key}"] == verdicts[0]["text"]
    assert parent.data.metrics["throughput/horovod_vs_ddp/np2/ratio"] == 1.2
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == ["verdicts.json"]

    run = next(r["run"] for r in wandb_records(out / "runs" / "horovod-np2-r0") if r["type"] == "run")
    assert run["run_group"] == "ab-test"
    recs = wandb_records(out)
    run = next(r["run"] for r in recs if r["type"] == "run")
    assert run["run_group"] == "ab-test" and run["job_type"] == "comparison"
    summary = {k: v for r in recs if r["type"] == "summary" for k, v in r["summary"]["update"].items()}
    assert summary["throughput/horovod_vs_ddp/np2/ratio"] == 1.2 and summary[f"verdict/{key}"] == verdicts[0]["text"]


@pytest.mark.mpi
def test_a_real_compare_logs_every_run_and_groups_them(tmp_path, offline):
    """``compare --trackers wandb,mlflow``: each ``mpirun -np 2`` run logs its epochs from the reporting rank, and
    the comparison is the W&B group and the MLflow parent run holding the verdicts."""
    _need("wandb", "mlflow")
    from conftest import FAST, dpcompare

    out = tmp_path / "ab"
    dpcompare("compare", "--np", "2", "--strategies", "ddp,horovod", "--repeats", "1", "--min-steps", "0",
              *FAST, "--epochs", "2", "--trackers", "wandb,mlflow", "--workers", "persistent", "--out", str(out))
    client, runs = _mlflow_runs(trackers.mlflow_store(None, out))
    parent = runs["ab"]
    assert parent.info.status == "FINISHED" and any(k.startswith("verdict.") for k in parent.data.tags)
    children = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 2
    for child in children:
        history = client.get_metric_history(child.info.run_id, "train_loss")
        assert len(history) == 2  # one point per epoch, from rank 0 only
    results = json.loads((out / "results.json").read_text())
    for r in results["runs"]:
        run = next(x["run"] for x in wandb_records(out / r["dir"]) if x["type"] == "run")
        assert run["run_group"] == "ab"
