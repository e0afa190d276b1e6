"""The "Projected to a cluster" section of report.html: what ``dpcompare predict`` made of the comparison's
traced runs (``OUT/projected/prediction.json`` and its picture, written by compare). Reads files only."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

FOLDER, JSON_FILE, PNG_FILE = "projected", "prediction.json", "prediction.png"
#: host counts shown in the table (the picture has them all)
SHOWN = (2, 8, 64, 1024)


def section(folder: str | Path) -> str:
    """HTML for the report, or "" when the comparison was not projected."""
    from dpcompare.report.html import data_uri  # here, not at the top: it loads numpy and scipy and matplotlib

    where = Path(folder) / FOLDER
    try:
        doc = json.loads((where / JSON_FILE).read_text())
    except (OSError, ValueError):
        return ""
    inputs, curves = doc.get("inputs") or {}, doc.get("curves") or []
    if not curves:
        return ""
    picture = (f'<figure><img alt="predicted step time and efficiency" src="{data_uri(where / PNG_FILE)}">'
               "</figure>") if (where / PNG_FILE).is_file() else ""
    said = [*doc.get("who_wins", []), *doc.get("below_threshold", []), *(a for a in doc.get("knob_advice", []) if a),
            *doc.get("band_advice", []), *(f"overlap: {x}" for x in doc.get("overlap", [])),
            *doc.get("interval", [])]
    lines = "".join(f"<li>{html.escape(str(x))}</li>" for x in said)
    return ('<h2 id="projected">Projected to a cluster</h2><div class="card">'
            f"<p>A model, not a measurement: <code>dpcompare predict</code> on the traced runs, one rank per host on a "
            f"{html.escape(str(inputs.get('link')))} link with {html.escape(str(inputs.get('latency')))} latency. "
            "It keeps the compute traced here (these CPUs) and prices each strategy's collectives where its library "
            "runs them with the α-β model, so it says where the network starts to decide, not how fast a cluster's "
            "own nodes compute; data loading, the first epoch and start-up are outside it. Other links and host "
            f"counts: <code>dpcompare predict {html.escape(str(folder))} --link 10gbit</code>.</p>"
            + picture + _table(curves) + (f"<ul>{lines}</ul>" if lines else "") + "</div>")


def _table(curves: list[dict[str, Any]]) -> str:
    """Per curve: predicted step and efficiency at a few host counts, and where it drops below the threshold.
    Headings stay short (the legend under the table says what a cell holds) so the table fits its card."""
    hosts = sorted({s["hosts"] for c in curves for s in c["steps"]})
    shown = [h for h in hosts if h in SHOWN] or hosts[:4]
    interval = any("interval_ms_low" in s for c in curves for s in c["steps"])
    band = any("step_ms_low" in s for c in curves for s in c["steps"])
    head = "".join(f"<th>{h} hosts</th>" for h in shown)
    rows = []
    for c in curves:
        at = {s["hosts"]: s for s in c["steps"]}
        cells = "".join(f"<td>{_step(at[h])}</td>" if h in at else "<td>–</td>" for h in shown)
        below = c.get("below_threshold_at_hosts")
        rows.append(f"<tr><td>{html.escape(str(c['label']))}</td>{cells}<td>{'never' if below is None else below}"
                    "</td></tr>")
    threshold = f"{100 * curves[0].get('threshold', 0.8):.0f} %"
    legend = ("Each cell: predicted step in ms · efficiency"
              + (", then the 95 % band from the inputs' own noise" if band else "")
              + ("; the 90 % interval with the model's error" if interval else "")
              + f". Last column: the first host count whose efficiency falls below {threshold}.")
    return (f'<div class="scroll"><table><thead><tr><th>strategy (traced run)</th>{head}<th>below {threshold} '
            f"from</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            f'<p class="muted" style="font-size:13px;margin:8px 0 0">{html.escape(legend)}</p>')


def _step(s: dict[str, Any]) -> str:
    """A predicted step and its efficiency; under them, when the prediction has them, its band from the inputs' own
    noise and its interval with the model's error."""
    parts = [f"{s[k + '_low']:.1f}–{s[k + '_high']:.1f}" for k in ("step_ms", "interval_ms") if k + "_low" in s]
    first = f"{s['step_ms']:.1f} · {100 * s['efficiency']:.0f} %"
    return first + (f'<br><span class="muted">{"; ".join(parts)}</span>' if parts else "")
