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
    assert {c["strategy"] for c in out["curves"]} == {"ddp", "horovod"} and (runs / "prediction.png").is_file()
    grad_bytes = strategies.profile(runs / "runs" / "ddp-np2-r0").grad_bytes
    for c in out["curves"]:
        steps = c["steps"]
        assert [s["hosts"] for s in steps] == [2**k for k in range(1, 11)]
        for s in steps:  # a step is its compute and its exposed communication; efficiency against one host
            assert s["step_ms"] == pytest.approx(s["compute_ms"] + s["exposed_ms"], abs=1e-3)
            assert s["efficiency"] == pytest.approx(c["one_host_step_ms"] / s["step_ms"], rel=1e-3)
        # the curve crosses 80 % where its efficiencies do, and says so
        below = next(s["hosts"] for s in steps if s["efficiency"] < 0.8)
        assert c["below_threshold_at_hosts"] == below
        line = f"{c['label']}: below 80 % efficiency on 25gbit from {below} hosts"
        assert line in out["below_threshold"] and line.split(": ", 1)[1] in p.stdout
    # DDP's one bucket (all its gradients) as the α-β model's ring all-reduce: 2(n-1) steps of 5 µs latency and
    # 2(n-1)/n of the bytes over 25 Gbit/s, nothing overlapped (the bucket is ready when backward ends)
    ddp = next(c for c in out["curves"] if c["strategy"] == "ddp")["steps"]
    for s in ddp:
        n = s["ranks"]
        ring_ms = 2 * (n - 1) * 5e-3 + 2 * (n - 1) / n * grad_bytes * 8 / 25e9 * 1e3
        assert (s["buckets"], s["wire_bytes"]) == (1, grad_bytes) and s["comm_ms"] == pytest.approx(ring_ms, rel=1e-3)
