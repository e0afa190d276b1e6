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


# A quoted measurement: a number with a unit of time, share or ratio in a page's prose (code, links, HTML comments
# and {{ fig... }} expressions taken out first). Settings and limits are not measurements: a size or a link rate,
# a level ("95 % CI"), a margin ("±5 %"), a number after "at most", "default" and the like, and a value written as
# code (a flag's, a setting's or a test's bound: `--timeout 10`, `75–125 %`).
_UNIT = r"(?:%|ms|µs|s|min|minutes|seconds|h|hours|×)"  # sizes and link rates are settings, not measurements
_MEASURE = re.compile(r"(?<![\w.\-/±])[-−+]?\d[\d,]*(?:\.\d+)?(?:\s?[–-]\s?[-−+]?\d[\d,]*(?:\.\d+)?)?\s?"
                      + _UNIT + r"(?![\w/])(?! (?:CI|interval|band|confidence|percentile|equivalence))")
_SETTING = re.compile(r"(?:at most|at least|below|under|above|up to|every|default:?|target|budget|"
                      r"threshold|limit|cap|margin|e\.g\.|≥|≤|<|>)\s*$", re.I)
_NOT_PROSE = [re.compile(p, re.S) for p in (r"```.*?```", r"`[^`]*`", r"\{\{.*?\}\}", r"\{%.*?%\}",
                                            r"<!--.*?-->", r"\]\([^)]*\)", r"<https?://[^>]*>")]
# generated; rules; a schema; all from the file
_EXEMPT = {"cli.md", "layout.md", "results-schema.md", "measurements.md"}


def quoted_measurements(text: str) -> list[str]:
    """The measurements in ``text``'s prose that no ``{{ fig... }}`` expression supplies."""
    for pattern in _NOT_PROSE:
        text = pattern.sub(" ", text)
    return [m.group(0) for m in _MEASURE.finditer(text) if not _SETTING.search(text[max(0, m.start() - 14):m.start()])]


def _pages() -> dict[str, str]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {p.name: p.read_text() for p in pages if p.name not in _EXEMPT}


def test_every_quoted_measurement_comes_from_the_figures_file():
    found = {page: quoted for page, text in _pages().items() if (quoted := quoted_measurements(text))}
    assert found == {}, "quote {{ fig.SECTION.KEY }} from bench/figures.json (a setting: write it as code)"


def test_a_planted_figure_fails_the_check():
    page = (ROOT / "docs" / "measurements.md").read_text()  # every figure on it from the file
    assert quoted_measurements(page) == []
    planted = page + "\n\nOn a quiet machine the lab demo took 3 min 12 s and horovod was 38 % slower.\n"
    assert quoted_measurements(planted) == ["3 min", "12 s", "38 %"]
    assert quoted_measurements("the run took 4–10 ms a step, within 7–19 % of the wire, 1.32× as fast") == [
        "4–10 ms", "7–19 %", "1.32×"]
    sourced = page + "\n\nThe lab demo took {{ fig.lab_demo.total }}, at most 10 minutes, with `--time-budget 240`.\n"
    assert quoted_measurements(sourced) == []


def test_every_quoted_figure_exists_in_the_figures_file():
    figures = json.loads((ROOT / "bench" / "figures.json").read_text())
    used = {m for text in _pages().values() for m in re.findall(r"fig\.([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)", text)}
    used |= {m for text in [(ROOT / "docs" / "measurements.md").read_text()]
             for m in re.findall(r"fig\.([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)", text)}
    assert used and [f"{s}.{k}" for s, k in sorted(used) if k not in figures.get(s, {})] == []
    for section, entry in figures.items():
        if not section.startswith("_"):
            assert {"date", "machine", "load", "command"} <= set(entry), section


def test_a_remeasure_writes_its_figures_into_the_file():
    import datetime
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "bench" / "figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    log = ("[quiet] machine: 2 cores, AMD EPYC 7B13, 23 GiB, 6.18.0\n[quiet] quiet: load average 0.31 0.40 0.52\n"
           "=== 775 passed in 649.12s (0:10:49) ===\n=== 3 passed, 775 deselected in 14.2s ===\n"
           "make test: 879.4 s wall\nfigure: commit = abc1234\n")
    when = datetime.datetime(2026, 12, 2, 12, 0)
    new = figures.record({"suite": {"pytest": "old", "keep": "x"}}, "suite", log, when)
    assert new["suite"] == {"pytest": "10 min 49 s", "solitary": "14 s", "total": "14 min 39 s", "tests": "775",
                            "commit": "abc1234",
                            "keep": "x", "machine": "2 cores AMD EPYC 7B13, 23 GiB", "load": "0.31 at the start",
                            "date": "2026-12-02", "command": "bash bench/remeasure.sh suite"}
    assert figures.record(new, "suite", "[quiet] quiet: load average 0.2\nnothing measured\n", when) is new
    trackers = figures.record({}, "trackers", "import wandb: 0.5 s (median of 3; 0.4–0.7)\n"
                              "mlflow run in a fresh sqlite store: create, 10 epochs logged, end: 3.1 s (median of 3; "
                              "2.9–3.3)\n", when)
    assert trackers["trackers"]["wandb_import"] == "0.5 s (0.4–0.7)"
    assert trackers["trackers"]["mlflow_run"] == "3.1 s (2.9–3.3)"


def test_pages_that_advise_sudo_say_how_it_finds_dpcompare():
    """sudo resets PATH: every page that writes `sudo dpcompare` gives the fix (issue 68, item 5)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    advising = [p for p in pages if p.name != "cli.md" and "sudo dpcompare" in p.read_text()]
    assert advising and [p.name for p in advising if "sudo -E env PATH=$PATH" not in p.read_text()] == []


def test_make_tests_root_side_effects_are_beside_the_command():
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "getting-started.md"):
        text = page.read_text()
        assert "make test" in text and all(w in text for w in ("munge", "/etc/slurm", "namespaces")), page.name
