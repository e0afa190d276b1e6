"""Real distributed runs under ``mpirun -np 2`` for ddp and horovod: results, parity, resume, cross-resume."""

import json
import shutil

import pytest
import torch
from _shared_runs import train

from conftest import FAST, ckpt_tensors, dpcompare, load_ckpt, needs_horovod, needs_mpi, summary

pytestmark = [needs_mpi]
HOROVOD = pytest.param("horovod", marks=needs_horovod)

SUMMARY_KEYS = {"strategy", "world_size", "model", "dataset", "epochs", "batch_size", "global_batch_size", "lr",
                "seed", "final_train_loss", "final_test_accuracy", "samples_per_sec", "versions"}





@pytest.fixture(scope="module")
def trained(convnet_np2):
    """The suite's trained convnet (conftest.ConvnetNp2): ddp and horovod, 4 epochs at np=2, checkpoints after
    epochs 2 and 4; the runs below continue it."""
    return convnet_np2


@pytest.mark.parametrize("strategy", ["ddp", HOROVOD])
def test_each_strategy_writes_its_files_and_learns(trained, strategy):
    out = trained(strategy)
    s = summary(out)
    assert set(s) >= SUMMARY_KEYS
    assert (s["strategy"], s["world_size"], s["global_batch_size"], s["launcher"]) == (strategy, 2, 64, "openmpi")
    assert s["final_test_accuracy"] >= 0.95
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4] and rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert s["timing"]["samples_per_sec"] > 0 and len(s["timing"]["per_rank"]) == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch-2.pt", "epoch-4.pt"]
    assert "global 64" in trained.stdout[strategy]  # the global batch is printed


@needs_horovod
def test_same_seed_same_numbers_under_both_strategies(trained):
    """The README claims exact equality (0.0) on CPU: assert exactly that."""
    a, b = summary(trained("ddp")), summary(trained("horovod"))
    assert a["final_train_loss"] == b["final_train_loss"]
    ta, tb = ckpt_tensors(load_ckpt(trained("ddp"), 4)), ckpt_tensors(load_ckpt(trained("horovod"), 4))
    assert ta.keys() == tb.keys()
    assert all(torch.equal(ta[k], tb[k]) for k in ta)


def test_stopped_and_resumed_ends_bit_identical(trained):
    """The whole ddp run's folder as it was when it stopped after epoch 2 (its epoch-2 checkpoint, two metrics
    rows), continued with --resume auto: it ends where the run that never stopped did, bit for bit."""
    out = trained.base / "ddp-stopped"
    shutil.copytree(trained("ddp"), out)
    (out / "checkpoints" / "epoch-4.pt").unlink()
    (out / "summary.json").unlink()
    rows = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text("".join(rows[:2]))
    train(*trained.TRAIN[1:], "--strategy", "ddp", "--resume", "auto", out=out)  # its own command
    assert summary(out)["resumed_from"].endswith("epoch-2.pt")
    ta, tb = ckpt_tensors(load_ckpt(trained("ddp"), 4)), ckpt_tensors(load_ckpt(out, 4))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert [json.loads(x)["epoch"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


@needs_horovod
def test_horovod_resume_is_bit_identical(trained):
    out = trained.base / "hvd-resumed"
    train("--strategy", "horovod", *FAST, "--epochs", "4", "--checkpoint-every", "2", "--resume",
          str(trained("horovod") / "checkpoints" / "epoch-2.pt"), out=out)
    ta, tb = ckpt_tensors(load_ckpt(trained("horovod"), 4)), ckpt_tensors(load_ckpt(out, 4))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.fixture(scope="module")
def ddp_to_horovod_np1(trained):
    out = trained.base / "ddp2-to-hvd1"
    stdout = train("--strategy", "horovod", *FAST, "--epochs", "4", "--save-final", "--resume",
                   str(trained("ddp") / "checkpoints" / "epoch-2.pt"), out=out, np=1)
    return out, stdout


@needs_horovod
def test_ddp_checkpoint_resumes_under_horovod_at_np1(trained, ddp_to_horovod_np1):
    out, stdout = ddp_to_horovod_np1
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    first_ddp = json.loads((trained("ddp") / "metrics.jsonl").read_text().splitlines()[0])
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]  # epochs 1-2 from the checkpoint's history
    assert rows[2]["train_loss"] < first_ddp["train_loss"] / 3  # continues, no fall back to the initial loss
    assert summary(out)["final_test_accuracy"] >= 0.9
    diff_lines = [ln for ln in stdout.splitlines() if "differs from the checkpoint" in ln]
    assert len(diff_lines) == 1
    assert "strategy 'ddp' → 'horovod'" in diff_lines[0] and "world_size 2 → 1" in diff_lines[0]


@needs_horovod
def test_np1_checkpoint_resumes_under_ddp_at_np2(trained, ddp_to_horovod_np1):
    src, _ = ddp_to_horovod_np1
    out = trained.base / "hvd1-to-ddp2"
    stdout = train("--strategy", "ddp", *FAST, "--epochs", "5", "--resume", str(src / "checkpoints" / "epoch-4.pt"),
                   out=out)
    assert "world_size 1 → 2" in stdout
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5] and summary(out)["final_test_accuracy"] >= 0.9


@needs_horovod
def test_parity_command_passes_for_convnet_under_every_strategy(tmp_path):
    """One parity run covers horovod, zero and fsdp against ddp (convnet: BatchNorm buffers included), and the
    one-process reference replays the two processes' batches (halving each one's loss: the same sums as at np=2)
    and each process's BatchNorm statistics, so it matches too. Every run is a job of launch.jobs: its output is
    kept beside its checkpoint."""
    p = dpcompare("parity", "--np", "2", "--strategies", "ddp,horovod,zero,fsdp", *FAST, "--steps", "12",
                  "--out", str(tmp_path / "p"))
    res = json.loads((tmp_path / "p" / "parity.json").read_text())
    assert res["passed"] and set(res["diffs"]) == {"horovod", "zero", "fsdp", "single"}
    assert res["diffs"]["horovod"]["weights_max"] == 0.0 == res["diffs"]["horovod"]["loss_max"]  # exact on CPU
    assert all(res["diffs"][s]["weights_max"] <= 1e-6 for s in ("zero", "fsdp"))
    assert res["diffs"]["single"]["weights_max"] == 0.0 and res["note"] is None  # BatchNorm replayed per process
    assert res["model"]["batchnorm"] and res["config"]["strategy"] == "ddp"
    assert "PASS" in p.stdout and "fc.weight" in p.stdout
    assert all((tmp_path / "p" / s / log).is_file() for s in ("ddp", "horovod", "zero", "fsdp", "single")
               for log in ("stdout.log", "stderr.log"))


def test_parity_fails_with_exit_1_when_a_difference_exceeds_the_tolerance(tmp_path, monkeypatch, capsys):
    """The FAIL path, in-process: the runs are faked (one weight off by 1e-3), the judging is real."""
    from dpcompare.cli import main
    from dpcompare.compare import parity

    def fake_run(cfg, np_, console, lab=None, timeout=None, pool=None):
        w = torch.zeros(3) + (1e-3 if cfg.strategy == "horovod" else 0.0)
        return {"weights": {"fc.weight": w}, "losses": [1.0, 0.5]}

    monkeypatch.setattr(parity, "_run_one", fake_run)
    code = main(["parity", "--np", "2", "--model", "mlp", "--steps", "2", "--no-single", "--out", str(tmp_path / "q")])
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "q" / "parity.json").read_text())
    assert code == 1 and "FAIL" in out and not res["passed"]
    assert res["diffs"]["horovod"]["weights_max"] == pytest.approx(1e-3)


def _job(tmp_path, code):
    """A stand-in for a parity run's job line: this Python running ``code`` (a child of its own too)."""
    import sys

    return lambda np_, words, placement=None: [sys.executable, "-c", code.replace("TMP", str(tmp_path))]


def test_a_failed_parity_run_says_its_last_lines_and_keeps_its_logs(tmp_path, monkeypatch):
    from rich.console import Console

    from dpcompare.compare import parity
    from dpcompare.config import TrainConfig

    monkeypatch.setattr(parity, "dpcompare_command", _job(tmp_path, "import sys; print('started'); "
                        "sys.stderr.write('\\n'.join(f'line {i}' for i in range(30)) + '\\n'); sys.exit(4)"))
    cfg = TrainConfig(strategy="ddp", out=str(tmp_path / "ddp"))
    with pytest.raises(RuntimeError) as e:
        parity._run_one(cfg, 2, Console(quiet=True), None, 60.0)
    msg = str(e.value)
    assert msg.startswith("ddp run failed (exit 4)") and msg.endswith("line 29") and "line 14" not in msg
    assert (tmp_path / "ddp" / "stdout.log").read_text() == "started\n"


def test_a_parity_run_past_its_timeout_is_stopped_with_its_children(tmp_path, monkeypatch):
    """The run (and the process it started, as mpirun starts ranks) ends at --run-timeout, in its own session."""
    import time
    from pathlib import Path

    from rich.console import Console

    from dpcompare.compare import parity
    from dpcompare.config import TrainConfig

    code = ("import subprocess, sys, time, pathlib; c = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(120)']); pathlib.Path('TMP/pids').write_text(f'{c.pid}'); time.sleep(120)")
    monkeypatch.setattr(parity, "dpcompare_command", _job(tmp_path, code))
    cfg = TrainConfig(strategy="horovod", out=str(tmp_path / "hvd"))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="took longer than --run-timeout 5 s and was stopped"):
        parity._run_one(cfg, 2, Console(quiet=True), None, 5.0)
    assert time.monotonic() - t0 < 30 and (tmp_path / "hvd" / "stderr.log").is_file()
    stat = Path(f"/proc/{(tmp_path / 'pids').read_text()}/stat")
    assert not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z", "the run's child outlived it"


def test_parity_refuses_to_overwrite(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "parity.json").write_text("{}")
    p = dpcompare("parity", "--np", "2", *FAST, "--steps", "5", "--out", str(tmp_path / "p"), check=False)
    assert p.returncode == 2 and "--overwrite" in p.stderr


def test_torchrun_launch_gives_the_same_numbers(trained, tmp_path):
    from conftest import BIN, mpi_env, run

    out = tmp_path / "tr"
    run([str(BIN / "torchrun"), "--nproc-per-node", "2", "-m", "dpcompare", "train", "--strategy", "ddp", *FAST,
         "--epochs", "1", "--out", str(out)], env=mpi_env())
    s = summary(out)
    assert (s["launcher"], s["world_size"]) == ("torchrun", 2)
    first = json.loads((trained("ddp") / "metrics.jsonl").read_text().splitlines()[0])
    assert s["final_train_loss"] == pytest.approx(first["train_loss"], abs=1e-6)
