"""Horovod's own timeline (``HOROVOD_TIMELINE``) converted onto dpcompare's trace clock and lanes.

Pure: a list of Chrome-trace events in, a list out; :class:`~dpcompare.backends.horovod.HorovodStrategy`
reads the file rank 0 wrote and calls :func:`horovod_timeline_events` after the run.
"""

from __future__ import annotations

import re
from typing import Any

from dpcompare import trace as tr

_DTYPE_BYTES = {"uint8": 1, "int8": 1, "bool": 1, "uint16": 2, "int16": 2, "float16": 2, "bfloat16": 2,
                "int32": 4, "float32": 4, "int64": 8, "float64": 8}


def _nbytes(args: dict[str, Any]) -> int:
    dims = [int(d) for d in re.findall(r"\d+", str(args.get("shape", "")))]
    n = 1
    for d in dims:
        n *= d
    return n * _DTYPE_BYTES.get(str(args.get("dtype", "")), 4)


def horovod_timeline_events(raw: list[dict[str, Any]], pid: int,
                            steps: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Horovod's timeline (a list of Chrome-trace events, rank 0's view) on dpcompare's clock.

    Horovod draws one row per tensor with ``B``/``E`` pairs (NEGOTIATE_ALLREDUCE, ALLREDUCE and the
    activities inside it), ``ts`` in microseconds since the timeline started; its first event carries
    ``start_time_since_epoch_in_micros``. Returned: per-tensor lanes (``tr.LANE_TENSORS + i``) with those
    spans as complete events, and on :data:`tr.LANE_COMM` one ``allreduce`` span per fused operation
    (tensors whose ALLREDUCE overlap: Horovod's background thread runs one response at a time) with its
    bytes and tensor names, and the first tensor's activities (memcpy, MPI/Gloo all-reduce) inside it.
    Only spans starting inside one of ``steps`` (start, end, epoch microseconds) are kept.
    """
    origin = next((float(e["args"]["start_time_since_epoch_in_micros"]) for e in raw
                   if e.get("ph") == "M" and "start_time_since_epoch_in_micros" in (e.get("args") or {})), None)
    if origin is None:
        return []
    names = {e["pid"]: e["args"]["name"] for e in raw
             if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in (e.get("args") or {})}

    spans, ticks = _spans_and_ticks(raw, set(names), origin)
    spans = [s for s in spans if any(a <= s["start"] <= b for a, b in steps)]
    ticks = [t for t in ticks if any(a <= t["ts"] <= b for a, b in steps)]
    used = sorted({s["tensor"] for s in spans} | {t["tensor"] for t in ticks})
    lane = {t: tr.LANE_TENSORS + i for i, t in enumerate(used)}

    out: list[dict[str, Any]] = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tr.LANE_TENSORS + i,
                                  "args": {"name": f"horovod: {names[t]}"}} for i, t in enumerate(used)]
    for s in spans:
        out.append({"name": s["name"], "cat": "horovod", "ph": "X", "ts": s["start"], "dur": s["end"] - s["start"],
                    "pid": pid, "tid": lane[s["tensor"]]})
    for t in ticks:
        out.append({"name": f"rank {t['name']} ready", "cat": "horovod", "ph": "i", "s": "t", "ts": t["ts"],
                    "pid": pid, "tid": lane[t["tensor"]]})
    return out + _fused_operations(spans, names, pid)


def _spans_and_ticks(raw: list[dict[str, Any]], tensors: set[int], origin: float
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Horovod's ``B``/``E`` pairs per tensor as spans (tensor, name, start, end, depth, args) and its ``X``
    ready ticks, on the epoch clock."""
    spans: list[dict[str, Any]] = []
    ticks: list[dict[str, Any]] = []
    stacks: dict[int, list[dict[str, Any]]] = {}
    for e in raw:
        ph, tensor = e.get("ph"), e.get("pid")
        if ph not in ("B", "E", "X") or tensor not in tensors:
            continue
        ts = origin + float(e["ts"])
        stack = stacks.setdefault(tensor, [])
        if ph == "B":
            stack.append({"tensor": tensor, "name": e.get("name", ""), "start": ts, "depth": len(stack)})
        elif ph == "E" and stack:
            s = stack.pop()
            s.update(end=ts, args=e.get("args") or {})
            spans.append(s)
        elif ph == "X":
            ticks.append({"tensor": tensor, "name": e.get("name", ""), "ts": ts})
    return spans, ticks


def _fused_operations(spans: list[dict[str, Any]], names: dict[int, str], pid: int) -> list[dict[str, Any]]:
    """One ``allreduce`` span per fused operation (overlapping top-level ALLREDUCE spans) on
    :data:`tr.LANE_COMM`, with the first tensor's activities inside it."""
    out: list[dict[str, Any]] = []
    tops = sorted((s for s in spans if s["depth"] == 0 and s["name"] == "ALLREDUCE"), key=lambda s: s["start"])
    groups: list[list[dict[str, Any]]] = []
    for s in tops:
        if groups and s["start"] <= max(g["end"] for g in groups[-1]):
            groups[-1].append(s)
        else:
            groups.append([s])
    for g in groups:
        start, end = min(s["start"] for s in g), max(s["end"] for s in g)
        tensors = [names[s["tensor"]].removeprefix("allreduce.") for s in g]
        out.append({"name": f"all-reduce ({len(g)} tensor{'s' if len(g) > 1 else ''})", "cat": tr.CAT_COMM,
                    "ph": "X", "ts": start, "dur": end - start, "pid": pid, "tid": tr.LANE_COMM,
                    "args": {"bytes": sum(_nbytes(s["args"]) for s in g), "tensors": tensors}})
        first = g[0]
        for a in spans:
            if a["tensor"] == first["tensor"] and a["depth"] == 1 and first["start"] <= a["start"] <= first["end"]:
                out.append({"name": a["name"], "cat": tr.CAT_COMM_PHASE, "ph": "X", "ts": max(a["start"], start),
                            "dur": min(a["end"], end) - max(a["start"], start), "pid": pid, "tid": tr.LANE_COMM})
    return out
