"""Seeds as blocks, accuracy verdicts and time to accuracy (issue 15)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats as sps

from dpcompare import cli, knobs, models
from dpcompare.checkpoint import seed_everything
from dpcompare.compare import plan as compare
from dpcompare.config import TrainConfig
from dpcompare.report import render, stats
from dpcompare.training.evaluation import EvalCurve

from conftest import needs_horovod, needs_mpi

# -- seeds ---------------------------------------------------------------------------------------------


def _initial_weights(cfg: TrainConfig) -> torch.Tensor:
    """The flattened initial weights a run with ``cfg`` starts from (what the trainer does before training)."""
    seed_everything(cfg.seed)
    m = models.build_model(cfg.model, (1, 8, 8), 10, width=cfg.width)
    return torch.cat([p.detach().flatten() for p in m.parameters()])


def test_seeds_change_initial_weights_and_every_arm_of_a_block_gets_the_same(tmp_path: Path) -> None:
    a = cli.build_parser().parse_args(["compare", "--seeds", "3", "--seed", "7"])
    seeds = compare.seed_list(a.seeds, 7)
    assert seeds == [7, 8, 9] and compare.seed_list(compare.parse_seeds("5,1"), 7) == [5, 1]
    arms = compare.build_arms([], [compare.Arm("ddp", "ddp"), compare.Arm("fp16", "horovod",
                                                                           (("grad_compression", "fp16"),))])
    weights = {}
    for k in range(3):
        specs = compare.block(arms, [2], k, seeds)
        assert {s.seed for s in specs} == {seeds[k]} and all(s.name.endswith(f"-r{k}-s{seeds[k]}") for s in specs)
        per_arm = [_initial_weights(compare.child_config(TrainConfig(seed=7), s, tmp_path)) for s in specs]
        assert all(torch.equal(per_arm[0], w) for w in per_arm[1:])  # same seed: the same start for every arm
        weights[seeds[k]] = per_arm[0]
    assert not torch.equal(weights[7], weights[8]) and not torch.equal(weights[8], weights[9])


def test_bad_seeds_are_refused() -> None:
    for bad in ("0", "x", "1,1"):
        with pytest.raises(Exception, match="seed"):
            compare.parse_seeds(bad)


# -- time to accuracy bookkeeping ----------------------------------------------------------------------


def test_eval_curve_records_the_first_point_at_or_above_the_target() -> None:
    c = EvalCurve(0.9)
    for step, secs, acc in ((10, 1.0, 0.5), (20, 2.0, 0.89), (30, 3.0, 0.9), (40, 4.0, 0.85), (44, 4.4, 0.95)):
        c.add(step, secs, acc, step / 44)
    c.add(44, 4.4, 0.95, 1.0)  # the epoch's end at an --eval-every point: not a second row
    s = c.summary()
    assert (s["time_to_accuracy_s"], s["steps_to_accuracy"], s["epochs_to_accuracy"]) == (3.0, 30, round(30 / 44, 4))
    assert [r["step"] for r in s["eval_curve"]] == [10, 20, 30, 40, 44]
    never = EvalCurve(0.99)
    never.add(10, 1.0, 0.98, 1.0)
    assert never.summary()["time_to_accuracy_s"] is None and never.summary()["steps_to_accuracy"] is None
    assert EvalCurve().summary()["target_accuracy"] is None


# -- verdict arithmetic --------------------------------------------------------------------------------


def test_paired_difference_interval_is_scipys_student_t() -> None:
    base, other = [0.95, 0.96, 0.94, 0.97], [0.951, 0.957, 0.946, 0.975]
    iv = stats.paired_diff_ci(base, other)
    d = np.subtract(other, base)
    lo, hi = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    assert iv is not None and (iv.mean, iv.lo, iv.hi) == pytest.approx((d.mean(), lo, hi))
    assert stats.paired_diff_ci([0.9, 0.8], [0.91, 0.81]).lo == pytest.approx(0.01)  # type: ignore[union-attr]
    assert stats.decide_difference(stats.Interval(0.001, -0.002, 0.004, 3), 0.005) == "equal"
    assert stats.decide_difference(stats.Interval(0.02, 0.01, 0.03, 3), 0.005) == "higher"
    assert stats.decide_difference(stats.Interval(-0.02, -0.03, -0.01, 3), 0.005) == "lower"
    assert stats.decide_difference(stats.Interval(0.0, -0.03, 0.03, 3), 0.005) == "undecided"


def test_lossy_knobs_decide_exact_equivalence() -> None:
    assert knobs.lossy({"grad_compression": "fp16", "bucket_mb": 4.0, "amp": "none"}) == ["grad_compression"]
    assert knobs.exact_equivalents([{}, {"bucket_mb": 4.0}, {"amp": "none"}])
    for lossy in ({"adasum": True}, {"powersgd_rank": 2}, {"amp": "bf16"}, {"grad_compression": "bf16"}):
        assert not knobs.exact_equivalents([{}, lossy])
    assert not knobs.exact_equivalents([{}, {"batch_size": 64}])  # not a knob: may change the model


def _run(arm: str, repeat: int, seed: int, acc: float, loss: float, tta: float | None, steps: int | None = None,
         strategy: str = "ddp") -> dict[str, Any]:
    return {"arm": arm, "strategy": strategy, "np": 2, "repeat": repeat, "seed": seed, "status": "ok",
            "final_test_accuracy": acc, "final_train_loss": loss, "time_to_accuracy_s": tta,
            "steps_to_accuracy": steps, "samples_per_sec": 1000.0, "global_batch": 64,
            "step_ms": {"median": 64.0, "p95": 70.0}}


def _results(runs: list[dict[str, Any]], arms: list[dict[str, Any]], target: float | None = 0.95) -> dict[str, Any]:
    return {"schema": 2, "config": {"arms": arms, "np": [2], "seeds": [1, 2, 3], "accuracy_equivalence": 0.005,
                                    "equivalence": 0.05, "train": {"target_accuracy": target}}, "runs": runs}


def test_accuracy_and_time_to_accuracy_verdicts() -> None:
    arms = [{"label": "ddp", "strategy": "ddp", "knobs": {}},
            {"label": "fp16", "strategy": "horovod", "knobs": {"grad_compression": "fp16"}}]
    base_acc, other_acc = [0.960, 0.955, 0.962], [0.950, 0.947, 0.950]
    times_b, times_o = [10.0, 12.0, 11.0], [8.0, 9.9, None]
    runs = [r for k, s in enumerate((1, 2, 3)) for r in (
        _run("ddp", k, s, base_acc[k], 0.10, times_b[k], 100),
        _run("fp16", k, s, other_acc[k], 0.12, times_o[k], 90, strategy="horovod"))]
    res = _results(runs, arms)
    acc, tta = stats.accuracy_verdicts(res), stats.time_to_accuracy_verdicts(res)
    (a,) = acc
    d = np.subtract(other_acc, base_acc)
    ci = sps.ttest_1samp(d, 0.0).confidence_interval(0.95)
    assert a.metric == "accuracy" and a.outcome == "lower" and (a.ci_low, a.ci_high) == pytest.approx((ci.low, ci.high))
    j = a.to_json()
    assert j["metric"] == "accuracy" and j["difference"] == pytest.approx(d.mean(), abs=1e-6)
    assert j["exact_by_construction"] is False and j["seeds"] == [1, 2, 3] and "lower by" in j["text"]
    (t,) = tta
    ratios = [8.0 / 10.0, 9.9 / 12.0]  # the third block: fp16 never reached the target
    logs = np.log(ratios)
    lo, hi = np.exp(logs.mean() + np.array([-1, 1]) * sps.t.ppf(0.975, 1) * logs.std(ddof=1) / np.sqrt(2))
    assert t.metric == "time_to_accuracy" and t.blocks == 2 and t.ratio == pytest.approx(np.exp(logs.mean()))
    assert (t.ci_low, t.ci_high) == pytest.approx((lo, hi))
    assert t.to_json()["reached"] == {"ddp": [3, 3], "fp16": [2, 3]}
    assert "1 of 3 runs of fp16 never reached it" in t.text and "start-up and evaluation excluded" in t.text


def test_exact_equivalents_are_zero_by_construction_and_checked() -> None:
    arms = [{"label": "ddp", "strategy": "ddp", "knobs": {}}, {"label": "horovod", "strategy": "horovod", "knobs": {}}]
    same = [r for k, s in enumerate((1, 2, 3)) for r in (_run("ddp", k, s, 0.96 + k / 1000, 0.1, 5.0),
                                                         _run("horovod", k, s, 0.96 + k / 1000, 0.1, 5.5, 40,
                                                              strategy="horovod"))]
    (a,) = stats.accuracy_verdicts(_results(same, arms))
    assert a.outcome == "equal" and "zero by construction" in a.text and a.to_json()["difference"] == 0.0
    same[1]["final_test_accuracy"] += 0.01
    (b,) = stats.accuracy_verdicts(_results(same, arms))
    assert b.outcome == "mismatch" and b.text.startswith("NOT IDENTICAL")
    assert stats.accuracy_verdicts({**_results(same, arms), "config": {"arms": arms, "np": [2]}}) == []  # no --seeds


# -- one real comparison -------------------------------------------------------------------------------


@needs_mpi
@needs_horovod
@pytest.mark.mpi
def test_compare_with_seeds_and_target_accuracy(tmp_path: Path) -> None:
    from conftest import dpcompare

    out = tmp_path / "acc"
    p = dpcompare("compare", "--np", "2", "--strategies", "ddp,horovod", "--seeds", "2", "--target-accuracy", "0.5",
                  "--eval-every", "10", "--model", "convnet", "--dataset", "digits", "--threads", "1",
                  "--warmup-steps", "2", "--min-steps", "0", "--epochs", "1", "--workers", "persistent",
                  "--out", str(out), timeout=500)
    res = json.loads((out / "results.json").read_text())
    assert [(r["arm"], r["seed"], r["status"]) for r in res["runs"]] == [
        ("ddp", 42, "ok"), ("horovod", 42, "ok"), ("horovod", 43, "ok"), ("ddp", 43, "ok")]
    for r in res["runs"]:
        assert r["eval_curve"][0]["step"] == 10 and r["time_to_accuracy_s"] > 0
        assert r["steps_to_accuracy"] in [row["step"] for row in r["eval_curve"]]
    by = {(r["arm"], r["seed"]): r["final_test_accuracy"] for r in res["runs"]}
    assert by[("ddp", 42)] != by[("ddp", 43)]  # another seed, another model
    metrics = {v.get("metric", "throughput"): v for v in res["verdicts"]}
    assert set(metrics) == {"throughput", "accuracy", "time_to_accuracy"}
    assert metrics["accuracy"]["difference"] == 0.0 and metrics["accuracy"]["exact_by_construction"]
    assert metrics["accuracy"]["text"] in p.stdout and metrics["time_to_accuracy"]["text"] in p.stdout
    page = (out / "report.html").read_text()
    assert "Test accuracy and time to the target" in page and "zero by construction" in page
    # the report shows the stored verdicts, and drawing them again from the runs gives the same ones
    shown = render(out, quiet=True).verdicts
    assert [v.split("; ")[0] for v in shown] == [v["text"].split("; ")[0] for v in res["verdicts"]]
    assert render(out, quiet=True, recompute=True).verdicts == shown
    assert (metrics["accuracy"]["outcome"], metrics["time_to_accuracy"]["other"]) == ("equal", "horovod")
