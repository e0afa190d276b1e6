"""The run loop of ``dpcompare compare``: block after block until the schedule stops, each run its own job
(or a run of a persistent worker), ``OUT/results.json`` rewritten after each run, the report at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpcompare.argtypes import format_rate_bits
from dpcompare.backends.registry import facts
from dpcompare.compare import fault_runs, records
from dpcompare.compare.axes import AXES, FAULT
from dpcompare.compare.cmdline import plan_flags, train_flags, write_comparison_config
from dpcompare.compare.load import LoadWatch, why_disturbed
from dpcompare.compare.plan import Arm, Comparison, RunSpec, block, child_config, launch_options, with_arm
from dpcompare.compare.stopping import shortfall, stop_reason
from dpcompare.compare.workers import WorkerPool
from dpcompare.errors import ConfigError
from dpcompare.files import METRICS, RESULTS, STEP_LOG, SUMMARY, atomic_write_json
from dpcompare.lab import Lab, session
from dpcompare.launch.elastic import ElasticLaunch
from dpcompare.launch.env import under_launcher
from dpcompare.launch.jobs import dpcompare_command, run_job
from dpcompare.launch.mpirun import dpcompare_argv, in_slurm_allocation, job_command, job_env
from dpcompare.native.calls import SCRIPT_ELASTIC
from dpcompare.options import train_argv
from dpcompare.prediction.command import project
from dpcompare.progress import ProgressLine

#: how a fresh run starts: (command, run folder, environment, timeout) → (exit code or None, seconds)
Launch = Callable[[list[str], Path, dict[str, str], float | None], tuple[int | None, float]]


def child_command(cfg: Any, spec: RunSpec, run_dir: Path, lab: Lab | None = None, step_log: bool = False,
                  replay: bool = False, script: Any = None, bind: str = "none") -> list[str]:
    """The job that runs ``spec`` on its own (recorded with the run: it reruns it); with a ``lab``, placed on its
    hosts (mpirun started inside its host 0; an elastic arm's launcher: :func:`elastic_launch`); else with its
    ranks placed as ``bind`` (or the arm's ``bind`` axis) says. With a ``script`` (``--script``), the script in the
    run's arm."""
    if script is not None:
        seeded = with_arm(cfg if spec.seed is None else dataclasses.replace(cfg, seed=spec.seed), spec.arm)
        return script.command(
            spec.strategy,
            spec.np,
            run_dir,
            seeded,
            lab,
            elastic=elastic_launch(spec, run_dir, lab),
            step_log=step_log,
            launch=None if lab else launch_options(seeded, spec.arm, bind, spec.np),
        )
    child = child_config(cfg, spec, run_dir, step_log, replay)
    how = elastic_launch(spec, run_dir, lab)
    options = {"elastic": how} if how else {} if lab else launch_options(child, spec.arm, bind, spec.np)
    return dpcompare_command(spec.np, ["train", *train_argv(child)], lab, **options)


def elastic_launch(spec: RunSpec, run_dir: Path, lab: Lab | None) -> ElasticLaunch | None:
    """How an elastic arm's job starts: its strategy's elastic launcher (torchrun, horovodrun), allowed to lose
    one host of the lab; None for any other arm."""
    if not spec.arm.elastic or lab is None:
        return None
    launcher = SCRIPT_ELASTIC.get(spec.strategy) or facts(spec.strategy).elastic  # native-elastic: a script's
    assert launcher is not None  # an elastic arm names a strategy that has an elastic mode (plan.Arm.named)
    return ElasticLaunch(launcher, min_np=max(1, spec.np - lab.slots), run_id=run_dir.name)


def _script_records(run_dir: Path) -> list[str]:
    """A script run's records (``rank*.json``, ``params.pt``) left in ``run_dir`` by an earlier attempt."""
    return [p.name for p in run_dir.glob("rank*.json")] + ["params.pt"]


class _Run:
    """One comparison in progress: its results object, the kept runs of a resumed one, and how runs start."""

    def __init__(self, c: Comparison, console: Any, launch: Launch, lab: Lab | None = None) -> None:
        self.c, self.console, self.launch, self.lab = c, console, launch, lab
        self.arms: list[Arm] = c.all_arms
        self.per_block = len(self.arms) * len(c.nps)
        self.results = records.new_results(c, self.arms, train_flags(c.config), plan_flags(c))
        self.kept: dict[str, dict[str, Any]] = {}
        if c.options.resume:
            self.results, self.kept = records.resume_state(c.out, self.results)
        self.env = job_env()
        from dpcompare.compare.trackers import open_group  # W&B group / MLflow parent run, if asked for

        self.group = open_group(c.out.name, c.out, c.config.log, c.config.mlflow_uri)
        self.env.update(self.group.env)
        # srun's ranks are not this process's descendants: their CPU time would count as other processes'
        self.watch_load = not in_slurm_allocation()
        self.pool: Any = None
        self.again = 0  # runs of disturbed blocks, run again (--rerun-disturbed)
        if c.options.workers == "persistent":
            self.pool = WorkerPool(c.out / "runs", self.env, job_command, local=not in_slurm_allocation())

    def save(self) -> None:
        """results.json as it stands, with the kept runs not reused yet (so an interruption loses none)."""
        used = {r["dir"] for r in self.results["runs"]}
        atomic_write_json(self.c.out / RESULTS, {**self.results, "runs": [*self.results["runs"], *(
            r for r in self.kept.values() if r["dir"] not in used)]})

    def run_one(self, spec: RunSpec, bar: Any) -> dict[str, Any]:
        run_dir = self.c.out / "runs" / spec.name
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in (SUMMARY, METRICS, STEP_LOG, *_script_records(run_dir)):
            (run_dir / stale).unlink(missing_ok=True)  # never read an earlier job's files as this one's
        for kept in ("checkpoints", "commits"):  # nor resume from them (elastic arms; a script's: commits)
            shutil.rmtree(run_dir / kept, ignore_errors=True)
        cfg, timeout = self.c.config, self.c.options.run_timeout
        for name, value in spec.arm.axes:  # e.g. the link reshaped (once per link: its arms run side by side)
            if AXES[name].before_run is not None:
                AXES[name].before_run(self.lab, value)
        step_log = self.c.fault is not None  # the fault's runs and their twins without it: steps over time
        cmd = child_command(cfg, spec, run_dir, self.lab, step_log, self.c.replay, self.c.script, self.c.options.bind)
        bar.update(description=f"running {spec.name}")
        fault, t_start = None, time.time()
        # what else the machine ran meanwhile; across a lab, the job's ranks started through ssh (named by the run's
        # folder) are sampled as its own too
        watch = LoadWatch(str(run_dir) if self.lab is not None else None) if self.watch_load else None
        if self.pool:
            child = child_config(cfg, spec, run_dir)
            rc, wall = self.pool.run(spec.np, train_argv(child), run_dir, timeout,
                                     launch_options(child, spec.arm, self.c.options.bind, spec.np))
        elif spec.arm.fault is not None and self.lab is not None:
            every = child_config(cfg, spec, run_dir).commit_every
            rc, wall, fault = fault_runs.run_with_fault(cmd, run_dir, self.env, timeout, spec.arm.fault, self.lab,
                                                    self.rejoin(spec, run_dir, step_log),
                                                    commits=bool(every) and spec.arm.fault.at_step % every == 0)
        else:
            rc, wall = self.launch(cmd, run_dir, self.env, timeout)
        if self.lab is not None and rc != 0:
            _name_lost_hosts(self.lab, run_dir)
        if self.c.script is not None:
            self.c.script.summarize(run_dir, cfg)  # the ranks' records → summary.json, read as a training run's
        rec = records.read_run(spec, run_dir, f"runs/{spec.name}", rc, wall, cmd)
        rec["load"] = watch.result() if watch else None
        rec.update(fault_runs.figures(run_dir, fault, t_start) if step_log else {})
        if self.c.replay and spec.arm.fault is not None and spec.arm.elastic:
            bar.update(description=f"replaying {spec.name}")
            rec["replay"] = self.replay(spec, run_dir, rec)
        return rec

    def replay(self, spec: RunSpec, run_dir: Path, rec: dict[str, Any]) -> dict[str, Any]:
        """Nothing lost: a clean run of the same arm (not elastic, no fault) from the checkpoint the elastic run
        rolled back to, at the world size it carried on with, in RUN/replay; the two final states compared tensor
        by tensor (:func:`~dpcompare.compare.fault_runs.same_weights`)."""
        from dpcompare import checkpoint  # torch: not while compare's parser is built

        r, fault = rec.get("recovery") or {}, spec.arm.fault
        if rec["status"] != "ok" or not r.get("recovered") or fault is None or fault.back_at_step is not None:
            return {"equal": None, "why": "not replayed: the run did not carry on at one smaller world size"}
        start = checkpoint.step_checkpoint_path(run_dir, int(r["resumed_from_step"]))
        if not start.is_file():
            return {"equal": None, "why": f"not replayed: no checkpoint {start.name} to start from"}
        clean = RunSpec(dataclasses.replace(spec.arm.without_axes(FAULT), elastic=False), int(r["world_size_after"]),
                        spec.repeat, spec.seed)
        out = run_dir / "replay"
        shutil.rmtree(out, ignore_errors=True)
        cfg = dataclasses.replace(child_config(self.c.config, clean, out), resume=str(start), save_final=True)
        cmd = dpcompare_command(clean.np, ["train", *train_argv(cfg)], self.lab)
        rc, _ = self.launch(cmd, out, self.env, self.c.options.run_timeout)
        if rc != 0:
            return {"equal": None, "why": f"the replay failed (exit code {rc}); see {out}/stderr.log", "command": cmd}
        return {**fault_runs.same_weights(run_dir, out), "from": start.name, "np": clean.np, "command": cmd}

    def rejoin(self, spec: RunSpec, run_dir: Path, step_log: bool) -> list[str] | None:
        """What brings the fault's host back into an elastic job when it returns (a torchrun agent), or None."""
        how = elastic_launch(spec, run_dir, self.lab)
        if how is None or self.lab is None or spec.arm.fault is None or spec.arm.fault.back_at_step is None:
            return None
        argv = [*dpcompare_argv(), "train", *train_argv(child_config(self.c.config, spec, run_dir, step_log))]
        return self.lab.rejoin_command(argv, spec.np, how, spec.arm.fault.host)

    def run_block(self, blocks: int, done: int, planned: int, bar: Any) -> int:
        """Run block number ``blocks``, again while a run of it was disturbed (``--rerun-disturbed``: its runs move
        to results.json's ``disturbed_runs``, the try to ``disturbed``) and tries are left; runs done so far."""
        tries = max(1, self.c.options.disturbed_tries) if self.c.options.disturbed and self.watch_load else 1
        for attempt in range(1, tries + 1):
            start = len(self.results["runs"])
            done = self.run_specs(blocks, done, planned, bar, reuse=attempt == 1)
            mine = self.results["runs"][start:]
            why = why_disturbed([r.get("load") for r in mine], self.c.options.disturbed)
            if why is None:
                return done
            last = attempt == tries
            self.results.setdefault("disturbed", []).append(
                {"block": blocks, "try": attempt, "why": why, "runs": [r["dir"] for r in mine], "counted": last})
            if not last:
                self.again += len(mine)  # the progress line's total grows by the runs to do again
                del self.results["runs"][start:]
                self.results.setdefault("disturbed_runs", []).extend(mine)
            self.save()
            bar.print(f"block {blocks} disturbed: {why}; " + ("counted anyway (no tries left)" if last else
                                                               "running it again"), markup=False)
        return done

    def run_specs(self, blocks: int, done: int, planned: int, bar: Any, reuse: bool = True) -> int:
        """Run every run of block number ``blocks`` once (``reuse``: a resumed comparison's kept runs are reused)."""
        for spec in block(self.arms, self.c.nps, blocks, self.c.stopping.seeds):
            done += 1
            self.results["config"]["order"].append(spec.name)
            if reuse and spec.name in self.kept:
                self.results["runs"].append(self.kept[spec.name])
                bar.update(advance=1)
                continue
            try:
                rec = self.run_one(spec, bar)
            except KeyboardInterrupt:
                self.save()  # valid, complete: false; this run is not in it
                self.console.print(f"interrupted during {spec.name}: {len(self.results['runs'])} runs recorded in "
                                   f"{self.c.out / RESULTS}; continue with: dpcompare compare --continue {self.c.out}",
                                   soft_wrap=True)
                raise
            self.results["runs"].append(rec)
            self.save()
            bar.update(advance=1)
            bar.print(_finished_line(done, self.per_block * max(planned, blocks + 1) + self.again, spec, rec),
                      markup=True)
        return done


def _name_lost_hosts(lab: Lab, run_dir: Path) -> None:
    """After a failed run across a lab: the hosts it lost, in one line at the end of its stderr.log."""
    logs = [run_dir / "stdout.log", run_dir / "stderr.log"]
    line = lab.lost_line("".join(p.read_text(errors="replace") for p in logs if p.exists()))
    if line:
        with open(run_dir / "stderr.log", "a") as err:  # not atomic: a log stream
            err.write(line + "\n")


def run_compare(c: Comparison, *, console: Any = None, launch: Launch = run_job) -> int:
    """Run every job, write results.json, render the report; 0 when every run succeeded, else 1.

    ``c.options.resume``: continue the comparison in ``c.out`` (its plan and configuration must be the stored
    ones): runs recorded ``ok`` are reused, the others run. ``c.options.workers``: ``fresh`` starts every run
    as its own job (through ``launch``); ``persistent`` runs them in one long-lived job per process count
    (:mod:`dpcompare.compare.workers`).
    """
    from dpcompare.report.table import console_for_report  # here, not at the top: it loads numpy and scipy

    if under_launcher():
        raise ConfigError("run compare as one process: it starts mpirun (or srun) for every run itself")
    console = console or console_for_report()
    if not c.options.resume:
        records.prepare_out(c.out, c.options.overwrite)
    write_comparison_config(c)
    t_start = time.perf_counter()
    say = (lambda line: console.print(line, soft_wrap=True)) if c.options.progress != "none" else None
    with session(c.lab, say) as lab:
        run = _Run(c, console, launch, lab)
        run.save()
        schedule = c.stopping
        planned = schedule.blocks if schedule.blocks is not None else schedule.max_repeats
        if c.options.progress != "none":
            _announce(run)
        done = blocks = 0
        with ProgressLine(run.per_block * planned, "[bold]compare[/]", c.options.progress, console=console) as bar, \
                (contextlib.closing(run.pool) if run.pool else contextlib.nullcontext()):
            while (reason := stop_reason(run.results, schedule, blocks, time.perf_counter() - t_start)) is None:
                done = run.run_block(blocks, done, planned, bar)
                blocks += 1
    return _finish(run, blocks, reason, time.perf_counter() - t_start)


def _announce(run: _Run) -> None:
    s, c = run.c.stopping, run.c
    how = (f"{s.repeats} repeat{'s' if s.repeats != 1 else ''}"
           + (f" × seeds {','.join(map(str, s.seeds))}" if s.seeds else "")
           if s.repeats is not None
           else f"blocks until ±{100 * s.target_ci:g} %, at most {s.max_repeats}"
           + (f" or {s.time_budget:g} s" if s.time_budget else ""))
    run.console.print(f"dpcompare compare: {', '.join(a.label for a in run.arms)} × np {','.join(map(str, c.nps))} × "
                      f"{how} ({run.per_block} runs per block) → {c.out}", soft_wrap=True)
    if c.options.resume:
        run.console.print(f"resuming {c.out}: {len(run.kept)} finished runs are kept; the others run", soft_wrap=True)


def _project(c: Comparison, console: Any) -> None:
    """Traced runs: ``dpcompare predict`` them onto ``--project-link`` into OUT/projected for the report. A model
    that cannot be built (a strategy without a schedule, an unreadable trace) costs a line, not the comparison."""
    if not c.options.project_link or not c.config.trace:
        return
    try:
        where = project(c.out, c.options.project_link)
    except (ConfigError, OSError, ValueError, KeyError) as e:
        console.print(f"[yellow]no projection to a cluster: {e}[/]", soft_wrap=True)
        return
    if where and c.options.progress != "none":
        console.print(f"projected the traced runs to 2-1024 hosts on {format_rate_bits(c.options.project_link)} → "
                      f"{where}", soft_wrap=True)


def _finish(run: _Run, blocks: int, reason: str, elapsed: float) -> int:
    """Verdicts into results.json (now complete), the report, and the exit code."""
    # here, not at the top: it loads numpy and scipy and matplotlib
    from dpcompare.report import attribution, faults, noise, render, stats

    c, results, console = run.c, run.results, run.console
    results["config"]["stop"] = {"blocks": blocks, "reason": reason, "seconds": round(elapsed, 1)}
    verdicts = stats.verdicts(results, equivalence=c.stopping.equivalence,
                              accuracy_equivalence=c.stopping.accuracy_equivalence)
    if more := shortfall(verdicts, c.stopping, blocks, elapsed):
        results["config"]["stop"]["shortfall"] = more
    results["verdicts"] = [v.to_json() for v in verdicts]
    results["noise"] = noise.floors(verdicts)  # what each throughput verdict could resolve
    results["attributions"] = [a.to_json() for a in attribution.attributions(results)]
    fault = faults.summary(results)  # --fault: what the lost host cost each arm, the wall-time verdicts
    if fault is not None:
        results["faults"] = fault
    results["complete"] = True
    atomic_write_json(c.out / RESULTS, results)
    run.group.finish(results["verdicts"])
    _project(c, console)
    render(c.out, console=console)
    if c.options.progress != "none":
        console.print(f"compare: {blocks} block{'s' if blocks != 1 else ''} in {elapsed:.0f} s; stopped: {reason}",
                      soft_wrap=True)
    ended = [r for r in results["runs"] if r["status"] == "failed" and r.get("fault") and not r.get("elastic")]
    if ended:
        console.print(f"{len(ended)} run(s) of non-elastic arms ended when their host died, as expected (the lost "
                      f"host is named at the end of their stderr.log)", soft_wrap=True)
    failed = [r for r in results["runs"] if r["status"] != "ok" and r not in ended]
    if failed:
        diverged = sum(r["status"] == "diverged" for r in failed)
        what = f" ({diverged} diverged)" if diverged else ""
        console.print(f"[red]{len(failed)} of {len(results['runs'])} runs failed{what}[/] (their stderr is in "
                      f"results.json and {c.out}/runs/<run>/stderr.log; `dpcompare compare --continue {c.out}` reruns "
                      "the failed ones)", soft_wrap=True)
    return 1 if failed else 0


def _finished_line(done: int, total: int, spec: RunSpec, rec: dict[str, Any]) -> str:
    # here, not at the top: it loads numpy and scipy
    from dpcompare.report.fmt import headline, metric_label, metric_value, rate

    if rec["status"] == "diverged":
        msg = f"[yellow]DIVERGED[/] {headline(rec['error'])}"
    elif rec["status"] == "ok":
        metric = rec.get("metric") or {}
        value = rec.get("final_metric", rec.get("final_test_accuracy"))
        msg = (f"[green]ok[/]     {rate(rec['samples_per_sec'] or 0):>9} samples/s"
               f" · step {rec['step_ms']['median']:.2f} ms"
               + ("" if value is None else f" · {metric_label(metric)} {metric_value(metric, value)}"))
    else:
        msg = f"[red]FAILED[/] {headline(rec['error'])}"
    return f"[{done}/{total}] {spec.name:<18} {msg} ({rec['wall_seconds']:.1f} s)"
