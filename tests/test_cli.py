"""The command line: one-line errors with exit code 2, --help, doctor."""

import json

import pytest

from conftest import DPCOMPARE, FAST, dpcompare, run


@pytest.mark.parametrize("args, words", [
    (["train", "--strategy", "nope"], "invalid choice: 'nope'"),
    (["train", "--model", "nope"], "invalid choice: 'nope'"),
    (["train", "--dataset", "mnist"], "MNIST/raw/{train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                                      "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte} under --data-dir DIR (none given)"),
    (["train", "--dataset", "mnist", "--data-dir", "/nonexistent"],
     "under --data-dir /nonexistent (no such folder); missing train-images-idx3-ubyte"),
    (["train", "--batch-size", "0"], "at least 1"),
    (["train", "--input-shape", "a,b"], "not a shape"),
    (["nope"], "invalid choice"),
    (["parity", "--strategies", "ddp,nope"], "unknown strategy nope"),
    (["parity", "--strategies", "single"], "needs a distributed strategy"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    p = run([DPCOMPARE, *args, "--out", str(tmp_path / "o")] if args[0] == "train" else [DPCOMPARE, *args],
            check=False, cwd=tmp_path)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert words in lines[0] and "Traceback" not in p.stderr
    assert not (tmp_path / "o" / "summary.json").exists()


def test_help_explains_strategies_and_batch():
    out = run([DPCOMPARE, "train", "--help"]).stdout
    for words in ("ddp", "horovod", "single", "PER PROCESS", "mpirun -np 2", "--resume"):
        assert words in out


def test_doctor_reports_the_build(tmp_path):
    info = json.loads(run([DPCOMPARE, "doctor", "--json"]).stdout)
    assert info["torch_distributed"]["gloo"] is True
    assert set(info["strategies"]) >= {"ddp", "horovod", "single"} and "mpi" in info
    hvd = info["strategies"]["horovod"]
    assert hvd["controllers"]["MPI"] is True if hvd["installed"] else "make setup" in hvd["error"]
    assert run([DPCOMPARE, "doctor"]).returncode == 0


def test_single_trains_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "run"
    dpcompare("train", "--strategy", "single", *FAST, "--epochs", "1", "--out", str(out))
    before = (out / "metrics.jsonl").read_text()
    p = dpcompare("train", "--strategy", "single", *FAST, "--epochs", "1", "--out", str(out), check=False)
    assert p.returncode == 2 and "already holds a run" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert (out / "metrics.jsonl").read_text() == before
    rows = [json.loads(x) for x in before.splitlines()]
    assert set(rows[0]) >= {"epoch", "train_loss", "test_accuracy", "samples_per_sec", "epoch_seconds"}


def test_sync_bn_on_cpu_says_it_needs_a_gpu(tmp_path):
    p = dpcompare("train", "--strategy", "ddp", *FAST, "--epochs", "1", "--sync-bn", "--device", "cpu",
                  "--out", str(tmp_path / "o"), np=1, check=False)
    assert p.returncode != 0 and "GPUs only" in p.stderr and "Traceback" not in p.stderr
