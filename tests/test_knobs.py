"""The communication knobs: refusals (in-process and at np=2), and at np=2 under both strategies that each
knob takes effect (hook/compressor installed, wire dtype, bucket count, all-reduces per micro-batch), that
accumulation is exact between ddp and horovod, and that a checkpoint crosses strategies and knobs."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dpcompare import backends, knobs
from dpcompare.config import TrainConfig
from dpcompare.errors import ConfigError

from conftest import dpcompare, needs_horovod, needs_mpi, summary

MLP = ("--model", "mlp", "--dataset", "digits", "--trackers", "none", "--threads", "1", "--warmup-steps", "1",
       "--epochs", "0", "--progress", "none", "--count-allreduces")
MLP_TENSORS = 6  # three Linear layers: weight and bias each


def _cfg(**kw: object) -> TrainConfig:
    return TrainConfig(**kw)  # type: ignore[arg-type]


# -- in-process: the table and the refusals -------------------------------------------------------------

def test_every_knob_is_in_the_table_and_honoured_by_someone():
    assert set(knobs.names()) == set(knobs.TABLE)
    for k in knobs.names():
        assert any(k in backends.get(s).knobs for s in backends.names()), k


@pytest.mark.parametrize("strategy, knob, who", [
    ("ddp", {"adasum": True}, "--strategy horovod"),
    ("ddp", {"horovod_cycle_ms": 3.0}, "--strategy horovod"),
    ("ddp", {"horovod_ops": "mpi"}, "--strategy horovod"),
    ("zero", {"mpi_allreduce": "recursive-doubling"}, "--strategy horovod"),
    ("horovod", {"powersgd_rank": 2}, "--strategy ddp"),
    ("horovod", {"static_graph": True}, "--strategy ddp"),
    ("single", {"grad_compression": "fp16"}, "--strategy ddp or --strategy horovod or --strategy zero"),
    ("single", {"bucket_mb": 4.0}, "--strategy ddp or --strategy horovod or --strategy zero"),
    ("fsdp", {"grad_compression": "fp16"}, "--strategy ddp or --strategy horovod or --strategy zero"),
])
def test_a_knob_a_strategy_cannot_honour_is_refused_naming_who_can(strategy, knob, who):
    with pytest.raises(ConfigError) as e:
        backends.check_config(strategy, _cfg(strategy=strategy, **knob), 2)
    assert who in str(e.value) and "\n" not in str(e.value)


def test_values_a_strategy_cannot_take_are_refused(monkeypatch):
    hvd_cls, ddp_cls = backends.get("horovod"), backends.get("ddp")
    with pytest.raises(ConfigError, match="power-of-two.*not 3; use -np 2 or 4"):
        hvd_cls.check_config(_cfg(strategy="horovod", adasum=True), 3)
    hvd_cls.check_config(_cfg(strategy="horovod", adasum=True), 4)
    for k in ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_CONTROLLER"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ConfigError, match="horovodrun --gloo"):
        hvd_cls.check_config(_cfg(strategy="horovod", horovod_ops="gloo"), 2)
    hvd_cls.check_config(_cfg(strategy="horovod", mpi_allreduce="ring"), 2)
    monkeypatch.setenv("HOROVOD_CONTROLLER", "gloo")
    hvd_cls.check_config(_cfg(strategy="horovod", horovod_ops="gloo"), 2)
    with pytest.raises(ConfigError, match="--mpi-allreduce ring chooses Open MPI's all-reduce, but this run's "
                                          "all-reduces go through gloo: launch with mpirun"):
        hvd_cls.check_config(_cfg(strategy="horovod", mpi_allreduce="ring"), 2)
    with pytest.raises(ConfigError, match="choose one"):
        ddp_cls.check_config(_cfg(strategy="ddp", powersgd_rank=1, grad_compression="fp16"), 2)


def test_amp_is_checked_against_what_torch_can_autocast(monkeypatch):
    knobs.check_amp("bf16", "cpu")  # torch 2.x autocasts bf16 (and, since 2.x, fp16) on CPU
    monkeypatch.setattr(torch.amp.autocast_mode, "is_autocast_available", lambda device_type: False)
    with pytest.raises(ConfigError, match="cannot autocast to fp16 on cpu; try --amp bf16"):
        knobs.check_amp("fp16", "cpu")


@pytest.mark.parametrize("compression, wire, hook", [("none", torch.float32, "allreduce_hook"),
                                                     ("fp16", torch.float16, "fp16_compress_hook"),
                                                     ("bf16", torch.bfloat16, "bf16_compress_hook")])
def test_ddp_compression_hook_sends_the_wire_dtype(tmp_path, monkeypatch, compression, wire, hook):
    """One in-process gloo member: the gradient that reaches the all-reduce has the compressed dtype."""
    sent: list[torch.dtype] = []
    real = dist.all_reduce

    def spy(t, *a, **kw):
        sent.append(t.dtype)
        return real(t, *a, **kw)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        monkeypatch.setattr(dist, "all_reduce", spy)
        strategy = backends.get("ddp")()
        strategy.configure(_cfg(strategy="ddp", grad_compression=compression, count_allreduces=True))
        model = strategy.wrap_model(nn.Linear(8, 3))
        model(torch.randn(4, 8)).sum().backward()
        grad = model.module.weight.grad
    finally:
        dist.destroy_process_group()
    report = strategy.comm_report()
    assert report["comm_hook"].endswith(hook) and report["wire_dtype"] == str(wire).removeprefix("torch.")
    assert report["grad_allreduces"] == 1 and report["grad_allreduce_elements"] == 8 * 3 + 3
    assert sent == [wire] and grad.dtype == torch.float32


@needs_horovod
def test_horovod_bf16_compressor_casts_and_restores():
    from dpcompare.backends.horovod import bf16_compressor

    c = bf16_compressor()
    x = torch.tensor([1.0, 1 + 2**-10, -3.5])
    sent, ctx = c.compress(x)
    assert sent.dtype == torch.bfloat16
    back = c.decompress(sent, ctx)
    assert back.dtype == torch.float32 and back[1] == 1.0  # rounded on the wire
    i = torch.arange(3)
    assert c.decompress(*c.compress(i)).dtype == torch.int64  # integers untouched


# -- np=2: refusals, each knob taking effect, accumulation parity, checkpoints across knobs -----------------

@needs_mpi
@pytest.mark.parametrize("strategy, flags, who", [
    ("ddp", ("--adasum",), "only --strategy horovod can"),
    pytest.param("horovod", ("--powersgd-rank", "2"), "only --strategy ddp or --strategy zero can",
                 marks=needs_horovod)])
def test_refused_in_one_line_exit_2_under_mpirun(tmp_path, strategy, flags, who):
    p = dpcompare("train", "--strategy", strategy, *flags, "--out", str(tmp_path / "x"), np=2, check=False)
    assert p.returncode == 2
    lines = [x for x in p.stderr.splitlines() if "dpcompare train: error:" in x]
    assert len(lines) == 1 and who in lines[0], p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def ddp_fp16(tmp_path_factory):
    """ddp with fp16 compression, small buckets, static graph and bf16 autocast; keeps a final checkpoint."""
    out = tmp_path_factory.mktemp("knobs") / "ddp-fp16"
    dpcompare("train", "--strategy", "ddp", *MLP, "--max-steps", "4", "--grad-compression", "fp16",
              "--bucket-mb", "0.05", "--static-graph", "--amp", "bf16", "--save-final", "--out", str(out), np=2)
    return out


@needs_mpi
def test_ddp_knobs_take_effect(ddp_fp16):
    s = summary(ddp_fp16)
    c = s["comm"]
    assert c["library"] == "gloo"
    assert (c["comm_hook"], c["wire_dtype"], c["bucket_cap_mb"], c["static_graph"]) == (
        "fp16_compress_hook", "float16", 0.05, True)
    n_params = sum(t.numel() for t in torch.load(ddp_fp16 / "checkpoints" / "epoch-1.pt",
                                                 weights_only=True)["model"].values())
    assert c["grad_allreduce_elements"] == n_params * c["optimizer_steps"]  # every gradient, once per step
    # 0.05 MB buckets: several per step once DDP rebuilds them after step 1 (25 MB: one for this mlp)
    assert c["grad_allreduces"] >= 1 + 2 * (c["optimizer_steps"] - 1)
    assert s["knobs"] == {"grad_compression": "fp16", "bucket_mb": 0.05, "static_graph": True, "amp": "bf16"}


@needs_mpi
@needs_horovod
def test_fp16_ddp_checkpoint_resumes_under_horovod_with_accumulation_and_knobs_take_effect(ddp_fp16, tmp_path):
    out = tmp_path / "hvd"
    # 11 steps of 2 micro-batches per epoch: the checkpoint ends epoch 1, so epoch 2 runs steps 5-12
    p = dpcompare("train", "--strategy", "horovod", *MLP, "--max-steps", "12", "--resume",
                  str(ddp_fp16 / "checkpoints" / "epoch-1.pt"), "--accumulate", "2", "--grad-compression", "fp16",
                  "--bucket-mb", "0.05", "--horovod-cycle-ms", "2", "--horovod-ops", "mpi", "--mpi-allreduce",
                  "recursive-doubling", "--amp", "fp16",
                  "--progress", "lines", "--out", str(out), np=2)
    changed = [x for x in p.stdout.splitlines() if "differs from the checkpoint's run" in x]
    assert len(changed) == 1
    for k in ("strategy 'ddp' → 'horovod'", "accumulate 1 → 2", "amp 'bf16' → 'fp16'", "static_graph True → False"):
        assert k in changed[0], changed[0]
    s = summary(out)
    assert (
        s["steps"] == 12
        and s["comm"]["optimizer_steps"] == 8
        and s["global_batch_size"] == 32 * 2 * 2
        and "global 128" in p.stdout
    )
    c = s["comm"]
    assert (c["compression"], c["wire_dtype"], c["backward_passes_per_step"], c["op"]) == (
        "FP16Compressor", "float16", 2, "Average")
    assert (c["HOROVOD_FUSION_THRESHOLD"], c["HOROVOD_CYCLE_TIME"], c["HOROVOD_CPU_OPERATIONS"]) == (
        str(int(0.05 * 1024 * 1024)), "2", "mpi")
    # Open MPI's MCA settings for recursive doubling, in the environment before hvd.init() (MPI_Init reads them)
    assert (c["library"], c["OMPI_MCA_coll_tuned_use_dynamic_rules"], c["OMPI_MCA_coll_tuned_allreduce_algorithm"]) == (
        "mpi", "1", "3")
    # one all-reduce per tensor per optimizer step, i.e. per 2 micro-batches
    assert c["micro_batches"] == 2 * c["optimizer_steps"] and c["grad_allreduces"] == MLP_TENSORS * c["optimizer_steps"]


@needs_mpi
def test_powersgd_hook_installed(tmp_path):
    out = tmp_path / "psgd"
    dpcompare("train", "--strategy", "ddp", *MLP, "--max-steps", "3", "--powersgd-rank", "1", "--out", str(out), np=2)
    c = summary(out)["comm"]
    assert (c["comm_hook"], c["powersgd_rank"]) == ("powerSGD_hook", 1) and c["grad_allreduces"] == 3


@needs_mpi
@needs_horovod
def test_adasum_op_installed(tmp_path):
    out = tmp_path / "adasum"
    dpcompare("train", "--strategy", "horovod", *MLP, "--max-steps", "3", "--adasum", "--out", str(out), np=2)
    c = summary(out)["comm"]
    assert c["op"] == "Adasum" and c["grad_allreduces"] == 3 * MLP_TENSORS


@needs_mpi
@needs_horovod
def test_accumulation_is_exact_between_ddp_and_horovod_and_all_reduces_drop(tmp_path):
    out = tmp_path / "parity"
    p = dpcompare("parity", "--np", "2", "--model", "mlp", "--threads", "1", "--accumulate", "2", "--steps", "5",
                  "--no-single", "--count-allreduces", "--out", str(out), check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads((out / "parity.json").read_text())
    assert r["passed"] and r["mode"] == "exact" and r["knobs"] == {"accumulate": 2}
    assert r["diffs"]["horovod"]["weights_max"] <= 1e-6 and r["diffs"]["horovod"]["loss_max"] <= 1e-6
    for strategy, per_step in (("ddp", 1), ("horovod", MLP_TENSORS)):  # ddp: this mlp fits one 25 MB bucket
        c = summary(out / strategy)["comm"]
        assert c["micro_batches"] == 2 * c["optimizer_steps"] == 10
        assert c["grad_allreduces"] == per_step * c["optimizer_steps"]  # half as many per micro-batch


def test_parity_judges_knobs():
    from dpcompare.compare.parity import judge

    assert judge(_cfg(accumulate=4))[:2] == ("exact", 0.0)
    mode, tol, note = judge(_cfg(grad_compression="fp16"))
    assert mode == "lossy" and tol == knobs.COMPRESSION_TOLERANCE["fp16"] and "tolerance" in note
    assert "prescale" in note  # says how the two compress differently
    assert judge(_cfg(adasum=True))[0] == judge(_cfg(powersgd_rank=1))[0] == "distance"
    assert "not meant to match" in judge(dataclasses.replace(_cfg(), adasum=True))[2]
