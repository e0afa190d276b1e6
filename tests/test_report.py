"""Statistics, verdict wording and report rendering from a hand-made results.json (no training)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats as scipy_stats

from dpcompare import cli
from dpcompare.errors import ConfigError
from dpcompare.files import SCHEMA
from dpcompare.report import load_results, render, stats
from dpcompare.report.stats import Interval

from conftest import dpcompare

# -- statistics on known inputs (reference values computed independently with scipy.stats) -----------


def test_mean_ci() -> None:
    iv = stats.mean_ci([10, 12, 14])
    assert iv is not None and iv.n == 3
    assert (iv.mean, iv.lo, iv.hi) == pytest.approx((12.0, 7.031724576, 16.968275424))
    one = stats.mean_ci([5.0])
    assert one is not None and one.mean == 5.0 and not one.has_ci
    assert stats.mean_ci([]) is None


def test_welch_difference() -> None:
    d = stats.welch_diff_ci([10, 12, 14], [8, 9, 10])  # scipy: ttest_ind(equal_var=False).confidence_interval()
    assert d is not None
    assert (d.mean, d.lo, d.hi) == pytest.approx((-3.0, -7.155399503, 1.155399503))
    assert d.spans_zero()
    exact = stats.welch_diff_ci([3.0, 3.0], [4.0, 4.0])  # no spread at all: the difference is exact
    assert exact is not None and (exact.lo, exact.hi) == (1.0, 1.0) and not exact.spans_zero()


BASE = [1000.0, 980.0, 1010.0, 950.0, 990.0]
OTHER = [1290.0, 1300.0, 1250.0, 1240.0, 1330.0]


def test_paired_t_interval_matches_scipy() -> None:
    iv, method = stats.paired_log_ratio_ci(BASE, OTHER)
    ref = scipy_stats.ttest_1samp(np.log(np.array(OTHER) / np.array(BASE)), 0.0).confidence_interval(0.95)
    assert method == "t" and iv is not None and iv.n == 5
    assert (iv.lo, iv.hi) == pytest.approx((ref.low, ref.high), rel=1e-12)
    assert iv.mean == pytest.approx(np.mean(np.log(np.array(OTHER) / np.array(BASE))))
    # the same by hand from scipy's t quantile: mean ± t(0.975, 4) · sd / √5
    d = np.log(np.array(OTHER) / np.array(BASE))
    half = scipy_stats.t.ppf(0.975, 4) * d.std(ddof=1) / np.sqrt(5)
    assert iv.hi - iv.mean == pytest.approx(half)


def test_the_paired_interval_keeps_its_promise_over_a_few_skewed_units() -> None:
    """A/A blocks whose ratio has a second mode (15 % of them 10 % faster, as Horovod's launches can be), true mean
    zero: over 20 units the 95 % interval must contain it at least 94 % of the time. A BCa bootstrap from 10 units
    on contained it 91 % of the time; Student t does 97 %."""
    rng = np.random.default_rng(3)
    sims, n, hits = 400, 20, 0
    for _ in range(sims):
        fast = rng.random(n) < 0.15
        d = np.where(fast, rng.normal(0.10, 0.03, n), rng.normal(0.0, 0.03, n)) - 0.015
        iv, _ = stats.paired_log_ratio_ci(np.ones(n), np.exp(d))
        hits += iv.lo <= 0.0 <= iv.hi  # type: ignore[operator]
    assert hits / sims >= 0.94


def test_paired_interval_is_student_t_at_every_size() -> None:
    """Many blocks too: the interval is scipy's one-sample t interval of the log ratios (a BCa bootstrap from 30
    on was narrower by about z's ÷ t's quantile and missed more often than 5 %: bench/coverage.py)."""
    rng = np.random.default_rng(7)
    for n in (30, 120):
        base = 1000.0 * (1 + 0.2 * rng.random(n))
        other = base * np.exp(0.1 + 0.03 * rng.standard_normal(n))
        iv, method = stats.paired_log_ratio_ci(base, other)
        ref = scipy_stats.ttest_1samp(np.log(other / base), 0.0).confidence_interval(0.95)
        assert method == "t" and iv is not None
        assert (iv.lo, iv.hi) == pytest.approx((ref.low, ref.high))


def test_paired_interval_edge_cases() -> None:
    assert stats.paired_log_ratio_ci([], []) == (None, "none")
    one, m1 = stats.paired_log_ratio_ci([100.0], [110.0])
    assert m1 == "none" and one is not None and not one.has_ci
    exact, m2 = stats.paired_log_ratio_ci([100.0, 200.0], [110.0, 220.0])
    assert m2 == "exact" and exact is not None and exact.lo == exact.hi == pytest.approx(np.log(1.1))


def test_blocks_needed_from_the_observed_spread() -> None:
    d = [0.02, -0.03, 0.04, 0.01]  # mean 0.01, sd ≈ 0.0294: equal once the 90 % half-width < log(1.05) − 0.01
    n = stats.blocks_needed(d, 0.05)
    sd, target = np.std(d, ddof=1), np.log(1.05) - 0.01
    assert n is not None and scipy_stats.t.ppf(0.95, n - 1) * sd / np.sqrt(n) < target
    assert scipy_stats.t.ppf(0.95, n - 2) * sd / np.sqrt(n - 1) >= target
    assert stats.blocks_needed([0.1], 0.05) is None
    # a clear difference decides as faster/slower through the 95 % interval leaving 0
    d2 = [0.10, 0.14, 0.06]
    n2 = stats.blocks_needed(d2, 0.05)
    assert n2 is not None and scipy_stats.t.ppf(0.975, n2 - 1) * np.std(d2, ddof=1) / np.sqrt(n2) < np.mean(d2)


def test_equal_is_two_one_sided_tests_at_5_percent() -> None:
    """equal ⇔ the 90 % interval lies inside ±E ⇔ both one-sided t tests against ±log(1+E) reject at 5 %."""
    base = [1000.0, 960.0, 1040.0, 990.0, 1010.0, 970.0]
    other = [1059.0, 936.0, 1065.0, 968.0, 1066.0, 956.0]
    d = np.log(np.array(other) / np.array(base))
    iv90, _ = stats.paired_log_ratio_ci(base, other, stats.equivalence_confidence())
    ref = scipy_stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
    assert iv90 is not None and (iv90.lo, iv90.hi) == pytest.approx((ref.low, ref.high), rel=1e-12)
    p_low = scipy_stats.ttest_1samp(d, np.log(0.95), alternative="greater").pvalue
    p_high = scipy_stats.ttest_1samp(d, np.log(1.05), alternative="less").pvalue
    tost_equal = max(p_low, p_high) < 0.05
    iv95, _ = stats.paired_log_ratio_ci(base, other)
    assert iv95 is not None and np.exp(iv95.hi) > 1.05  # the 95 % interval alone would not call it equal …
    outcome, text = stats.throughput_verdict("ddp#2", "ddp#1", 2, iv95, 0.05, log_eq_iv=iv90)
    assert tost_equal and outcome == "equal"  # … the equivalence test does, as scipy's one-sided tests do
    assert "90 % CI" in text and "two one-sided tests" in text
    results = make_results({("ddp#1", 2): base, ("ddp#2", 2): other})
    (v,) = stats.verdicts(results)
    assert v.outcome == "equal" and v.equivalence_ci == pytest.approx((np.exp(ref.low), np.exp(ref.high)))
    assert v.to_json()["equivalence_ci"] == pytest.approx([np.exp(ref.low), np.exp(ref.high)], abs=1e-6)


@pytest.mark.parametrize(("lo", "hi", "outcome"), [(1.21, 1.37, "faster"), (0.80, 0.95, "slower"),
                                                   (0.97, 1.04, "equal"), (1.01, 1.03, "equal"),
                                                   (0.97, 1.12, "undecided"), (0.90, 1.02, "undecided")])
def test_decide(lo: float, hi: float, outcome: str) -> None:
    assert stats.decide(lo, hi, 0.05) == outcome


def _log_iv(ratio: float, lo: float, hi: float, n: int = 6) -> Interval:
    return Interval(float(np.log(ratio)), float(np.log(lo)), float(np.log(hi)), n)


def test_throughput_verdict_wording() -> None:
    assert stats.throughput_verdict("horovod", "ddp", 2, _log_iv(1.29, 1.21, 1.37)) == (
        "faster", "horovod 29 % faster than ddp at np=2 (95 % CI 21–37 %)")
    assert stats.throughput_verdict("horovod", "ddp", 4, _log_iv(0.917, 0.888, 0.949)) == (
        "slower", "horovod 8.3 % slower than ddp at np=4 (95 % CI 5.1–11.2 %)")
    assert stats.throughput_verdict("ddp#2", "ddp#1", 2, _log_iv(1.005, 0.98, 1.03)) == (
        "equal", "ddp#2 equal to ddp#1 within ±5.0 % at np=2 (+0.5 %, 95 % CI −2.0 … +3.0 %)")
    assert stats.throughput_verdict("ddp#2", "ddp#1", 2, _log_iv(1.005, 0.95, 1.06),
                                    log_eq_iv=_log_iv(1.005, 0.96, 1.04)) == (
        "equal", "ddp#2 equal to ddp#1 within ±5.0 % at np=2 (+0.5 %, 90 % CI −4.0 … +4.0 %: two one-sided tests)")
    assert "−90 … over +900 %" in stats.throughput_verdict("a", "b", 2, _log_iv(1.0, 0.1, 40.0))[1]
    assert stats.throughput_verdict("horovod", "ddp", 2, _log_iv(1.04, 0.97, 1.12), needed=14) == (
        "undecided", "horovod vs ddp at np=2 undecided: interval −3 … +12 %, needs about 8 more repeats")
    outcome, text = stats.throughput_verdict("horovod", "ddp", 2, Interval(0.05, None, None, 1))
    assert outcome == "undecided" and "1 block, no interval" in text


def test_verdicts_are_paired_over_blocks() -> None:
    # ddp drifts down 30 % over the repeats; horovod is 10 % slower within every block: unpaired intervals
    # would overlap, the paired one decides
    results = make_results({("ddp", 2): [1000, 850, 700, 900], ("horovod", 2): [900, 766, 629, 811]})
    (v,) = stats.verdicts(results)
    assert (v.outcome, v.blocks, v.method, v.baseline, v.other, v.np) == ("slower", 4, "t", "ddp", "horovod", 2)
    assert v.ratio == pytest.approx(0.9, abs=0.002) and v.ci_low < 0.9 < v.ci_high  # type: ignore[operator]
    assert v.ci_high < 0.905 and v.ci_low > 0.895  # type: ignore[operator]
    assert v.block_ratios == pytest.approx([0.9, 766 / 850, 629 / 700, 811 / 900])
    assert v.text.startswith("horovod 10.0 % slower than ddp at np=2 (95 % CI 9.8–10.2 %)")
    assert v.accuracy == "test accuracy identical (96.39 %)"
    js = v.to_json()
    assert (js["metric"], js["outcome"], js["blocks"]) == ("throughput", "slower", 4)
    assert js["ci_low"] <= js["ratio"] <= js["ci_high"]


def test_persistent_workers_count_two_neighbouring_blocks_as_one_unit() -> None:
    """With persistent workers the interval is a t interval over the means of neighbouring block pairs
    (an odd block joins the last pair), computed here independently with scipy."""
    ddp = [1000, 980, 1010, 990, 1005, 1000, 995]
    hvd = [1200, 1150, 1230, 1160, 1250, 1190, 1180]
    results = make_results({("ddp", 2): ddp, ("horovod", 2): hvd})
    logs = np.log(np.array(hvd) / np.array(ddp))
    units = [logs[0:2].mean(), logs[2:4].mean(), logs[4:7].mean()]
    ci = scipy_stats.ttest_1samp(units, 0.0).confidence_interval(0.95)
    (fresh,) = stats.verdicts(results)
    results["config"]["workers"] = "persistent"
    (v,) = stats.verdicts(results)
    assert (v.blocks, v.unit_blocks, v.method) == (7, 2, "t") and v.unit_log_ratios == pytest.approx(units)
    assert v.ratio == pytest.approx(np.exp(np.mean(units)))
    assert (v.ci_low, v.ci_high) == pytest.approx((np.exp(ci.low), np.exp(ci.high)))
    assert (fresh.unit_blocks, fresh.blocks) == (1, 7) and v.half_width > fresh.half_width  # type: ignore[operator]
    assert v.to_json()["unit_blocks"] == 2 and fresh.to_json()["unit_blocks"] == 1


def test_a_a_control_is_equal() -> None:
    results = make_results({("ddp#1", 2): [1000, 900, 950, 1010], ("ddp#2", 2): [1010, 895, 948, 1000]})
    for r in results["runs"]:
        r["arm"], r["strategy"] = r["strategy"], "ddp"
    (v,) = stats.verdicts(results)
    assert v.outcome == "equal" and v.ci_low < 1.0 < v.ci_high  # type: ignore[operator]
    assert v.text.startswith("ddp#2 equal to ddp#1 within ±5.0 % at np=2")


def test_undecided_says_how_many_more_repeats() -> None:
    results = make_results({("ddp", 2): [1000, 1000, 1000], ("horovod", 2): [1100, 950, 1120]})
    (v,) = stats.verdicts(results)
    assert v.outcome == "undecided" and v.blocks_needed is not None and v.blocks_needed > 3
    assert f"needs about {v.blocks_needed - 3} more repeats" in v.text


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
    (v,) = stats.verdicts(results)
    assert (v.outcome, v.ratio, v.blocks) == ("undecided", None, 0)
    assert v.text == "horovod vs ddp at np=2: no comparison (horovod: 0 of 1 runs succeeded)"


# -- rendering ---------------------------------------------------------------------------------------


COMM_PHASE = {"ddp": "backward", "horovod": "optimizer"}


def run_entry(strategy: str, np: int, repeat: int, sps: float, acc: float = 0.9639) -> dict[str, Any]:
    comm = {COMM_PHASE[strategy.split("#")[0]]: 2.0 * (np - 1)}  # where each strategy's communication lands
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
    return {"strategy": strategy, "np": np, "repeat": repeat, "status": "failed",
            "dir": f"runs/{strategy}-np{np}-r{repeat}",
            "error": "Traceback (most recent call last):\nRuntimeError: <boom> & friends\n-----\nmpirun noise",
            "samples_per_sec": None, "step_ms": None, "phases_ms": None, "final_test_accuracy": None,
            "final_train_loss": None, "peak_rss_mb": None, "wall_seconds": 1.0, "metrics": []}


def make_results(throughputs: dict[tuple[str, int], list[float]]) -> dict[str, Any]:
    runs = [run_entry(s, n, k, v) for (s, n), vs in throughputs.items() for k, v in enumerate(vs)]
    return {"schema": SCHEMA, "created": "2025-01-01T00:00:00+00:00", "complete": True,
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
    for name in ("throughput", "drift", "breakdown", "scaling", "curves"):
        png = handmade / "plots" / f"{name}.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (handmade / "report.html").read_text()
    assert out.html == handmade / "report.html"
    assert page.count("data:image/png;base64,") == 5  # throughput, drift, breakdown, scaling, curves
    assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", page, re.I), "report.html must not reach out"
    assert "<script" not in page and "<link" not in page
    assert "horovod" in page and "&lt;boom&gt; &amp; friends" in page  # failed run's error, escaped
    # ddp/horovod per block at np=2: 3600/4000, 3700/4100, 3650/3900 → horovod about 9 % slower
    assert out.details[1].outcome == "slower" and out.details[1].np == 2
    assert out.verdicts[1].startswith("horovod 8.7 % slower than ddp at np=2 (95 % CI 3.6–13.6 %)")
    assert '<strong class="outcome-slower">horovod 8.7 % slower than ddp at np=2' in page
    assert page.count("8.7 % slower") == 1  # each verdict stated once
    assert "synchronize" in page and "backward" in page  # the teaching section
    assert any("at np=2" in v for v in out.verdicts)


def test_render_prints_table_and_verdict(handmade: Path) -> None:
    from rich.console import Console

    console = Console(record=True, width=160)
    render(handmade, console=console)
    text = console.export_text()
    assert "samples/s" in text and "report.html" in text
    verdicts = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("• ")]
    # the same verdicts the HTML states (ddp/horovod per block at np=2: 3600/4000, 3700/4100, 3650/3900)
    assert [v.split(";")[0] for v in verdicts] == [
        "• horovod vs ddp at np=1 undecided: interval −11 … +3 %, needs about 2 more repeats",
        "• horovod 8.7 % slower than ddp at np=2 (95 % CI 3.6–13.6 %)"]
    assert "failed horovod-np2-r3: RuntimeError: <boom> & friends" in text


def _cells(table: str) -> list[list[str]]:
    """The text of every row's cells as the page lays it out: a data cell on one line, a header wrapped at
    ``<br>`` and at spaces (the CSS: ``td`` nowrap, ``th`` and ``td.l`` normal), so its longest word counts."""
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S):
        row = []
        for tag, attrs, c in re.findall(r"<(t[hd])([^>]*)>(.*?)</t[hd]>", tr, re.S):
            text = re.sub(r"<[^>]+>", " ", c).replace("&amp;", "&").strip()
            wraps = tag == "th" or 'class="l"' in attrs
            row.append(max(text.split() or [""], key=len) if wraps else re.sub(r"\s+", " ", text))
        rows.append(row)
    return rows


#: the page's text column: main's max-width less its padding and the card's
TEXT_PX, CHAR_PX, CELL_PAD_PX = 1120 - 48 - 46, 7.5, 18


def test_the_report_fits_1300_px_and_states_attribution_and_regime(handmade: Path) -> None:
    """No table wider than the page at 1300 px (text width by characters, 7.5 px each at 13.5 px tabular figures, plus
    padding), wrappers that scroll inside the card, long values that wrap; the verdict card's attribution and regime."""
    results = json.loads((handmade / "results.json").read_text())
    for r in results["runs"]:  # a sharded-looking run: the memory columns must not join the main table
        r["memory_mb"] = {"params": 0.06, "grads": 0.06, "optimizer_state": 0.12, "total": 0.24}
    (handmade / "results.json").write_text(json.dumps(results))
    render(handmade, quiet=True)
    page = (handmade / "report.html").read_text()
    css = page[page.index("<style>"):page.index("</style>")]
    assert ".scroll { overflow-x: auto; max-width: 100%; }" in css and "overflow-wrap: anywhere" in css
    assert "<h3>Memory per rank</h3>" in page
    tables = re.findall(r"<table>.*?</table>", page, re.S)
    assert tables and all(page[:page.index(t)].endswith('<div class="scroll">') for t in tables)
    for t in tables:
        rows = _cells(t)
        widths = [max(len(r[i]) for r in rows if i < len(r)) * CHAR_PX + CELL_PAD_PX for i in range(len(rows[0]))]
        assert sum(widths) <= TEXT_PX, f"a table of {sum(widths):.0f} px: {rows[0]}"
    # attribution: per phase with intervals, and the sentence; the regime card with the tiny-step warning
    assert "Where the difference lies · horovod vs ddp at np=2" in page
    # horovod's all-reduce wait moved 2 ms from backward into optimizer (run_entry), and its step is longer
    assert re.search(r"<td>optimizer ◀</td><td>\+2\.00</td>", page)  # the phases that carry the gap are marked
    assert "its optimizer 2.00 ms longer" in page and "its backward 2.00 ms shorter" in page
    assert "share of" not in page and "time moved from backward to optimizer" in page
    # the bars on one ms scale: optimizer's +2.00 and backward's −2.00 fill a half each, on either side
    assert re.search(r'<td>optimizer ◀</td>.*?<span class="half l"></span><span class="half r"><span class="bar" '
                     r'style="width:64px', page)
    assert re.search(r'<td>backward</td>.*?<span class="half l"><span class="bar" style="width:64px', page)
    assert "synchronize()" in page and "bucketed all-reduce" in page
    assert "What was measured · np=2" in page and "threads per rank" in page and "gradients per step" in page
    assert page.count('class="tiny"') == 2  # 1 ms steps of a model with no recorded gradients: np=1 and np=2
    # runs: 13 of them, collapsed; the per-block ratios behind a <details>
    assert "<details><summary>13 runs, 1 failed</summary>" in page
    assert "<details><summary>horovod/ddp throughput ratio per block" in page


def test_the_terminal_table_warns_of_tiny_steps_and_says_why(handmade: Path) -> None:
    from rich.console import Console

    console = Console(record=True, width=200)
    render(handmade, console=console)
    text = console.export_text()
    assert "fixed per-step costs decide this verdict" in text
    assert re.search(r"note: steps of 1[67]\.\d ms \(np=2\)", text)
    why = text[text.index("why: horovod's step 1.5"):].splitlines()
    assert "optimizer +2.00 ms" in why[0] and "backward −2.00 ms" in why[0]
    assert (
        why[1].strip().startswith("in optimizer — ddp: nothing; horovod: step() waits")
        and len(why[0]) + len(why[1]) < 240
    )
    assert not why[2].strip().startswith(("in ", "why"))  # two lines, no more


def test_attributions_are_read_back_as_stored(handmade: Path) -> None:
    results = json.loads((handmade / "results.json").read_text())
    from dpcompare.report.attribution import attributions

    results["attributions"] = [a.to_json() for a in attributions(results)]
    results["attributions"][0]["text"] = "EDITED: the attribution compare stored"
    (handmade / "results.json").write_text(json.dumps(results))
    render(handmade, quiet=True)
    assert "EDITED: the attribution compare stored" in (handmade / "report.html").read_text()
    render(handmade, quiet=True, recompute=True)
    assert "EDITED" not in (handmade / "report.html").read_text()


def test_one_repeat_says_no_ci(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps(make_results({("ddp", 2): [4000], ("horovod", 2): [3600]})))
    out = render(tmp_path, quiet=True)
    assert out.verdicts == ["horovod vs ddp at np=2 undecided: −10 % from 1 block, no interval; run at least "
                            "3 repeats; test accuracy identical (96.39 %)"]
    assert not (tmp_path / "plots" / "scaling.png").exists()  # one np: no scaling plot


def test_report_command_rerenders(handmade: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(handmade)]) == 0
    assert "Verdict" in capsys.readouterr().out
    assert (handmade / "report.html").is_file()


@pytest.mark.parametrize("content", [None, "{not json", '{"schema": 99, "runs": []}', '{"schema": 2}',
                                     '{"schema": 2, "runs": [{"strategy": "ddp"}]}'])
def test_report_refuses_missing_or_invalid(tmp_path: Path, content: str | None,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    if content is not None:
        (tmp_path / "results.json").write_text(content)
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpcompare report: error: ") and err.count("\n") == 1
    with pytest.raises(ConfigError, match="results.json"):
        load_results(tmp_path)


def test_report_missing_dir_cli(tmp_path: Path) -> None:
    p = dpcompare("report", str(tmp_path / "nowhere"), check=False)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "results.json" not in p.stdout
    assert "dpcompare report: error:" in p.stderr


# -- the verdicts compare stored are the ones the report shows ------------------------------------------
def _seeded_results() -> dict[str, Any]:
    """Two arms over three seeds with a target accuracy: throughput, accuracy and time-to-accuracy verdicts."""
    results = make_results({("ddp", 2): [4000, 4100, 3900], ("horovod", 2): [3600, 3700, 3650]})
    for r in results["runs"]:
        k = r["repeat"]
        r.update(seed=k + 1, final_test_accuracy=0.95 + k / 1000 + (0.004 if r["strategy"] == "ddp" else 0),
                 time_to_accuracy_s=[10.0, 12.0, None][k] if r["strategy"] == "horovod" else 9.0 + k,
                 steps_to_accuracy=40, epochs_to_accuracy=1)
    results["config"].update(seeds=[1, 2, 3], train={**results["config"]["train"], "target_accuracy": 0.95})
    return results


def test_verdicts_round_trip_through_results_json() -> None:
    vs = stats.verdicts(_seeded_results())
    assert {v.metric for v in vs} == {"throughput", "accuracy", "time_to_accuracy"}
    for v in vs:
        j = json.loads(json.dumps(v.to_json()))
        back = stats.Verdict.from_json(j)
        assert back.to_json() == j
        assert (back.metric, back.outcome, back.full_text, back.block_repeats) == (
            v.metric, v.outcome, v.full_text, v.block_repeats)
        assert back.block_ratios == pytest.approx(v.block_ratios) and back.ratio == pytest.approx(v.ratio)


def test_report_shows_the_stored_verdicts_and_recompute_draws_them_again(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    results = _seeded_results()
    stored = [v.to_json() for v in stats.verdicts(results)]
    drawn = stored[0]["text"]
    stored[0]["text"] = "EDITED: the verdict compare stored"
    (tmp_path / "results.json").write_text(json.dumps({**results, "verdicts": stored}))
    out = render(tmp_path, quiet=True)
    assert out.verdicts[0] == "EDITED: the verdict compare stored"
    assert "EDITED: the verdict compare stored" in (tmp_path / "report.html").read_text()
    assert cli.main(["report", "--recompute", "--quiet", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "EDITED" not in page and drawn.split(";")[0] in page
    assert stats.report_verdicts(load_results(tmp_path), recompute=True)[0].full_text == drawn
    # still running (complete: false), or verdicts from before they could be read back: drawn from the runs
    assert stats.report_verdicts({**results, "verdicts": stored, "complete": False})[0].full_text == drawn
    legacy = [{k: x for k, x in d.items() if k != "block_repeats"} for d in stored]
    assert stats.report_verdicts({**results, "verdicts": legacy})[0].full_text == drawn
    assert stats.report_verdicts({**results, "verdicts": stored})[0].full_text.startswith("EDITED")


def test_many_block_ratios_are_a_range_in_the_terminal() -> None:
    from dpcompare.report.table import _ratios

    assert _ratios([1.0, 0.9]) == "1.00 0.90"
    assert _ratios([0.9, 1.0, 1.1] * 10) == "0.90 to 1.10 over 30 blocks (each in the report)"


def test_the_load_average_shown_is_the_one_before_the_first_run() -> None:
    """A load average trails a minute, so a later run's start counts the comparison's own runs: the card shows the
    first run's, not the largest (3.1 here, the comparison's own two busy ranks)."""
    from dpcompare.report.regime import others_text, regime

    runs = [{"np": 2, "status": "ok", "load": {"others_cpu_share": share, "loadavg_start": [load, 0.0, 0.0],
                                               "cores": 2}} for share, load in ((0.01, 0.4), (0.02, 3.1))]
    r = regime({"runs": runs}, 2)
    assert r.loadavg == 0.4 and r.others_cpu == 0.02
    assert others_text(r) == "2 % of the 2 cores at most in a run; load average 0.40 when the first run started"


def test_a_comparison_stopped_short_says_what_its_target_would_take(handmade: Path) -> None:
    """config.stop.shortfall (compare.stopping.shortfall) is on the verdict card, its flags as one piece of code,
    and in the terminal under the reason it stopped."""
    from rich.console import Console

    res = json.loads((handmade / "results.json").read_text())
    more = ("±5 % (--target-ci) would take about 78 blocks, ≈4 min at this comparison's pace, by its spread so far: "
            "run it again with --time-budget 240 --max-repeats 78")
    res["config"]["stop"] = {"blocks": 40, "reason": "reached --max-repeats 40", "seconds": 121.0, "shortfall": more}
    (handmade / "results.json").write_text(json.dumps(res))
    console = Console(record=True, width=300)
    render(handmade, console=console)
    page = (handmade / "report.html").read_text()
    assert ('Stopped short: ±5 % (--target-ci) would take about 78 blocks' in page
            and '<code style="white-space:nowrap">--time-budget 240 --max-repeats 78</code>' in page)
    text = console.export_text()
    assert text.index("40 blocks: reached --max-repeats 40") < text.index(more)
