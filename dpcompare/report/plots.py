"""PNG figures of a comparison (matplotlib, Agg; no pyplot state, no display needed).

Every figure is keyed by strategy name and np generically: colours follow the order of the
strategies in results.json, line styles and markers the process counts.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from dpcompare.files import PHASES, atomic_write_figure
from dpcompare.report import fmt  # noqa: E402
from dpcompare.report.groups import (  # noqa: E402
    Group,
    arm_of,
    find,
    metric_of,
    np_order,
    run_throughput,
    strategy_order,
    tta_target,
)
from dpcompare.report.verdicts import Verdict  # noqa: E402

STRATEGY_COLORS = ("#3b6fb6", "#e07b39", "#3a9a5b", "#c0404a", "#8a63b8", "#8c6d46", "#d46ea8", "#6f7782")
PHASE_COLORS = {"data": "#b9c0c8", "forward": "#6fb7c9", "backward": "#f2a541", "optimizer": "#a05fa8"}
PHASE_NAMES = {"data": "data wait", "forward": "forward", "backward": "backward (DDP's all-reduce overlaps here)",
               "optimizer": "optimizer step (Horovod's synchronize waits here)"}
NP_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))
DPI = 120
RC = {
    "font.size": 10, "axes.titlesize": 11.5, "axes.titleweight": "bold", "axes.titlelocation": "left",
    "axes.labelsize": 10, "axes.labelcolor": "#333333", "axes.edgecolor": "#999999", "axes.linewidth": 0.8,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.color": "#e6e6e6",
    "grid.linewidth": 0.8, "axes.axisbelow": True, "xtick.color": "#555555", "ytick.color": "#555555",
    "legend.frameon": False, "legend.fontsize": 9, "figure.facecolor": "white", "savefig.facecolor": "white",
}


@dataclass
class Plot:
    key: str
    path: Path
    title: str
    caption: str


def colors(strategies: Sequence[str]) -> dict[str, str]:
    return {s: STRATEGY_COLORS[i % len(STRATEGY_COLORS)] for i, s in enumerate(strategies)}


def _np_style(nps: Sequence[int], n: int) -> tuple[str, str]:
    return NP_STYLES[list(nps).index(n) % len(NP_STYLES)]


@dataclass
class Series:
    """The runs of one (arm, np) and how their line is drawn."""

    arm: str
    np: int
    runs: list[dict[str, Any]]
    color: str
    ls: str
    marker: str
    lw: float
    alpha: float

    def line(self, ax: Any, xs: Sequence[float], ys: Sequence[float], lo: Sequence[float], hi: Sequence[float],
             ms: float = 4.0) -> None:
        """The mean line, and the min–max band when several runs make it."""
        ax.plot(xs, ys, ls=self.ls, marker=self.marker, ms=ms if self.lw < 2 else 0, lw=self.lw, alpha=self.alpha,
                color=self.color, label=f"{self.arm} · np={self.np}", solid_capstyle="round")
        if len(self.runs) > 1:
            ax.fill_between(xs, lo, hi, color=self.color, alpha=0.12, lw=0)


def _series(runs: Sequence[dict[str, Any]], arms: Sequence[str], nps: Sequence[int]) -> Iterator[Series]:
    """One series per (arm, np) that has runs; the first arm is drawn wide and pale, the others narrow on
    top, so identical curves stay visible."""
    col = colors(arms)
    for si, a in enumerate(arms):
        for n in nps:
            rs = [r for r in runs if arm_of(r) == a and r["np"] == n]
            if rs:
                lw, alpha = (4.5, 0.45) if si == 0 and len(arms) > 1 else (1.6, 0.95)
                yield Series(a, n, rs, col[a], *_np_style(nps, n), lw, alpha)


def save_figure(fig: Figure, path: Path) -> Path:
    return atomic_write_figure(path, fig, dpi=DPI, bbox_inches="tight", pad_inches=0.15, metadata={"Software": None})


def new_figure(w: float, h: float, ncols: int = 1) -> tuple[Figure, Any]:
    fig = Figure(figsize=(w, h), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, axes


def _metric_axis(runs: Sequence[dict[str, Any]]) -> tuple[str, float, str]:
    """The runs' metric as a plot shows it: its name, the scale of its values (100 for a share in %) and the
    axis label."""
    metric = metric_of(runs)
    name, pct = str(metric["name"]), metric.get("unit") == "%"
    return name, 100.0 if pct else 1.0, f"test {name}" + (" (%)" if pct else "")


def _metric_value(row: dict[str, Any]) -> Any:
    """An epoch's or evaluation's value of the workload's metric (older rows: the test accuracy)."""
    return row.get("test_metric", row.get("test_accuracy"))


def curves(results: dict[str, Any], path: Path) -> Plot | None:
    """Train loss and the workload's test metric per epoch; a line per (strategy, np), the mean over repeats
    (band: min–max)."""
    runs = [r for r in results.get("runs", []) if r.get("status") == "ok" and r.get("metrics")]
    if not runs:
        return None
    strategies, nps = strategy_order(results), np_order(results)
    name, scale_m, label = _metric_axis(runs)
    with matplotlib.rc_context(RC):
        fig, (ax_l, ax_a) = new_figure(10, 3.9, 2)
        for ser in _series(runs, strategies, nps):
            for ax, value, scale in ((ax_l, lambda row: row.get("train_loss"), 1.0), (ax_a, _metric_value, scale_m)):
                by_epoch: dict[int, list[float]] = {}
                for r in ser.runs:
                    for row in r["metrics"]:
                        if value(row) is not None:
                            by_epoch.setdefault(int(row["epoch"]), []).append(scale * float(value(row)))
                if by_epoch:
                    ep = sorted(by_epoch)
                    ser.line(ax, ep, [statistics.fmean(by_epoch[e]) for e in ep], [min(by_epoch[e]) for e in ep],
                             [max(by_epoch[e]) for e in ep])
        ax_l.set_title("Training loss")
        ax_l.set_xlabel("epoch")
        ax_l.set_ylabel("mean train loss (log scale)")
        ax_l.set_yscale("log")
        ax_a.set_title(f"Test {name}")
        ax_a.set_xlabel("epoch")
        ax_a.set_ylabel(label)
        for ax in (ax_l, ax_a):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        # one legend row per strategy, one column per np (the legend fills column by column)
        entries = dict(zip(*reversed(ax_a.get_legend_handles_labels()), strict=True))
        order = [f"{s} · np={n}" for n in nps for s in strategies if f"{s} · np={n}" in entries]
        fig.legend([entries[k] for k in order], order, loc="outside lower center", handlelength=3.2,
                   ncols=max(1, len(order) // max(1, len({k.split(" · ")[0] for k in order}))))
        save_figure(fig, path)
    return Plot("curves", path, f"Loss and {name} per epoch",
                "Mean over repeats (shaded: min–max). Same seed and data order for every strategy, so matching "
                "curves mean the strategies computed the same thing; the first strategy is drawn wide and pale "
                "so that curves lying exactly on top of each other stay visible.")


def _whisker(ax: Any, x: float, iv: Any, top: float) -> tuple[float, bool]:
    """The 95 % interval of one bar, ending in an arrow (and its value) above ``top``; where the bar's label
    goes, and whether the whisker was cut."""
    if not iv.has_ci:
        return iv.mean, False
    lo, hi = max(iv.lo, 0.0), max(min(iv.hi, top), iv.mean)
    clipped = hi < iv.hi
    yerr = [[max(iv.mean - lo, 0.0)], [hi - iv.mean]]
    ax.errorbar(x, iv.mean, yerr=yerr, fmt="none", ecolor="#222222",
                elinewidth=1.3, capsize=0 if clipped else 5, capthick=1.3, zorder=4)
    if not clipped:
        return hi, False
    ax.annotate("", (x, hi * 1.035), (x, hi), zorder=4, arrowprops={"arrowstyle": "-|>", "color": "#222222", "lw": 1.3})
    ax.annotate(f"CI to {fmt.rate(iv.hi)}", (x, hi * 1.035), xytext=(5, 0),
                textcoords="offset points", fontsize=7.5, color="#555555", va="center")
    return iv.mean, True


def throughput(groups: Sequence[Group], strategies: Sequence[str], nps: Sequence[int], path: Path) -> Plot | None:
    """Global samples/s per np (groups of bars) and strategy, with 95 % t-intervals and every repeat as a dot."""
    if not any(g.samples_per_sec for g in groups):
        return None
    col = colors(strategies)
    width = 0.8 / max(len(strategies), 1)
    no_ci = False
    with matplotlib.rc_context(RC):
        fig, ax = new_figure(max(5.5, 1.6 + 1.5 * len(nps) * len(strategies) ** 0.5 * 1.3), 4.2)
        # Whiskers far beyond every measurement (2 repeats on a noisy machine) would flatten the bars:
        # the axis stops at 1.4 × the largest measurement and longer whiskers end in an arrow.
        seen = max(max([g.samples_per_sec.mean, *g.throughputs]) for g in groups if g.samples_per_sec)
        top = max(min(g.samples_per_sec.hi or 0.0, seen * 1.4) for g in groups if g.samples_per_sec)
        top = max(top, seen) * 1.12
        for si, s in enumerate(strategies):
            for ni, n in enumerate(nps):
                g = find(groups, s, n)
                if g is None or g.samples_per_sec is None:
                    continue
                x = ni + (si - (len(strategies) - 1) / 2) * width
                iv = g.samples_per_sec
                ax.bar(x, iv.mean, width * 0.86, color=col[s], alpha=0.85, label=s if ni == 0 else None, zorder=2)
                label_y, clipped = _whisker(ax, x, iv, top / 1.12)
                no_ci = no_ci or not iv.has_ci
                k = len(g.throughputs)
                offs = [(i - (k - 1) / 2) * min(0.5 * width / max(k, 1), 0.06) for i in range(k)]
                ax.scatter([x + o for o in offs], g.throughputs, s=14, color="white", edgecolor="#222222",
                           linewidth=0.8, zorder=5)
                label = fmt.rate(iv.mean) + ("" if iv.has_ci else "\n(n=1, no CI)")
                label_y = max([label_y, *(t for t in g.throughputs if t <= top / 1.12)])  # above the dots too
                ax.annotate(label, (x, label_y), xytext=(0, 6), textcoords="offset points", ha="center",
                            va="bottom", fontsize=8.5, color="#333333", zorder=6,
                            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85}
                            if clipped else None)
        ax.set_xticks(range(len(nps)), [f"np={n}" for n in nps])
        ax.set_ylim(0, top)
        ax.set_ylabel("samples / s (global, slowest rank decides)")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt.rate(v)))
        ax.grid(axis="x", visible=False)
        ax.set_title("Throughput")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, clear of the labels
        save_figure(fig, path)
    cap = ("Bars: mean over repeats; whiskers: 95 % t-interval; dots: individual repeats. Throughput is the "
           "global rate over the timed steps, decided by the slowest rank.")
    if no_ci:
        cap += " Configurations with a single successful repeat have no confidence interval (n=1, no CI)."
    return Plot("throughput", path, "Throughput per strategy and process count", cap)


def breakdown(groups: Sequence[Group], path: Path) -> Plot | None:
    """Stacked median time per phase of a step, a bar per (strategy, np)."""
    gs = [g for g in groups if g.phases_ms]
    if not gs:
        return None
    with matplotlib.rc_context(RC):
        fig, ax = new_figure(10, 1.3 + 0.55 * len(gs))
        labels = [f"{g.arm} · np={g.np}" for g in gs]
        y = list(range(len(gs)))[::-1]
        total = max(sum(g.phases_ms.values()) for g in gs)
        left = [0.0] * len(gs)
        for p in PHASES:
            vals = [g.phases_ms.get(p, 0.0) for g in gs]
            ax.barh(y, vals, 0.62, left=left, color=PHASE_COLORS[p], label=PHASE_NAMES[p], edgecolor="white",
                    linewidth=0.8, zorder=2)
            for yi, v, lft in zip(y, vals, left, strict=True):
                if v >= 0.085 * total:
                    ax.text(lft + v / 2, yi, fmt.ms(v), ha="center", va="center", fontsize=8.5, color="#1d1d1d")
            left = [a + b for a, b in zip(left, vals, strict=True)]
        for yi, tot in zip(y, left, strict=True):
            ax.text(tot + total * 0.01, yi, f"{fmt.ms(tot)} ms", va="center", fontsize=8.5, color="#333333")
        ax.set_yticks(y, labels)
        ax.set_xlim(0, total * 1.12)
        ax.set_xlabel("milliseconds per step (median per phase, mean over ranks and repeats)")
        ax.grid(axis="y", visible=False)
        ax.set_title("Where a step's time goes")
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.02 + 0.02 * (8 - min(len(gs), 8)) / 8), ncols=2,
                  fontsize=8.5)
        ax.set_title("Where a step's time goes", pad=42)
        save_figure(fig, path)
    return Plot("breakdown", path, "Step-time breakdown",
                "Medians per phase of a training step. DDP all-reduces gradient buckets from autograd hooks while "
                "backward() still runs, so its communication lands in the backward bar; Horovod's "
                "DistributedOptimizer waits for its all-reduces in optimizer.step(), so its communication lands "
                "in the optimizer bar.")


def scaling(groups: Sequence[Group], strategies: Sequence[str], nps: Sequence[int], path: Path) -> Plot | None:
    """Speed-up and scaling efficiency throughput(np) / (np · throughput(1)); needs np=1 and another np."""
    if len(nps) < 2 or 1 not in nps or not any(g.efficiency is not None and g.np > 1 for g in groups):
        return None
    col = colors(strategies)
    with matplotlib.rc_context(RC):
        fig, (ax_s, ax_e) = new_figure(10, 3.9, 2)
        ax_s.plot(nps, nps, color="#999999", ls="--", lw=1, label="ideal (linear)")
        ax_e.axhline(100, color="#999999", ls="--", lw=1, label="ideal")
        for si, s in enumerate(strategies):
            pts = [(g.np, g.efficiency) for n in nps if (g := find(groups, s, n)) and g.efficiency is not None]
            if not pts:
                continue
            x = [p[0] for p in pts]
            ax_s.plot(x, [n * e for n, e in pts], marker="o", color=col[s], lw=2, label=s)
            ax_e.plot(x, [100 * e for _, e in pts], marker="o", color=col[s], lw=2, label=s)
            for n, e in pts:
                if n > 1:
                    ax_e.annotate(f"{100 * e:.0f} %", (n, 100 * e), xytext=(0, 9 if si % 2 == 0 else -11),
                                  textcoords="offset points", ha="center", va="center", fontsize=8.5,
                                  color=col[s], fontweight="bold")
        for ax in (ax_s, ax_e):
            ax.set_xticks(list(nps))
            ax.set_xlim(min(nps) - 0.25 * (max(nps) - min(nps)) / len(nps), max(nps) * 1.06)
            ax.set_xlabel("processes (np)")
        ax_s.set_title("Speed-up over np=1")
        ax_s.set_ylabel("throughput(np) / throughput(1)")
        ax_s.legend(loc="upper left")
        ax_e.set_title("Scaling efficiency")
        ax_e.set_ylabel("throughput(np) / (np · throughput(1))  %")
        ax_e.set_ylim(0, max(110, *(100 * g.efficiency + 15 for g in groups if g.efficiency)))
        save_figure(fig, path)
    return Plot("scaling", path, "Scaling",
                "Speed-up and efficiency against the same strategy at np=1 (means over repeats). Efficiency "
                "below 100 % is time spent communicating or waiting; on a machine with fewer cores than "
                "processes it also measures the processes competing for cores.")


def drift(results: dict[str, Any], verdicts: Sequence[Verdict], path: Path) -> Plot | None:
    """Per-run throughput in the order the runs ran, and the per-block ratios behind each verdict."""
    runs = [(i, r, v) for i, r in enumerate(results.get("runs", []))
            if r.get("status") == "ok" and (v := run_throughput(r)) is not None]
    if len(runs) < 2:
        return None
    arms, nps = strategy_order(results), np_order(results)
    col = colors(arms)
    shown = [v for v in verdicts if v.block_ratios and v.metric == "throughput"]
    with matplotlib.rc_context(RC):
        fig, axes = new_figure(10, 3.9, 2 if shown else 1)
        ax_r, ax_b = (axes[0], axes[1]) if shown else (axes, None)
        for s in arms:
            for n in nps:
                pts = [(i, v) for i, r, v in runs if arm_of(r) == s and int(r["np"]) == n]
                if pts:
                    ax_r.plot([p[0] + 1 for p in pts], [p[1] for p in pts], ls="none", marker=_np_style(nps, n)[1],
                              ms=5, color=col[s], label=f"{s} · np={n}")
        ax_r.set_title("Throughput per run, in run order")
        ax_r.set_xlabel("run (in the order it ran)")
        ax_r.set_ylabel("samples / s (global batch ÷ median step)")
        ax_r.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt.rate(v)))
        ax_r.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_r.legend(loc="best", fontsize=8)
        if ax_b is not None:
            eq = shown[0].equivalence
            ax_b.axhline(1.0, color="#999999", lw=1)
            ax_b.axhspan(1 - eq, 1 + eq, color="#999999", alpha=0.10, lw=0, label=f"±{100 * eq:g} % (equal)")
            for k, v in enumerate(shown):
                c = col.get(v.other, STRATEGY_COLORS[k % len(STRATEGY_COLORS)])
                ls = _np_style(nps, v.np)[0] if v.np in nps else "-"
                ax_b.plot([r + 1 for r in v.block_repeats], v.block_ratios, marker="o", ms=4, lw=0.8, ls=ls, color=c,
                          label=f"{v.other}/{v.baseline} · np={v.np}: {v.outcome}")
                if v.ci_low is not None and v.ci_high is not None:
                    ax_b.axhspan(v.ci_low, v.ci_high, color=c, alpha=0.22, lw=0)
                    ax_b.axhline(v.ratio, color=c, lw=1.6, ls=ls)
            seen = [x for v in shown for x in v.block_ratios] + [1 - eq, 1 + eq]
            pad = 0.15 * (max(seen) - min(seen))
            ax_b.set_ylim(min(seen) - pad, max(seen) + pad)  # a very wide interval fills the axis, clipped
            ax_b.set_title("Ratio within each block, and the verdict")
            ax_b.set_xlabel("block (repeat)")
            ax_b.set_ylabel("throughput ratio other / baseline")
            ax_b.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax_b.legend(loc="best", fontsize=8)
        save_figure(fig, path)
    return Plot("drift", path, "Drift and pairing",
                "Left: every run's throughput in the order the runs ran; a shared machine drifts, and both arms of a "
                "block drift together. Right: the ratio of the two arms within each block (dots), the verdict's "
                "ratio (line) and its 95 % interval (band); the grey band is the equivalence margin.")


def accuracy_curves(results: dict[str, Any], path: Path) -> Plot | None:
    """The workload's test metric against training time and against steps: a line per (arm, np), the mean over
    seeds and repeats at each evaluation point (band: min–max), with the --target-accuracy line."""
    runs = [r for r in results.get("runs", []) if r.get("status") == "ok" and r.get("eval_curve")]
    if not runs:
        return None
    name, scale, label = _metric_axis(runs)
    arms, nps = strategy_order(results), np_order(results)
    target = tta_target(results)
    with matplotlib.rc_context(RC):
        fig, (ax_t, ax_s) = new_figure(10, 3.9, 2)
        for ser in _series(runs, arms, nps):
            by_step: dict[int, list[tuple[float, float]]] = {}
            for r in ser.runs:
                for row in r["eval_curve"]:
                    by_step.setdefault(int(row["step"]), []).append(
                        (float(row["train_seconds"]), scale * float(_metric_value(row))))
            steps = [k for k in sorted(by_step) if len(by_step[k]) == len(ser.runs)]  # points every run has
            if not steps:
                continue
            secs = [statistics.fmean(t for t, _ in by_step[k]) for k in steps]
            acc = [statistics.fmean(a for _, a in by_step[k]) for k in steps]
            lo = [min(a for _, a in by_step[k]) for k in steps]
            hi = [max(a for _, a in by_step[k]) for k in steps]
            for ax, xs in ((ax_t, secs), (ax_s, steps)):
                ser.line(ax, xs, acc, lo, hi, ms=3.5)
        for ax in (ax_t, ax_s):
            if target:
                ax.axhline(scale * target, color="#c0303a", lw=1, ls="--", label=f"target {scale * target:g}"
                           + (" %" if scale == 100.0 else ""))
            ax.set_ylabel(label)
        ax_t.set_title(f"Test {name} vs training time")
        ax_t.set_xlabel("training seconds (start-up and evaluation excluded; slowest rank)")
        ax_s.set_title(f"Test {name} vs optimizer steps")
        ax_s.set_xlabel("optimizer step")
        ax_s.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_s.legend(loc="lower right", fontsize=8)
        save_figure(fig, path)
    n_seeds = len({r.get("seed") for r in runs})
    return Plot("accuracy", path, f"Test {name} against time and steps",
                f"Mean over {n_seeds} seed{'s' if n_seeds != 1 else ''} (and repeats) at every evaluation point "
                "(shaded: min–max). Time counts the optimizer steps only (the slowest rank's), not start-up or the "
                "evaluations themselves; the dashed line is --target-accuracy. The first arm is drawn wide and pale "
                "so that identical curves stay visible.")


def make_all(results: dict[str, Any], groups: Sequence[Group], folder: Path,
             verdicts: Sequence[Verdict] = ()) -> list[Plot]:
    """Every figure that has data, written to ``folder``; in report order."""
    strategies, nps = strategy_order(results), np_order(results)
    made = [throughput(groups, strategies, nps, folder / "throughput.png"),
            drift(results, verdicts, folder / "drift.png"),
            breakdown(groups, folder / "breakdown.png"),
            scaling(groups, strategies, nps, folder / "scaling.png"),
            curves(results, folder / "curves.png"),
            accuracy_curves(results, folder / "accuracy.png")
            if (results.get("config") or {}).get("seeds") or tta_target(results) else None]
    return [p for p in made if p is not None]
