"""``dpcompare timeline RUN_DIR...``: one traced step drawn per run ("one step, drawn"), a PNG.

For every run (a ``dpcompare train --trace N`` folder) a Gantt chart of one step with, per rank, three
lanes: the compute phases as bands (Horovod's wait inside ``step()`` hatched over the optimizer band),
a tick when each parameter's gradient was ready, and the all-reduce spans. Several runs share one time
axis (milliseconds since the first rank began the step), so DDP's buckets inside backward and Horovod's
fused all-reduces followed by the wait at ``step()`` can be compared at a glance.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpcompare import trace as tr
from dpcompare.errors import ConfigError
from dpcompare.files import atomic_write_figure
from dpcompare.options import deprecate

COMM_COLOR, COMM_PHASE_COLOR, GRAD_COLOR, WAIT_COLOR = "#2f6db5", "#15365c", "#333333", "#c0303a"
LANES = ("compute", "grad ready", "all-reduce")


def load_trace(path: str | Path) -> dict[str, Any]:
    """A trace.json (or a run folder holding one), checked enough to draw; ConfigError (one line) otherwise."""
    path = Path(path)
    if path.is_dir():
        path = path / tr.TRACE_FILE
    if not path.is_file():
        raise ConfigError(f"{path} not found; run `dpcompare train --trace N --out DIR` first")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not a readable trace ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ConfigError(f"{path} is not a dpcompare trace (no traceEvents)")
    return data


def pick_step(events: Sequence[dict[str, Any]]) -> int | None:
    """The traced step to draw: the one of median duration on rank 0 (ties: the later one)."""
    steps = tr.steps_by_rank(events).get(0, [])
    if not steps:
        return None
    ordered = sorted(steps, key=lambda e: (e["dur"], e["args"]["step"]))
    return int(ordered[len(ordered) // 2]["args"]["step"])


def _step_of(events: Sequence[dict[str, Any]], rank: int, step: int) -> dict[str, Any] | None:
    return next((e for e in tr.steps_by_rank(events).get(rank, []) if e["args"]["step"] == step), None)


def _label(data: dict[str, Any], fallback: str) -> str:
    o = data.get("otherData") or {}
    parts = [str(o.get("strategy", fallback))]
    if o.get("world_size"):
        parts.append(f"np={o['world_size']}")
    if o.get("model"):
        parts.append(str(o["model"]))
    if o.get("batch_size"):
        parts.append(f"batch {o['batch_size']}/process")
    return " · ".join(parts)


def step_window(data: dict[str, Any], step: int | None = None) -> tuple[int, float, float] | None:
    """(step, start, length in ms) of the drawn step: from the first rank's start to the last rank's end."""
    events = data["traceEvents"]
    step = pick_step(events) if step is None else step
    sts = [s for r in tr.steps_by_rank(events) if (s := _step_of(events, r, step)) is not None]
    if step is None or not any(s["pid"] == 0 for s in sts):
        return None
    start = min(s["ts"] for s in sts)
    return step, start, (max(s["ts"] + s["dur"] for s in sts) - start) / 1e3


def _draw_run(ax: Any, data: dict[str, Any], step: int, t0: float, title: str) -> None:
    from dpcompare.report.plots import PHASE_COLORS  # here, not at the top: it loads numpy and scipy and matplotlib

    events = data["traceEvents"]
    ranks = sorted(tr.steps_by_rank(events))
    ms = lambda ts: (ts - t0) / 1e3  # noqa: E731
    yticks, ylabels = [], []
    row = 0
    for rank in ranks:
        st = _step_of(events, rank, step)
        if st is None:
            continue
        y_cmp, y_grd, y_com = row, row + 1, row + 2
        for y, name in zip((y_cmp, y_grd, y_com), LANES, strict=True):
            yticks.append(y)
            ylabels.append(f"rank {rank} · {name}")
        for e in tr.events_in(events, st, tr.CAT_PHASE):
            ax.broken_barh([(ms(e["ts"]), e["dur"] / 1e3)], (y_cmp - 0.38, 0.76), color=PHASE_COLORS[e["name"]],
                           edgecolor="white", linewidth=0.6)
        for e in tr.events_in(events, st, tr.CAT_WAIT):
            ax.broken_barh([(ms(e["ts"]), e["dur"] / 1e3)], (y_cmp - 0.38, 0.76), facecolor="none",
                           edgecolor=WAIT_COLOR, hatch="////", linewidth=0.8)
        ticks = [ms(e["ts"]) for e in tr.events_in(events, st, tr.CAT_GRAD)]
        ax.vlines(ticks, y_grd - 0.32, y_grd + 0.32, color=GRAD_COLOR, linewidth=1.0)
        comm = tr.events_in(events, st, tr.CAT_COMM)
        span = st["dur"] / 1e3
        for e in comm:
            x, w = ms(e["ts"]), e["dur"] / 1e3
            ax.broken_barh([(x, w)], (y_com - 0.38, 0.76), color=COMM_COLOR, alpha=0.75, edgecolor="white",
                           linewidth=0.6)
            nbytes = (e.get("args") or {}).get("bytes")
            if nbytes and w > 0.09 * span:
                ax.text(x + w / 2, y_com, _size(nbytes), ha="center", va="center", fontsize=7.5, color="white")
        for e in tr.events_in(events, st, tr.CAT_COMM_PHASE):
            ax.broken_barh([(ms(e["ts"]), e["dur"] / 1e3)], (y_com - 0.38, 0.16), color=COMM_PHASE_COLOR)
        if not comm:
            note = ("no all-reduce recorded on this rank (the library's own timeline is written by rank 0 only)"
                    if data.get("otherData", {}).get("library_timeline_rank0") and rank else "no all-reduce")
            ax.text(0.005, y_com, note, transform=ax.get_yaxis_transform(), va="center", fontsize=7.5,
                    color="#777777")
        row += 3.6
    ax.set_yticks(yticks, ylabels)
    ax.set_ylim(max(yticks, default=0) + 0.7, -0.7)
    ax.grid(axis="y", visible=False)
    ax.set_title(title, fontsize=10)


def _size(n: float) -> str:
    for unit, f in (("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n:.0f} B"


def _caption(data: dict[str, Any], step: int) -> str:
    """Two lines: the drawn step, then the means over the traced steps."""
    events = data["traceEvents"]
    fig = tr.communication_figures(events)
    st = _step_of(events, 0, step)
    first = f"step {step} drawn ({st['dur'] / 1e3 if st else 0:.1f} ms on rank 0)"
    parts = []
    if fig["allreduce_ops_per_step"]:
        overlap = "–" if fig["overlap_pct"] is None else f"{fig['overlap_pct']:.0f} %"
        parts.append(f"all-reduce {fig['comm_ms_per_step']:.1f} ms ({overlap} hidden behind backward), "
                     f"{fig['allreduce_ops_per_step']:.3g} op(s), {_size(fig['allreduce_bytes_per_step'])}")
    if fig["wait_ms_per_step"]:
        parts.append(f"wait in step() {fig['wait_ms_per_step']:.1f} ms")
    return first + ("\nper traced step: " + " · ".join(parts) if parts else "")


def render(runs: Sequence[str | Path], path: str | Path, step: int | None = None,
           labels: Sequence[str] | None = None) -> Path:
    """Draw one step of each run (a run folder or a trace.json) on one shared time axis; write ``path``."""
    # lazy: matplotlib is slow to import; only plotting needs it
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib is slow to import; only plotting needs it
    from matplotlib.figure import Figure

    # lazy: matplotlib is slow to import; only plotting needs it
    from matplotlib.lines import Line2D

    # lazy: matplotlib is slow to import; only plotting needs it
    from matplotlib.patches import Patch

    # here, not at the top: it loads numpy and scipy and matplotlib
    from dpcompare.report.plots import DPI, PHASE_COLORS, RC

    loaded = []
    for i, r in enumerate(runs):
        data = load_trace(r)
        win = step_window(data, step)
        if win is None:
            raise ConfigError(f"{r}: no traced step{'' if step is None else f' {step}'} on rank 0 to draw")
        label = labels[i] if labels else _label(data, Path(r).name)
        loaded.append((data, win, label))
    xmax = max(w[2] for _, w, _ in loaded) * 1.02
    heights = [3.6 * len(tr.steps_by_rank(d["traceEvents"])) * 0.34 + 0.9 for d, _, _ in loaded]
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(11, sum(heights) + 0.7), layout="constrained")
        axes = fig.subplots(len(loaded), 1, sharex=True, height_ratios=heights, squeeze=False)[:, 0]
        for ax, (data, (k, t0, _), label) in zip(axes, loaded, strict=True):
            _draw_run(ax, data, k, t0, f"{label} · {_caption(data, k)}")
            ax.set_xlim(0, xmax)
        axes[-1].set_xlabel("milliseconds since the first rank began the step (one clock for every rank)")
        handles = [Patch(color=PHASE_COLORS[p], label=p) for p in PHASE_COLORS]
        handles += [Patch(facecolor="none", edgecolor=WAIT_COLOR, hatch="////", label="wait in step()"),
                    Patch(color=COMM_COLOR, alpha=0.75, label="all-reduce (DDP: a bucket; Horovod: a fused op)"),
                    Patch(color=COMM_PHASE_COLOR, label="inside: memcpy / MPI all-reduce (Horovod)"),
                    Line2D([], [], color=GRAD_COLOR, marker="|", linestyle="none", markersize=10,
                           label="gradient ready (one parameter)")]
        fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8.5)
        path = atomic_write_figure(path, fig, dpi=DPI, metadata={"Software": None})
    return path


def _cmd_timeline(a: argparse.Namespace) -> int:
    first = Path(a.runs[0])
    out = Path(a.out) if a.out else (first if first.is_dir() else first.parent) / "timeline.png"
    path = render(a.runs, out, step=a.step)
    print(f"wrote {path}")
    return 0


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:

    p = sub.add_parser("timeline", help="draw one traced step of one or more runs (PNG) on one time axis",
                       description="Draw one step recorded by `dpcompare train --trace N`: per rank the compute "
                                   "phases, the moment each gradient was ready and the all-reduces. Several runs "
                                   "are drawn one above the other on the same time axis.",
                       epilog="examples:\n  dpcompare timeline runs/traced\n"
                              "  dpcompare timeline runs/ab/runs/*-np2-r0 --out-file steps.png   # arms one above "
                              "the other",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a --out folder of `train --trace N` (or its trace.json)")
    p.add_argument("--out-file", dest="out", metavar="PNG",
                   help="where to write the picture (default: RUN_DIR/timeline.png)")
    deprecate(p, "--out", "--out-file")
    p.add_argument("--step", type=int, help="which traced step to draw (default: the median-length one)")
    p.set_defaults(func=_cmd_timeline)

