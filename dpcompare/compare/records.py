"""What a comparison writes: one record per run (the ONE mapping from a run's summary.json to results.json's
``runs``), the results object itself, and reading it back to resume. Schema: docs/results-schema.md.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpcompare import backends
from dpcompare.compare.axes import AXES, LINK
from dpcompare.compare.cmdline import stored_args
from dpcompare.compare.plan import Arm, Comparison, RunSpec
from dpcompare.compare.stopping import StoppingRule
from dpcompare.errors import DIVERGED_EXIT, ConfigError
from dpcompare.files import MEMORY_KINDS, METRICS, RESULTS, SCHEMA, SUMMARY
from dpcompare.launch.mpirun import comm_vars
from dpcompare.launch.openmpi import YIELD_VAR
from dpcompare.native.calls import SCRIPT_ARM_FACTS
from dpcompare.versions import versions

REPORT_FILES = ("report.html", "plots")
ERROR_TAIL_LINES = 40
ERROR_TAIL_CHARS = 4000
#: what must match between a stored comparison and its resumption
PLAN_KEYS = ("arms", "np", "repeats", "target_ci", "max_repeats", "time_budget", "equivalence", "seeds",
             "accuracy_equivalence", "train_flags")


def tail(text: str, lines: int = ERROR_TAIL_LINES, chars: int = ERROR_TAIL_CHARS) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


def _read_text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def run_record(spec: RunSpec, rel_dir: str, returncode: int | None, wall_seconds: float,
               summary: dict[str, Any] | None, metrics: list[dict[str, Any]], stderr: str,
               stdout: str = "", command: Sequence[str] = ()) -> dict[str, Any]:
    """One entry of results.json ``runs`` from what the job left behind."""
    rec: dict[str, Any] = {
        "arm": spec.arm.label, "strategy": spec.strategy, "elastic": spec.arm.elastic,
        "knobs": spec.arm.to_json()["knobs"], "axes": spec.arm.axes_json(),
        "np": spec.np,
        "repeat": spec.repeat, "seed": spec.seed, "status": "failed", "error": None, "global_batch": None,
        "measured_seconds": None,
        "dir": rel_dir, "returncode": returncode, "command": list(command), "samples_per_sec": None,
        "step_ms": None, "phases_ms": None, "final_test_accuracy": None, "final_train_loss": None,
        "peak_rss_mb": None, "memory_mb": None, "regime": None, "communication": None, "metric": None,
        "final_metric": None, "workload": None, "measured_steps": None, "device": None,
        "wall_seconds": round(wall_seconds, 3),
        "metrics": metrics, "target_accuracy": None, "time_to_accuracy_s": None, "steps_to_accuracy": None,
        "epochs_to_accuracy": None, "eval_curve": [], "load": None,
    }
    if returncode == 0 and summary is not None:
        t = summary.get("timing") or {}
        rec.update(samples_per_sec=t.get("samples_per_sec", summary.get("samples_per_sec")),
                   step_ms={"median": t.get("step_ms_median"), "p95": t.get("step_ms_p95")},
                   phases_ms=t.get("phases_ms"), final_test_accuracy=summary.get("final_test_accuracy"),
                   final_train_loss=summary.get("final_train_loss"), peak_rss_mb=t.get("peak_rss_mb"),
                   measured_steps=t.get("measured_steps"), device=summary.get("device"),
                   memory_mb=_memory_mb(summary.get("memory")), regime=summary.get("regime"),
                   communication=summary.get("communication"),
                   metric=summary.get("metric"), final_metric=summary.get("final_metric"),
                   workload=summary.get("workload"),
                   global_batch=summary.get("global_batch_size"), measured_seconds=t.get("measured_seconds"),
                   timing_only_steps=t.get("timing_only_steps"),
                   **{k: summary.get(k) for k in ("target_accuracy", "time_to_accuracy_s", "steps_to_accuracy",
                                                  "epochs_to_accuracy")}, eval_curve=summary.get("eval_curve") or [])
        rec["cpu_ms"] = t.get("cpu_ms")  # the main thread's and the other threads' CPU per step (what took the cores)
        if summary.get("seed") is not None:
            rec["seed"] = summary["seed"]
        if not t.get("measured_steps"):
            rec["error"] = ("no step was timed: --warmup-steps is at least the number of steps the run took; "
                            "lower it or train longer")
        else:
            rec["status"] = "ok"
    elif returncode == DIVERGED_EXIT:
        rec["status"] = "diverged"
        rec["error"] = tail(stderr or stdout) or "the loss or the gradients stopped being finite (exit code 3)"
    elif returncode == 0:
        rec["error"] = "the job exited 0 but wrote no summary.json\n" + tail(stderr or stdout)
    elif returncode is None:
        rec["error"] = f"timed out after {wall_seconds:.0f} s and was stopped\n" + tail(stderr or stdout)
    else:
        rec["error"] = tail(stderr or stdout) or f"exited with code {returncode} and printed nothing"
    return rec


def _memory_mb(memory: dict[str, Any] | None) -> dict[str, Any] | None:
    """summary.json's tensor accounting: the largest rank's MB per kind (:data:`dpcompare.files.MEMORY_KINDS`,
    the one list of them), and every rank's."""
    if not memory:
        return None
    return {**{k: memory.get(f"{k}_mb") for k in MEMORY_KINDS},
            "per_rank": [{k: r[f"{k}_bytes"] / 2**20 for k in MEMORY_KINDS} for r in memory.get("per_rank", [])]}



def environment(strategies: Sequence[str] | None = None) -> dict[str, Any]:
    return {**versions(), "platform": platform.platform(), "machine": platform.machine(),
            "hostname": platform.node(), "cpus": os.cpu_count(),
            "strategies": {n: _strategy_facts(n) for n in (strategies or backends.names())}}


def _strategy_facts(name: str) -> dict[str, Any]:
    """What results.json records about an arm's strategy; the native layer (a ``--script`` arm) is no strategy."""

    if name in SCRIPT_ARM_FACTS:
        return dict(SCRIPT_ARM_FACTS[name])
    s = backends.get(name)
    return {"summary": s.summary, "sync_mechanism": s.sync_mechanism, "communication": dict(s.communication)}


def prepare_out(out: Path, overwrite: bool) -> None:
    """Refuse a folder holding results unless --overwrite; with it, remove only what compare wrote."""
    if (out / RESULTS).exists() and not overwrite:
        raise ConfigError(f"{out} already holds a comparison ({RESULTS}); pass --overwrite to replace it, "
                          "or another --out")
    if overwrite:
        for name in ("runs", RESULTS, *REPORT_FILES):
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _lab_json(c: Comparison) -> dict[str, Any]:
    if c.lab is None:
        return {}
    lab = c.lab.to_json()
    links = [str(link) for link in c.values(LINK)]
    if links:  # swept: every link the arms ran on (the report's regime card shows `link`)
        lab.update({LINK: ", ".join(links), "links": links})
    return {"lab": lab}


def new_results(c: Comparison, arms: Sequence[Arm], train_flags: list[str], cli: list[str]) -> dict[str, Any]:
    """The results object a comparison starts with (no runs yet, ``complete`` false)."""
    schedule = c.stopping.to_json()
    return {
        "schema": SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "complete": False,
        "config": {"arms": [a.to_json() for a in arms], "strategies": [a.strategy for a in arms],
                   "np": list(c.nps), "repeats": schedule["repeats"], "baseline": arms[0].label,
                   **{k: v for k, v in schedule.items() if k != "repeats"},
                   "order": [], "workers": c.options.workers, "train": c.config.to_dict(),
                   "train_flags": train_flags, "cli": cli, **_lab_json(c),
                   "axes": {name: AXES[name].record(values) for name, values in c.axes},
                   "binding": binding(c), "rerun_disturbed": c.options.disturbed or None,
                   **({"script": c.script.to_json()} if c.script is not None else {})},
        "environment": environment(list(dict.fromkeys(a.strategy for a in arms))), "runs": [], "verdicts": [],
    }


def binding(c: Comparison) -> dict[str, Any]:
    """results.json's ``config.binding``: where the ranks ran (``bind``: --bind, or ``by arm`` with a ``bind``
    axis, each arm's in ``arms[].axes``), the intra-op threads per rank (0: torch's default) and Horovod's
    ``HOROVOD_THREAD_AFFINITY`` as forwarded to the ranks (None: unset; ``--bind comm`` without it: "from the
    local rank", each run's own value in its summary.json's ``comm``) and Open MPI's ``mpi_yield_when_idle`` (None:
    unset, Open MPI's default; ``--bind comm`` sets "1" unless the environment sets it). A value only the comm arms
    of a ``bind`` axis got says so."""
    placements = c.values("bind") or (c.options.bind,)
    comm = "comm" in placements
    only = " (the bind=comm arms)" if comm and set(placements) != {"comm"} else ""
    return {"bind": "by arm" if c.values("bind") else c.options.bind, "threads": c.config.threads,
            "horovod_thread_affinity": os.environ.get("HOROVOD_THREAD_AFFINITY")
            or (f"from the local rank{only}" if comm else None),
            "mpi_yield_when_idle": os.environ.get(YIELD_VAR) or (comm_vars(os.environ)[YIELD_VAR] + only if comm
                                                                 else None)}


def read_run(spec: RunSpec, run_dir: Path, rel_dir: str, returncode: int | None, wall_seconds: float,
             command: Sequence[str]) -> dict[str, Any]:
    """The record of the run that just ended in ``run_dir`` (:func:`run_record` of what it left there)."""
    summary_path = run_dir / SUMMARY
    try:
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        metrics = _read_jsonl(run_dir / METRICS)
    except (OSError, ValueError):
        summary, metrics = None, []
    return run_record(spec, rel_dir, returncode, wall_seconds, summary, metrics, _read_text(run_dir / "stderr.log"),
                      _read_text(run_dir / "stdout.log"), command)


def resume_state(out: Path, fresh: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The stored results of the comparison in ``out`` to continue, and its runs that are ``ok`` by name.

    ``fresh`` is the results object this invocation would start with; its plan and configuration must
    be the stored ones (else one line saying what differs).
    """
    path = out / RESULTS
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--continue {out}: no {RESULTS} there; start the comparison with --out {out}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"--continue {out}: {path} cannot be read ({e})") from None
    if not isinstance(stored, dict) or stored.get("schema") != SCHEMA or not isinstance(stored.get("runs"), list):
        raise ConfigError(f"--continue {out}: {path} is not a results file of this dpcompare (schema {SCHEMA})")
    old, new = stored.get("config") or {}, fresh["config"]
    absent = {"seeds": None, "accuracy_equivalence": StoppingRule().accuracy_equivalence}  # results from before them
    for key in PLAN_KEYS:
        if key == "train_flags" and same_train_settings(old.get(key), new.get(key)):
            continue  # the same settings, written another way (e.g. by an earlier dpcompare)
        if old.get(key, absent.get(key)) != new.get(key):
            raise ConfigError(f"--continue {out}: the {key.replace('_', ' ')} differs from the stored comparison's "
                              f"({short(new.get(key))} here, {short(old.get(key))} stored); pass the same "
                              f"options, or start a new comparison with another --out")
    kept = {}
    for rec in stored["runs"]:
        name = Path(str(rec.get("dir", ""))).name
        if rec.get("status") == "ok" and (out / str(rec["dir"]) / SUMMARY).exists():
            kept[name] = rec
    resumed = {**stored, "config": {**old, "order": []}, "complete": False, "runs": [], "verdicts": [],
               "resumed": [*stored.get("resumed", []), fresh["created"]]}
    return resumed, kept




def same_train_settings(old: Any, new: Any) -> bool:
    """Whether two stored train-flag lists set the same train settings when compare reads them back."""
    if not isinstance(old, list) or not isinstance(new, list):
        return False
    try:
        return vars(stored_args(old)[0]) == vars(stored_args(new)[0])
    except ConfigError:
        return False


def short(value: Any) -> str:
    """A stored or given setting in at most 80 characters, for one-line messages."""
    text = " ".join(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else str(value)
    return (text or "none") if len(text) <= 80 else text[:77] + "..."
