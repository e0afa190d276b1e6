"""``dpcompare predict`` on real traced runs: np=2 ddp and horovod, a tiny mlp (mpirun)."""

from __future__ import annotations

import json

import pytest

from dpcompare import trace as tr
from dpcompare.prediction import strategies
from dpcompare.report.timeline import load_trace

from conftest import dpcompare, needs_horovod, needs_mpi, summary

TINY = ("--model", "mlp", "--width", "256", "--dataset", "digits", "--no-tensorboard", "--threads", "1",
        "--warmup-steps", "2", "--epochs", "0", "--max-steps", "6", "--trace", "4")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("predict")
    for strategy in ("ddp", "horovod"):
        dpcompare("train", "--strategy", strategy, *TINY, "--out", str(base / "runs" / f"{strategy}-np2-r0"), np=2)
    return base


@needs_mpi
@needs_horovod
def test_ticks_carry_bytes_and_the_ddp_bucket_model_matches_the_trace(runs):
    ddp = runs / "runs" / "ddp-np2-r0"
    events = load_trace(ddp)["traceEvents"]
    assert any(e.get("name") == "model_buffers" and e["args"]["bytes"] == 0 for e in events)  # an mlp has none
    p = strategies.profile(ddp)
    assert p.grad_bytes == pytest.approx(summary(ddp)["memory"]["params_mb"] * 2**20, rel=1e-6) and not p.notes
    assert p.backward > 0 and p.compute < tr.communication_figures(events)["step_ms"] / 1e3 * 1.5
    # the schedule's buckets are the ones DDP built (bucket_cap_mb as dpcompare passes it)
    from dpcompare.prediction.schedule import Knobs

    buckets = strategies.schedule("ddp")(p, Knobs()).buckets()
    traced = {tuple(e["args"]["tensors"]) for e in events if e.get("cat") == tr.CAT_COMM}
    assert {tuple(g.name for g in b) for b in buckets} == traced


@needs_mpi
@needs_horovod
def test_predict_both_strategies_from_a_compare_folder(runs):
    p = dpcompare("predict", str(runs), "--hosts", "2,4,...,1024", "--link", "25gbit")
    out = json.loads((runs / "prediction.json").read_text())
    assert {c["strategy"] for c in out["curves"]} == {"ddp", "horovod"}
    for c in out["curves"]:
        eff = [s["efficiency"] for s in c["steps"]]
        assert len(eff) == 10 and eff[-1] < eff[0] <= 1.0
    assert "below 80 % efficiency" in p.stdout and (runs / "prediction.png").is_file()
