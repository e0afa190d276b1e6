"""zero (ZeRO-1) and fsdp (FSDP2) under ``mpirun``: equal to ddp, plain checkpoints both ways, memory per rank.

One module fixture trains each configuration once, the first time a test asks for it.
"""

import json

import pytest
import torch
from _shared_runs import train

from conftest import ckpt_tensors, load_ckpt, needs_horovod, needs_mpi, summary

pytestmark = [needs_mpi]

# A 64→64→64→10 MLP on digits with Adam: its two 64×64 layers let ZeRO split the optimizer state evenly.
MLP = ("--model", "mlp", "--width", "64", "--dataset", "digits", "--optimizer", "adam", "--lr", "0.005",
       "--no-tensorboard", "--threads", "1", "--warmup-steps", "2")





def _epochs(out):
    return [json.loads(x)["epoch"] for x in (out / "metrics.jsonl").read_text().splitlines()]


class Runs:
    """name → output folder; each run is trained once, when a test first needs it."""

    def __init__(self, base):
        self.base = base
        self.stdout: dict[str, str] = {}

    def __call__(self, name: str, *args: str, np: int = 2):
        out = self.base / name
        if name not in self.stdout:
            self.stdout[name] = train(*MLP, *args, out=out, np=np)  # one job per process count for them all
        return out

    def np2(self, strategy: str):
        return self(strategy, "--strategy", strategy, "--epochs", "2", "--checkpoint-every", "1")

    def resumed(self, strategy: str, source: str):
        """``strategy`` at np=1 continuing from epoch 1 of ``source``'s np=2 run."""
        ckpt = self.np2(source) / "checkpoints" / "epoch-1.pt"
        return self(f"{source}2-to-{strategy}1", "--strategy", strategy, "--epochs", "2", "--save-final",
                    "--resume", str(ckpt), np=1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("sharded"))


@pytest.mark.parametrize("strategy", ["zero", "fsdp"])
def test_trains_at_np2_equal_to_ddp_with_plain_checkpoints(runs, strategy):
    ref, out = load_ckpt(runs.np2("ddp"), 2), load_ckpt(runs.np2(strategy), 2)
    s = summary(runs.np2(strategy))
    assert (s["strategy"], s["world_size"]) == (strategy, 2) and s["final_test_accuracy"] >= 0.85
    assert _epochs(runs.np2(strategy)) == [1, 2]
    # The plain torch.optim layout: parameter ids 0..n-1, the same keys, shapes and values as ddp's.
    n = len(ref["model"])
    assert sorted(out["optimizer"]["state"]) == list(range(n))
    assert [g["params"] for g in out["optimizer"]["param_groups"]] == [list(range(n))]
    assert set(out["optimizer"]["param_groups"][0]) == set(ref["optimizer"]["param_groups"][0])
    ta, tb = ckpt_tensors(ref), ckpt_tensors(out)
    assert ta.keys() == tb.keys()
    assert all(type(tb[k]) is torch.Tensor and tb[k].shape == ta[k].shape for k in ta)  # no DTensor shards
    assert max(float((ta[k].double() - tb[k].double()).abs().max()) for k in ta) <= 1e-6


def test_memory_per_rank_is_shared_out(runs):
    mem = {s: summary(runs.np2(s))["memory"] for s in ("ddp", "zero", "fsdp")}
    for m in mem.values():
        assert len(m["per_rank"]) == 2 and all(r["peak_rss_mb"] > 0 for r in m["per_rank"])
    ddp = mem["ddp"]["per_rank"][0]
    assert ddp["params_bytes"] == ddp["grads_bytes"] > 0 and ddp["optimizer_state_bytes"] >= 2 * ddp["params_bytes"]
    zero = mem["zero"]["per_rank"]
    # ZeRO-1: replicated parameters and gradients, each parameter's optimizer state on exactly one rank.
    assert all(r["params_bytes"] == ddp["params_bytes"] for r in zero)
    assert sum(r["optimizer_state_bytes"] for r in zero) == ddp["optimizer_state_bytes"]
    assert max(r["optimizer_state_bytes"] for r in zero) <= 0.6 * ddp["optimizer_state_bytes"]
    # FSDP: parameters, gradients and optimizer state all about halved (shards padded to equal rows).
    for r in mem["fsdp"]["per_rank"]:
        assert 0.45 * ddp["total_bytes"] <= r["total_bytes"] <= 0.55 * ddp["total_bytes"]
    assert mem["fsdp"]["total_mb"] == pytest.approx(max(r["total_bytes"] for r in mem["fsdp"]["per_rank"]) / 2**20)


@pytest.mark.parametrize(("strategy", "source"), [
    ("zero", "ddp"), ("fsdp", "zero"), pytest.param("horovod", "fsdp", marks=needs_horovod)])
def test_cross_resume_at_another_world_size(runs, strategy, source):
    """Every np=2 run's epoch 1 is the same state, so each np=1 continuation must end identically."""
    out = runs.resumed(strategy, source)
    assert _epochs(out) == [1, 2]
    assert f"written by {source} at np=2" in runs.stdout[out.name]
    ref = ckpt_tensors(load_ckpt(runs.resumed("zero", "ddp"), 2))
    got = ckpt_tensors(load_ckpt(out, 2))
    assert ref.keys() == got.keys()
    assert max(float((ref[k].double() - got[k].double()).abs().max()) for k in ref) <= 1e-6
    # ... and it really continued: not equal to the np=2 run's epoch 1 any more.
    assert not torch.equal(ref["model.net.1.weight"], load_ckpt(runs.np2(source), 1)["model"]["net.1.weight"])


def test_compare_record_and_table_carry_memory():
    from rich.console import Console

    from dpcompare.compare.plan import RunSpec
    from dpcompare.compare.records import run_record
    from dpcompare.report.stats import aggregate
    from dpcompare.report.table import build_table

    def rec(strategy, total):
        mem = {"params_mb": 1.0, "grads_mb": 1.0, "optimizer_state_mb": 2.0, "total_mb": total, "peak_rss_mb": 9.0,
               "per_rank": [{"rank": 0, "params_bytes": 2**20, "grads_bytes": 2**20, "optimizer_state_bytes": 2**21,
                             "total_bytes": int(total * 2**20), "peak_rss_mb": 9.0}]}
        s = {"timing": {"samples_per_sec": 10.0, "measured_steps": 3}, "memory": mem}
        return run_record(RunSpec(strategy, 2, 0), f"runs/{strategy}", 0, 1.0, s, [], "")

    runs = [rec("ddp", 4.0), rec("fsdp", 2.0)]
    assert runs[1]["memory_mb"]["total"] == 2.0 and runs[1]["memory_mb"]["per_rank"][0]["optimizer_state"] == 2.0
    groups = aggregate({"config": {"strategies": ["ddp", "fsdp"], "np": [2]}, "runs": runs})
    assert [g.memory_mb["total"] for g in groups] == [4.0, 2.0]
    console = Console(width=250, record=True)
    console.print(build_table(groups))
    text = console.export_text()
    assert "opt state" in text and "4.00" in text and "2.00" in text
