"""What a run reports: its timing and memory across ranks, and the run summary (``summary.json``).

Every key ``summary.json`` has ever had stays: for an accuracy workload ``final_test_accuracy`` and the
history rows' ``test_accuracy``; for every workload the generic ``metric``, ``final_metric``, the rows'
``test_metric`` and ``metrics`` (every metric by name), and ``workload``.
"""

from __future__ import annotations

import resource
import socket
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpcompare import knobs
from dpcompare.backends.base import Strategy
from dpcompare.config import TrainConfig
from dpcompare.data.workload import Metric, Workload
from dpcompare.files import MEMORY_PARTS, PHASES
from dpcompare.training.step import StepTiming
from dpcompare.versions import versions


def peak_rss_mb() -> float:
    """The process's peak resident memory: Linux's VmHWM (which a compare worker resets before each run),
    else the lifetime maximum getrusage keeps."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def timing_summary(strategy: Strategy, steps: list[StepTiming], samples_per_step: int,
                   cpu: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every rank's timed steps → global throughput (the slowest rank decides) and step statistics; ``cpu``:
    this rank's :meth:`dpcompare.trace.CpuClock.figures` (``cpu_ms``: each rank's main and other threads)."""
    totals = [s.total for s in steps] or [0.0]
    mine = {"step_ms_median": statistics.median(totals) * 1e3, "step_ms_p95": float(np.percentile(totals, 95)) * 1e3,
            **{f"{p}_ms": statistics.median([getattr(s, p) for s in steps] or [0.0]) * 1e3 for p in PHASES},
            "cpu_main_ms": (cpu or {}).get("main", -1.0), "cpu_helpers_ms": (cpu or {}).get("helpers", -1.0),
            "measured_seconds": sum(s.total for s in steps), "measured_steps": float(len(steps)),
            "peak_rss_mb": peak_rss_mb()}
    table = strategy.all_gather_floats(list(mine.values()))
    per_rank = [{"rank": r, **dict(zip(mine, row, strict=True))} for r, row in enumerate(table)]
    for r in per_rank:
        r["measured_steps"] = int(r["measured_steps"])
    slowest = max(per_rank, key=lambda r: r["measured_seconds"])
    measured = slowest["measured_steps"]
    sps = samples_per_step * measured / slowest["measured_seconds"] if slowest["measured_seconds"] > 0 else 0.0
    return {
        "samples_per_sec": sps,
        "measured_steps": measured,
        "measured_seconds": slowest["measured_seconds"],
        "step_ms_median": max(r["step_ms_median"] for r in per_rank),
        "step_ms_p95": max(r["step_ms_p95"] for r in per_rank),
        "phases_ms": {p: statistics.fmean(r[f"{p}_ms"] for r in per_rank) for p in PHASES},
        "peak_rss_mb": max(r["peak_rss_mb"] for r in per_rank),
        "per_rank": per_rank,
        "cpu_ms": cpu_ms(per_rank, cpu),
    }


def cpu_ms(per_rank: list[dict[str, Any]], mine: dict[str, Any] | None) -> dict[str, Any] | None:
    """``timing.cpu_ms``: CPU ms per timed step of the thread that runs the steps (``main``) and of the process's
    other threads (``helpers``), the mean over ranks and each rank's; ``threads``: this rank's (rank 0's, in the
    summary) busiest other threads by name. The ``cpu_*`` keys leave ``per_rank`` for it."""
    rows = [{"rank": r["rank"], "main": r.pop("cpu_main_ms"), "helpers": r.pop("cpu_helpers_ms")} for r in per_rank]
    rows = [r for r in rows if r["main"] >= 0]
    if not rows or mine is None:
        return None
    return {"main": statistics.fmean(r["main"] for r in rows), "helpers": statistics.fmean(r["helpers"] for r in rows),
            "per_rank": rows, "threads": mine.get("threads", [])}


def memory_summary(strategy: Strategy, mine: dict[str, int], timing: dict[str, Any]) -> dict[str, Any]:
    """Bytes of parameters, gradients and optimizer state on every rank (tensor accounting, at the end of
    training) with each rank's peak RSS; the top-level figures are the largest rank's, in MB."""
    values = [float(mine[k]) for k in MEMORY_PARTS]
    table = strategy.all_gather_floats([*values, float(sum(values))])
    per_rank = [{"rank": r, **{f"{k}_bytes": int(v) for k, v in zip((*MEMORY_PARTS, "total"), row, strict=True)},
                 "peak_rss_mb": timing["per_rank"][r]["peak_rss_mb"]} for r, row in enumerate(table)]
    return {**{f"{k}_mb": max(r[f"{k}_bytes"] for r in per_rank) / 2**20 for k in (*MEMORY_PARTS, "total")},
            "peak_rss_mb": timing["peak_rss_mb"], "per_rank": per_rank}


def metric_keys(metric: Metric, values: dict[str, float]) -> dict[str, Any]:
    """A history row's evaluation keys: ``test_accuracy`` for accuracy (as always), ``test_metric`` (the first
    metric's value) and ``metrics`` (every metric by name)."""
    keys: dict[str, Any] = {"test_accuracy": values["accuracy"]} if "accuracy" in values else {}
    return {**keys, "test_metric": values[metric.name], "metrics": dict(values)}


def workload_keys(workload: Workload) -> dict[str, Any]:
    """summary.json's description of the workload and of its (first) metric."""
    m = workload.metric
    return {"metric": {"name": m.name, "higher_is_better": m.higher_is_better, "unit": m.unit},
            "workload": {"name": workload.name, "source": workload.source, "label": workload.label, **workload.info}}


def run_summary(cfg: TrainConfig, strategy: Strategy, workload: Workload, history: list[dict[str, Any]],
                figures: dict[str, Any], resume_path: Path | None) -> dict[str, Any]:
    """The run summary every rank returns and rank 0 writes as ``summary.json``.

    ``figures`` holds what the run measured: lr, stepping (the optimizer's class and groups, the schedule, the
    clipping norm, the last learning rate), global_batch, epochs, steps, timing, memory, curve (the eval curve's
    summary), comm (the run's own communication counters) and run_info (the run's config).
    """
    last = history[-1] if history else {}
    f = figures
    return {
        "strategy": strategy.name, "world_size": strategy.world_size, "launcher": strategy.env.launcher,
        "device": str(strategy.device), "model": workload.info.get("model"), "dataset": workload.info.get("dataset"),
        "epochs": f["epochs"],
        "steps": f["steps"], "batch_size": cfg.batch_size, "global_batch_size": f["global_batch"], "lr": f["lr"],
        "stepping": f["stepping"],
        "seed": cfg.seed, "final_train_loss": last.get("train_loss"),
        "final_test_accuracy": last.get("test_accuracy"),
        "samples_per_sec": f["timing"]["samples_per_sec"], "timing": f["timing"], "memory": f["memory"],
        **f["curve"],
        "resumed_from": str(resume_path) if resume_path else None,
        "sync_mechanism": strategy.sync_mechanism, "knobs": knobs.active(cfg),
        "comm": {"library": strategy.library(), **strategy.comm_report(), **f["comm"]},
        "config": f["run_info"], "versions": versions(),
        **workload_keys(workload), "final_metric": last.get("test_metric"),
    }


def regime_facts(strategy: Strategy, model: Any, communication: dict[str, Any] | None) -> dict[str, Any]:
    """What a report's regime card needs: the gradient MB a rank exchanges per step, the MB of buffers (DDP
    broadcasts them at each forward), intra-op threads per rank,
    the number of distinct hosts, and (traced runs) the communication the step waited for."""
    params = [p for p in strategy.unwrap_model(model).parameters() if p.requires_grad]
    hosts = {h.decode() for h in strategy.gather_bytes(socket.gethostname().encode())}
    buffers = strategy.unwrap_model(model).buffers()
    facts: dict[str, Any] = {"gradient_mb": sum(p.numel() * p.element_size() for p in params) / 2**20,
                             "buffer_mb": sum(b.numel() * b.element_size() for b in buffers) / 2**20,
                             "threads": torch.get_num_threads(), "hosts": len(hosts)}
    traits = strategy.traits  # what the workload's pre-check saw, and what the strategy did about it
    if traits is not None and (traits.unused or traits.sparse):
        facts.update(unused_parameters=list(traits.unused), sparse_parameters=list(traits.sparse),
                     find_unused_parameters=strategy.comm_report().get("find_unused_parameters"))
    if communication:
        facts["communication"] = {k: communication[k] for k in ("exposed_ms_per_step", "hidden_ms_per_step",
                                                                 "wait_ms_per_step", "comm_ms_per_step")
                                  if k in communication}
    return facts
