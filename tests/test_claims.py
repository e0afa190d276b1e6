"""Claims the README and docs make that only a test can keep honest: TensorBoard output, the slowest-rank rule,
--scale-lr, --device cuda without a GPU, doctor, a smoke run of the overhead benchmark, and figures (the demo's
speed-up, the suite's time, GPU status) stated only beside the one page that keeps them."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from dpcompare.backends.single import SingleStrategy
from dpcompare.training.step import StepTiming
from dpcompare.training.summary import timing_summary

from conftest import FAST, ROOT, dpcompare, mpi_env, needs_mpi, summary


def test_tensorboard_events_hold_the_epoch_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    args = [*FAST, "--trackers", "tensorboard"]  # the last one given wins
    dpcompare("train", "--strategy", "single", *args, "--epochs", "2", "--out", str(out))
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert {"train_loss", "test_accuracy", "samples_per_sec"} <= set(acc.Tags()["scalars"])
    losses = acc.Scalars("train_loss")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e.step for e in losses] == [1, 2]
    assert [e.value for e in losses] == pytest.approx([r["train_loss"] for r in rows], rel=1e-6)


class _TwoRanks(SingleStrategy):
    """A fake two-rank strategy: rank 1 took twice as long for the same steps."""

    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        slow = list(values)
        slow[0] *= 2  # step_ms_median
        slow[-3] *= 2  # measured_seconds
        return [list(values), slow]


def test_throughput_is_decided_by_the_slowest_rank():
    steps = [StepTiming(0.001, 0.002, 0.003, 0.004, 0.010)] * 10  # 10 steps of 10 ms
    t = timing_summary(_TwoRanks(), steps, samples_per_step=64)
    # 640 samples over the slowest rank's 0.2 s, not rank 0's 0.1 s (nor rank 0 × 2)
    assert t["samples_per_sec"] == pytest.approx(640 / 0.2)
    assert t["step_ms_median"] == pytest.approx(20.0) and [r["rank"] for r in t["per_rank"]] == [0, 1]
    assert t["per_rank"][1]["measured_seconds"] == pytest.approx(0.2)


@needs_mpi
def test_scale_lr_multiplies_by_the_number_of_processes(tmp_path):
    out = tmp_path / "s"
    p = dpcompare("train", "--strategy", "ddp", *FAST, "--epochs", "0", "--max-steps", "3", "--lr", "0.05",
                  "--scale-lr", "--out", str(out), np=2)
    assert summary(out)["lr"] == pytest.approx(0.1) and "lr 0.1 " in p.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU; the refusal needs one without")
def test_device_cuda_without_a_gpu_is_one_line(tmp_path):
    p = dpcompare("train", "--strategy", "single", *FAST, "--epochs", "1", "--device", "cuda",
                  "--out", str(tmp_path / "o"), check=False)
    assert p.returncode == 2 and p.stderr.strip() == (
        "dpcompare train: error: --device cuda but torch sees no GPU; use --device cpu")
    assert not (tmp_path / "o" / "summary.json").exists()


def test_doctor_short_is_one_line_of_versions():
    import horovod

    line = dpcompare("doctor", "--short").stdout
    assert line.count("\n") == 1 and f"torch {torch.__version__}" in line
    assert f"horovod {horovod.__version__}" in line and "Open MPI" in line


def test_doctor_table_shows_horovods_build_and_torchvision():
    text = dpcompare("doctor", env={**mpi_env(), "COLUMNS": "200"}).stdout
    assert "strategy horovod" in text and "controllers" in text and "MPI yes" in text and "Gloo yes" in text
    assert "torchvision" in text and ("CUDA" in text or "CPU build" in text)


@needs_mpi
def test_overhead_benchmark_runs_and_prints_ratios():
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "overhead.py"), "--rounds", "2", "--epochs", "2",
                        "--strategies", "ddp"], capture_output=True, text=True, timeout=300,
                       env={**mpi_env(), "COLUMNS": "200", "QUIET_MAX_WAIT": "0", "QUIET_STRICT": "0"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("[quiet] ") and "[quiet] machine: " in p.stdout  # the machine, said first
    row = re.search(r"ddp\s*│\s*[\d,]+\s*│\s*[\d,]+\s*│\s*(\d+\.\d{3})\s*│", p.stdout)
    assert row and 0.3 < float(row.group(1)) < 3.0, p.stdout


def _chunks(skip: str) -> list[tuple[str, str]]:
    """Every paragraph and table row of the README, CONTRIBUTING and docs/*.md but `skip`, with its page."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    out = []
    for page in pages:
        if page.name == skip:
            continue
        for para in re.split(r"\n\s*\n", page.read_text()):
            rows = para.splitlines() if para.lstrip().startswith("|") else [para]
            out += [(page.name, row) for row in rows]
    return out


def test_the_demos_speedup_is_quoted_from_measurements_only():
    """The demo's effect moves between runs: a page states it only beside a link to the one page that dates it."""
    speedup = re.compile(r"\d+(\.\d+)?(–\d+)? ?% faster|faster[^.]{0,60}?\bby \d+|\d+ to \d+ ?% (from|between)")
    bare = [(page, text[:120]) for page, text in _chunks("measurements.md")
            if "demo" in text and speedup.search(text) and "measurements.md" not in text]
    assert bare == []


def test_the_suites_time_is_stated_in_one_place():
    minutes = re.compile(r"(suite|make test|\btests)[^.]{0,80}?\b\d+ min\b|\d+ tests in \d+")
    stated = [(page, text[:120]) for page, text in _chunks("measurements.md") if minutes.search(text)]
    assert stated == []
    assert "## The test suite" in (ROOT / "docs" / "measurements.md").read_text()


def test_gpu_claims_link_the_gpu_page():
    """The GPU path ran on one H100 only: every page that names it says so beside a link to docs/gpu.md."""
    claims = [(page, text[:120]) for page, text in _chunks("gpu.md") if "H100" in text and "gpu.md" not in text]
    assert claims == []
