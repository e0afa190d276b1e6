"""``dpcompare submit``: a ``train`` or ``compare`` job sent to Slurm from Python or the command line through
submitit, requeued on preemption or time-out and resumed from its last checkpoint.

:func:`submit` makes submitit's ``AutoExecutor`` (Slurm; nodes, tasks per node, CPUs, GPUs, partition, time) or
its ``LocalExecutor`` (this machine, for trying it out), and sends it a :class:`DpcompareJob`: one dpcompare
command. submitit starts one task per process; each task runs the command as a child process, which takes its
rank from the task's environment (under Slurm, ``SLURM_PROCID`` and the rest, as under ``dpcompare slurm``'s
srun; under the ``LocalExecutor``, the torchrun variables this module sets from submitit's).

Preemption and time-outs follow submitit's ``Checkpointable`` pattern. Slurm (or ``job._interrupt()``) signals
the job; in every task this module stops its child (whose checkpoints are written atomically, so the newest one
is whole), and submitit calls :meth:`DpcompareJob.checkpoint` on task 0, which hands back the job to run when
requeued: the same ``train`` with ``--resume auto`` (the newest checkpoint in its ``--out``; a train job gets
``--checkpoint-every 1`` unless it asks for checkpoints itself), or ``compare --continue OUT`` (its finished runs
are kept). The child ignores SIGTERM and SIGUSR2, so that the task, not a signal's race, decides what happens.

``compare`` runs as one task on one node and starts its runs with mpirun there (it launches its own jobs; give
it the node's cores with ``cpus_per_task``). Horovod under the ``LocalExecutor`` needs one task (mpirun or srun
start Horovod's ranks, not submitit's local tasks).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpcompare.argtypes import nonneg_int, positive_int
from dpcompare.backends.catalog import mpi_started
from dpcompare.config import TrainConfig
from dpcompare.errors import ConfigError
from dpcompare.files import SUMMARY
from dpcompare.launch.rendezvous import free_port
from dpcompare.launch.slurm import parse_time, resolve_srun_mpi

#: the commands a job may run
COMMANDS = ("train", "compare")
#: the exit status a task ends with when its child was stopped for a requeue
STOPPED = 143
INSTALL_HINT = "pip install submitit (the [slurm] extra: pip install -e '.[slurm]')"


def _submitit() -> Any:
    try:
        # lazy: an optional dependency, tried where it is used
        import submitit
    except ImportError:
        raise ConfigError(f"dpcompare submit needs submitit: {INSTALL_HINT}") from None
    return submitit


def _flag(words: Sequence[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in ``words`` (the last one), else None."""
    value = None
    for i, w in enumerate(words):
        if w == name and i + 1 < len(words):
            value = words[i + 1]
        elif w.startswith(name + "="):
            value = w.split("=", 1)[1]
    return value


def minutes(time: str) -> int:
    """A Slurm time limit (``HH:MM:SS`` or ``D-HH:MM:SS``) in whole minutes, at least 1."""
    days, _, rest = parse_time(time).rpartition("-")
    h, m, s = (int(x) for x in rest.split(":"))
    return max(1, (int(days or 0) * 24 + h) * 60 + m + (1 if s else 0))


@dataclass(frozen=True)
class Resources:
    """What the job asks Slurm for (``#SBATCH`` lines submitit writes)."""

    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    time: str = "01:00:00"
    job_name: str = "dpcompare"

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node


class DpcompareJob:
    """One dpcompare command as a submitit job (picklable; submitit calls it in every task)."""

    def __init__(self, words: Sequence[str], requeues: int = 0, port: int | None = None) -> None:
        self.words = list(words)
        self.requeues = requeues  # how many times it was requeued (the requeued job's is one more)
        self.port = port          # the LocalExecutor's rendezvous port on 127.0.0.1
        self._child: subprocess.Popen[bytes] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_child"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _child=None)

    def __call__(self) -> Any:
        """Run the command as this task's child; task 0 returns what it wrote (train: its summary, compare: its
        results.json path)."""
        # lazy: an optional dependency (the submit extra)
        import submitit

        env = submitit.JobEnvironment()
        previous = signal.getsignal(signal.SIGUSR2)

        def stop_then_submitit(signum: int, frame: Any) -> None:
            self.stop()  # every task: its child first; then submitit's handler checkpoints (task 0) and requeues
            # a preemption's SIGTERM may reach the job after this USR2: ignored here, and so in the `scontrol
            # requeue` that submitit starts (an ignored signal stays ignored across exec), it cannot kill that
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGUSR2, stop_then_submitit)
        self._child = subprocess.Popen(
            [sys.executable, "-m", "dpcompare", *self.words], env=self._env(env), preexec_fn=_ignore_stop_signals)
        rc = self._child.wait()
        if rc in (-signal.SIGKILL, STOPPED):  # stopped for a requeue: task 0 is requeueing the job
            raise SystemExit(0 if env.global_rank else STOPPED)
        if rc != 0:
            raise RuntimeError(f"dpcompare {' '.join(self.words[:1])} ended with exit code {rc} "
                               f"(task {env.global_rank}; its log: submitit's folder)")
        return self.result() if env.global_rank == 0 else None

    def _env(self, job: Any) -> dict[str, str]:
        """The child's environment: under the LocalExecutor, torchrun's variables from submitit's; under Slurm the
        task's own (``compare`` leaves the allocation's out: it starts its runs with mpirun on this node)."""
        env = dict(os.environ)
        if self.words[0] == "compare":
            env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SUBMITIT_LOCAL_"))}
        elif "SUBMITIT_LOCAL_JOB_ID" in env:
            env.update(RANK=str(job.global_rank), WORLD_SIZE=str(job.num_tasks), LOCAL_RANK=str(job.local_rank),
                       LOCAL_WORLD_SIZE=str(job.num_tasks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port))
        return env

    def stop(self) -> None:
        """Stop the child now (its checkpoints are whole: each is written atomically). Called from a signal
        handler while the task waits for the child: it kills, the waiting reaps."""
        if self._child is not None and self._child.returncode is None:
            self._child.send_signal(signal.SIGKILL)

    def checkpoint(self) -> Any:
        """submitit's hook on task 0 before a requeue: the job that continues this one from its checkpoint."""
        # lazy: an optional dependency (the submit extra)
        import submitit

        self.stop()
        return submitit.helpers.DelayedSubmission(DpcompareJob(resumed_words(self.words), self.requeues + 1,
                                                               self.port))

    def result(self) -> Any:
        out = Path(_flag(self.words, "--out") or ".")
        if self.words[0] == "compare":
            return str(out / "results.json")

        path = out / SUMMARY
        return json.loads(path.read_text()) if path.is_file() else None


def _ignore_stop_signals() -> None:
    """In the child: SIGTERM (sent before a preemption) and SIGUSR2 (submitit's) are the task's to handle."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def job_words(words: Sequence[str]) -> list[str]:
    """The command a job starts with: ``train`` resumes from the newest checkpoint in its ``--out`` when there is
    one and writes one every epoch unless asked otherwise; ``compare`` as given. Refuses what cannot be
    requeued."""
    words = list(words)
    if not words or words[0] not in COMMANDS:
        raise ConfigError(f"dpcompare submit runs {' or '.join(COMMANDS)}: put the command after --, e.g. "
                          "`dpcompare submit --tasks-per-node 2 -- train --strategy ddp --out runs/a`")
    if _flag(words, "--out") is None:
        raise ConfigError(f"give {words[0]} an --out folder: a requeued job continues from what it wrote there")
    if words[0] == "train":
        if _flag(words, "--resume") is None:
            words += ["--resume", "auto"]
        if not any(_flag(words, f) for f in ("--checkpoint-every", "--checkpoint-steps")):
            words += ["--checkpoint-every", "1"]
    return words


def resumed_words(words: Sequence[str]) -> list[str]:
    """The command a requeued job runs: ``train`` as before (``--resume auto``), ``compare --continue OUT``."""
    if words[0] == "compare":
        return ["compare", "--continue", str(_flag(words, "--out"))]
    return list(words)


def check_local(words: Sequence[str], resources: Resources) -> None:
    """Refuse, in one line, what ``submit --local`` cannot run: more than one node, or a train job of several
    tasks whose strategy needs mpirun or srun to start its ranks (the catalog says which: Horovod's)."""
    if resources.nodes != 1:
        raise ConfigError("--local runs on this machine: one node (--nodes 1)")
    strategy = _flag(words, "--strategy") or TrainConfig().strategy
    if resources.tasks > 1 and words[0] == "train" and mpi_started(strategy):
        raise ConfigError(f"--local starts submitit's own tasks, which --strategy {strategy} cannot join (mpirun or "
                          "srun start its ranks): use --tasks-per-node 1, a torch.distributed --strategy, or Slurm")


def submit(words: Sequence[str], resources: Resources = Resources(), folder: str | Path = "submitit/%j",
           local: bool = False, srun_mpi: str | None = "auto", **executor_params: Any) -> Any:
    """Send ``dpcompare WORDS`` (``train ...`` or ``compare ...``) to Slurm through submitit's AutoExecutor, or
    with ``local`` through its LocalExecutor on this machine; the submitit Job (``job.result()`` waits for it).

    A Python program does the same: ``submit(["train", "--strategy", "ddp", "--out", "runs/a"],
    Resources(tasks_per_node=2, time="00:30:00", partition="cpu"))``; ``executor_params`` go to submitit's
    ``update_parameters`` as they are (``timeout_min=0.5``, ``signal_delay_s=5``, ``slurm_mem="4G"``...)."""
    submitit = _submitit()
    words = job_words(words)
    if words[0] == "compare" and resources.tasks != 1:
        raise ConfigError("compare starts its own runs: submit it as one task (--nodes 1 --tasks-per-node 1) and "
                          "give it the node's cores with --cpus-per-task")
    port = None
    if local:
        check_local(words, resources)

        port = free_port("127.0.0.1")
    executor = submitit.AutoExecutor(folder=str(folder), cluster="local" if local else None)
    params: dict[str, Any] = {"nodes": resources.nodes, "tasks_per_node": resources.tasks_per_node,
                              "cpus_per_task": resources.cpus_per_task, "timeout_min": minutes(resources.time),
                              "name": resources.job_name}
    if resources.gpus_per_node:
        params["gpus_per_node"] = resources.gpus_per_node
    if executor.cluster == "slurm":
        mpi = resolve_srun_mpi(srun_mpi)
        params.update(slurm_srun_args=[f"--mpi={mpi}"] if mpi else [],
                      **({"slurm_partition": resources.partition} if resources.partition else {}))
    executor.update_parameters(**{**params, **executor_params})
    return executor.submit(DpcompareJob(words, port=port))


def _cmd_submit(a: argparse.Namespace) -> int:
    words = a.command_argv[1:] if a.command_argv[:1] == ["--"] else a.command_argv
    res = Resources(a.nodes, a.tasks_per_node, a.cpus_per_task, a.gpus_per_node, a.partition, a.time, a.job_name)
    job = submit(words, res, a.folder, a.local, a.srun_mpi)
    print(f"submitted job {job.job_id} ({'this machine' if a.local else 'Slurm'}): logs in {job.paths.folder}",
          flush=True)
    if a.wait:
        result = job.results()[0]  # task 0's
        print(result if isinstance(result, str) else f"done: {job.paths.folder}")
    return 0


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "submit", help="send a train or compare job to Slurm through submitit (requeued on preemption, resumed "
                       "from its checkpoint)",
        description="Send `dpcompare train ...` or `dpcompare compare ...` to Slurm through submitit: one task per "
                    "process, each running the command (ranks from srun's variables). On preemption or time-out "
                    "the job is requeued and continues: train from the newest checkpoint in its --out "
                    "(--resume auto; --checkpoint-every 1 unless given), compare with --continue OUT.",
        epilog="examples:\n"
               "  dpcompare submit --tasks-per-node 2 --time 00:30:00 --partition cpu -- train --strategy ddp "
               "--out runs/a\n"
               "  dpcompare submit --cpus-per-task 8 --time 02:00:00 -- compare --np 2 --strategies ddp,horovod "
               "--out runs/ab\n"
               "  dpcompare submit --local --tasks-per-node 2 --wait -- train --strategy ddp --out runs/local",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--nodes", type=positive_int, default=1, help="nodes (default: 1)")
    s.add_argument("--tasks-per-node", type=positive_int, default=1, help="processes per node (default: 1)")
    s.add_argument("--cpus-per-task", type=positive_int, default=1, help="CPU cores per process (default: 1)")
    s.add_argument("--gpus-per-node", type=nonneg_int, default=0, help="GPUs per node (default: 0)")
    s.add_argument("--partition", help="Slurm partition (default: the cluster's)")
    s.add_argument("--time", type=parse_time, default="01:00:00", metavar="HH:MM:SS",
                   help="time limit of each submission; a job that reaches it is requeued (default: 01:00:00)")
    s.add_argument("--job-name", default="dpcompare", help="Slurm job name (default: dpcompare)")
    s.add_argument("--folder", default="submitit/%j", metavar="DIR",
                   help="submitit's folder: the job's pickles and logs, %%j the job id (default: submitit/%%j)")
    s.add_argument("--srun-mpi", metavar="TYPE", default="auto",
                   help="srun --mpi for the tasks (auto: pmix where srun offers it; as `dpcompare slurm`)")
    s.add_argument("--local", action="store_true",
                   help="submitit's LocalExecutor: the tasks on this machine, no Slurm (to try it out)")
    s.add_argument("--wait", action="store_true", help="wait for the job and print where its results are")
    s.add_argument("command_argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="train ... or compare ..., after --")
    s.set_defaults(func=_cmd_submit)
