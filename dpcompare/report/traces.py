"""The "one step, drawn" section of report.html, for a comparison run with ``--trace N``.

Self-contained: it looks for ``RUN/trace.json`` in the folders of the comparison's successful runs,
draws the first traced run of every arm (strategy, np) on one shared time axis and tabulates each
arm's communication figures (overlap % included). Without traces it adds nothing.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from dpcompare import trace as tr

PNG = "timeline.png"


def traced_arms(folder: Path, results: dict[str, Any]) -> dict[str, Path]:
    """``strategy-npN`` → the trace.json of its first successful run that has one, in results order."""
    arms: dict[str, Path] = {}
    for r in results.get("runs", []):
        path = folder / str(r.get("dir", "")) / tr.TRACE_FILE
        arm = f"{r['strategy']}-np{r['np']}"
        if r.get("status") == "ok" and arm not in arms and r.get("dir") and path.is_file():
            arms[arm] = path
    return arms


def section(folder: str | Path, results: dict[str, Any], plots_dir: str | Path) -> str:
    """HTML for the report (a heading, the picture, a table), or "" when no run was traced."""
    from dpcompare.report.html import data_uri
    from dpcompare.report.timeline import load_trace, render

    folder = Path(folder)
    arms = traced_arms(folder, results)
    if not arms:
        return ""
    png = render(list(arms.values()), Path(plots_dir) / PNG, labels=list(arms))
    rows = []
    for arm, path in arms.items():
        f = tr.communication_figures(load_trace(path)["traceEvents"])
        cells = [arm, f"{f['traced_steps']}", f"{f['step_ms']:.2f}", f"{f['comm_ms_per_step']:.2f}",
                 "–" if f["overlap_pct"] is None else f"{f['overlap_pct']:.0f} %",
                 f"{f['allreduce_ops_per_step']:.1f}", f"{f['allreduce_bytes_per_step'] / 1e3:,.1f}",
                 f"{f['wait_ms_per_step']:.2f}"]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = ["arm", "traced steps", "step ms", "all-reduce ms<br>per step", "overlap<br>(inside backward)",
            "all-reduce ops<br>per step", "kB all-reduced<br>per step", "wait in step()<br>ms"]
    table = ('<div class="scroll"><table><thead><tr>' + "".join(f"<th>{h}</th>" for h in head)
             + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>")
    return ('<h2 id="timeline">One step, drawn</h2><div class="card">'
            f'<figure><img alt="one traced step per arm" src="{data_uri(png)}"><figcaption>One traced step of '
            "the first run of each arm, every rank on one clock and every arm on the same time axis: compute "
            "phases as bands, a tick when each gradient was ready, the all-reduces on their own lane. DDP "
            "all-reduces its buckets while backward still runs; Horovod's background thread all-reduces fused "
            "tensors and <code>optimizer.step()</code> waits for them (hatched). Tracing slows the runs (Horovod's "
            "timeline writer thread polls on rank 0 for the whole run), so read throughput from an untraced "
            "comparison; the figures below come from the traces.</figcaption></figure>" + table + "</div>")
