"""Comparison reports from ``results.json``: terminal table and verdicts, PNG plots, a self-contained HTML.

``render(dir)`` needs nothing but ``DIR/results.json`` (schema: docs/results-schema.md).

Modules: ``intervals`` (intervals and the decisions they imply), ``groups`` (arms, per-arm aggregates, the
pairing of runs), ``verdicts`` (Verdict and the accuracy verdicts), ``stats`` (the throughput verdicts, the
stopping rule, and every statistics name in one place), ``table``/``plots``/``html`` (the three renderings),
``traces``/``timeline`` (reading and drawing traces).

May import: the top-level modules only. It reads results.json and trace files as data; it never imports
``compare``, ``training`` or a strategy (the strategies' torch-free catalog it may read).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcompare.errors import ConfigError
from dpcompare.files import RESULTS, SCHEMA

#: a run's outcome: ok, failed (non-zero exit, time-out, no summary) or diverged (non-finite loss, exit 3)
STATUSES = ("ok", "failed", "diverged")
_RUN_KEYS = {"strategy": str, "np": int, "repeat": int, "status": str}


@dataclass
class Rendered:
    html: Path
    plots: list[Path] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    details: list[Any] = field(default_factory=list)  # stats.Verdict objects


def load_results(folder: str | Path) -> dict[str, Any]:
    """``folder/results.json``, checked enough to render; ConfigError (one line) when it cannot be."""
    path = Path(folder) / RESULTS
    if not Path(folder).is_dir():
        raise ConfigError(f"{folder} is not a folder; give the --out folder of a `dpcompare compare` run")
    if not path.is_file():
        raise ConfigError(f"{path} not found; give the --out folder of a `dpcompare compare` run")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(data, dict) or "runs" not in data:
        raise ConfigError(f"{path} is not a dpcompare results file (no \"runs\")")
    if data.get("schema") != SCHEMA:
        raise ConfigError(f"{path} has schema {data.get('schema')!r}; this dpcompare reads schema {SCHEMA}")
    if not isinstance(data["runs"], list):
        raise ConfigError(f"{path}: \"runs\" must be a list")
    for i, r in enumerate(data["runs"]):
        bad = [k for k, t in _RUN_KEYS.items() if not isinstance(r, dict) or not isinstance(r.get(k), t)]
        if bad:
            raise ConfigError(f"{path}: runs[{i}] lacks a valid {', '.join(bad)}")
        if r["status"] not in STATUSES:
            raise ConfigError(f"{path}: runs[{i}] has status {r['status']!r}; expected one of "
                              + ", ".join(f'"{s}"' for s in STATUSES))
    return data


def render(folder: str | Path, console: Any = None, quiet: bool = False, recompute: bool = False) -> Rendered:
    """Table and verdicts on the terminal, ``DIR/plots/*.png`` and ``DIR/report.html``, from results.json.

    The verdicts are the ones compare stored in results.json; ``recompute`` (``dpcompare report --recompute``)
    draws them again from the runs, as happens anyway when none were stored (an unfinished comparison).
    """
    # here, not at the top: it loads numpy and scipy and matplotlib and rich
    from dpcompare.report import attribution, axes, faults, html, plots, projection, stats, table, traces

    folder = Path(folder)
    results = load_results(folder)
    groups = stats.aggregate(results)
    verdicts = stats.report_verdicts(results, groups, recompute=recompute)
    made = plots.make_all(results, groups, folder / "plots", verdicts)
    made += axes.axis_plots(results, groups, folder / "plots")  # --sweep link=..., threads=...
    fault_plot = faults.plot(results, folder / "plots" / "fault.png")  # --fault
    fault = faults.section(results, fault_plot)
    traced = traces.section(folder, results, folder / "plots")  # runs made with --trace N
    projected = projection.section(folder)  # ... and projected to a cluster by compare (OUT/projected)
    why = attribution.for_report(results, recompute=recompute)
    cost = faults.lines(results)  # a comparison with a fault leads with what the fault cost
    page = html.write_html(folder / "report.html", results, groups, verdicts, made,
                           [x for x in (fault, traced, projected) if x], why, lead=cost)
    if not quiet:
        console = console or table.console_for_report()
        if cost:
            console.print()
        for line in cost:
            console.print(line, soft_wrap=True, markup=False)
        table.print_report(console, results, groups, verdicts, str(page), why)
    return Rendered(page, [p.path for p in made] + ([fault_plot.path] if fault_plot else []),
                    [v.full_text for v in verdicts] + [v["text"] for v in faults.wall_verdicts(results)], verdicts)
