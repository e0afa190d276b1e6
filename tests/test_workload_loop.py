"""The loop trains any Workload: a regression with MSE loss and lower-is-better metrics (issue 22, loop side)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dpcompare.config import TrainConfig
from dpcompare.data.workload import Metric, Workload
from dpcompare.errors import ConfigError
from dpcompare.training.evaluation import EvalCurve
from dpcompare.training.loop import train


def _regression() -> Workload:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.01 * torch.randn(256, 1, generator=g)
    mse = Metric("mse", higher_is_better=False, batch=lambda o, t: (float(((o - t) ** 2).sum()), t.numel()))
    mae = Metric("mae", higher_is_better=False, batch=lambda o, t: (float((o - t).abs().sum()), t.numel()))
    return Workload(name="regression", build_model=lambda: nn.Linear(4, 1),
                    build_data=lambda: (TensorDataset(x[:192], y[:192]), TensorDataset(x[192:], y[192:])),
                    loss=nn.functional.mse_loss, metrics=(mse, mae), source="tests:regression",
                    info={"features": 4})


def _cfg(out: Path, **kw: object) -> TrainConfig:
    base = {"strategy": "single", "epochs": 4, "batch_size": 16, "lr": 0.05, "out": str(out), "progress": "none",
            "tensorboard": False, "threads": 1, "warmup_steps": 0}
    return TrainConfig(**{**base, **kw})


def test_a_regression_workload_trains_and_reports_its_metric(tmp_path: Path) -> None:
    s = train(_cfg(tmp_path / "r", target_accuracy=0.5, save_final=True), workload=_regression())
    on_disk = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert on_disk["metric"] == {"name": "mse", "higher_is_better": False, "unit": ""} == s["metric"]
    assert on_disk["workload"] == {"name": "regression", "source": "tests:regression", "label": "regression",
                                   "features": 4}
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all("test_accuracy" not in r and set(r["metrics"]) == {"mse", "mae"} for r in rows)
    assert rows[-1]["test_metric"] == on_disk["final_metric"] < rows[0]["test_metric"]  # it learns
    assert on_disk["final_test_accuracy"] is None
    # lower is better: the target is reached at the first evaluation at or below it
    first = next(r for r in on_disk["eval_curve"] if r["test_metric"] <= 0.5)
    assert on_disk["steps_to_accuracy"] == first["step"] and on_disk["time_to_accuracy_s"] is not None
    # a checkpoint records the workload's source; resuming it as another workload is refused in one line
    with pytest.raises(ConfigError, match="tests:regression"):
        train(_cfg(tmp_path / "r", epochs=5, resume="auto", model="mlp", dataset="digits"))


def test_the_curve_of_a_lower_is_better_metric() -> None:
    c = EvalCurve(2.0, "perplexity", higher_is_better=False)
    for step, value in ((10, 9.0), (20, 2.5), (30, 1.9), (40, 1.5)):
        c.add(step, step / 10, value, step / 40)
    s = c.summary()
    assert s["steps_to_accuracy"] == 30 and all("test_accuracy" not in r for r in s["eval_curve"])


def test_an_accuracy_target_must_be_a_fraction(tmp_path: Path) -> None:
    from dpcompare.data.builtin import builtin
    from dpcompare.training.loop import check_target

    cfg = _cfg(tmp_path, model="mlp", dataset="digits", target_accuracy=95.0)
    with pytest.raises(ConfigError, match="0.95 for 95 %"):
        check_target(cfg, builtin(cfg))
    check_target(cfg, _regression())  # an MSE of 95 is a fine target
