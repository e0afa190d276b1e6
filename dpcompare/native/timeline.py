"""Horovod's timeline for the native layer: ``HOROVOD_TIMELINE=FILE``, ``hvd.start_timeline``/``stop_timeline``.

The file has Horovod's format (horovod/common/timeline.cc), so that chrome://tracing, ui.perfetto.dev and
dpcompare's reader of Horovod timelines (``backends.horovod_timeline``) open it alike: a JSON array of Chrome-trace
events, valid after every event; its first event carries ``start_time_since_epoch_in_micros``; one ``pid`` per
tensor, named by a ``process_name`` event with Horovod's tensor name (``allreduce.NAME``, or
``allreduce.noname.N``); ``ts`` in microseconds since the timeline started. Per collective: ``NEGOTIATE_<OP>``
then ``<OP>`` (``ALLREDUCE``, ``ALLGATHER``, ``BROADCAST``, ``ALLTOALL``, ``REDUCESCATTER``) holding the
backend's activity (``GLOO_<OP>``, or ``NCCL_<OP>`` for CUDA tensors); ``<OP>`` ends with the output's dtype and
shape. Only rank 0 writes, as only Horovod's coordinator does.

What differs, because torch.distributed has no negotiation and no background thread: ``NEGOTIATE_<OP>`` is a
zero-length span at the call, with no per-rank ready ticks; ``<OP>`` runs from the call until the result is waited
for (``synchronize``, or the optimizer's ``step()``), not until the transfer ended; ``CYCLE_START`` (``mark_cycles``)
marks each collective's start, there being no cycle. The DistributedOptimizer's fused all-reduces show as overlapping
``ALLREDUCE`` spans of their gradients, as Horovod's fusion does.

As in Horovod, ``start_timeline`` needs ``HOROVOD_TIMELINE`` set (to ``DYNAMIC`` or a file) before ``hvd.init()``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

import torch

from dpcompare.native import state

ENV, MARK_CYCLES_ENV = "HOROVOD_TIMELINE", "HOROVOD_TIMELINE_MARK_CYCLES"
F = TypeVar("F", bound=Callable[..., Any])


class _Writer:
    """One timeline file, valid JSON after every event (as Horovod's: the closing bracket is rewritten)."""

    def __init__(self, path: str, mark_cycles: bool) -> None:
        self.mark_cycles = mark_cycles
        self.t0_ns = time.perf_counter_ns()
        self.pids: dict[str, int] = {}
        self.lock = threading.Lock()
        # a log read as it grows, valid JSON after each event, as Horovod writes it
        self.file: TextIO = open(path, "w")  # noqa: SIM115  # not atomic: a log
        self._write([{"name": "process_name", "ph": "M", "pid": 0,
                      "args": {"start_time_since_epoch_in_micros": time.time_ns() // 1000}},
                     {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}], first=True)

    def now(self) -> int:
        return (time.perf_counter_ns() - self.t0_ns) // 1000

    def _write(self, events: list[dict[str, Any]], first: bool = False) -> None:
        text = ",\n".join(json.dumps(e) for e in events)
        if first:
            self.file.write("[\n" + text + "]")
        else:
            self.file.seek(self.file.tell() - 1)
            self.file.write(",\n" + text + "]")
        self.file.flush()

    def event(self, tensor: str, ph: str, name: str = "", ts: int | None = None,
              args: dict[str, Any] | None = None) -> None:
        with self.lock:
            events = []
            pid = self.pids.get(tensor)
            if pid is None:
                pid = self.pids[tensor] = len(self.pids) + 1
                events += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": tensor}},
                           {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
            e: dict[str, Any] = {"ph": ph, "ts": self.now() if ts is None else ts, "pid": pid}
            if ph != "E":
                e["name"] = name
            if args:
                e["args"] = args
            self._write(events + [e])

    def marker(self, name: str) -> None:
        with self.lock:
            self._write([{"ph": "i", "name": name, "ts": self.now(), "s": "g"}])

    def close(self) -> None:
        with self.lock:
            self.file.close()


_enabled = False            # HOROVOD_TIMELINE was set at init (start_timeline's condition)
_writer: _Writer | None = None
_depth = threading.local()  # collectives called by traced collectives are not traced again
_noname = itertools.count(1)


def from_env() -> None:
    """``hvd.init()``'s part: start the file ``HOROVOD_TIMELINE`` names (``DYNAMIC``: only enable the API)."""
    global _enabled
    value = os.environ.get(ENV, "")
    _enabled = bool(value)
    if value and value != "DYNAMIC" and _writer is None:
        _start(value, os.environ.get(MARK_CYCLES_ENV, "0").strip().lower() in ("1", "true", "yes"))


def _start(path: str, mark_cycles: bool) -> None:
    global _writer
    if _writer is not None:
        _writer.close()
    _writer = _Writer(path, mark_cycles) if state.rank() == 0 else None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing the timeline to ``file_path`` (rank 0), closing any file being written."""
    if not state.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if not _enabled:
        raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    _start(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop writing (the file stays valid JSON)."""
    global _writer
    if not state.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if _writer is not None:
        _writer.close()
        _writer = None


def active() -> bool:
    return _writer is not None


# -- recording ---------------------------------------------------------------------------------------------------
@dataclass
class Span:
    """One traced collective: its tensors' timeline names, op, activity and outputs' description."""

    names: list[str]
    op: str
    activity: str
    args: list[dict[str, Any]] = field(default_factory=list)


def _describe(t: Any) -> dict[str, Any]:
    if not isinstance(t, torch.Tensor):
        return {}
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": "[" + ", ".join(str(d) for d in t.shape) + "]"}


def begin(op: str, names: Sequence[str], tensors: Sequence[Any]) -> Span | None:
    """Open ``op`` (``allreduce``...) on each named tensor; None when no timeline is being written."""
    w = _writer
    if w is None:
        return None
    kind = op.upper()
    cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors)
    span = Span(list(names), kind, f"{'NCCL' if cuda else 'GLOO'}_{kind}", [_describe(t) for t in tensors])
    if w.mark_cycles:
        w.marker("CYCLE_START")
    ts = w.now()
    for n in span.names:
        w.event(n, "B", f"NEGOTIATE_{kind}", ts)
    return span


def started(span: Span | None) -> None:
    """The collective is handed to torch: negotiation over, the op and its activity begin."""
    w = _writer
    if w is None or span is None:
        return
    ts = w.now()
    for n in span.names:
        w.event(n, "E", ts=ts)
        w.event(n, "B", span.op, ts)
        w.event(n, "B", span.activity, ts)


def end(span: Span | None, outputs: Sequence[Any] = ()) -> None:
    """The result was waited for: the activity and the op end (with the outputs' dtype and shape)."""
    w = _writer
    if w is None or span is None:
        return
    ts = w.now()
    described = [_describe(o) for o in outputs] or span.args
    for i, n in enumerate(span.names):
        w.event(n, "E", ts=ts)
        w.event(n, "E", ts=ts, args=described[i] if i < len(described) else {})


_open: dict[int, Span] = {}


def _tensor_names(op: str, name: str | None, tensors: Sequence[Any], grouped: bool) -> list[str]:
    base = f"{op}.{name}" if name else f"{op}.noname.{next(_noname)}"
    if not grouped:
        return [base]
    return [f"{base}_{i + 1}of{len(tensors)}" for i in range(len(tensors))]


def traced(op: str, grouped: bool = False) -> Callable[[F], F]:
    """Trace a public collective: an ``_async`` call stays open until :func:`traced_synchronize` closes its
    handle; any other call is traced from entry to return. Calls made inside a traced call are not traced again."""
    def wrap(fn: F) -> F:
        signature = inspect.signature(fn)
        is_async = "_async" in fn.__name__
        prefix = f"grouped_{op}" if grouped else op

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if _writer is None or getattr(_depth, "n", 0):
                return fn(*args, **kwargs)
            bound = signature.bind_partial(*args, **kwargs).arguments
            first = next(iter(bound.values()), None)
            tensors = list(first) if grouped and first is not None else [first]
            span = begin(op, _tensor_names(prefix, bound.get("name"), tensors, grouped), tensors)
            _depth.n = 1
            try:
                started(span)
                out = fn(*args, **kwargs)
            finally:
                _depth.n = 0
            if is_async and span is not None:
                _open[out] = span
            else:
                end(span, out if isinstance(out, (list, tuple)) else [out])
            return out
        return call  # type: ignore[return-value]
    return wrap


def traced_synchronize(fn: F) -> F:
    """``synchronize``: closes the span its handle's call opened."""
    @functools.wraps(fn)
    def call(handle: int) -> Any:
        out = fn(handle)
        span = _open.pop(handle, None)
        if span is not None:
            end(span, out if isinstance(out, (list, tuple)) else [out])
        return out
    return call  # type: ignore[return-value]
