"""The prediction on the terminal (a rich table per curve), as a PNG (matplotlib, Agg) and as JSON."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from dpcompare.files import atomic_write_figure, atomic_write_json
from dpcompare.prediction.sweep import Curve, pct
from dpcompare.report.table import fit_columns

JSON_FILE, PNG_FILE = "prediction.json", "prediction.png"
COLORS = ("#3b6fb6", "#e07b39", "#3a9a5b", "#c0404a", "#8a63b8", "#8c6d46")


#: columns left out, in this order, until a curve's table fits the console (every figure stays in prediction.json)
DROP_ORDER = ("hidden", "no overlap", "samples/s", "exposed", "compute", "fast/slow mode")


def _columns(c: Curve, threshold: float) -> list[tuple[str, Callable[[int], str]]]:
    """(heading, cell of the i-th host count) for every column the curve has."""
    ms = lambda lo_hi: f"{lo_hi[0] * 1e3:.1f}–{lo_hi[1] * 1e3:.1f}"  # noqa: E731

    def eff(i: int) -> str:
        e = c.efficiency(c.steps[i])
        band = f" ({100 * c.eff_bands[i + 1][0]:.0f}–{100 * c.eff_bands[i + 1][1]:.0f})" if c.bands else ""
        return (f"[red]{pct(e)}[/red]" if e < threshold else pct(e)) + band

    st = c.steps
    level = f"{100 * c.model_error.level:.0f} % interval" if c.model_error else ""
    cols: list[tuple[str, Callable[[int], str]] | None] = [
        ("hosts", lambda i: f"{st[i].hosts}"),
        ("ranks", lambda i: f"{st[i].ranks}") if any(s.ranks != s.hosts for s in st) else None,
        ("step ms", lambda i: f"{st[i].step * 1e3:.2f}"),
        ("95 % band", lambda i: ms(c.bands[i + 1])) if c.bands else None,
        (level, lambda i: ms(c.intervals[i + 1])) if c.intervals else None,
        ("fast/slow mode", lambda i: f"{c.modes[i + 1][0] * 1e3:.1f} / {c.modes[i + 1][1] * 1e3:.1f}")
        if c.modes else None,
        ("no overlap", lambda i: f"{st[i].no_overlap * 1e3:.2f}"),
        ("compute", lambda i: f"{st[i].compute * 1e3:.2f}"),
        ("exposed", lambda i: f"{st[i].exposed * 1e3:.2f}"),
        ("hidden", lambda i: f"{st[i].hidden * 1e3:.2f}"),
        ("samples/s", lambda i: f"{st[i].throughput:,.0f}"),
        ("efficiency", eff)]
    return [col for col in cols if col is not None]


def table(c: Curve, threshold: float, leave_out: Sequence[str] = ()) -> Table:
    t = Table(title=f"{c.label}  ·  one host: {c.base.step * 1e3:.2f} ms/step  ·  {c.knob_text}  ·  times in ms",
              title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    cols = [col for col in _columns(c, threshold) if col[0] not in leave_out]
    for head, _ in cols:
        t.add_column(head, justify="right", no_wrap=True)
    for i in range(len(c.steps)):
        t.add_row(*(cell(i) for _, cell in cols))
    return t


def fitted(console: Console, c: Curve, threshold: float) -> tuple[Table, list[str]]:
    """The curve's table no wider than the console, leaving out columns in :data:`DROP_ORDER` until it fits (a
    cell is never cut); the headings left out."""
    present = {head for head, _ in _columns(c, threshold)}
    return fit_columns(console, lambda left_out: table(c, threshold, left_out), present, DROP_ORDER, console.width)


def answers(curves: Sequence[Curve], threshold: float, link: str) -> list[str]:
    """"At how many hosts does each strategy fall below 80 % efficiency on LINK?", one line per curve."""
    out = []
    for c in curves:
        h = c.below(threshold)
        last = c.steps[-1]
        out.append(f"{c.label}: below {pct(threshold)} efficiency on {link} from {h} hosts" if h is not None else
                   f"{c.label}: stays at or above {pct(threshold)} on {link} up to {last.hosts} hosts "
                   f"({pct(c.efficiency(last))} there)")
    return out


def make_console() -> Console:
    """A console that does not squeeze the tables to 80 columns when the output is a file or a pipe."""
    c = Console(highlight=False)
    return c if c.is_terminal else Console(highlight=False, width=max(c.width, 130))


def show(console: Console, curves: Sequence[Curve], lines: dict[str, list[str]], threshold: float) -> None:
    for c in curves:
        t, dropped = fitted(console, c, threshold)
        console.print(t)
        if dropped:
            console.print(f"  left out to fit {console.width} columns: {', '.join(dropped)} (all in {JSON_FILE})",
                          style="dim")
        if chk := c.measured.get("self_check"):
            lat = f", {chk['alpha_us']:g} us a step" if chk.get("alpha_us") else ""
            console.print(f"  self-check at the traced size (np={c.measured['world_size']}, all-reduces at "
                          f"{chk['busbw_gbit']:g} Gbit/s{lat} as traced): model {chk['model_step_ms']:.2f} ms per "
                          "step, "
                          f"traced {chk['traced_step_ms']:.2f} ms ({chk['error_pct']:+.0f} %)", style="dim")
        for note in c.notes:
            console.print(f"  note: {note}", style="dim")
    headings = {"who_wins": "who wins", "below_threshold": f"below {pct(threshold)} efficiency",
                "knob_advice": "the knob that would help most",
                "band_advice": "bands wider than ±5 %: measure more", "overlap": "overlap of communication and compute",
                "interval": "the interval"}
    for key, items in lines.items():
        if items:
            console.print(f"[bold]{headings.get(key, key)}[/bold]")
            for line in items:
                console.print(f"  {line}")


def plot(curves: Sequence[Curve], path: Path, threshold: float, title: str) -> Path:
    # lazy: matplotlib is slow to import; only plotting needs it
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib is slow to import; only plotting needs it
    from matplotlib.figure import Figure

    # lazy: matplotlib is slow to import; only plotting needs it
    from matplotlib.ticker import FuncFormatter, NullFormatter, PercentFormatter

    fig = Figure(figsize=(11, 4.2), dpi=120)
    ax_t, ax_e = fig.subplots(1, 2)
    for i, c in enumerate(curves):
        hosts = [s.hosts for s in c.steps]
        color = COLORS[i % len(COLORS)]
        ax_t.plot(hosts, [s.step * 1e3 for s in c.steps], "o-", color=color, label=c.label)
        if c.intervals:
            ax_t.fill_between(hosts, [b[0] * 1e3 for b in c.intervals[1:]], [b[1] * 1e3 for b in c.intervals[1:]],
                              color=color, alpha=0.07, linewidth=0)
        if c.bands:
            ax_t.fill_between(hosts, [b[0] * 1e3 for b in c.bands[1:]], [b[1] * 1e3 for b in c.bands[1:]],
                              color=color, alpha=0.18, linewidth=0)
            ax_e.fill_between(hosts, [100 * b[0] for b in c.eff_bands[1:]], [100 * b[1] for b in c.eff_bands[1:]],
                              color=color, alpha=0.18, linewidth=0)
        ax_t.plot(hosts, [s.compute * 1e3 for s in c.steps], ":", color=color, linewidth=1)
        ax_e.plot(hosts, [100 * c.efficiency(s) for s in c.steps], "o-", color=color, label=c.label)
    ax_e.axhline(100 * threshold, color="#999999", linestyle="--", linewidth=1)
    hosts = sorted({s.hosts for c in curves for s in c.steps})
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax, ylabel in ((ax_t, "step time, ms"), (ax_e, "scaling efficiency vs 1 host")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(hosts if len(hosts) <= 12 else hosts[:: -(-len(hosts) // 12)])
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("hosts")
        ax.set_ylabel(ylabel)
        ax.grid(True, color="#e6e6e6")
    ax_t.set_yscale("log")
    ax_t.yaxis.set_major_formatter(plain)
    ax_t.yaxis.set_minor_formatter(plain)
    ax_e.set_ylim(0, 105)
    ax_e.yaxis.set_major_formatter(PercentFormatter())
    ax_e.legend(fontsize=8, frameon=False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=11, fontweight="bold")
    shades = "shaded: 95 % bootstrap band from the inputs' noise" + (
        f", lighter: {100 * curves[0].model_error.level:.0f} % interval with the model's error"
        if curves and curves[0].model_error else "")
    fig.text(0.99, 0.975, f"{shades} · dotted: compute alone", ha="right",
             va="top", fontsize=8, color="#555555")
    fig.tight_layout()
    return atomic_write_figure(path, fig)


def write_json(path: Path, inputs: dict[str, Any], curves: Sequence[Curve], lines: dict[str, list[str]],
               threshold: float) -> Path:
    return atomic_write_json(path, {"inputs": inputs, "curves": [c.as_dict(threshold) for c in curves],
                                    **lines})
