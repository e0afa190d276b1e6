"""The swept axes (``compare --sweep link=...``, ``--sweep threads=...``: any axis whose arms pair within a
value): step time against the axis's values, one line per arm and np. Everything comes from results.json
(``config.axes``: the values in order and their title; ``arms[].axes``: each arm's value)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

from dpcompare.report.groups import WITHIN, Group, arm_order, np_order, recorded_axes, shown_without, valued
from dpcompare.report.plots import RC, Plot, colors, new_figure, save_figure


def axis_plots(results: dict[str, Any], groups: Sequence[Group], folder: Path) -> list[Plot]:
    """One plot per swept axis with two values or more (``plots/axis-NAME.png``)."""
    made = [axis_plot(results, groups, name, d, folder / f"axis-{name}.png")
            for name, d in recorded_axes(results).items() if d.get("pairs") == WITHIN]
    return [p for p in made if p is not None]


def axis_plot(results: dict[str, Any], groups: Sequence[Group], name: str, axis: dict[str, Any],
              path: Path) -> Plot | None:
    """Median step time (slowest rank) of every arm at every value of axis ``name``, one line per (arm, np)."""
    at = valued(results, name)
    order = [v for v in axis.get("values") or [] if v in set(at.values())]
    order += sorted(set(at.values()) - set(order))
    if len(order) < 2:
        return None
    series = list(dict.fromkeys(shown_without(results, a, [name]) for a in arm_order(results) if a in at))
    col, title = colors(series), str(axis.get("title") or name)
    drawn = False
    with matplotlib.rc_context(RC):
        fig, ax = new_figure(6.0, 4.0)
        for s in series:
            for n in np_order(results):
                pts = sorted((order.index(at[g.arm]), g.step_ms_median) for g in groups if g.arm in at
                             and shown_without(results, g.arm, [name]) == s and g.np == n and g.step_ms_median)
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=col[s], label=f"{s} · np={n}")
                    for x, y in pts:
                        ax.annotate(f"{y:,.0f}", (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8)
                    drawn = True
        if not drawn:
            return None
        ax.set_xticks(range(len(order)), order)
        ax.set_xlabel(title)
        ax.set_ylabel("step time, ms (median, slowest rank)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"Step time against {name}")
        ax.legend(loc="best")
        save_figure(fig, path)
    return Plot(f"axis-{name}", path, f"Step time against {name}",
                f"Every arm ran at every {title}, the arms of one value side by side in each block. "
                + str(axis.get("note") or ""))
