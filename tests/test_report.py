"""Statistics, verdict wording and report rendering from a hand-made results.json (no training)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dpcompare import cli
from dpcompare.report import load_results, render, stats
from dpcompare.report.stats import Interval

from conftest import dpcompare

# -- statistics on known inputs (reference values from scipy.stats) ------------------------------------


@pytest.mark.parametrize(("df", "expected"), [(1, 12.706204736), (2, 4.302652730), (2.5, 3.574654842),
                                              (4, 2.776445105), (10, 2.228138852), (30, 2.042272456)])
def test_t_quantile_matches_tables(df: float, expected: float) -> None:
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-8)
    assert stats.t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-8)


def test_t_quantile_one_sided_fractional_df() -> None:
    assert stats.t_quantile(0.95, 3.7) == pytest.approx(2.182493804, abs=1e-8)


def test_mean_ci() -> None:
    iv = stats.mean_ci([10, 12, 14])
    assert iv is not None and iv.n == 3
    assert (iv.mean, iv.lo, iv.hi) == pytest.approx((12.0, 7.031724576, 16.968275424))
    one = stats.mean_ci([5.0])
    assert one is not None and one.mean == 5.0 and not one.has_ci
    assert stats.mean_ci([]) is None


def test_welch_and_relative_difference() -> None:
    d = stats.welch_diff_ci([10, 12, 14], [8, 9, 10])  # scipy: ttest_ind(equal_var=False).confidence_interval()
    assert d is not None
    assert (d.mean, d.lo, d.hi) == pytest.approx((-3.0, -7.155399503, 1.155399503))
    assert d.spans_zero()
    r = stats.relative_diff_ci([10, 12, 14], [8, 9, 10])
    assert r is not None
    assert (r.mean, r.lo, r.hi) == pytest.approx((-0.25, -7.155399503 / 12, 1.155399503 / 12))
    exact = stats.welch_diff_ci([3.0, 3.0], [4.0, 4.0])  # no spread at all: the difference is exact
    assert exact is not None and (exact.lo, exact.hi) == (1.0, 1.0) and not exact.spans_zero()
    assert not stats.relative_diff_ci([10.0], [9.0]).has_ci  # type: ignore[union-attr]


def test_scaling_efficiency() -> None:
    assert stats.scaling_efficiency(1800.0, 2, 1000.0) == pytest.approx(0.9)


# -- verdict wording ---------------------------------------------------------------------------------


def test_throughput_verdict_wording() -> None:
    slower = stats.throughput_verdict("horovod", "ddp", 2, Interval(-0.083, -0.112, -0.051, 3))
    assert slower == "horovod 8.3 % slower than ddp at np=2 (95 % CI 5.1–11.2 %)"
    faster = stats.throughput_verdict("horovod", "ddp", 4, Interval(0.12, 0.05, 0.19, 3))
    assert faster == "horovod 12.0 % faster than ddp at np=4 (95 % CI 5.0–19.0 %)"
    same = stats.throughput_verdict("horovod", "ddp", 2, Interval(-0.012, -0.04, 0.016, 3))
    assert same == ("horovod vs ddp at np=2: no significant difference in throughput "
                    "(−1.2 %, 95 % CI −4.0 to +1.6 %)")
    noisy = stats.throughput_verdict("horovod", "ddp", 2, Interval(0.1, -0.9, 1.1, 2))
    assert "no significant difference" in noisy and "too noisy to tell" in noisy
    single = stats.throughput_verdict("horovod", "ddp", 2, Interval(-0.05, None, None, 1))
    assert single == "horovod 5.0 % slower than ddp at np=2 (1 repeat: no CI, noise unknown)"


def test_accuracy_verdict_wording() -> None:
    assert stats.accuracy_verdict("b", "a", [0.9639, 0.9639], [0.9639]) == "test accuracy identical (96.39 %)"
    assert stats.accuracy_verdict("b", "a", [0.95, 0.97], [0.96, 0.965]) == "test accuracy equal within noise"
    differs = stats.accuracy_verdict("b", "a", [0.96, 0.9602], [0.90, 0.9002])
    assert differs == "test accuracy 6.00 points lower for b (90.01 % vs 96.01 %)"
    one = stats.accuracy_verdict("b", "a", [0.96], [0.95])
    assert one == "test accuracy 1.00 points lower for b (95.00 % vs 96.00 %; 1 repeat: spread unknown)"


def test_verdicts_from_groups() -> None:
    results = make_results({("ddp", 2): [1000, 1010, 990], ("horovod", 2): [900, 905, 895]})
    groups = stats.aggregate(results)
    (v,) = stats.verdicts(groups, ["ddp", "horovod"])
    assert v.text.startswith("horovod 10.0 % slower than ddp at np=2 (95 % CI ")
    assert v.text.endswith("; test accuracy identical (96.39 %)")
    assert v.throughput is not None and v.throughput.hi < 0  # type: ignore[operator]


def test_aggregate_ignores_failed_runs_and_computes_efficiency() -> None:
    results = make_results({("ddp", 1): [1000, 1000], ("ddp", 2): [1800, 1800]})
    results["runs"].append(failed_run("ddp", 2, 2))
    groups = stats.aggregate(results)
    g2 = stats.find(groups, "ddp", 2)
    assert g2 is not None and (g2.ok, g2.runs) == (2, 3)
    assert g2.samples_per_sec is not None and g2.samples_per_sec.mean == pytest.approx(1800)
    assert g2.efficiency == pytest.approx(0.9)
    shift = stats.phase_shifts(groups, "ddp")[2]  # run_entry puts 2 ms of communication into ddp's backward
    assert (shift["backward"], shift["optimizer"], shift["forward"]) == pytest.approx((2.0, 0.0, 0.0))


def test_no_comparison_when_a_side_failed() -> None:
    results = make_results({("ddp", 2): [1000]})
    results["runs"].append(failed_run("horovod", 2, 0))
    results["config"]["strategies"] = ["ddp", "horovod"]
    (v,) = stats.verdicts(stats.aggregate(results), ["ddp", "horovod"])
    assert v.text == "horovod vs ddp at np=2: no comparison (horovod: 0 of 1 runs succeeded)"


# -- rendering ---------------------------------------------------------------------------------------


COMM_PHASE = {"ddp": "backward", "horovod": "optimizer"}


def run_entry(strategy: str, np: int, repeat: int, sps: float, acc: float = 0.9639) -> dict[str, Any]:
    comm = {COMM_PHASE[strategy]: 2.0 * (np - 1)}  # where each strategy's communication lands
    return {
        "strategy": strategy, "np": np, "repeat": repeat, "status": "ok", "error": None,
        "dir": f"runs/{strategy}-np{np}-r{repeat}", "samples_per_sec": sps,
        "step_ms": {"median": 64000 / sps, "p95": 72000 / sps},
        "phases_ms": {"data": 0.3, "forward": 1.2, "backward": 1.0 + comm.get("backward", 0.0),
                      "optimizer": 0.3 + comm.get("optimizer", 0.0)},
        "final_test_accuracy": acc, "final_train_loss": 0.127, "peak_rss_mb": 410.0, "wall_seconds": 9.5,
        "metrics": [{"epoch": e, "step": 22 * e, "train_loss": 1.0 / (e * e), "test_accuracy": acc - 0.02 / e,
                     "samples_per_sec": sps, "epoch_seconds": 0.2} for e in (1, 2, 3)],
    }


def failed_run(strategy: str, np: int, repeat: int) -> dict[str, Any]:
    return {"strategy": strategy, "np": np, "repeat": repeat, "status": "failed", "dir": f"runs/{strategy}-np{np}-r{repeat}",
            "error": "Traceback (most recent call last):\nRuntimeError: <boom> & friends\n-----\nmpirun noise",
            "samples_per_sec": None, "step_ms": None, "phases_ms": None, "final_test_accuracy": None,
            "final_train_loss": None, "peak_rss_mb": None, "wall_seconds": 1.0, "metrics": []}


def make_results(throughputs: dict[tuple[str, int], list[float]]) -> dict[str, Any]:
    runs = [run_entry(s, n, k, v) for (s, n), vs in throughputs.items() for k, v in enumerate(vs)]
    return {"schema": 1, "created": "2025-01-01T00:00:00+00:00", "complete": True,
            "config": {"strategies": list(dict.fromkeys(s for s, _ in throughputs)),
                       "np": sorted({n for _, n in throughputs}), "repeats": 3,
                       "train": {"model": "convnet", "dataset": "digits", "epochs": 3, "batch_size": 32},
                       "train_flags": ["--epochs", "3"]},
            "environment": {"dpcompare": "0.1.0", "torch": "2.x", "horovod": "0.28.1"}, "runs": runs}


@pytest.fixture
def handmade(tmp_path: Path) -> Path:
    results = make_results({("ddp", 1): [2500, 2450, 2550], ("horovod", 1): [2400, 2420, 2380],
                            ("ddp", 2): [4000, 4100, 3900], ("horovod", 2): [3600, 3700, 3650]})
    results["runs"].append(failed_run("horovod", 2, 3))
    (tmp_path / "results.json").write_text(json.dumps(results))
    return tmp_path


def test_render_from_handmade_results(handmade: Path) -> None:
    out = render(handmade, quiet=True)
    for name in ("throughput", "breakdown", "scaling", "curves"):
        png = handmade / "plots" / f"{name}.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (handmade / "report.html").read_text()
    assert out.html == handmade / "report.html"
    assert page.count("data:image/png;base64,") == 4
    assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", page, re.I), "report.html must not reach out"
    assert "<script" not in page and "<link" not in page
    assert "horovod" in page and "&lt;boom&gt; &amp; friends" in page  # failed run's error, escaped
    assert "no significant difference" in page or "slower than ddp at np=2" in page
    assert "synchronize" in page and "backward" in page  # the teaching section
    assert any("at np=2" in v for v in out.verdicts)


def test_render_prints_table_and_verdict(handmade: Path) -> None:
    from rich.console import Console

    console = Console(record=True, width=160)
    render(handmade, console=console)
    text = console.export_text()
    assert "samples/s" in text and "Verdict" in text and "horovod" in text and "at np=2" in text
    assert "report.html" in text


def test_one_repeat_says_no_ci(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps(make_results({("ddp", 2): [4000], ("horovod", 2): [3600]})))
    out = render(tmp_path, quiet=True)
    assert out.verdicts == ["horovod 10.0 % slower than ddp at np=2 (1 repeat: no CI, noise unknown); "
                            "test accuracy identical (96.39 %)"]
    assert not (tmp_path / "plots" / "scaling.png").exists()  # one np: no scaling plot


def test_report_command_rerenders(handmade: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(handmade)]) == 0
    assert "Verdict" in capsys.readouterr().out
    assert (handmade / "report.html").is_file()


@pytest.mark.parametrize("content", [None, "{not json", '{"schema": 99, "runs": []}', '{"schema": 1}',
                                     '{"schema": 1, "runs": [{"strategy": "ddp"}]}'])
def test_report_refuses_missing_or_invalid(tmp_path: Path, content: str | None,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    if content is not None:
        (tmp_path / "results.json").write_text(content)
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpcompare report: error: ") and err.count("\n") == 1
    with pytest.raises(Exception):  # noqa: B017
        load_results(tmp_path)


def test_report_missing_dir_cli(tmp_path: Path) -> None:
    p = dpcompare("report", str(tmp_path / "nowhere"), check=False)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "results.json" not in p.stdout
    assert "dpcompare report: error:" in p.stderr
