"""A fault as an axis of a comparison (``--fault host=2,at-step=40[,back-at-step=80]``): take a host down at a
step of a running job, and measure what it cost from the run's step log.

The comparing process starts the job as any other, then watches ``RUN/steps.jsonl`` (the reporting rank's line
per step, :mod:`dpcompare.training.steplog`). When a step at or past ``at-step`` is logged, the lab's host dies
(:meth:`~dpcompare.lab.Lab.fail_host`: its link down first, then every process in it killed, as a node losing
power); with ``back-at-step`` the host comes back once the log shows the job recovered and reached that step
(:meth:`~dpcompare.lab.Lab.revive_host`, and for torchrun a new agent there). Whatever happens, the host is
revived when the run ends, so the next run has the whole lab.

From the log, afterwards (:func:`recovery`): the **pause** (from the fault to the first step completed after the
job recovered: the first ``start`` or ``reset`` line after the fault), the **steps redone** (the newest step
completed before the recovery minus the step it resumed from: torchrun's checkpoint, Horovod's commit), the
**world size over time** and the step **timeline** the report draws throughput from.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from dpcompare.compare.axes import Fault
from dpcompare.files import STEP_LOG
from dpcompare.lab import Lab
from dpcompare.launch.jobs import LOGS, start_job, stop_job
from dpcompare.training.steplog import read_step_log

#: seconds between two looks at a running job's step log
POLL_S = 0.05
#: at most this many points of a run's step timeline are kept in results.json (the report draws them)
TIMELINE_POINTS = 400


class StepWatch:
    """Reads a step log as it grows: the newest step, and the lines after a time."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.rows: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        """The whole lines written since the last poll."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next poll
        self.offset += end
        new = []
        for line in chunk[:end].decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                new.append(json.loads(line))
        self.rows += new
        return new

    def last_step(self, after: float = 0.0) -> int:
        return max((int(r["step"]) for r in self.rows if "event" not in r and r["t"] > after), default=0)

    def last_commit(self) -> int:
        return max((int(r["step"]) for r in self.rows if r.get("event") == "commit"), default=0)

    def recovered_after(self, t: float) -> bool:
        return any(r.get("event") in ("start", "reset") and r["t"] > t for r in self.rows)


def run_with_fault(cmd: Sequence[str], run_dir: Path, env: dict[str, str], timeout: float | None, fault: Fault,
                   lab: Lab, rejoin: Sequence[str] | None = None,
                   commits: bool = False) -> tuple[int | None, float, dict[str, Any]]:
    """Run the job ``cmd`` (output in RUN/stdout.log and stderr.log, stopped after ``timeout``) and make ``fault``
    happen to it; (exit code or None when stopped, seconds, what happened when: the fault's record).

    ``commits``: the run commits at the fault's step (an elastic run whose --commit-every divides it): the host
    dies right after that commit is logged, not as soon as the step is (the commit may take a collective)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    watch = StepWatch(run_dir / STEP_LOG)
    record: dict[str, Any] = {**fault.to_json(), "t_start": time.time(), "t_fault": None, "step_at_fault": None,
                              "t_back": None, "after_commit": commits}
    extra: subprocess.Popen[bytes] | None = None
    t0 = time.perf_counter()
    with contextlib.ExitStack() as files:
        out, err = (files.enter_context(open(run_dir / name, "w")) for name in LOGS)  # not atomic: log streams
        rejoin_log = files.enter_context(open(run_dir / "rejoin.log", "w")) if rejoin else None  # not atomic: a log
        p = start_job(cmd, env, out, err)
        try:
            rc: int | None = None
            while (rc := p.poll()) is None:
                if timeout is not None and time.perf_counter() - t0 > timeout:
                    stop_job(p)
                    rc = None
                    break
                watch.poll()
                extra = _act(watch, fault, lab, record, rejoin, env, rejoin_log) or extra
                time.sleep(POLL_S)  # polling a running job's log, bounded by its timeout
        except BaseException:
            stop_job(p)
            raise
        finally:
            if extra is not None:
                stop_job(extra)
            if not lab.hosts[fault.host].alive or not lab.hosts[fault.host].up:
                lab.revive_host(fault.host)  # the next run has the whole lab
    return rc, time.perf_counter() - t0, record


def _act(watch: StepWatch, fault: Fault, lab: Lab, record: dict[str, Any], rejoin: Sequence[str] | None,
         env: dict[str, str], log: IO[Any] | None) -> subprocess.Popen[bytes] | None:
    """Take the host down, or bring it back, when the log says it is time; the rejoining agent, if started."""
    if record["t_fault"] is None:
        if (watch.last_commit() if record["after_commit"] else watch.last_step()) >= fault.at_step:
            record["step_at_fault"] = watch.last_step()
            record["t_fault"] = time.time()
            lab.fail_host(fault.host)
        return None
    if fault.back_at_step is None or record["t_back"] is not None or not watch.recovered_after(record["t_fault"]):
        return None
    if watch.last_step(after=record["t_fault"]) < fault.back_at_step:
        return None
    lab.revive_host(fault.host)
    record["t_back"] = time.time()
    return start_job(rejoin, env, log, log) if rejoin else None


# -- what the log says, afterwards ------------------------------------------------------------------------------
def _steps(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "event" not in r and "step" in r]


def recovery(rows: Sequence[dict[str, Any]], t_fault: float | None) -> dict[str, Any]:
    """The pause, the steps redone and the step it resumed from, from a run's step log and the fault's time.

    ``recovered`` is False when no start or reset line follows the fault (the job did not carry on)."""
    if t_fault is None:
        return {"recovered": False, "pause_s": None, "steps_redone": None, "resumed_from_step": None,
                "reason": "the run never reached the fault's step"}
    back = next((r for r in rows if r.get("event") in ("start", "reset") and r["t"] > t_fault), None)
    if back is None:
        return {"recovered": False, "pause_s": None, "steps_redone": None, "resumed_from_step": None,
                "reason": "no recovery after the fault"}
    steps = _steps(rows)
    done = max((int(r["step"]) for r in steps if r["t"] <= back["t"]), default=0)
    first = next((r for r in steps if r["t"] > back["t"]), None)
    return {"recovered": True, "pause_s": round(first["t"] - t_fault, 3) if first else None,
            "steps_redone": max(0, done - int(back["step"])), "resumed_from_step": int(back["step"]),
            "steps_before_fault": done, "world_size_after": int(back["world_size"]), "how": back["event"]}


def world_sizes(rows: Sequence[dict[str, Any]], t0: float) -> list[list[float]]:
    """``[[seconds since t0, world size], ...]``: the world size each time it changes."""
    out: list[list[float]] = []
    for r in rows:
        w = r.get("world_size")
        if w is not None and (not out or out[-1][1] != w):
            out.append([round(r["t"] - t0, 3), int(w)])
    return out


def timeline(rows: Sequence[dict[str, Any]], t0: float, points: int = TIMELINE_POINTS) -> list[list[float]]:
    """``[[seconds since t0, step, world size, samples so far], ...]`` for at most ``points`` steps (every k-th,
    and always the last): the report draws throughput over time from the samples' slope."""
    steps, total, out = _steps(rows), 0, []
    every = max(1, -(-len(steps) // points))
    for i, r in enumerate(steps):
        total += int(r.get("samples", 0))
        if i % every == 0 or i == len(steps) - 1:
            out.append([round(r["t"] - t0, 3), int(r["step"]), int(r["world_size"]), total])
    return out


def figures(run_dir: Path, fault: dict[str, Any] | None, t_start: float | None) -> dict[str, Any]:
    """What results.json keeps of a run's step log: its timeline and world sizes, and with a fault its record
    and :func:`recovery`."""
    rows = read_step_log(run_dir / STEP_LOG)
    if not rows:
        return {}
    t0 = t_start if t_start is not None else rows[0]["t"]
    out: dict[str, Any] = {"timeline": timeline(rows, t0), "world_sizes": world_sizes(rows, t0)}
    if fault is not None:
        out["fault"] = {**fault, "t_fault_s": None if fault["t_fault"] is None else round(fault["t_fault"] - t0, 3),
                        "t_back_s": None if fault["t_back"] is None else round(fault["t_back"] - t0, 3)}
        out["recovery"] = recovery(rows, fault["t_fault"])
    return out


def same_weights(run_dir: Path, other_dir: Path) -> dict[str, Any]:
    """The final states of two runs (their newest checkpoints), compared tensor by tensor: ``equal`` when every
    tensor of the model is bit for bit the same, with the largest absolute difference and the steps taken."""
    import torch  # here, not at the top: dpcompare --help loads this module

    from dpcompare import checkpoint  # here, not at the top: it loads torch and numpy

    paths = [checkpoint.latest_checkpoint(d) for d in (run_dir, other_dir)]
    if None in paths:
        return {"equal": None, "why": "no final checkpoint to compare"}
    a, b = (checkpoint.load_checkpoint(p) for p in paths)  # type: ignore[arg-type]
    names = sorted(a["model"])
    if names != sorted(b["model"]):
        return {"equal": False, "why": "the two models hold different tensors"}
    diff = max((float((a["model"][k].double() - b["model"][k].double()).abs().max()) for k in names), default=0.0)
    return {"equal": all(torch.equal(a["model"][k], b["model"][k]) for k in names), "max_abs_diff": diff,
            "tensors": len(names), "steps": [int(a["global_step"]), int(b["global_step"])]}
