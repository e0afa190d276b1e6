"""What the runner records of a script, the same way in every arm: its optimizer steps and its final weights.

In the Horovod arms (``native`` and ``horovod``) the ``DistributedOptimizer`` factory of the ``horovod.torch``
module the script sees is wrapped, so every optimizer it returns times its own ``step()`` (the instance's method is
replaced by a bound wrapper: LR schedulers keep working, and the zero-gradient step ``broadcast_optimizer_state``
runs on the wrapped class is not counted). In the ``ddp`` arm torch's global optimizer step hooks do the same for
the plain optimizer. Named scalar all-reduces (``hvd.allreduce(acc, name="val_accuracy")``) are kept as metrics: in a
DDP port, the ``allreduce`` helper ``dpcompare migrate`` writes raises the audit event :data:`PORT_METRIC_EVENT`.

Written into the runner's output folder, never beside the script: ``rank{R}.json`` per rank (step end times and
step() durations, metrics, exit code) and, from rank 0, ``params.pt``: the tensors the optimizers held at exit,
keyed by position (``optimizer.group.index``) with their names when the script gave them.

An elastic script (``hvd.elastic.run``), or any run asked to (``step_log``), also gets ``steps.jsonl``, the step
log ``compare --fault`` watches, in the format of dpcompare's own runs (``training/steplog.py``): a line per
optimizer step from the rank that is 0 now, ``start`` when the wrapped function first runs in a process (after a
torchrun restart: at the restored commit's step), ``commit`` at each commit and ``reset`` after Horovod Elastic
rolled back. Its step count is the job's: rolled back to the commit's at a reset, and kept in the layer's commit
on disk (:data:`dpcompare.native.elastic.extras`) for a restarted worker. A DDP port on torchrun's elastic agent
(the ``ddp`` arm with a commit folder: ``ddp-elastic``) logs ``start`` as it starts, at the step its commit was
written after (:func:`resumed_step`: the port's helpers know nothing of the recorder; its step lines name the
commit on disk as they are written), and ``commit`` at the first step that sees a new one.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpcompare.files import STEP_LOG, append_json_line, atomic_write, atomic_write_json
from dpcompare.native.summary import DEFAULT_WARMUP
from dpcompare.trace import NAMED_THREADS, thread_cpu_s, unnamed

#: the folder a runner's records go to, for ranks started by a launcher (set by ``dpcompare script --out``)
OUT_VAR = "DPCOMPARE_SCRIPT_OUT"
PARAMS = "params.pt"
#: the folder the layer's ``hvd.elastic`` keeps its commits in under torchrun (``dpcompare script --commit-dir``)
ELASTIC_DIR_VAR = "DPCOMPARE_ELASTIC_DIR"
#: the audit event (PEP 578) a port's ``allreduce`` helper raises with its name and result: the ``ddp`` arm's metrics
PORT_METRIC_EVENT = "hvd.allreduce"


def rank_file(out: Path, rank: int) -> Path:
    return out / f"rank{rank}.json"


def commit_key(commit: Path) -> str | None:
    """Which commit is on disk (each is a new file: its inode and modification time), None when none is."""
    try:
        st = commit.stat()
    except FileNotFoundError:
        return None
    return f"{st.st_ino}:{st.st_mtime_ns}"


def resumed_step(log: Path, commit: Path) -> int:
    """The step a restarted DDP port resumes from: in ``log`` (a step log whose step lines name the commit on
    disk when they were written), the step done, or started from, before the first line that names ``commit``
    (the commit it restores); when none does, it was written after the last line. 0 without a commit."""
    key = commit_key(commit)
    try:
        lines = log.read_text().splitlines() if key is not None else []
    except FileNotFoundError:
        return 0
    step = 0
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a half-written last line, as a killed process leaves it
        if row.get("commit") == key:
            break
        if row.get("event", "start") == "start" and "step" in row:
            step = int(row["step"])
    return step


class Recorder:
    """Step times, named metrics and the optimizers to read the final weights from, for one process."""

    def __init__(self, out: Path, arm: str, rank: int, world_size: int, step_log: bool = False) -> None:
        self.out, self.arm, self.rank, self.world_size = out, arm, rank, world_size
        self.step_log = step_log
        self.hvd: Any = None
        self._commit: Path | None = None  # a DDP port's commit on torchrun: step lines name the one on disk
        self._seen: str | None = None     # the last commit logged
        self.total = 0          # the job's optimizer steps (rolled back with the state)
        self.committed = 0      # ... as of the last commit
        self.t0 = time.perf_counter()
        self.step_ends: list[float] = []
        self.step_calls: list[float] = []
        self.metrics: dict[str, list[float]] = {}
        self.optimizers: list[Any] = []
        self._pre: float | None = None
        self.cpu_main: list[float] = []    # the stepping thread's CPU seconds at each step's end
        self.cpu_all: list[float] = []     # the process's (every thread's)
        self.threads_at_step = DEFAULT_WARMUP  # the helper threads are read from the end of this step to the last
        self.threads_before: dict[int, tuple[str, float]] | None = None

    # -- steps ----------------------------------------------------------------------------------------------
    def _stepped(self, start: float, end: float) -> None:
        self.step_ends.append(end - self.t0)
        self.step_calls.append(end - start)
        self.cpu_main.append(time.thread_time())  # what took the cores, read at each step's end
        self.cpu_all.append(time.process_time())
        if len(self.step_ends) == self.threads_at_step:
            self.threads_before = thread_cpu_s()
        seen = self._port_commit()
        self.total += 1
        if self.step_log:
            self.log(step=self.total, world_size=self._now()[1], samples=1, **seen)

    def _port_commit(self) -> dict[str, Any]:
        """A DDP port on torchrun: the commit on disk, for the step line; a new one is logged as a commit at the
        steps done before this one (it was written before this step, or after the previous one)."""
        if self._commit is None:
            return {}
        key = commit_key(self._commit)
        if key is not None and key != self._seen:
            self._seen = key
            self.log(event="commit", step=self.total)
        return {"commit": key}

    # -- the step log and elastic runs ------------------------------------------------------------------------
    def _now(self) -> tuple[int, int]:
        """(rank, world size) as they are now (an elastic run's change)."""
        hvd = self.hvd
        if hvd is not None and hvd.is_initialized():
            return hvd.rank(), hvd.size()
        return self.rank, self.world_size

    def log(self, **fields: Any) -> None:
        """One line of the step log, from the rank that is 0 now."""
        if self._now()[0] != 0:
            return
        append_json_line(self.out / STEP_LOG, fields)

    def restored(self, steps: int) -> None:
        self.total = self.committed = int(steps)

    def watch_elastic(self, hvd: types.ModuleType) -> None:
        """Log an elastic script's start, commits and resets, and keep the step count with its commits."""
        elastic = hvd.elastic
        state_class = importlib.import_module("horovod.common.elastic").State  # the layer's too, through the hook
        recorder, run, commit, on_reset = self, elastic.run, state_class.commit, state_class.on_reset

        def recorded_run(func: Callable[..., Any]) -> Callable[..., Any]:
            started = [False]

            @functools.wraps(func)
            def first(state: Any, *args: Any, **kwargs: Any) -> Any:
                if not started[0]:
                    started[0] = recorder.step_log = True
                    recorder.log(event="start", step=recorder.total, world_size=recorder._now()[1])
                return func(state, *args, **kwargs)
            return run(first)

        def recorded_commit(state: Any) -> Any:
            recorder.committed = recorder.total
            try:
                return commit(state)
            finally:
                recorder.log(event="commit", step=recorder.committed)

        def recorded_reset(state: Any) -> Any:
            recorder.total = recorder.committed
            on_reset(state)
            recorder.log(event="reset", step=recorder.total, world_size=recorder._now()[1])

        elastic.run, state_class.commit, state_class.on_reset = recorded_run, recorded_commit, recorded_reset
        if isinstance(getattr(elastic, "extras", None), dict):  # the layer: the step count goes with the commit
            elastic.extras["dpcompare.steps"] = (lambda: recorder.committed, recorder.restored)

    def watch(self, optimizer: Any) -> Any:
        """Time ``optimizer.step()`` of this instance and keep it for the final weights; returns it."""
        step = optimizer.step
        recorder = self

        def timed_step(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                recorder._stepped(start, time.perf_counter())

        optimizer.step = types.MethodType(timed_step, optimizer)
        self.optimizers.append(optimizer)
        return optimizer

    def watch_every_optimizer(self) -> None:
        """The ``ddp`` arm: torch's global step hooks time every optimizer's ``step()``."""
        # here, not at the top: dpcompare --help loads this module
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        if os.environ.get(ELASTIC_DIR_VAR) and "TORCHELASTIC_RESTART_COUNT" in os.environ:
            self._port_started()
        sys.addaudithook(self._audit)  # a port's allreduce helper names its metrics in an audit event

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            self._pre = time.perf_counter()

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            end = time.perf_counter()
            self._stepped(self._pre if self._pre is not None else end, end)
            if not any(o is opt for o in self.optimizers):
                self.optimizers.append(opt)

        register_optimizer_step_pre_hook(pre)
        register_optimizer_step_post_hook(post)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        """A port's ``allreduce`` helper (``dpcompare migrate`` writes it) says ``hvd.allreduce(name, result)``."""
        if event == PORT_METRIC_EVENT and len(args) == 2:
            self._keep_metric(*args)

    def _port_started(self) -> None:
        """A DDP port starting on torchrun's elastic agent, before the script runs: ``start`` at the step the
        commit it will restore was written after (the script may commit again before its first step)."""
        self.step_log = True
        self._commit = Path(os.environ[ELASTIC_DIR_VAR]) / "commit.pt"  # the port's helpers' name, as the layer's
        self.total = self.committed = resumed_step(self.out / STEP_LOG, self._commit)
        self._seen = commit_key(self._commit)  # the commit it restores is no new one
        self.log(event="start", step=self.total, world_size=self._now()[1])

    # -- the horovod.torch module ---------------------------------------------------------------------------
    def _factory(self, factory: Callable[..., Any]) -> Callable[..., Any]:
        def DistributedOptimizer(*args: Any, **kwargs: Any) -> Any:  # noqa: N802  (Horovod's name)
            return self.watch(factory(*args, **kwargs))
        DistributedOptimizer.__doc__ = factory.__doc__
        DistributedOptimizer.__wrapped__ = factory  # type: ignore[attr-defined]
        return DistributedOptimizer

    def _keep_metric(self, name: Any, out: Any) -> None:
        """A named scalar all-reduce's result, kept as a metric."""
        if name and hasattr(out, "numel") and out.numel() == 1:
            self.metrics.setdefault(str(name), []).append(float(out.detach().float().cpu()))

    def _metric(self, allreduce: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(allreduce)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = allreduce(*args, **kwargs)
            try:
                name = signature.bind_partial(*args, **kwargs).arguments.get("name")
            except TypeError:
                name = None
            self._keep_metric(name, out)
            return out
        recorded.__doc__ = allreduce.__doc__
        recorded.__wrapped__ = allreduce  # type: ignore[attr-defined]
        return recorded

    def patch(self, hvd: types.ModuleType) -> None:
        """Wrap ``hvd.DistributedOptimizer``, the synchronous all-reduces and ``hvd.elastic`` of a
        ``horovod.torch`` module."""
        self.hvd = hvd
        self.watch_elastic(hvd)
        hvd.DistributedOptimizer = self._factory(hvd.DistributedOptimizer)  # type: ignore[attr-defined]
        for name in ("allreduce", "allreduce_"):
            setattr(hvd, name, self._metric(getattr(hvd, name)))

    # -- at exit --------------------------------------------------------------------------------------------
    def final_tensors(self) -> tuple[dict[str, Any], dict[str, str]]:
        """(position → tensor on CPU, position → name) of every watched optimizer's parameters."""
        tensors: dict[str, Any] = {}
        names: dict[str, str] = {}
        for k, opt in enumerate(self.optimizers):
            prefix = f"{k}." if len(self.optimizers) > 1 else ""
            known = getattr(opt, "_parameter_names", {}) or {}
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    key = f"{prefix}{g}.{i}"
                    tensors[key] = p.detach().to("cpu", copy=True)
                    if p in known:
                        names[key] = known[p]
        return tensors, names

    def _threads(self) -> list[dict[str, Any]]:
        """The other threads' CPU seconds since :attr:`threads_at_step` (name, tid, seconds), the busiest first."""
        if self.threads_before is None:
            return []
        me, now = threading.get_native_id(), thread_cpu_s()
        spent = [{"name": unnamed(name, now, me), "tid": tid, "s": cpu - self.threads_before.get(tid, (name, 0.0))[1]}
                 for tid, (name, cpu) in now.items() if tid != me]
        return sorted((x for x in spent if x["s"] > 0), key=lambda x: -x["s"])[:NAMED_THREADS]

    def write(self, exit_code: int) -> None:
        self.rank, self.world_size = self._now()  # an elastic run's rank at the end
        record = {"arm": self.arm, "rank": self.rank, "world_size": self.world_size, "exit_code": exit_code,
                  "wall_s": time.perf_counter() - self.t0, "steps": len(self.step_ends),
                  "step_ends_s": self.step_ends, "step_call_s": self.step_calls, "metrics": self.metrics,
                  "cpu_main_s": self.cpu_main, "cpu_all_s": self.cpu_all, "helper_threads": self._threads()}
        if self.rank == 0 and self.optimizers:
            # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
            import torch

            tensors, names = self.final_tensors()
            atomic_write(self.out / PARAMS, lambda f: torch.save({"tensors": tensors, "names": names}, f))
        atomic_write_json(rank_file(self.out, self.rank), record)
