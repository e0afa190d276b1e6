"""The "one step, drawn" section of report.html, for a comparison run with ``--trace N``.

Self-contained: it looks for ``RUN/trace.json`` in the folders of the comparison's successful runs,
draws the first traced run of every arm (strategy, np) on one shared time axis and tabulates each
arm's communication figures (overlap % included). Without traces it adds nothing.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from dpcompare import trace as tr
from dpcompare.files import SUMMARY
from dpcompare.report.groups import arm_of
from dpcompare.report.timeline import load_trace, render

PNG = "timeline.png"


def traced_arms(folder: Path, results: dict[str, Any]) -> dict[str, Path]:
    """``ARM-npN`` → the trace.json of its first successful run that has one, in results order (an arm of a
    ``--variants`` or ``--sweep`` comparison keeps its own label: two Horovod arms stay two)."""
    arms: dict[str, Path] = {}
    for r in results.get("runs", []):
        path = folder / str(r.get("dir", "")) / tr.TRACE_FILE
        arm = f"{arm_of(r)}-np{r['np']}"
        if r.get("status") == "ok" and arm not in arms and r.get("dir") and path.is_file():
            arms[arm] = path
    return arms


def section(folder: str | Path, results: dict[str, Any], plots_dir: str | Path) -> str:
    """HTML for the report (a heading, the picture, a table), or "" when no run was traced."""
    from dpcompare.report.html import data_uri  # here, not at the top: it loads matplotlib

    folder = Path(folder)
    arms = traced_arms(folder, results)
    if not arms:
        return ""
    png = render(list(arms.values()), Path(plots_dir) / PNG, labels=list(arms))
    figures = {arm: tr.trace_figures(load_trace(path)) for arm, path in arms.items()}
    table = _steps_table(figures) + _collectives_table(figures) + library_advice(arms, figures)
    return ('<h2 id="timeline">One step, drawn</h2><div class="card">'
            f'<figure><img alt="one traced step per arm" src="{data_uri(png)}"><figcaption>One traced step of '
            "the first run of each arm, every rank on one clock and every arm on the same time axis: compute "
            "phases as bands, a tick when each gradient was ready, the all-reduces on their own lane. DDP "
            "all-reduces its buckets while backward still runs; Horovod's background thread all-reduces fused "
            "tensors and <code>optimizer.step()</code> waits for them (hatched). Only the traced steps carry the "
            "tracing hooks; the figures below come from them. <b>Exposed</b> communication is collective time "
            "the step waited for, <b>hidden</b> the part overlapped with backward's computation. Per collective, "
            "as nccl-tests reports it: algbw = bytes ÷ time with one in flight, busbw = algbw × 2(n−1)/n "
            "(all-reduce), (n−1)/n (all-gather, reduce-scatter) or 1 (broadcast), comparable with the link rate "
            "(given in a lab).</figcaption></figure>" + table + "</div>")


def _table(head: list[str], rows: list[list[str]]) -> str:
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return ('<div class="scroll"><table><thead><tr>' + "".join(f"<th>{h}</th>" for h in head)
            + "</tr></thead><tbody>" + body + "</tbody></table></div>")


def _num(x: float | None, fmt: str, unit: str = "") -> str:
    return "–" if x is None else f"{x:{fmt}}{unit}"


def _steps_table(figures: dict[str, dict[str, Any]]) -> str:
    """Per arm: step, communication split into exposed and hidden, all-reduces, the wait in step()."""
    rows = [[arm, f"{f['traced_steps']}", f"{f['step_ms']:.2f}", f"{f['comm_ms_per_step']:.2f}",
             f"{f['exposed_ms_per_step']:.2f}", f"{f['hidden_ms_per_step']:.2f}", _num(f["hidden_pct"], ".0f", " %"),
             f"{f['allreduce_ops_per_step']:.1f}", f"{f['allreduce_bytes_per_step'] / 1e3:,.1f}",
             f"{f['wait_ms_per_step']:.2f}"] for arm, f in figures.items()]
    return _table(["arm", "traced steps", "step ms", "communication<br>ms per step", "exposed<br>ms",
                   "hidden<br>ms", "hidden<br>(overlap)", "all-reduce ops<br>per step", "kB all-reduced<br>per step",
                   "wait in step()<br>ms"], rows)


def _collectives_table(figures: dict[str, dict[str, Any]]) -> str:
    """Per arm and collective, nccl-tests' way: count, bytes, time, algbw, busbw and busbw as % of the link."""
    rows = []
    for arm, f in figures.items():
        for kind, c in f["collectives"].items():
            rows.append([arm, kind.replace("_", "-"), f"{c['count']:.1f}", f"{c['bytes_per_step'] / 1e6:,.3f}",
                         f"{c['ms_per_step']:.2f}", _num(c["algbw_gbit_s"], ".3f"), _num(c["busbw_gbit_s"], ".3f"),
                         _num(c["busbw_pct_link"], ".0f", " %"), _num(c["hidden_pct"], ".0f", " %")])
    if not rows:
        return ""
    links = {f["link_gbit_s"] for f in figures.values() if f.get("link_gbit_s")}
    link = next(iter(links)) if len(links) == 1 else None
    head = ["arm", "collective", "ops<br>per step", "MB<br>per step", "ms<br>per step", "algbw<br>Gbit/s",
            "busbw<br>Gbit/s", "busbw, % of link" + (f"<br>({link:g} Gbit/s)" if link else
                                                     "<br>(each arm's)" if links else "<br>(no lab)"),
            "hidden"]
    return _table(head, rows)


#: an all-reduce below this share of the link is worth a sentence when another library did better
SLOW_LINK_SHARE = 80.0


def _library(trace_path: Path) -> tuple[str, str]:
    """(the library that carried the run's all-reduces, its forced MPI algorithm) from the run's summary.json."""
    try:
        summary = json.loads((trace_path.parent / SUMMARY).read_text())
    except (OSError, ValueError):
        return "", "default"
    return str((summary.get("comm") or {}).get("library", "")), str(
        (summary.get("config") or {}).get("mpi_allreduce", "default"))


def library_advice(arms: dict[str, Path], figures: dict[str, dict[str, Any]]) -> str:
    """A paragraph when an arm's all-reduce ran through Open MPI's default algorithm at under
    :data:`SLOW_LINK_SHARE` % of a lab link: the share it reached, gloo's beside it, and the knob to try."""
    share = {arm: (f["collectives"].get("all_reduce") or {}).get("busbw_pct_link") for arm, f in figures.items()}
    libs = {arm: _library(path) for arm, path in arms.items()}
    slow = {a: s for a, s in share.items() if s is not None and libs[a] == ("mpi", "default") and s < SLOW_LINK_SHARE}
    if not slow:
        return ""
    items = []
    for arm, s in slow.items():  # gloo beside it: the best gloo arm on the same link
        gloo = [(a, g) for a, g in share.items() if g is not None and libs[a][0] == "gloo"
                and figures[a].get("link_gbit_s") == figures[arm].get("link_gbit_s")]
        best = max(gloo, key=lambda kv: kv[1], default=None)
        beside = f" where {best[0]}'s gloo all-reduce reached {best[1]:.0f} %" if best and best[1] > s else ""
        items.append(f"<b>{html.escape(arm)}</b>: Open MPI's default all-reduce moved {s:.0f} % of the link"
                     f"{html.escape(beside, quote=False)}")
    return ('<p class="advice">' + "; ".join(items) + ". Open MPI chooses its all-reduce algorithm by message "
            "size and process count, and on a TCP link its choice can leave bandwidth unused. Try "
            "<code>--mpi-allreduce recursive-doubling</code> (or <code>ring</code>) on the Horovod arm, e.g. "
            "<code>--variants hvd=horovod hvd-rd=horovod:mpi_allreduce=recursive-doubling</code>, or compare the "
            "algorithms on the lab's link first with <code>dpcompare lab bench --backends gloo,mpi,mpi-rd</code>; "
            "<code>horovodrun --gloo</code> with <code>--horovod-ops gloo</code> uses gloo's all-reduce instead.</p>")
