"""``dpcompare compare``: the same training job under several arms and process counts, repeated.

An *arm* is a label, a strategy and train settings that differ from the shared ones (``--strategies``,
``--variants``, ``--sweep``). Every (arm, np, repeat) is its own job (``mpirun -np N python -m dpcompare
train ...``, or srun inside a Slurm allocation) with the same configuration and seed, written to
``OUT/runs/<arm>-np<N>-r<k>/``. Runs go in blocks: a repeat runs every (np, arm) once, with the order
reversed on odd repeats, so slow drifts of the machine hit every arm of a block alike and the verdicts
pair the arms within blocks. ``--repeats auto`` adds blocks until the verdicts' intervals are narrow
enough. ``OUT/results.json`` collects the runs (schema: docs/results-schema.md) and is rewritten after
each run; the report (table, verdicts, plots, report.html) is rendered from it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpcompare.config import TrainConfig
from dpcompare.errors import DIVERGED_EXIT, ConfigError
from dpcompare.files import RESULTS, SCHEMA, atomic_write_json
from dpcompare.launch.env import under_launcher
from dpcompare.launch.mpirun import job_command, job_env
from dpcompare.options import train_argv
from dpcompare.progress import ProgressLine

REPORT_FILES = ("report.html", "plots")
#: compare's default --min-steps: about 1 s of timed steps for the demo's few-ms steps
DEFAULT_MIN_STEPS = 200
ERROR_TAIL_LINES = 40
ERROR_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Arm:
    """One side of a comparison: a label, a strategy, and train settings that differ from the shared ones."""

    label: str
    strategy: str
    knobs: tuple[tuple[str, Any], ...] = ()

    @property
    def slug(self) -> str:
        """The label as a folder name (``ddp#1`` → ``ddp-1``, ``ddp/k=v`` → ``ddp-k-v``)."""
        return re.sub(r"[^A-Za-z0-9_.]+", "-", self.label).strip("-") or "arm"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "strategy": self.strategy, "knobs": _jsonable(dict(self.knobs))}


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


@dataclass(frozen=True)
class RunSpec:
    arm: Arm
    np: int
    repeat: int
    seed: int | None = None  # --seeds: this block's seed (None: the shared --seed)

    def __post_init__(self) -> None:
        if isinstance(self.arm, str):  # a bare strategy name is the arm of that strategy
            object.__setattr__(self, "arm", Arm(self.arm, self.arm))

    @property
    def strategy(self) -> str:
        return self.arm.strategy

    @property
    def name(self) -> str:
        return f"{self.arm.slug}-np{self.np}-r{self.repeat}" + ("" if self.seed is None else f"-s{self.seed}")


def block(arms: Sequence[Arm], nps: Sequence[int], repeat: int, seeds: Sequence[int] = ()) -> list[RunSpec]:
    """One block: every (np, arm) once; odd repeats run it backwards. With ``seeds`` the blocks take them in
    turn (block k: seeds[k mod len(seeds)]), the same seed for every run of the block."""
    configs = [(n, a) for n in nps for a in arms]
    seed = seeds[repeat % len(seeds)] if seeds else None
    return [RunSpec(a, n, repeat, seed) for n, a in (reversed(configs) if repeat % 2 else configs)]


def plan(arms: Sequence[Arm | str], nps: Sequence[int], repeats: int) -> list[RunSpec]:
    """Repeat-major order: every (np, arm) once per repeat; odd repeats run it backwards."""
    arms_ = as_arms(arms)
    return [spec for r in range(repeats) for spec in block(arms_, nps, r)]


def parse_np(text: str) -> list[int]:
    """``1,2,4`` → [1, 2, 4] (duplicates dropped, ascending)."""
    try:
        nps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of process counts like 1,2,4") from None
    if not nps or min(nps) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of process counts like 1,2,4")
    return sorted(set(nps))


def _check_strategy(name: str) -> str:
    from dpcompare import backends

    if name not in backends.names():
        raise argparse.ArgumentTypeError(f"unknown strategy {name or '(empty)'}; choose from "
                                         f"{', '.join(backends.names())}")
    return name


def parse_arm_strategies(text: str) -> list[str]:
    """``ddp,horovod`` → ['ddp', 'horovod'] (order kept; a repeated name is an A/A control, kept too)."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"unknown strategy {text!r}; give names like ddp,horovod")
    return [_check_strategy(n) for n in names]


def parse_strategies(text: str) -> list[str]:
    """``ddp,horovod`` → ['ddp', 'horovod'], checked against the registered strategies (order kept, no repeats)."""
    return list(dict.fromkeys(parse_arm_strategies(text)))


#: train settings an arm may not change: compare sets them for every run itself
NOT_ARM_SETTINGS = ("strategy", "out", "overwrite", "progress", "resume")


def parse_setting(name: str, text: str) -> Any:
    """``text`` as the value of TrainConfig field ``name``, with the field's own type and choices."""
    from dpcompare.options import _FIELDS, flag_of

    f = _FIELDS.get(name)
    if f is None or name in NOT_ARM_SETTINGS:
        known = ", ".join(n for n, g in _FIELDS.items() if n not in NOT_ARM_SETTINGS and not g.metadata.get("hidden"))
        raise argparse.ArgumentTypeError(f"unknown train setting {name!r}; choose from {known}")
    md = f.metadata
    if isinstance(f.default, bool):
        low = text.strip().lower()
        if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise argparse.ArgumentTypeError(f"{name}={text!r}: expected true or false")
        return low in ("true", "1", "yes", "on")
    conv = md.get("type") or (type(f.default) if isinstance(f.default, int | float) else str)
    try:
        value = conv(text)
    except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"{name} ({flag_of(name)}) {text!r}: {e}") from None
    choices = md.get("choices")
    choices = choices() if callable(choices) else choices
    if choices is not None and value not in choices:
        raise argparse.ArgumentTypeError(f"{name}={text!r} is not one of {', '.join(map(str, choices))}")
    return value


def _pairs(text: str) -> list[tuple[str, str]]:
    """``a=1,b=x,y`` → [('a', '1'), ('b', 'x,y')]: a piece without ``=`` continues the previous value."""
    out: list[tuple[str, str]] = []
    for piece in text.split(","):
        if "=" in piece:
            k, v = piece.split("=", 1)
            out.append((k.strip(), v.strip()))
        elif out:
            out[-1] = (out[-1][0], f"{out[-1][1]},{piece.strip()}")
        elif piece.strip():
            raise argparse.ArgumentTypeError(f"{text!r}: expected KNOB=VALUE pairs")
    return out


def parse_variant(text: str) -> Arm:
    """``NAME=STRATEGY[:knob=value,...]`` → an arm labelled NAME."""
    label, sep, rest = text.partition("=")
    if not sep or not label.strip() or not rest.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=STRATEGY[:knob=value,...]")
    strategy, _, knobs = rest.partition(":")
    _check_strategy(strategy.strip())
    values = tuple((k.replace("-", "_"), parse_setting(k.replace("-", "_"), v)) for k, v in _pairs(knobs))
    return Arm(label.strip(), strategy.strip(), values)


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """``KNOB=v1,v2`` → ('knob', [v1, v2]), each value parsed with the field's own type."""
    name, sep, values = text.partition("=")
    name = name.strip().replace("-", "_").lstrip("_")
    if not sep or not values.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KNOB=VALUE1,VALUE2")
    vals = [parse_setting(name, v.strip()) for v in values.split(",") if v.strip()]
    return name, list(dict.fromkeys(vals))


def _text(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, tuple | list) else str(v).lower() if isinstance(v, bool) else str(v)


def as_arms(arms: Sequence[Arm | str]) -> list[Arm]:
    return [a if isinstance(a, Arm) else Arm(a, a) for a in arms]


def build_arms(strategies: Sequence[str], variants: Sequence[Arm] = (),
               sweeps: Sequence[tuple[str, list[Any]]] = ()) -> list[Arm]:
    """The arms of a comparison: the variants (else one per strategy), crossed with every swept value.

    A label that occurs more than once (``--strategies ddp,ddp``, the A/A control) gets ``#1``, ``#2``...
    """
    base = list(variants) or [Arm(s, s) for s in strategies]
    for name, values in sweeps:
        base = [Arm(f"{a.label}/{name}={_text(v)}" if "/" not in a.label else f"{a.label},{name}={_text(v)}",
                    a.strategy, (*[kv for kv in a.knobs if kv[0] != name], (name, v)))
                for a in base for v in values]
    counts: dict[str, int] = {}
    for a in base:
        counts[a.label] = counts.get(a.label, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for a in base:
        if counts[a.label] > 1:
            seen[a.label] = seen.get(a.label, 0) + 1
            a = Arm(f"{a.label}#{seen[a.label]}", a.strategy, a.knobs)
        out.append(a)
    slugs = [a.slug for a in out]
    clash = next((a.label for a in out if slugs.count(a.slug) > 1), None)
    if clash:
        raise ConfigError(f"arm labels {', '.join(a.label for a in out if a.slug == Arm(clash, '').slug)} "
                          "would share a run folder; give them labels that differ in letters or digits")
    return out


def child_config(cfg: TrainConfig, spec: RunSpec, run_dir: Path) -> TrainConfig:
    """The run's own configuration: the shared one with its arm's strategy and settings, and its folder."""
    seed = {} if spec.seed is None else {"seed": spec.seed}
    return dataclasses.replace(cfg, **dict(spec.arm.knobs), **seed, strategy=spec.strategy, out=str(run_dir),
                               overwrite=True, progress="lines")


def child_command(cfg: TrainConfig, spec: RunSpec, run_dir: Path) -> list[str]:
    return job_command(spec.np, [sys.executable, "-m", "dpcompare", "train",
                                 *train_argv(child_config(cfg, spec, run_dir))])


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
        "arm": spec.arm.label, "strategy": spec.strategy, "knobs": _jsonable(dict(spec.arm.knobs)), "np": spec.np,
        "repeat": spec.repeat, "seed": spec.seed, "status": "failed", "error": None, "global_batch": None, "measured_seconds": None,
        "dir": rel_dir, "returncode": returncode, "command": list(command), "samples_per_sec": None,
        "step_ms": None, "phases_ms": None, "final_test_accuracy": None, "final_train_loss": None,
        "peak_rss_mb": None, "memory_mb": None, "measured_steps": None, "device": None, "wall_seconds": round(wall_seconds, 3),
        "metrics": metrics, "target_accuracy": None, "time_to_accuracy_s": None, "steps_to_accuracy": None,
        "epochs_to_accuracy": None, "eval_curve": [],
    }
    if returncode == 0 and summary is not None:
        t = summary.get("timing") or {}
        rec.update(samples_per_sec=t.get("samples_per_sec", summary.get("samples_per_sec")),
                   step_ms={"median": t.get("step_ms_median"), "p95": t.get("step_ms_p95")},
                   phases_ms=t.get("phases_ms"), final_test_accuracy=summary.get("final_test_accuracy"),
                   final_train_loss=summary.get("final_train_loss"), peak_rss_mb=t.get("peak_rss_mb"),
                   measured_steps=t.get("measured_steps"), device=summary.get("device"),
                   memory_mb=_memory_mb(summary.get("memory")),
                   global_batch=summary.get("global_batch_size"), measured_seconds=t.get("measured_seconds"),
                   timing_only_steps=t.get("timing_only_steps"),
                   **{k: summary.get(k) for k in ("target_accuracy", "time_to_accuracy_s", "steps_to_accuracy",
                                                  "epochs_to_accuracy")}, eval_curve=summary.get("eval_curve") or [])
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
    """summary.json's tensor accounting: the largest rank's MB per kind, and every rank's."""
    if not memory:
        return None
    kinds = ("params", "grads", "optimizer_state", "total")
    return {**{k: memory.get(f"{k}_mb") for k in kinds},
            "per_rank": [{k: r[f"{k}_bytes"] / 2**20 for k in kinds} for r in memory.get("per_rank", [])]}


def _launch(cmd: list[str], run_dir: Path, env: dict[str, str], timeout: float | None) -> tuple[int | None, float]:
    """Run one job with its output in RUN/stdout.log and RUN/stderr.log; None as exit code on timeout."""
    t0 = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as out, open(run_dir / "stderr.log", "w") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        try:
            rc: int | None = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            stop_job(p)
        except BaseException:  # Ctrl-C: take the job's processes down with us
            stop_job(p)
            raise
    return rc, time.perf_counter() - t0


def stop_job(p: subprocess.Popen[bytes]) -> None:
    """End a job started in its own session: SIGTERM to the whole group, SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def environment(strategies: Sequence[str] | None = None) -> dict[str, Any]:
    from dpcompare import backends
    from dpcompare.versions import versions

    return {**versions(), "platform": platform.platform(), "machine": platform.machine(),
            "hostname": platform.node(), "cpus": os.cpu_count(),
            "strategies": {n: {"summary": backends.get(n).summary, "sync_mechanism": backends.get(n).sync_mechanism}
                           for n in (strategies or backends.names())}}


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


#: what must match between a stored comparison and its resumption
PLAN_KEYS = ("arms", "np", "repeats", "target_ci", "max_repeats", "time_budget", "equivalence", "seeds",
             "accuracy_equivalence", "train_flags")


def resume_state(out: Path, fresh: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The stored results of the comparison in ``out`` to continue, and its runs that are ``ok`` by name.

    ``fresh`` is the results object this invocation would start with; its plan and configuration must
    be the stored ones (else one line saying what differs).
    """
    path = out / RESULTS
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--resume {out}: no {RESULTS} there; start the comparison with --out {out}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume {out}: {path} cannot be read ({e})") from None
    if not isinstance(stored, dict) or stored.get("schema") != SCHEMA or not isinstance(stored.get("runs"), list):
        raise ConfigError(f"--resume {out}: {path} is not a results file of this dpcompare (schema {SCHEMA})")
    old, new = stored.get("config") or {}, fresh["config"]
    absent = {"seeds": None, "accuracy_equivalence": Schedule().accuracy_equivalence}  # results from before them
    for key in PLAN_KEYS:
        if old.get(key, absent.get(key)) != new.get(key):
            raise ConfigError(f"--resume {out}: the {key.replace('_', ' ')} differs from the stored comparison's "
                              f"({_short(new.get(key))} here, {_short(old.get(key))} stored); pass the same "
                              f"options, or start a new comparison with another --out")
    kept = {}
    for rec in stored["runs"]:
        name = Path(str(rec.get("dir", ""))).name
        if rec.get("status") == "ok" and (out / str(rec["dir"]) / "summary.json").exists():
            kept[name] = rec
    resumed = {**stored, "config": {**old, "order": []}, "complete": False, "runs": [], "verdicts": [],
               "resumed": [*stored.get("resumed", []), fresh["created"]]}
    return resumed, kept


def _short(value: Any) -> str:
    text = " ".join(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else str(value)
    return (text or "none") if len(text) <= 80 else text[:77] + "..."


def _finished_line(done: int, total: int, spec: RunSpec, rec: dict[str, Any]) -> str:
    if rec["status"] == "diverged":
        from dpcompare.report.fmt import headline

        msg = f"[yellow]DIVERGED[/] {headline(rec['error'])}"
    elif rec["status"] == "ok":
        msg = (f"[green]ok[/]     {rec['samples_per_sec']:>9,.0f} samples/s · step {rec['step_ms']['median']:.2f} ms"
               f" · test acc {rec['final_test_accuracy'] or 0:.4f}")
    else:
        from dpcompare.report.fmt import headline

        msg = f"[red]FAILED[/] {headline(rec['error'])}"
    return f"[{done}/{total}] {spec.name:<18} {msg} ({rec['wall_seconds']:.1f} s)"


@dataclass(frozen=True)
class Schedule:
    """How many blocks: ``repeats`` of them, or (``repeats`` None) blocks until every verdict is precise
    enough (:func:`stop_reason`: half-width within ``target_ci``, a fraction, and the equivalence interval
    within half of ``equivalence``), ``max_repeats`` blocks were run, or another block would overrun
    ``time_budget`` seconds."""

    repeats: int | None = 3
    target_ci: float = 0.05
    max_repeats: int = 100
    time_budget: float = 0.0
    equivalence: float = 0.05
    # --repeats auto looks from this block on. Below it the sample spread is too unreliable on machines whose
    # noise is mostly small with rare large runs: a 4-block A/A whose ratios all fell within 1.04-1.06 passed
    # the 99.9 % interim test.
    min_blocks: int = 6
    seeds: tuple[int, ...] = ()  # --seeds: block k runs with seeds[k mod len]; a fixed plan runs repeats × seeds
    accuracy_equivalence: float = 0.005  # a fraction: 0.005 is ±0.5 points of accuracy

    def to_json(self) -> dict[str, Any]:
        return {"repeats": "auto" if self.repeats is None else self.repeats, "target_ci": self.target_ci,
                "max_repeats": self.max_repeats, "time_budget": self.time_budget or None,
                "equivalence": self.equivalence, "seeds": list(self.seeds) or None,
                "accuracy_equivalence": self.accuracy_equivalence}

    @property
    def blocks(self) -> int | None:
        """The fixed plan's number of blocks (None: --repeats auto)."""
        return None if self.repeats is None else self.repeats * max(1, len(self.seeds))


def stop_reason(results: dict[str, Any], schedule: Schedule, blocks: int, elapsed: float) -> str | None:
    """Why no further block should run, or None to run another."""
    if schedule.repeats is not None:
        seeds = f" × {len(schedule.seeds)} seeds" if schedule.seeds else ""
        return f"{schedule.repeats} repeat{'s' if schedule.repeats != 1 else ''}{seeds} as asked" if (
            blocks >= (schedule.blocks or 0)) else None
    from dpcompare.report import stats

    if blocks >= schedule.min_blocks:
        # Looking after every block is a sequential design. The blocks go on until every interval is precise
        # enough, by a rule blind to where the intervals lie: 95 % half-width within --target-ci and the
        # equivalence interval within half the margin (stats.RESOLUTION), from stats.PRECISION_MIN_BLOCKS
        # blocks on. A verdict settled at the interim level (Haybittle–Peto, stats.INTERIM_ALPHA) may end it
        # sooner, once within --target-ci. The verdict is then drawn once, at the usual levels. Stopping as
        # soon as a verdict is decided at 95 % would call identical arms different far more often than 5 %.
        vs = [v for v in stats.verdicts(results, equivalence=schedule.equivalence) if v.metric == "throughput"]
        widths = [v.half_width for v in vs]
        if vs and all(w is not None and w <= schedule.target_ci for w in widths):
            within = (f"every verdict's 95 % interval is within ±{100 * schedule.target_ci:g} % "
                      f"(widest ±{100 * max(w for w in widths if w is not None):.1f} %; --target-ci)")
            if blocks >= stats.PRECISION_MIN_BLOCKS and all(stats.resolves_equal(v) for v in vs):
                half = 100 * stats.RESOLUTION * schedule.equivalence
                return (f"{within} and every equivalence interval within ±{half:g} % (half of --equivalence): "
                        "precise enough to tell equal from different")
            if all(stats.settled_early(v.unit_log_ratios, v.equivalence) for v in vs):
                return f"{within}, and settled beyond doubt (99.9 % interval, or the equivalence test at 0.1 %)"
    if blocks >= schedule.max_repeats:
        return (f"reached --max-repeats {schedule.max_repeats} before every verdict was precise enough "
                f"(--target-ci {100 * schedule.target_ci:g} %, equivalence interval within "
                f"±{100 * stats.RESOLUTION * schedule.equivalence:g} %)")
    if schedule.time_budget and blocks and elapsed + elapsed / blocks > schedule.time_budget:
        return (f"another block (≈{elapsed / blocks:.0f} s) would overrun --time-budget "
                f"{schedule.time_budget:g} s")
    return None


def run_compare(cfg: TrainConfig, arms: Sequence[Arm | str], nps: Sequence[int], repeats: int | Schedule,
                out: Path, *, overwrite: bool = False, progress: str = "auto", run_timeout: float | None = None,
                console: Any = None, launch: Callable[..., tuple[int | None, float]] = _launch,
                cli_args: Sequence[str] | None = None, resume: bool = False, workers: str = "fresh") -> int:
    """Run every job, write results.json, render the report; 0 when every run succeeded, else 1.

    ``resume``: continue the comparison in ``out`` (its plan and configuration must be the stored ones):
    runs recorded ``ok`` are reused, the others run. ``workers``: ``fresh`` launches every run as its own job
    (through ``launch``); ``persistent`` runs them in one long-lived job per process count
    (:mod:`dpcompare.compare.workers`).
    """
    from dpcompare.report import render
    from dpcompare.report.table import console_for_report

    if under_launcher():
        raise ConfigError("run compare as one process: it starts mpirun (or srun) for every run itself")
    schedule = repeats if isinstance(repeats, Schedule) else Schedule(repeats=repeats)
    arms_ = as_arms(arms)
    if len({a.label for a in arms_}) != len(arms_):
        arms_ = build_arms([], arms_)  # the same label twice: an A/A control, labelled apart
    console = console or console_for_report()
    if not resume:
        prepare_out(out, overwrite)
    t_start = time.perf_counter()
    per_block = len(arms_) * len(nps)
    strategies = list(dict.fromkeys(a.strategy for a in arms_))
    results: dict[str, Any] = {
        "schema": SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "complete": False,
        "config": {"arms": [a.to_json() for a in arms_], "strategies": [a.strategy for a in arms_],
                   "np": list(nps), "repeats": schedule.to_json()["repeats"], "baseline": arms_[0].label,
                   **{k: v for k, v in schedule.to_json().items() if k != "repeats"},
                   "order": [], "workers": workers, "train": cfg.to_dict(),
                   "train_flags": train_argv(cfg, skip=("strategy", "out", "overwrite", "progress")),
                   "cli": list(cli_args) if cli_args is not None else _plan_flags(arms_, nps, schedule)},
        "environment": environment(strategies), "runs": [], "verdicts": [],
    }
    kept: dict[str, dict[str, Any]] = {}
    if resume:
        results, kept = resume_state(out, results)

    def save() -> None:
        """results.json as it stands, with the kept runs not reused yet (so an interruption loses none)."""
        used = {r["dir"] for r in results["runs"]}
        atomic_write_json(out / RESULTS, {**results, "runs": [*results["runs"], *(
            r for r in kept.values() if r["dir"] not in used)]})

    save()
    planned = schedule.blocks if schedule.blocks is not None else schedule.max_repeats
    if progress != "none":
        how = (f"{schedule.repeats} repeat{'s' if schedule.repeats != 1 else ''}"
               + (f" × seeds {','.join(map(str, schedule.seeds))}" if schedule.seeds else "")
               if schedule.repeats is not None
               else f"blocks until ±{100 * schedule.target_ci:g} %, at most {schedule.max_repeats}"
               + (f" or {schedule.time_budget:g} s" if schedule.time_budget else ""))
        console.print(f"dpcompare compare: {', '.join(a.label for a in arms_)} × np {','.join(map(str, nps))} × "
                      f"{how} ({per_block} runs per block) → {out}", soft_wrap=True)
        if resume:
            console.print(f"resuming {out}: {len(kept)} finished runs are kept; the others run", soft_wrap=True)
    env = job_env()
    done = blocks = 0
    pool = None
    if workers == "persistent":
        from dpcompare.compare.workers import WorkerPool
        from dpcompare.launch.mpirun import in_slurm_allocation

        pool = WorkerPool(out / "runs", env, job_command, local=not in_slurm_allocation())
    with ProgressLine(per_block * planned, "[bold]compare[/]", progress, console=console) as bar, \
            (contextlib.closing(pool) if pool else contextlib.nullcontext()):
        while (reason := stop_reason(results, schedule, blocks, time.perf_counter() - t_start)) is None:
            for spec in block(arms_, nps, blocks, schedule.seeds):
                done += 1
                results["config"]["order"].append(spec.name)
                if spec.name in kept:
                    results["runs"].append(kept[spec.name])
                    bar.update(advance=1)
                    continue
                try:
                    rec = _run_one(cfg, spec, out, env, run_timeout, launch, bar, pool)
                except KeyboardInterrupt:
                    save()  # valid, complete: false; this run is not in it
                    console.print(f"interrupted during {spec.name}: {len(results['runs'])} runs recorded in "
                                  f"{out / RESULTS}; continue with: dpcompare compare --resume {out}", soft_wrap=True)
                    raise
                results["runs"].append(rec)
                save()
                bar.update(advance=1)
                bar.print(_finished_line(done, per_block * max(planned, blocks + 1), spec, rec), markup=True)
            blocks += 1
    from dpcompare.report import stats

    elapsed = time.perf_counter() - t_start
    results["config"]["stop"] = {"blocks": blocks, "reason": reason, "seconds": round(elapsed, 1)}
    results["verdicts"] = [v.to_json() for v in stats.verdicts(results, equivalence=schedule.equivalence,
                                                               accuracy_equivalence=schedule.accuracy_equivalence)]
    results["complete"] = True
    atomic_write_json(out / RESULTS, results)
    render(out, console=console)
    if progress != "none":
        console.print(f"compare: {blocks} block{'s' if blocks != 1 else ''} in {elapsed:.0f} s; stopped: {reason}",
                      soft_wrap=True)
    failed = [r for r in results["runs"] if r["status"] != "ok"]
    if failed:
        diverged = sum(r["status"] == "diverged" for r in failed)
        what = f" ({diverged} diverged)" if diverged else ""
        console.print(f"[red]{len(failed)} of {len(results['runs'])} runs failed{what}[/] (their stderr is in "
                      f"results.json and {out}/runs/<run>/stderr.log; `dpcompare compare --resume {out}` reruns "
                      "the failed ones)", soft_wrap=True)
    return 1 if failed else 0


def _run_one(cfg: TrainConfig, spec: RunSpec, out: Path, env: dict[str, str], run_timeout: float | None,
             launch: Callable[..., tuple[int | None, float]], bar: Any, pool: Any = None) -> dict[str, Any]:
    run_dir = out / "runs" / spec.name
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("summary.json", "metrics.jsonl"):  # never read an earlier job's files as this one's
        (run_dir / stale).unlink(missing_ok=True)
    cmd = child_command(cfg, spec, run_dir)  # recorded: it reruns this run on its own
    bar.update(description=f"running {spec.name}")
    rc, wall = (pool.run(spec.np, train_argv(child_config(cfg, spec, run_dir)), run_dir, run_timeout) if pool
                else launch(cmd, run_dir, env, run_timeout))
    summary_path = run_dir / "summary.json"
    try:
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        metrics = _read_jsonl(run_dir / "metrics.jsonl")
    except (OSError, ValueError):
        summary, metrics = None, []
    return run_record(spec, f"runs/{spec.name}", rc, wall, summary, metrics, _read_text(run_dir / "stderr.log"),
                      _read_text(run_dir / "stdout.log"), cmd)


def parse_seeds(text: str) -> int | list[int]:
    """``3`` → 3 (seeds --seed … --seed+2), ``1,7,9`` → [1, 7, 9] (these seeds)."""
    from dpcompare.argtypes import positive_int

    if "," not in text:
        try:
            return positive_int(text)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e}: give a number of seeds (3) or a list of seeds (1,7,9)") from None
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seeds (3) or a list of seeds (1,7,9)") from None
    if len(set(seeds)) != len(seeds) or not seeds:
        raise argparse.ArgumentTypeError(f"{text!r}: every seed once, e.g. 1,7,9")
    return seeds


def seed_list(seeds: int | list[int] | None, base: int) -> list[int]:
    """The seeds of the blocks: N of them counted from ``base`` (--seed), or the ones given."""
    if not seeds:
        return []
    return list(range(base, base + seeds)) if isinstance(seeds, int) else list(seeds)


def parse_repeats(text: str) -> int | None:
    """A number of blocks, or ``auto`` (None): add blocks until the verdicts are precise enough."""
    if text.strip().lower() == "auto":
        return None
    from dpcompare.argtypes import positive_int

    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (or auto)") from None


def resumed_args(a: argparse.Namespace) -> argparse.Namespace:
    """The stored comparison's arguments (its plan and train flags, re-parsed), checked against ``a``.

    Options left at their default take the stored value; an option given here that differs from the
    stored one is refused with one line.
    """
    out = Path(a.resume_dir)
    try:
        stored = json.loads((out / RESULTS).read_text())["config"]
        argv = [*stored["cli"], *stored["train_flags"]]
    except FileNotFoundError:
        raise ConfigError(f"--resume {out}: no {RESULTS} there; start the comparison with --out {out}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--resume {out}: {out / RESULTS} holds no comparison plan ({e})") from None
    from dpcompare.cli import build_parser

    parser = build_parser()
    merged = parser.parse_args(["compare", *argv])
    defaults = parser.parse_args(["compare"])
    for name, given in vars(a).items():
        if name in ("out", "overwrite", "progress", "resume_dir", "func", "workers") or not hasattr(defaults, name):
            continue  # not a comparison setting (e.g. the top-level parser's `command`)
        value = getattr(merged, name, None)
        if given != getattr(defaults, name, None) and given != value:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"--resume {out}: {flag} {_short(given)} differs from the stored comparison's "
                              f"{_short(value)}; leave it out to continue, or start a new comparison with another --out")
    for name, value in vars(a).items():  # what the comparison's own parser does not set
        if not hasattr(merged, name):
            setattr(merged, name, value)
    merged.out, merged.progress, merged.resume_dir, merged.overwrite = str(out), a.progress, a.resume_dir, False
    merged.workers = a.workers or merged.workers  # how runs start is this invocation's choice
    return merged


def _cmd_compare(a: argparse.Namespace) -> int:
    from dpcompare.options import config_from_args

    if a.resume_dir:
        if a.overwrite:
            raise ConfigError("--resume continues a comparison and --overwrite replaces it; pass one of them")
        a = resumed_args(a)
    arms = build_arms(a.strategies, a.variants or (), a.sweep or ())
    cfg = config_from_args(a, strategy=arms[0].strategy, out=a.out)
    repeats = a.repeats if a.repeats != 0 else (1 if a.seeds else 3)  # 0: not given
    schedule = Schedule(repeats=repeats, target_ci=a.target_ci / 100.0, max_repeats=a.max_repeats,
                        time_budget=a.time_budget, equivalence=a.equivalence / 100.0,
                        seeds=tuple(seed_list(a.seeds, cfg.seed)), accuracy_equivalence=a.accuracy_equivalence / 100.0)
    return run_compare(cfg, arms, a.np, schedule, Path(a.out), overwrite=a.overwrite, progress=a.progress,
                       run_timeout=a.run_timeout or None, cli_args=comparison_flags(a), resume=bool(a.resume_dir),
                       workers=a.workers or "fresh")


def _plan_flags(arms: Sequence[Arm], nps: Sequence[int], schedule: Schedule) -> list[str]:
    """Flags that rebuild a plan given through the API rather than the command line (for --resume)."""
    if any(a.knobs for a in arms):
        how = ["--variants", *(f"{a.slug}={a.strategy}" + (":" + ",".join(f"{k}={_text(v)}" for k, v in a.knobs)
                                                            if a.knobs else "") for a in arms)]
    else:
        how = ["--strategies", ",".join(a.strategy for a in arms)]
    flags = ["--np", ",".join(map(str, nps)), *how,
             "--repeats", "auto" if schedule.repeats is None else str(schedule.repeats)]
    if schedule.repeats is None:
        flags += ["--target-ci", f"{100 * schedule.target_ci:g}", "--max-repeats", str(schedule.max_repeats)]
        if schedule.time_budget:
            flags += ["--time-budget", f"{schedule.time_budget:g}"]
    if schedule.seeds:
        flags += ["--seeds", ",".join(map(str, schedule.seeds)) + ("," if len(schedule.seeds) == 1 else "")]
    return [*flags, "--equivalence", f"{100 * schedule.equivalence:g}",
            "--accuracy-equivalence", f"{100 * schedule.accuracy_equivalence:g}"]


def comparison_flags(a: argparse.Namespace) -> list[str]:
    """The comparison's own flags (not the train settings), to print how to reproduce it."""
    flags = ["--np", ",".join(map(str, a.np))]
    if a.variants:
        flags += ["--variants", *(f"{v.label}={v.strategy}" + (":" + ",".join(f"{k}={_text(x)}" for k, x in v.knobs)
                                                               if v.knobs else "") for v in a.variants)]
    else:
        flags += ["--strategies", ",".join(a.strategies)]
    for name, values in a.sweep or ():
        flags += ["--sweep", f"{name}={','.join(map(_text, values))}"]
    flags += ["--repeats", "auto" if a.repeats is None else str(a.repeats if a.repeats != 0 else 1 if a.seeds else 3)]
    if a.seeds:
        flags += ["--seeds", ",".join(map(str, a.seeds)) + ("," if len(a.seeds) == 1 else "")
                  if isinstance(a.seeds, list) else str(a.seeds)]
    if a.repeats is None:
        flags += ["--target-ci", f"{a.target_ci:g}", "--max-repeats", str(a.max_repeats)]
        if a.time_budget:
            flags += ["--time-budget", f"{a.time_budget:g}"]
    if a.equivalence != 5.0:
        flags += ["--equivalence", f"{a.equivalence:g}"]
    if a.accuracy_equivalence != 0.5:
        flags += ["--accuracy-equivalence", f"{a.accuracy_equivalence:g}"]
    if a.workers:
        flags += ["--workers", a.workers]
    return flags


def register(sub: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    from dpcompare.argtypes import nonneg_float, positive_float, positive_int
    from dpcompare.options import add_config_options

    p = sub.add_parser(
        "compare", help="A/B comparison: every arm (strategy or variant) at every process count, in paired blocks",
        description="Run the same training job under each arm (a strategy, or a labelled strategy with its own "
                    "train settings) at each process count, in blocks: a block runs every arm once, side by side, "
                    "and the verdict pairs the arms within blocks so the machine's drift cancels. Prints a table "
                    "and a verdict per process count (faster, slower, equal within ±--equivalence, or undecided "
                    "with the repeats it would need) and writes OUT/results.json, plots and a self-contained "
                    "OUT/report.html. Every `dpcompare train` option applies to every run. Exit code 0 only when "
                    "every run succeeded.",
        epilog="examples:\n"
               "  dpcompare compare --np 2 --strategies ddp,horovod --repeats auto --target-ci 5 --out runs/ab\n"
               "  dpcompare compare --np 2 --strategies ddp,ddp --repeats auto --out runs/aa   # A/A control\n"
               "  dpcompare compare --variants base=ddp small=ddp:batch_size=16 --out runs/batch\n"
               "  dpcompare compare --strategies ddp,horovod --sweep batch_size=16,64 --out runs/sweep\n"
               "  dpcompare report runs/ab      # re-render the report from results.json\n"
               "  dpcompare compare --resume runs/ab   # continue an interrupted comparison",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("comparison")
    g.add_argument("--np", type=parse_np, default=[2], metavar="N[,N2,...]",
                   help="process counts to run every arm at (default: 2); include 1 for scaling efficiency")
    g.add_argument("--strategies", type=parse_arm_strategies, default=["ddp", "horovod"], metavar="A,B[,...]",
                   help="strategies to compare, one arm each; the first is the baseline of the verdicts; the same "
                        "one twice (ddp,ddp) is an A/A control whose verdict should be equal (default: ddp,horovod)")
    g.add_argument("--variants", type=parse_variant, nargs="+", metavar="NAME=STRATEGY[:KNOB=V,...]",
                   help="arms with their own train settings instead of --strategies, e.g. base=ddp "
                        "fp16=horovod:grad_compression=fp16 (knobs are TrainConfig field names)")
    g.add_argument("--sweep", type=parse_sweep, action="append", metavar="KNOB=V1,V2[,...]",
                   help="cross every arm with every value of a train setting (labels like ddp/batch_size=64); "
                        "repeat the flag to cross several")
    g.add_argument("--repeats", type=parse_repeats, default=0, metavar="N|auto",
                   help="blocks to run (a block runs every arm once at every np), per seed with --seeds; auto: add "
                        "blocks until every throughput verdict is precise enough to decide: from 10 blocks on, its "
                        "95 %% interval within ±--target-ci and its equivalence interval within half of "
                        "±--equivalence (so that no difference can come out equal); sooner once within ±--target-ci "
                        "if settled beyond doubt at 99.9 %% (from 6 blocks on). A rule on the spread only, so looking after every block "
                        "keeps the verdicts' 5 %% error rate (default: 3, or 1 per seed with --seeds)")
    g.add_argument("--seeds", type=parse_seeds, metavar="N|S1,S2,...",
                   help="run every block under another seed (initial weights and sampling), the same for every arm "
                        "of the block: N seeds counted from --seed, or these seeds; adds accuracy verdicts over "
                        "the seeds (with --target-accuracy also time-to-accuracy verdicts)")
    g.add_argument("--accuracy-equivalence", type=positive_float, default=0.5, metavar="POINTS",
                   help="arms whose paired difference of final test accuracy has its 95 %% interval inside "
                        "±POINTS percentage points are reported equal (its 90 %% interval: two one-sided tests at 5 %%) "
                        "(default: 0.5)")
    g.add_argument("--target-ci", type=positive_float, default=5.0, metavar="PCT",
                   help="with --repeats auto: the 95 %% interval half-width to reach, in %%; the equivalence "
                        "interval must also reach half of --equivalence (default: 5)")
    g.add_argument("--max-repeats", type=positive_int, default=100, metavar="N",
                   help="with --repeats auto: stop after this many blocks (default: 100)")
    g.add_argument("--time-budget", type=nonneg_float, default=0, metavar="SECONDS",
                   help="with --repeats auto: start no block that would end after this many seconds "
                        "(default: 0, no limit)")
    g.add_argument("--equivalence", type=positive_float, default=5.0, metavar="PCT",
                   help="arms whose throughput ratio lies inside ±PCT %% by an equivalence test (two one-sided tests "
                        "at 5 %%: the 90 %% interval inside the margin) are reported equal (default: 5)")
    g.add_argument("--workers", choices=("fresh", "persistent"), metavar="fresh|persistent",
                   help="how runs start. fresh: every run is its own mpirun/srun job, as a user would start it. "
                        "persistent: one long-lived job per process count runs them one after another, each run "
                        "still building its data, model and optimizer and joining and leaving its strategy's "
                        "process group; a demo run then takes ~3 s instead of ~8 s (Python, torch and MPI start "
                        "once), so the same time buys about three times the blocks, and the verdict's interval "
                        "counts each two neighbouring blocks as one unit (they run seconds apart). A failed run "
                        "ends its job and the next run starts a new one (default: fresh)")
    g.add_argument("--run-timeout", type=nonneg_float, default=0, metavar="SECONDS",
                   help="stop a run that takes longer and record it as failed (default: 0, no limit)")
    g.add_argument("--resume", dest="resume_dir", metavar="DIR",
                   help="continue the interrupted comparison in DIR: runs recorded ok are kept, missing and "
                        "failed ones run; its plan and options are reused (any given must match them)")
    g.add_argument("--tensorboard", dest="tensorboard", action="store_true",
                   help="let every run write TensorBoard events (default: off for compare)")
    add_config_options(p, exclude=("strategy", "tensorboard", "resume"),
                       defaults={"out": "runs/compare", "min_timed_steps": DEFAULT_MIN_STEPS})
    p.set_defaults(func=_cmd_compare, tensorboard=False)
