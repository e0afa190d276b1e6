"""A diverging run stops on every rank with exit code 3; checkpoints are pruned to --keep-last; stale
temporary files of killed writes are removed when a run starts in OUT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpcompare import checkpoint
from dpcompare.compare import records as compare
from dpcompare.files import remove_stale_temporaries

from conftest import dpcompare, needs_mpi

# A learning rate of a million sends mlp's loss to inf/NaN within a few steps (--lr nan is refused at parse).
DIVERGE = ("--model", "mlp", "--width", "16", "--dataset", "digits", "--lr", "1e6", "--trackers", "none",
           "--threads", "1", "--warmup-steps", "0")


def test_prune_keeps_newest_multiples_and_the_given(tmp_path: Path) -> None:
    for e in range(1, 8):
        checkpoint.checkpoint_path(tmp_path, e).parent.mkdir(exist_ok=True)
        checkpoint.checkpoint_path(tmp_path, e).write_bytes(b"x")
    deleted = checkpoint.prune_checkpoints(tmp_path, 2, keep_every=3, keep=(checkpoint.checkpoint_path(tmp_path, 1),))
    assert sorted(p.name for p in deleted) == ["epoch-2.pt", "epoch-4.pt", "epoch-5.pt"]
    assert [e for e, _ in checkpoint.list_checkpoints(tmp_path)] == [1, 3, 6, 7]
    assert checkpoint.prune_checkpoints(tmp_path, 0) == []  # 0 keeps all


def test_stale_temporaries_removed_live_ones_kept(tmp_path: Path) -> None:
    import os

    dead, live = tmp_path / ".epoch-3.pt.tmp-999999999", tmp_path / f".epoch-4.pt.tmp-{os.getppid()}"
    dead.write_bytes(b"half")
    live.write_bytes(b"being written")
    assert remove_stale_temporaries(tmp_path) == [dead] and live.exists()


def test_run_keeps_last_n_and_removes_leftovers(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / ".epoch-1.pt.tmp-999999999").write_bytes(b"killed write")
    dpcompare("train", "--strategy", "single", "--model", "mlp", "--width", "16", "--dataset", "digits",
              "--trackers", "none", "--threads", "1", "--epochs", "5", "--checkpoint-every", "1", "--keep-last", "2",
              "--keep-every", "2", "--resume", "auto", "--out", str(out))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch-2.pt", "epoch-4.pt", "epoch-5.pt"]


def test_diverging_run_exits_3_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "div"
    p = dpcompare("train", "--strategy", "single", *DIVERGE, "--epochs", "3", "--checkpoint-every", "1",
                  "--out", str(out), check=False)
    assert p.returncode == 3, p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert line.startswith("dpcompare train: error: training diverged at step ") and "under single" in line
    assert "no checkpoint was written" in line or "last good checkpoint" in line
    bad = dpcompare("train", "--lr", "-1", "--out", str(tmp_path / "neg"), check=False)
    assert bad.returncode == 2 and "--lr" in bad.stderr


@needs_mpi
@pytest.mark.parametrize("strategy", ["ddp", pytest.param("horovod", marks=pytest.mark.horovod)])
def test_every_rank_stops_at_the_same_step(tmp_path: Path, strategy: str) -> None:
    p = dpcompare("train", "--strategy", strategy, *DIVERGE, "--epochs", "3", "--out", str(tmp_path / "d"), np=2,
                  check=False)
    assert p.returncode == 3, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if "diverged" in ln]
    assert len(lines) == 1 and f"under {strategy}" in lines[0] and "Traceback" not in p.stderr


def test_compare_records_a_diverged_run(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    p = dpcompare("compare", "--np", "1", "--strategies", "single", "--repeats", "1",
                  *DIVERGE, "--epochs", "2", "--out", str(out), check=False)
    assert p.returncode == 1
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["status"] == "diverged" and "diverged at step" in run["error"]
    assert "DIVERGED" in p.stdout and "1 diverged" in p.stdout
    assert "diverged" in (out / "report.html").read_text()
    assert compare.run_record(compare.RunSpec("single", 1, 0), "d", 3, 1.0, None, [], "x")["status"] == "diverged"


