"""The link as an axis (``compare --lab ... --sweep link=...``): step time against link rate, per strategy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

from dpcompare.report.groups import Group, arm_links, arm_order, np_order, without_link
from dpcompare.report.plots import RC, Plot, _new, _save, colors


def _bps(link: str) -> float:
    """A rate's bit/s for ordering (``unlimited`` after every shaped rate)."""
    units = {"tbit": 1e12, "gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, scale in units.items():
        if link.endswith(unit):
            try:
                return float(link[: -len(unit)]) * scale
            except ValueError:
                break
    return float("inf")


def link_plot(results: dict[str, Any], groups: Sequence[Group], path: Path) -> Plot | None:
    """Median step time (slowest rank) of every strategy on every link of the sweep, one line per (strategy, np)."""
    links = arm_links(results)
    if len(set(links.values())) < 2:
        return None
    order = sorted(set(links.values()), key=_bps)
    names = list(dict.fromkeys(without_link(a) for a in arm_order(results) if a in links))
    col = colors(names)
    drawn = False
    with matplotlib.rc_context(RC):
        fig, ax = _new(6.0, 4.0)
        for name in names:
            for n in np_order(results):
                pts = [(order.index(links[g.arm]), g.step_ms_median) for g in groups
                       if g.arm in links and without_link(g.arm) == name and g.np == n and g.step_ms_median]
                if pts:
                    pts.sort()
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=col[name],
                            label=f"{name} · np={n}")
                    for x, y in pts:
                        ax.annotate(f"{y:,.0f}", (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8)
                    drawn = True
        if not drawn:
            return None
        ax.set_xticks(range(len(order)), order)
        ax.set_xlabel("link rate (each emulated host's link, both directions)")
        ax.set_ylabel("step time, ms (median, slowest rank)")
        ax.set_ylim(bottom=0)
        ax.set_title("Step time against link rate")
        ax.legend(loc="best")
        _save(fig, path)
    lab = (results.get("config") or {}).get("lab") or {}
    return Plot("links", path, "Step time against link rate",
                f"{lab.get('hosts', '?')} emulated hosts (network namespaces) joined by tbf-shaped links; every "
                "strategy ran on every link, the arms of one link side by side in each block. The unshaped veth "
                "('unlimited') is CPU-bound, not a fast NIC.")
