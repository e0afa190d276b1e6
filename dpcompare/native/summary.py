"""A script run's records (``rank*.json``) as a run summary: its step times and its metric.

A step's time is the time between the ends of two successive ``optimizer.step()`` calls on a rank, so it holds
the data, the forward, the backward (where the gradients' all-reduces overlap) and the optimizer, as the
script's loop lives them; the ``step()`` call alone would miss the communication that overlaps backward. Every
rank is read, and a step takes as long as its slowest rank took. The first ``warmup`` steps are left out: the
native layer reduces its first two steps' gradients at ``step()`` before it fixes its fusion groups. A step
that spans the script's evaluation (or anything else between two steps) counts too; the median keeps it from
deciding the figure.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from dpcompare.files import SUMMARY, atomic_write_json

#: steps left out by default: the layer's two steps with the whole reduction at step(), and one more
DEFAULT_WARMUP = 3


def read_ranks(out: Path) -> list[dict[str, Any]]:
    """Every rank's record in ``out``, by rank."""
    records = []
    for path in sorted(out.glob("rank*.json"), key=lambda p: int(p.stem[4:]) if p.stem[4:].isdigit() else -1):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return records


def step_times(records: list[dict[str, Any]]) -> list[float]:
    """Seconds of each step after the first, the slowest rank's."""
    per_rank = []
    for r in records:
        ends = r.get("step_ends_s") or []
        per_rank.append([b - a for a, b in zip(ends, ends[1:], strict=False)])
    steps = min((len(x) for x in per_rank), default=0)
    return [max(x[i] for x in per_rank) for i in range(steps)]


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def script_cpu_ms(records: list[dict[str, Any]], warmup: int = DEFAULT_WARMUP) -> dict[str, Any] | None:
    """``timing.cpu_ms`` as a training run's: CPU ms per step after the warm-up of the thread that steps
    (``main``) and of the process's other threads (``helpers``), over ranks and per rank; rank 0's busiest other
    threads by name, each with its share of the helpers' time."""
    rows = []
    for r in records:
        main, every = r.get("cpu_main_s") or [], r.get("cpu_all_s") or []
        first = max(warmup - 1, 0)
        n = min(len(main), len(every)) - 1 - first
        if n < 1:
            continue
        m = 1e3 * (main[first + n] - main[first]) / n
        rows.append({"rank": r.get("rank", len(rows)), "main": m,
                     "helpers": max(1e3 * (every[first + n] - every[first]) / n - m, 0.0)})
    if not rows:
        return None
    threads = records[0].get("helper_threads") or []
    total = sum(t["s"] for t in threads)
    helpers0 = rows[0]["helpers"]
    return {"main": statistics.fmean(r["main"] for r in rows), "helpers": statistics.fmean(r["helpers"] for r in rows),
            "per_rank": rows, "threads": [{"name": t["name"], "tid": t["tid"], "ms": helpers0 * t["s"] / total}
                                          for t in threads] if total > 0 else []}


def script_summary(out: Path, warmup: int = DEFAULT_WARMUP, metric: str | None = None) -> dict[str, Any] | None:
    """The summary of the script run recorded in ``out`` (None: no rank left a record)."""
    records = read_ranks(out)
    if not records:
        return None
    times = step_times(records)[max(warmup - 1, 0):]
    first = records[0]
    metrics = first.get("metrics") or {}
    timing = {"measured_steps": len(times), "measured_seconds": sum(times) if times else None,
              "step_ms_median": statistics.median(times) * 1e3 if times else None,
              "step_ms_p95": _p95(times) * 1e3 if times else None, "samples_per_sec": None, "phases_ms": None}
    timing["cpu_ms"] = script_cpu_ms(records, warmup)
    summary: dict[str, Any] = {"script": True, "arm": first.get("arm"), "world_size": first.get("world_size"),
                               "steps": first.get("steps"), "exit_code": max(r.get("exit_code", 1) for r in records),
                               "timing": timing, "warmup_steps": warmup, "metrics_seen": sorted(metrics)}
    if metric:
        values = metrics.get(metric) or []
        summary.update(metric={"name": metric}, final_metric=values[-1] if values else None,
                       metric_curve=values)
    return summary


def write_summary(out: Path, warmup: int = DEFAULT_WARMUP, metric: str | None = None) -> dict[str, Any] | None:
    """:func:`script_summary` written to ``out/summary.json``; what was written."""
    summary = script_summary(out, warmup, metric)
    if summary is not None:
        atomic_write_json(out / SUMMARY, summary)
    return summary
