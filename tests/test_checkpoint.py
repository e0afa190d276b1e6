"""Checkpoint format, atomic writes, refusals and --init-from (one process)."""

import argparse
import json
import shutil

import pytest
import torch

from dpcompare import checkpoint
from dpcompare.errors import CheckpointError

from conftest import FAST, dpcompare, summary


def test_atomic_save_never_leaves_a_half_file(tmp_path):
    path = tmp_path / "c" / "epoch-1.pt"
    checkpoint.atomic_save({"a": torch.ones(3)}, path)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        checkpoint.atomic_save({"a": torch.zeros(3), "b": Boom()}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))  # the old file, whole
    assert [p.name for p in path.parent.iterdir()] == ["epoch-1.pt"]  # no temporary left


def test_latest_checkpoint_sorts_numerically(tmp_path):
    for n in (2, 10, 9):
        checkpoint.atomic_save({}, checkpoint.checkpoint_path(tmp_path, n))
    assert checkpoint.latest_checkpoint(tmp_path).name == "epoch-10.pt"


def test_rng_state_round_trips_through_weights_only(tmp_path):
    torch.manual_seed(1)
    state = checkpoint.rng_state()
    checkpoint.atomic_save(state, tmp_path / "r.pt")
    a = torch.rand(3)
    checkpoint.set_rng_state(torch.load(tmp_path / "r.pt", weights_only=True))
    assert torch.equal(torch.rand(3), a)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A one-process run with a checkpoint after each of 2 epochs."""
    out = tmp_path_factory.mktemp("ck") / "run"
    dpcompare("train", "--strategy", "single", *FAST, "--epochs", "2", "--checkpoint-every", "1", "--out", str(out))
    return out


def test_checkpoint_contents_load_with_weights_only(trained):
    ck = torch.load(trained / "checkpoints" / "epoch-2.pt", weights_only=True)
    assert ck["format"] == checkpoint.FORMAT and ck["epoch"] == 2 and ck["strategy"] == "single"
    assert ck["world_size"] == 1 and ck["global_step"] == 2 * (1437 // 32)
    assert not any(k.startswith("module.") for k in ck["model"])
    assert ck["optimizer"]["state"] and ck["sampler"]["seed"] == 42 and ck["config"]["model"] == "convnet"
    assert {"torch", "python", "numpy"} <= set(ck["rng"]) and ck["versions"]["torch"]


def _refused(out_dir, ckpt, *extra):
    p = dpcompare("train", "--strategy", "single", *FAST, "--epochs", "3", "--resume", str(ckpt),
                  "--out", str(out_dir), *extra, check=False)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    return p.stderr


def test_truncated_checkpoint_is_refused_and_nothing_is_overwritten(trained, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes((trained / "checkpoints" / "epoch-2.pt").read_bytes()[:5000])
    before = (trained / "metrics.jsonl").read_text()
    assert "truncated or corrupt" in _refused(trained, bad)
    assert (trained / "metrics.jsonl").read_text() == before
    assert sorted(p.name for p in (trained / "checkpoints").iterdir()) == ["epoch-1.pt", "epoch-2.pt"]


def test_pickled_object_is_refused(trained, tmp_path):
    evil = tmp_path / "evil.pt"
    ck = torch.load(trained / "checkpoints" / "epoch-2.pt", weights_only=True)
    ck["payload"] = argparse.Namespace(cmd="rm -rf /")  # an arbitrary class: weights_only must refuse it
    torch.save(ck, evil)
    err = _refused(trained, evil).strip()
    # dpcompare's own sentence, naming the class torch refused and what to do (torch's would name neither so)
    assert f"checkpoint {evil} holds pickled objects that torch.load(weights_only=True) refuses (" in err
    assert "argparse.Namespace" in err and err.endswith("; re-save it with plain tensors and containers only")


def test_checkpoint_of_another_model_is_refused(trained):
    err = _refused(trained, trained / "checkpoints" / "epoch-2.pt", "--model", "mlp")
    assert "another model" in err


def test_resume_auto_continues_and_keeps_history(trained, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(trained, out)
    dpcompare("train", "--strategy", "single", *FAST, "--epochs", "3", "--resume", "auto", "--out", str(out))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert summary(out)["resumed_from"].endswith("epoch-2.pt")


@pytest.mark.parametrize("prefixed", [True, False])
def test_init_from_plain_and_ddp_state_dicts(trained, tmp_path, prefixed):
    sd = torch.load(trained / "checkpoints" / "epoch-2.pt", weights_only=True)["model"]
    if prefixed:  # what a hand-written DDP script saves: model.state_dict() of the DDP wrapper
        sd = {f"module.{k}": v for k, v in sd.items()}
    torch.save(sd, tmp_path / "w.pt")
    out = tmp_path / "init"
    dpcompare("train", "--strategy", "single", *FAST, "--epochs", "1", "--lr", "1e-12", "--save-final", "--init-from",
              str(tmp_path / "w.pt"), "--out", str(out))
    final = torch.load(out / "checkpoints" / "epoch-1.pt", weights_only=True)["model"]
    source = torch.load(trained / "checkpoints" / "epoch-2.pt", weights_only=True)["model"]
    # lr 1e-12 (it must be > 0): the loaded weights, practically untouched
    assert torch.allclose(final["fc.weight"], source["fc.weight"], rtol=0, atol=1e-8)
    assert summary(out)["final_train_loss"] < 0.5  # a trained network, not a random one (~2.3)


def test_load_model_weights_rejects_non_state_dicts(tmp_path):
    torch.save([1, 2], tmp_path / "x.pt")
    with pytest.raises(CheckpointError, match="no state_dict"):
        checkpoint.load_model_weights(tmp_path / "x.pt")
