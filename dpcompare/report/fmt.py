"""Number formatting shared by the terminal table and the HTML report."""

from __future__ import annotations

from typing import Any

from dpcompare.report.groups import Group
from dpcompare.report.intervals import Interval


def ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def rate(v: float | None) -> str:
    """A throughput: whole numbers from 100 on, three significant digits below (a script's optimizer steps/s)."""
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def sps(iv: Interval | None) -> str:
    """Samples/s as ``mean ± half-width`` (or ``mean (no CI)`` with one repeat)."""
    if iv is None:
        return "–"
    if not iv.has_ci:
        return f"{rate(iv.mean)} (no CI)"
    return f"{rate(iv.mean)} ± {rate(iv.half_width)}"


def pct(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{100 * v:.{digits}f} %"


def accuracy(g: Group) -> str:
    """The group's final metric (accuracy for classifiers), with its 95 % half-width over repeats."""
    if g.accuracy is None:
        return "–"
    half = g.accuracy.half_width if g.accuracy.has_ci and g.accuracy.half_width else None
    if g.metric.get("unit") == "%":
        return f"{100 * g.accuracy.mean:.2f} ± {100 * half:.2f} %" if half else f"{100 * g.accuracy.mean:.2f} %"
    return f"{g.accuracy.mean:.3g} ± {half:.2g}" if half else f"{g.accuracy.mean:.3g}"


def metric_value(metric: dict, v: float | None) -> str:
    """One run's final metric, as its unit says."""
    if v is None:
        return "–"
    return f"{100 * v:.2f} %" if metric.get("unit") == "%" else f"{v:.3g}"


def metric_label(metric: dict, short: bool = False) -> str:
    """The column header: "test acc" / "test accuracy", "test perplexity ↓"."""
    name = "acc" if short and metric.get("name") == "accuracy" else str(metric.get("name", "accuracy"))
    return f"test {name}" + ("" if metric.get("higher_is_better", True) else " ↓")


def mb(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}"


def size_mb(v: float | None) -> str:
    """Tensor memory in MB, with decimals for small models."""
    if v is None:
        return "–"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def headline(error: str | None, limit: int = 160) -> str:
    """The telling line of a stderr tail: the first one saying "error", else the last non-banner line."""
    if not error:
        return ""
    lines = [ln.strip() for ln in error.splitlines() if ln.strip() and not set(ln.strip()) <= set("-=*")]
    hit = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "")
    return hit if len(hit) <= limit else hit[: limit - 1] + "…"


def script_description(config: dict[str, Any]) -> str | None:
    """A script comparison's workload (``config.script``): the script, its arguments and what a sample is."""
    script = config.get("script")
    if not isinstance(script, dict):
        return None
    words = " ".join([str(script.get("path", "")).rsplit("/", 1)[-1], *map(str, script.get("args") or [])])
    batch = script.get("global_batch")
    unit = f"{batch} samples per optimizer step" if batch else "samples/s = optimizer steps/s (no --global-batch)"
    return f"script {words} · {unit}"
