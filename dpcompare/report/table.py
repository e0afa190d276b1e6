"""The terminal side of a report: a rich table per (strategy, np) and a verdict per np."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from dpcompare.files import PHASES
from dpcompare.report import attribution, fmt, noise, regime
from dpcompare.report.groups import (
    MEMORY_KINDS,
    MEMORY_LABELS,
    Group,
    arm_of,
    launch_note,
    measured_share,
    metric_of,
    workload_label,
)
from dpcompare.report.verdicts import Verdict

PHASE_LABELS = {"data": "data", "forward": "fwd", "backward": "bwd", "optimizer": "opt"}


def next_strategy_differs(groups: Sequence[Group], g: Group) -> bool:
    i = list(groups).index(g)
    return i + 1 < len(groups) and groups[i + 1].arm != g.arm


def console_for_report() -> Console:
    """A console that does not squeeze the table to 80 columns when the output is a file or a pipe."""
    c = Console(highlight=False)
    return c if c.is_terminal else Console(highlight=False, width=max(c.width, 150))


def others_by_group(results: dict[str, Any]) -> dict[tuple[str, int], float]:
    """(arm, np) → the largest share of the cores other processes took during one of its runs."""
    out: dict[tuple[str, int], float] = {}
    for r in results.get("runs", []):
        share = (r.get("load") or {}).get("others_cpu_share")
        if r.get("status") == "ok" and share is not None:
            key = (arm_of(r), int(r["np"]))
            out[key] = max(out.get(key, 0.0), float(share))
    return out


#: the terminal table's width: it never breaks a cell; it leaves columns out to fit, and says which
TABLE_COLUMNS = 100
#: the columns left out first when the table is wider than the console (the report has every one of them)
DROP_ORDER = ("memory", "step p95", "peak RSS", "others' CPU", "data ms", "metric", "other threads' CPU",
              "scaling eff.")


def _columns(groups: Sequence[Group], others: dict[tuple[str, int], float] | None,
             cpu: dict[tuple[str, int], dict[str, Any] | None] | None) -> list[tuple[str, str, Any]]:
    """(name, header, cell of a group) for every column the table can show."""
    several_np = len({g.np for g in groups}) > 1

    def ok(g: Group) -> str:
        return f"{g.ok}/{g.runs}" if g.ok == g.runs else f"[red]{g.ok}/{g.runs}[/]"

    cols: list[tuple[str, str, Any]] = [
        ("arm", "arm", lambda g: g.arm), ("np", "np", lambda g: str(g.np)), ("ok", "ok", ok),
        ("samples/s", "samples/s\n± 95 % CI", lambda g: fmt.sps(g.samples_per_sec)),
        ("step ms", "step ms\nmedian", lambda g: fmt.ms(g.step_ms_median)),
        ("step p95", "step ms\np95", lambda g: fmt.ms(g.step_ms_p95)),
        *((f"{p} ms", f"{PHASE_LABELS[p]}\nms", (lambda g, p=p: fmt.ms(g.phases_ms.get(p)))) for p in PHASES),
        ("metric", fmt.metric_label(groups[0].metric if groups else {}, short=True), fmt.accuracy),
        ("peak RSS", "peak RSS\nMB", lambda g: fmt.mb(g.peak_rss_mb))]
    if any(g.memory_mb for g in groups):  # tensor accounting per rank: what sharding saves
        cols += [("memory", f"{MEMORY_LABELS[k]}\nMB/rank", (lambda g, k=k: fmt.size_mb(g.memory_mb.get(k))))
                 for k in MEMORY_KINDS]
    if several_np:
        cols.append(("scaling eff.", "scaling\neff.",
                     lambda g: fmt.pct(g.efficiency, 0) if g.efficiency is not None and g.np > 1 else ""))
    if cpu and any(cpu.values()):
        cols.append(
            (
                "other threads' CPU",
                "CPU ms/step\nmain / other",
                lambda g: "–" if not (c := cpu.get((g.arm, g.np))) else f"{fmt.ms(c['main'])} / {fmt.ms(c['helpers'])}",
            )
        )
    if others:
        def other(g: Group) -> str:
            share = others.get((g.arm, g.np))
            cell = "–" if share is None else fmt.pct(share, 0)
            return f"[yellow]{cell}[/]" if share is not None and share >= regime.SHARED_SHARE else cell
        cols.append(("others' CPU", "others'\nCPU", other))
    return cols


def build_table(groups: Sequence[Group], title: str | None = None,
                others: dict[tuple[str, int], float] | None = None,
                cpu: dict[tuple[str, int], dict[str, Any] | None] | None = None,
                drop: Sequence[str] = ()) -> Table:
    """One row per (arm, np); ``others``: :func:`others_by_group`, a column when any run recorded it; ``cpu``:
    (arm, np) → :func:`~dpcompare.report.attribution.thread_cpu`; ``drop``: columns left out (by name). No cell
    ever wraps."""
    t = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    cols = [c for c in _columns(groups, others, cpu) if c[0] not in drop]
    for i, (_name, head, _) in enumerate(cols):
        t.add_column(head, justify="left" if i == 0 else "right", style="bold" if i == 0 else None, no_wrap=True)
    prev = None
    for g in groups:
        row = [cell(g) for _, _, cell in cols]
        if cols and cols[0][0] == "arm" and g.arm == prev:
            row[0] = ""
        t.add_row(*row, end_section=bool(next_strategy_differs(groups, g)))
        prev = g.arm
    return t


def fit_columns(console: Console, build: Callable[[list[str]], Table], present: set[str], order: Sequence[str],
                width: int) -> tuple[Table, list[str]]:
    """``build(left_out)`` at most ``width`` (and the console's) columns wide: the columns named in ``order`` that
    are ``present`` left out one by one until it fits; the table and the names left out. A cell is never cut."""
    limit = min(width, console.width)
    dropped: list[str] = []
    table = build(dropped)
    unbounded = console.options.update_width(10_000)  # its natural width, not the console's
    for name in order:
        if console.measure(table, options=unbounded).maximum <= limit:
            break
        if name in present:
            dropped.append(name)
            table = build(dropped)
    return table, dropped


def fitted_table(console: Console, groups: Sequence[Group], title: str | None = None,
                 others: dict[tuple[str, int], float] | None = None,
                 cpu: dict[tuple[str, int], dict[str, Any] | None] | None = None,
                 width: int = TABLE_COLUMNS) -> tuple[Table, list[str]]:
    """The table at most ``width`` (and the console's) columns wide, leaving out columns in :data:`DROP_ORDER`
    until it fits; the names of those left out."""
    present = {c[0] for c in _columns(groups, others, cpu)}
    return fit_columns(console, lambda left_out: build_table(groups, title, others, cpu, left_out), present,
                       DROP_ORDER, width)


def print_report(console: Console, results: dict[str, Any], groups: Sequence[Group], verdicts: Sequence[Verdict],
                 html_path: str | None = None, attributions: Sequence[dict[str, Any]] | None = None) -> None:
    cfg = (results.get("config") or {}).get("train") or {}
    desc = fmt.script_description(results.get("config") or {}) or " · ".join(
        str(x) for x in (workload_label(results), cfg.get("epochs") and f"{cfg['epochs']} epochs",
                         cfg.get("batch_size") and f"batch {cfg['batch_size']}/process") if x)
    console.print()
    others = others_by_group(results)
    cpu = {(g.arm, g.np): attribution.thread_cpu(results, g.arm, g.np) for g in groups}
    table, dropped = fitted_table(console, groups, f"[bold]Comparison[/] {desc}" if desc else "[bold]Comparison[/]",
                                  others, cpu)
    console.print(table)
    if dropped:
        console.print(f"[dim]left out to fit {min(TABLE_COLUMNS, console.width)} columns: {', '.join(dropped)} "
                      "(every column is in the report)[/]", soft_wrap=True)
    console.print("[dim]times are per step, median over steps (slowest rank for step ms, mean over ranks for "
                  "phases), averaged over repeats; warm-up steps excluded"
                  + ("; others' CPU: the largest share of the cores other processes took during a run"
                     if others and "others' CPU" not in dropped else "")
                  + ("; CPU ms/step: the thread that runs the steps / the process's other threads (background and "
                     "communication threads)" if any(cpu.values()) and "other threads' CPU" not in dropped else "")
                  + "[/]", soft_wrap=True)
    share = measured_share(results)
    if share is not None:
        console.print(f"[dim]timed steps: {100 * share:.0f} % of the runs' wall time (the rest is start-up, "
                      f"data loading, evaluation and warm-up); {launch_note(results)}[/]", soft_wrap=True)
    tiny = regime.tiny_warning(results)
    if tiny:
        console.print(f"[yellow]{tiny}[/]", soft_wrap=True, highlight=False)
    stop = (results.get("config") or {}).get("stop")
    if stop:
        console.print(f"[dim]{stop.get('blocks')} block{'s' if stop.get('blocks') != 1 else ''}: "
                      f"{stop.get('reason')}[/]", soft_wrap=True)
        if stop.get("shortfall"):
            console.print(f"[yellow]{stop['shortfall']}[/]", soft_wrap=True, highlight=False)
    for line in noise.setting_lines(results):
        console.print(f"[dim]{line}[/]", soft_wrap=True, highlight=False)
    console.print()
    if verdicts:
        _print_throughput_verdicts(console, results, verdicts, attributions)
        others = [v for v in verdicts if v.metric != "throughput"]
        if others:
            name = metric_of(results.get("runs", []))["name"]
            console.print(f"[bold]Test {name}[/] (paired by seed; time to the target paired over blocks, training "
                          "time only)")
        for v in others:
            colour = {"equal": "cyan", "faster": "green", "slower": "red", "mismatch": "bold red"}.get(
                v.outcome, "yellow")
            console.print(_bullet(v, colour), soft_wrap=True, highlight=False)
    elif groups:
        console.print("[bold]Verdict[/]: one arm only, nothing to compare", soft_wrap=True)
    failed = [r for r in results.get("runs", []) if r.get("status") != "ok"]
    for r in failed:
        console.print(f"  [red]{r.get('status', 'failed')}[/] {arm_of(r)}-np{r['np']}-r{r['repeat']}: "
                      f"{fmt.headline(r.get('error'))}", soft_wrap=True, highlight=False)
    if not results.get("complete", True):
        console.print("[yellow]results.json is incomplete: the comparison was interrupted[/] "
                      "(`dpcompare compare --continue DIR` continues it)")
    if html_path:
        console.print(f"report: [bold]{html_path}[/]", soft_wrap=True)


def _bullet(v: Verdict, colour: str) -> str:
    """A verdict's line, its outcome said once: as a coloured tag, unless the sentence already says it."""
    if v.outcome in v.full_text.split(":")[0].split():
        return f"  • [{colour}]{v.full_text}[/]"
    return f"  • [{colour}]{v.outcome:<9}[/] {v.full_text}"


def _print_throughput_verdicts(console: Console, results: dict[str, Any], verdicts: Sequence[Verdict],
                               attributions: Sequence[dict[str, Any]] | None) -> None:
    """Each throughput verdict once, its per-block ratios, and the sentence on where the difference lies."""
    why = {(a["np"], a["other"]): a for a in (attribution.for_report(results) if attributions is None
                                               else attributions)}
    shared = {r.np: r for r in regime.regimes(results) if r.shared}
    console.print("[bold]Verdict[/] (paired over blocks: each repeat runs every arm once, side by side)")
    for v in (v for v in verdicts if v.metric == "throughput"):
        colour = {"faster": "green", "slower": "red", "equal": "cyan"}.get(v.outcome, "yellow")
        console.print(_bullet(v, colour), soft_wrap=True, highlight=False)
        if v.np in shared:
            console.print(f"    [yellow]{regime.shared_line(shared[v.np])}[/]", soft_wrap=True, highlight=False)
        if v.block_ratios:
            console.print(f"    [dim]{v.other}/{v.baseline} throughput per block: {_ratios(v.block_ratios)}[/]",
                          soft_wrap=True, highlight=False)
            console.print(f"    [dim]{noise.floor_words(noise.verdict_floor(v))}[/]", soft_wrap=True, highlight=False)
        a = why.get((v.np, v.other))
        lines = (a.get("lines") or [a.get("text")]) if a else []
        for i, line in enumerate(x for x in lines if x):
            console.print(f"    {'why: ' if i == 0 else '     '}{line}", soft_wrap=True, highlight=False, markup=False)


#: more blocks than this: the terminal gives their range, the report each of them
SHOWN_RATIOS = 10


def _ratios(ratios: Sequence[float]) -> str:
    """The per-block ratios, or with many blocks their range (every one is in the report and results.json)."""
    if len(ratios) <= SHOWN_RATIOS:
        return " ".join(f"{x:.2f}" for x in ratios)
    return f"{min(ratios):.2f} to {max(ratios):.2f} over {len(ratios)} blocks (each in the report)"
