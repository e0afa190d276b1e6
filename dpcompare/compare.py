"""``dpcompare compare``: the same training job under several strategies and process counts, repeated.

Every (strategy, np, repeat) is its own job (``mpirun -np N python -m dpcompare train ...``, or srun
inside a Slurm allocation) with the same configuration and seed, written to
``OUT/runs/<strategy>-np<N>-r<k>/``. Runs go repeat-major (every configuration once, then again),
with the order reversed on odd repeats, so slow drifts of the machine hit every configuration alike.
``OUT/results.json`` collects them (schema: docs/results-schema.md) and is rewritten after each run;
the report (table, verdicts, plots, report.html) is rendered from it at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import platform
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
ERROR_TAIL_LINES = 40
ERROR_TAIL_CHARS = 4000


@dataclass(frozen=True)
class RunSpec:
    strategy: str
    np: int
    repeat: int

    @property
    def name(self) -> str:
        return f"{self.strategy}-np{self.np}-r{self.repeat}"


def plan(strategies: Sequence[str], nps: Sequence[int], repeats: int) -> list[RunSpec]:
    """Repeat-major order: every (np, strategy) once per repeat; odd repeats run it backwards."""
    configs = [(n, s) for n in nps for s in strategies]
    out: list[RunSpec] = []
    for r in range(repeats):
        for n, s in (reversed(configs) if r % 2 else configs):
            out.append(RunSpec(s, n, r))
    return out


def parse_np(text: str) -> list[int]:
    """``1,2,4`` → [1, 2, 4] (duplicates dropped, ascending)."""
    try:
        nps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of process counts like 1,2,4") from None
    if not nps or min(nps) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of process counts like 1,2,4")
    return sorted(set(nps))


def parse_strategies(text: str) -> list[str]:
    """``ddp,horovod`` → ['ddp', 'horovod'], checked against the registered strategies (order kept)."""
    from dpcompare import backends

    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [n for n in names if n not in backends.names()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown strategy {', '.join(unknown) or repr(text)}; "
                                         f"choose from {', '.join(backends.names())}")
    return names


def child_config(cfg: TrainConfig, spec: RunSpec, run_dir: Path) -> TrainConfig:
    """The run's own configuration: the shared one with its strategy and folder."""
    return dataclasses.replace(cfg, strategy=spec.strategy, out=str(run_dir), overwrite=True, progress="lines")


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
        "strategy": spec.strategy, "np": spec.np, "repeat": spec.repeat, "status": "failed", "error": None,
        "dir": rel_dir, "returncode": returncode, "command": list(command), "samples_per_sec": None,
        "step_ms": None, "phases_ms": None, "final_test_accuracy": None, "final_train_loss": None,
        "peak_rss_mb": None, "memory_mb": None, "measured_steps": None, "device": None, "wall_seconds": round(wall_seconds, 3),
        "metrics": metrics,
    }
    if returncode == 0 and summary is not None:
        t = summary.get("timing") or {}
        rec.update(samples_per_sec=t.get("samples_per_sec", summary.get("samples_per_sec")),
                   step_ms={"median": t.get("step_ms_median"), "p95": t.get("step_ms_p95")},
                   phases_ms=t.get("phases_ms"), final_test_accuracy=summary.get("final_test_accuracy"),
                   final_train_loss=summary.get("final_train_loss"), peak_rss_mb=t.get("peak_rss_mb"),
                   measured_steps=t.get("measured_steps"), device=summary.get("device"),
                   memory_mb=_memory_mb(summary.get("memory")))
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
            _stop(p)
        except BaseException:  # Ctrl-C: take the job's processes down with us
            _stop(p)
            raise
    return rc, time.perf_counter() - t0


def _stop(p: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def environment() -> dict[str, Any]:
    from dpcompare import backends
    from dpcompare.versions import versions

    return {**versions(), "platform": platform.platform(), "machine": platform.machine(),
            "hostname": platform.node(), "cpus": os.cpu_count(),
            "strategies": {n: {"summary": backends.get(n).summary, "sync_mechanism": backends.get(n).sync_mechanism}
                           for n in backends.names()}}


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
PLAN_KEYS = ("strategies", "np", "repeats", "order", "train_flags")


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
    for key in PLAN_KEYS:
        if old.get(key) != new.get(key):
            raise ConfigError(f"--resume {out}: the {key.replace('_', ' ')} differs from the stored comparison's "
                              f"({_short(new.get(key))} here, {_short(old.get(key))} stored); pass the same "
                              f"options, or start a new comparison with another --out")
    names = {s for s in old.get("order", [])}
    kept = {}
    for rec in stored["runs"]:
        name = Path(str(rec.get("dir", ""))).name
        if rec.get("status") == "ok" and name in names and (out / str(rec["dir"]) / "summary.json").exists():
            kept[name] = rec
    resumed = {**stored, "complete": False, "runs": [],
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
        msg = (f"[green]ok[/]     {rec['samples_per_sec']:>9,.0f} samples/s · step {rec['step_ms']['median']:.1f} ms"
               f" · test acc {rec['final_test_accuracy'] or 0:.4f}")
    else:
        from dpcompare.report.fmt import headline

        msg = f"[red]FAILED[/] {headline(rec['error'])}"
    return f"[{done}/{total}] {spec.name:<18} {msg} ({rec['wall_seconds']:.1f} s)"


def run_compare(cfg: TrainConfig, strategies: Sequence[str], nps: Sequence[int], repeats: int, out: Path, *,
                overwrite: bool = False, progress: str = "auto", run_timeout: float | None = None,
                console: Any = None, launch: Callable[..., tuple[int | None, float]] = _launch,
                resume: bool = False) -> int:
    """Run every job, write results.json, render the report; 0 when every run succeeded, else 1.

    ``resume``: continue the comparison in ``out`` (its results.json must hold the same plan and
    configuration): runs recorded ``ok`` are kept, the others run.
    """
    from dpcompare.report import render
    from dpcompare.report.table import console_for_report

    if under_launcher():
        raise ConfigError("run compare as one process: it starts mpirun (or srun) for every run itself")
    console = console or console_for_report()
    if not resume:
        prepare_out(out, overwrite)
    specs = plan(strategies, nps, repeats)
    results: dict[str, Any] = {
        "schema": SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "complete": False,
        "config": {"strategies": list(strategies), "np": list(nps), "repeats": repeats, "baseline": strategies[0],
                   "order": [s.name for s in specs], "train": cfg.to_dict(),
                   "train_flags": train_argv(cfg, skip=("strategy", "out", "overwrite", "progress"))},
        "environment": environment(), "runs": [],
    }
    kept: dict[str, dict[str, Any]] = {}
    if resume:
        results, kept = resume_state(out, results)
    atomic_write_json(out / RESULTS, results)
    if progress != "none":
        if resume:
            console.print(f"resuming {out}: {len(kept)} of {len(specs)} runs already ok, "
                          f"{len(specs) - len(kept)} to run", soft_wrap=True)
        console.print(f"dpcompare compare: {len(specs)} runs ({', '.join(strategies)} × np "
                      f"{','.join(map(str, nps))} × {repeats} repeat{'s' if repeats > 1 else ''}) → {out}",
                      soft_wrap=True)
    env = job_env()
    with ProgressLine(len(specs), "[bold]compare[/]", progress, console=console) as bar:
        for done, spec in enumerate(specs, 1):
            if spec.name in kept:
                results["runs"].append(kept[spec.name])
                bar.update(advance=1)
                continue
            run_dir = out / "runs" / spec.name
            run_dir.mkdir(parents=True, exist_ok=True)
            for stale in ("summary.json", "metrics.jsonl"):  # never read an earlier job's files as this one's
                (run_dir / stale).unlink(missing_ok=True)
            cmd = child_command(cfg, spec, run_dir)
            bar.update(description=f"running {spec.name}")
            try:
                rc, wall = launch(cmd, run_dir, env, run_timeout)
            except KeyboardInterrupt:
                atomic_write_json(out / RESULTS, results)  # valid, complete: false; this run is not in it
                console.print(f"interrupted during {spec.name}: {len(results['runs'])} of {len(specs)} runs "
                              f"recorded in {out / RESULTS}; continue with: dpcompare compare --resume {out}",
                              soft_wrap=True)
                raise
            summary_path = run_dir / "summary.json"
            try:
                summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
                metrics = _read_jsonl(run_dir / "metrics.jsonl")
            except (OSError, ValueError):
                summary, metrics = None, []
            rec = run_record(spec, f"runs/{spec.name}", rc, wall, summary, metrics,
                             _read_text(run_dir / "stderr.log"), _read_text(run_dir / "stdout.log"), cmd)
            results["runs"].append(rec)
            atomic_write_json(out / RESULTS, results)
            bar.update(advance=1)
            bar.print(_finished_line(done, len(specs), spec, rec), markup=True)
    results["complete"] = True
    atomic_write_json(out / RESULTS, results)
    render(out, console=console)
    failed = [r for r in results["runs"] if r["status"] != "ok"]
    if failed:
        diverged = sum(r["status"] == "diverged" for r in failed)
        what = f" ({diverged} diverged)" if diverged else ""
        console.print(f"[red]{len(failed)} of {len(specs)} runs failed{what}[/] (their stderr is in results.json "
                      f"and {out}/runs/<run>/stderr.log; `dpcompare compare --resume {out}` reruns them)",
                      soft_wrap=True)
    return 1 if failed else 0


def resumed_args(a: argparse.Namespace, defaults: argparse.Namespace) -> argparse.Namespace:
    """``a`` with the plan and training options of the comparison stored in ``a.resume_dir``.

    Options left at their default take the stored value; an option given here that differs from the
    stored one is refused with one line.
    """
    out = Path(a.resume_dir)
    try:
        stored = json.loads((out / RESULTS).read_text())["config"]
        train = dict(stored["train"])
        plan_values = {"strategies": stored["strategies"], "np": stored["np"], "repeats": stored["repeats"]}
    except FileNotFoundError:
        raise ConfigError(f"--resume {out}: no {RESULTS} there; start the comparison with --out {out}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--resume {out}: {out / RESULTS} holds no comparison plan ({e})") from None
    if "input_shape" in train:
        train["input_shape"] = tuple(train["input_shape"])
    merged = argparse.Namespace(**vars(a))
    for name, value in {**plan_values, **train}.items():
        if not hasattr(a, name) or name in ("out", "overwrite", "progress", "strategy"):
            continue
        given, default = getattr(a, name), getattr(defaults, name, None)
        if given != default and given != value:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"--resume {out}: {flag} {_short(given)} differs from the stored comparison's "
                              f"{_short(value)}; leave it out to continue, or start a new comparison with another --out")
        setattr(merged, name, value)
    merged.out = str(out)
    return merged


def _cmd_compare(a: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from dpcompare.options import config_from_args

    if a.resume_dir:
        if a.overwrite:
            raise ConfigError("--resume continues a comparison and --overwrite replaces it; pass one of them")
        a = resumed_args(a, parser.parse_args([]))
    cfg = config_from_args(a, strategy=a.strategies[0], out=a.out)
    timeout = a.run_timeout or None
    return run_compare(cfg, a.strategies, a.np, a.repeats, Path(a.out), overwrite=a.overwrite,
                       progress=a.progress, run_timeout=timeout, resume=bool(a.resume_dir))


def register(sub: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    from dpcompare.argtypes import nonneg_float, positive_int
    from dpcompare.options import add_config_options

    p = sub.add_parser(
        "compare", help="A/B comparison: every strategy at every process count, repeated, with a report",
        description="Run the same training job under each strategy at each process count, --repeats times "
                    "(repeat-major, so machine noise spreads evenly), then print a table and a verdict per "
                    "process count and write OUT/results.json, plots and a self-contained OUT/report.html. "
                    "Every `dpcompare train` option applies to every run. Exit code 0 only when every run "
                    "succeeded.",
        epilog="examples:\n"
               "  dpcompare compare --np 1,2 --strategies ddp,horovod --repeats 3 --out runs/ab\n"
               "  dpcompare compare --np 2 --model resnet18 --dataset synthetic --epochs 1 --out runs/ab-resnet\n"
               "  dpcompare report runs/ab      # re-render the report from results.json\n"
               "  dpcompare compare --resume runs/ab   # continue an interrupted comparison",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("comparison")
    g.add_argument("--np", type=parse_np, default=[2], metavar="N[,N2,...]",
                   help="process counts to run every strategy at (default: 2); include 1 for scaling efficiency")
    g.add_argument("--strategies", type=parse_strategies, default=["ddp", "horovod"], metavar="A,B[,...]",
                   help="strategies to compare; the first is the baseline of the verdicts (default: ddp,horovod)")
    g.add_argument("--repeats", type=positive_int, default=3,
                   help="runs of every (strategy, np); confidence intervals need at least 2 (default: 3)")
    g.add_argument("--run-timeout", type=nonneg_float, default=0, metavar="SECONDS",
                   help="stop a run that takes longer and record it as failed (default: 0, no limit)")
    g.add_argument("--resume", dest="resume_dir", metavar="DIR",
                   help="continue the interrupted comparison in DIR: runs recorded ok are kept, missing and "
                        "failed ones run; its plan and options are reused (any given must match them)")
    g.add_argument("--tensorboard", dest="tensorboard", action="store_true",
                   help="let every run write TensorBoard events (default: off for compare)")
    add_config_options(p, exclude=("strategy", "tensorboard", "resume"), defaults={"out": "runs/compare"})
    p.set_defaults(func=lambda a: _cmd_compare(a, p), tensorboard=False)
