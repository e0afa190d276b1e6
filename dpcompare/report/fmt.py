"""Number formatting shared by the terminal table and the HTML report."""

from __future__ import annotations

from dpcompare.report.groups import Group
from dpcompare.report.intervals import Interval


def ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def sps(iv: Interval | None) -> str:
    """Samples/s as ``mean ± half-width`` (or ``mean (no CI)`` with one repeat)."""
    if iv is None:
        return "–"
    if not iv.has_ci:
        return f"{iv.mean:,.0f} (no CI)"
    return f"{iv.mean:,.0f} ± {iv.half_width:,.0f}"


def pct(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{100 * v:.{digits}f} %"


def accuracy(g: Group) -> str:
    if g.accuracy is None:
        return "–"
    if g.accuracy.has_ci and g.accuracy.half_width:
        return f"{100 * g.accuracy.mean:.2f} ± {100 * g.accuracy.half_width:.2f} %"
    return f"{100 * g.accuracy.mean:.2f} %"


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
