"""Comparing a user's Horovod script (``--script``) instead of dpcompare's own training: the plan that
``compare --script`` and ``parity --script`` (:mod:`.parity`) run.

The arms are ways to run the one script, unchanged: ``horovod`` (the real library), ``native`` (dpcompare's layer
on torch.distributed) and ``ddp`` (its DDP port, the one ``dpcompare migrate`` writes, or ``--ddp-script``). Every
run is ``dpcompare script --as ARM --out RUN -- python SCRIPT ARGS`` as a job of :mod:`dpcompare.launch.jobs`
(mpirun, srun, or a lab's hosts), seeded and threaded alike. Its records (:mod:`dpcompare.native.record`) give
the final weights the optimizer held (parity) and the step times between successive ``optimizer.step()`` ends
(compare: ``RUN/summary.json``, which compare's records read as they read a training run's).

An elastic script (``hvd.elastic.run``) has two elastic arms, started by the launch builders of dpcompare's own
elastic arms (:meth:`dpcompare.lab.Lab.elastic_command`): ``horovod-elastic``, real Horovod Elastic
(``horovodrun`` with the lab's host discovery script), and ``native-elastic``, the native layer on torchrun's
elastic agents, one per host (:mod:`dpcompare.native.elastic`); ``ddp-elastic`` runs the DDP port (its elastic helpers:
:mod:`dpcompare.native.port_elastic`) on torchrun's agents. Their runs write the step log ``--fault`` reads.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpcompare.argtypes import positive_int
from dpcompare.errors import ConfigError
from dpcompare.files import SUMMARY, atomic_write_json
from dpcompare.launch.jobs import dpcompare_command
from dpcompare.native.calls import LAYER_ARM, PORT_ARM, SCRIPT_ARMS, SCRIPT_ELASTIC
from dpcompare.native.migrate import port_warnings, scan_script
from dpcompare.native.summary import script_summary

if TYPE_CHECKING:
    from dpcompare.compare.plan import Arm
    from dpcompare.config import TrainConfig
    from dpcompare.lab import Lab
    from dpcompare.launch.elastic import ElasticLaunch


@dataclass(frozen=True)
class ScriptPlan:
    """The script a comparison runs, its arguments, the DDP port for the ``ddp`` arm, and what to record."""

    path: Path
    args: tuple[str, ...] = ()
    ddp_path: Path | None = None
    metric: str | None = None           # ``NAME`` or ``NAME:lower``: what the script all-reduces under that name
    global_batch: int | None = None     # samples per optimizer step over all ranks, when the user says it

    def script_for(self, arm: str) -> Path:
        if arm == PORT_ARM:
            if self.ddp_path is None:
                raise ConfigError("the ddp arm needs a DDP port of the script: pass --ddp-script FILE")
            return self.ddp_path
        return self.path

    def command(self, arm: str, np: int, run_dir: Path, cfg: TrainConfig, lab: Lab | None = None,
                elastic: ElasticLaunch | None = None, step_log: bool = False,
                launch: dict[str, Any] | None = None) -> list[str]:
        """The job that runs the script in ``arm`` at ``np`` ranks with its records in ``run_dir``; ``elastic``:
        as an elastic job (``horovod-elastic``: horovodrun's elastic mode; ``native-elastic``: torchrun's agents,
        the layer's commits in RUN/commits), every collective bounded by ``--timeout``; ``step_log``: writing
        RUN/steps.jsonl from its first step (an elastic script writes it anyway); ``launch``: mpirun's options (the
        binding: :func:`~dpcompare.compare.plan.launch_options`)."""
        words = ["script", "--as", arm, "--out", str(run_dir), "--overwrite", "--seed", str(cfg.seed),
                 "--threads", str(cfg.threads)]
        if step_log:
            words.append("--step-log")
        if elastic is not None:
            words += ["--timeout", f"{cfg.timeout:g}", "--commit-dir", str(run_dir / "commits")]
        words += ["--", "python", str(self.script_for(arm)), *self.args]
        return dpcompare_command(np, words, lab, **(launch or {}), **({"elastic": elastic} if elastic else {}))

    @property
    def metric_name(self) -> str | None:
        return None if self.metric is None else self.metric.split(":")[0]

    def summarize(self, run_dir: Path, cfg: TrainConfig) -> None:
        """RUN/summary.json from the ranks' records, in the shape compare's records read."""

        summary = script_summary(run_dir, cfg.warmup_steps, self.metric_name)
        if summary is None or summary["exit_code"] != 0:
            return  # the run failed: compare records its exit code and stderr
        t = summary["timing"]
        # without --global-batch a "sample" is one optimizer step of the job: throughput is steps per second
        batch = self.global_batch or 1
        t["samples_per_sec"] = batch * 1000.0 / t["step_ms_median"] if t["step_ms_median"] else None
        summary["global_batch_size"] = batch
        if self.metric:
            summary["metric"] = {"name": self.metric_name, "higher_is_better": not self.metric.endswith(":lower"),
                                 "unit": None}
        atomic_write_json(run_dir / SUMMARY, summary)

    def to_json(self) -> dict[str, Any]:
        """What results.json keeps about the script (``config.script``; the report's title reads it)."""
        return {"path": str(self.path), "args": list(self.args), "ddp_path": self.ddp_path and str(self.ddp_path),
                "metric": self.metric, "global_batch": self.global_batch}

    def flags(self) -> list[str]:
        """This plan as compare's own flags (for results.json's ``cli``, read back by --continue)."""
        flags = ["--script", str(self.path)]
        if self.ddp_path is not None:
            flags += ["--ddp-script", str(self.ddp_path)]
        if self.metric:
            flags += ["--metric", self.metric]
        if self.global_batch:
            flags += ["--global-batch", str(self.global_batch)]
        return [*flags, *(f"--script-arg={x}" for x in self.args)]


def add_script_arguments(p: Any, compare: bool) -> None:
    """``--script FILE [...] -- ARGS``: the options of a script comparison (compare's and parity's)."""
    p.add_argument("--script", type=Path, metavar="FILE",
                   help="compare a Horovod PyTorch script run unchanged instead of dpcompare's training: the arms "
                        f"({', '.join(SCRIPT_ARMS)}) run it on real Horovod, on dpcompare's native layer, or its DDP "
                        "port; its own arguments follow --")
    p.add_argument("--ddp-script", type=Path, metavar="FILE",
                   help="with --script: the ddp arm's script (default: SCRIPT_ddp.py beside it, else the port "
                        "`dpcompare migrate` writes into OUT)")
    p.add_argument("--script-arg", action="append", default=[], help=argparse.SUPPRESS)
    if compare:
        p.add_argument("--metric", metavar="NAME[:lower]",
                       help="with --script: the value the script all-reduces with hvd.allreduce(v, name=NAME), as "
                            "the accuracy column (:lower when lower is better)")
        p.add_argument("--global-batch", type=positive_int, metavar="N",
                       help="with --script: samples per optimizer step over all ranks, for samples/s (default: "
                            "throughput is optimizer steps per second)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="-- SCRIPT ARGS", help=argparse.SUPPRESS)


def script_plan(a: argparse.Namespace, arms: list[str], out: Path) -> ScriptPlan | None:
    """The script plan the parsed arguments ask for (None without --script), checked: the script exists, the arms
    are script arms, the ddp arm has its port."""
    remainder = list(getattr(a, "script_args", None) or [])
    if remainder[:1] == ["--"]:
        remainder = remainder[1:]
    if a.script is None:
        if LAYER_ARM in arms or remainder or a.ddp_script:
            raise ConfigError("native (and --ddp-script, and arguments after --) run a Horovod script: add "
                              "--script FILE")
        return None
    if not a.script.is_file():
        raise ConfigError(f"--script {a.script}: no such file")
    wrong = [x for x in arms if x not in SCRIPT_ARMS]
    if wrong:
        raise ConfigError(f"--script runs the arms {', '.join(SCRIPT_ARMS)}; not {', '.join(wrong)}")
    ddp = ddp_script(a.script, a.ddp_script, out) if PORT_ARM in arms else a.ddp_script
    return ScriptPlan(a.script.resolve(), tuple([*a.script_arg, *remainder]), ddp and Path(ddp).resolve(),
                      getattr(a, "metric", None), getattr(a, "global_batch", None))


def check_elastic_arms(arms: list[Arm]) -> None:
    """A script's elastic arms are horovod-elastic (real Horovod Elastic), native-elastic (the layer on torchrun)
    and ddp-elastic (the DDP port on torchrun)."""
    wrong = [a.name for a in arms if a.elastic and a.strategy not in SCRIPT_ELASTIC]
    if wrong:
        raise ConfigError(f"--script runs the elastic arms {', '.join(f'{x}-elastic' for x in SCRIPT_ELASTIC)}; "
                          f"not {', '.join(wrong)}")


def ddp_script(script: Path, given: Path | None, out: Path) -> Path:
    """The ddp arm's script: ``--ddp-script``, else SCRIPT_ddp.py beside the script, else the port written into
    OUT (one already there is used as it is); refused with migrate's reasons when no port can be written."""
    if given is not None:
        if not given.is_file():
            raise ConfigError(f"--ddp-script {given}: no such file")
        return given
    beside = script.with_name(f"{script.stem}_ddp.py")
    if beside.is_file():
        return beside
    dest = out / f"{script.stem}_ddp.py"
    if dest.is_file():
        return dest
    from dpcompare.native.port import write_port  # lazy: libcst is slow to import, and only a port needs it

    result = write_port(scan_script(script), dest)
    if result["written"] is None:
        why = "; ".join(result["reasons"]) or result["message"]  # the reasons, not migrate's own sentence
        raise ConfigError(f"the ddp arm needs a DDP port of {script}, which dpcompare migrate did not write "
                          f"({why}); write one and pass --ddp-script FILE")
    return dest


def port_notes(plan: ScriptPlan, arms: list[str]) -> list[str]:
    """Where the ddp arm is expected to compute other numbers (migrate's warnings), when it runs."""
    if PORT_ARM not in arms:
        return []
    from dpcompare.native.port import write_port  # lazy: libcst is slow to import, and only a port needs it

    scan = scan_script(plan.path)
    notes = write_port(scan, None, dry_run=True)["notes"]  # what the port's passes changed (nothing written)
    return [f"ddp arm: {w}" for w in [*port_warnings(scan), *notes]]
