"""``dpcompare submit``: a train job sent through submitit, preempted once after its first checkpoint, requeued,
and resumed from that checkpoint — with submitit's LocalExecutor, and on the real one-node Slurm the Slurm tests
start (scripts/slurm-local.sh, the session fixture of tests/test_slurm.py)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_slurm import slurm_cluster  # noqa: F401  (the session's one-node Slurm)

from dpcompare import cli
from dpcompare.errors import ConfigError
from dpcompare.launch import submission
from dpcompare.launch.submission import Resources, job_words, minutes, resumed_words, submit

from conftest import FAST

submitit = pytest.importorskip("submitit")

#: a train job that checkpoints every 10 steps and takes many more (2 ranks, mlp): on a quiet machine 40 steps
#: were over before the preemption reached them, and the requeued run resumed from the last step
STEPS = 1000
TRAIN = ["train", "--strategy", "ddp", *FAST, "--model", "mlp", "--epochs", "0", "--max-steps", str(STEPS),
         "--checkpoint-steps", "10", "--batch-size", "16", "--progress", "none"]
LIMIT_S = 300


def test_the_job_words_resume_and_checkpoint_and_refuse_what_cannot_be_requeued() -> None:
    words = job_words(["train", "--strategy", "ddp", "--out", "runs/a"])
    assert words[-4:] == ["--resume", "auto", "--checkpoint-every", "1"]
    assert job_words(["train", "--out", "a", "--checkpoint-steps", "5"])[-2:] == ["--resume", "auto"]
    assert resumed_words(words) == words
    assert resumed_words(["compare", "--np", "2", "--out=runs/ab"]) == ["compare", "--continue", "runs/ab"]
    for bad, said in ((["predict"], "runs train or compare"), (["train", "--strategy", "ddp"], "--out folder")):
        with pytest.raises(ConfigError, match=said):
            job_words(bad)
    with pytest.raises(ConfigError, match="one task"):
        submit(["compare", "--out", "x"], Resources(tasks_per_node=2), local=True)
    with pytest.raises(ConfigError, match="--strategy horovod cannot join"):
        submit(["train", "--strategy", "horovod", "--out", "x"], Resources(tasks_per_node=2), local=True)


def test_local_refuses_only_a_strategy_whose_ranks_mpirun_starts() -> None:
    """The catalog says which strategy needs mpirun or srun (Horovod); the default strategy, ``single``, is not
    taken for Horovod, and neither is a torch.distributed one or a plug-in."""
    two = Resources(tasks_per_node=2)
    for words in (["train", "--out", "x"], ["train", "--strategy", "ddp", "--out", "x"],
                  ["train", "--strategy=my.py:Mine", "--out", "x"], ["compare", "--strategies", "horovod"]):
        submission.check_local(words, two)  # nothing refused
    for words in (["train", "--strategy", "horovod", "--out", "x"], ["train", "--strategy=horovod"]):
        with pytest.raises(ConfigError, match="--strategy horovod cannot join"):
            submission.check_local(words, two)
    submission.check_local(["train", "--strategy", "horovod"], Resources(tasks_per_node=1))
    with pytest.raises(ConfigError, match="one node"):
        submission.check_local(["train"], Resources(nodes=2))
    assert (minutes("00:00:30"), minutes("01:30:00"), minutes("1-00:00:01")) == (1, 90, 1441)


def test_the_command_line_refuses_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["submit", "--local", "--", "train", "--strategy", "ddp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give train an --out folder" in err


def _preempt_after_first_checkpoint(job: Any, out: Path, signal_tasks: Any) -> dict[str, Any]:
    """Wait for the first checkpoint, preempt the job, and return task 0's summary once the requeued job ends."""
    deadline = time.monotonic() + LIMIT_S
    while not list((out / "checkpoints").glob("step-*.pt")):
        assert time.monotonic() < deadline and not job.done(), job.stderr()
        time.sleep(0.2)  # polling a file the job writes (there is no event to wait on)
    signal_tasks(job)
    deadline = time.monotonic() + LIMIT_S
    while not job.done():  # never a hang: a job that does not come back fails with what Slurm says of it
        assert time.monotonic() < deadline, f"{job} did not end after its requeue:\n" + (
            _job_state(str(job.job_id)) + subprocess.run(["sinfo", "-R"], capture_output=True, text=True).stdout
            if shutil.which("sinfo") else job.stdout() or "")
        time.sleep(0.5)  # polling the job's state (there is no event to wait on)
    summary = job.results()[0]
    assert summary is not None, job.stdout()
    return summary


def _usr2_to_the_local_tasks(job: Any) -> None:
    """What Slurm does to a preempted job's tasks, done to the LocalExecutor's (its controller forwards only
    time-outs)."""
    for task in psutil.Process(job._process.pid).children():
        task.send_signal(signal.SIGUSR2)


def test_a_local_job_is_requeued_once_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    job = submit([*TRAIN, "--out", str(out)], Resources(tasks_per_node=2, time="00:10:00"), tmp_path / "jobs",
                 local=True)
    s = _preempt_after_first_checkpoint(job, out, _usr2_to_the_local_tasks)
    assert re.search(r"step-\d+\.pt$", s["resumed_from"]) and not s["resumed_from"].endswith(f"step-{STEPS}.pt"), \
        s["resumed_from"]
    assert s["world_size"] == 2 and s["timing"]["per_rank"][1]["measured_steps"] > 0
    log = job.stdout()
    assert log.count("Requeued job") == 1 and "Job completed successfully" in log


def _job_state(job_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout


def _preempt_on_slurm(job: Any) -> None:
    """submitit's preemption (``scancel --signal`` TERM, then USR2); once task 0 has requeued the job, Slurm holds
    it for 121 s (its BeginTime) before it may start again: release it now."""
    job._interrupt()
    deadline = time.monotonic() + LIMIT_S
    while not ("JobState=PENDING" in (state := _job_state(job.job_id)) and "Restarts=1" in state):
        assert time.monotonic() < deadline and "JobState=COMPLETED" not in state, state
        time.sleep(0.2)  # polling the job's state (there is no event to wait on)
    # now+3 s, not now: slurmd refuses a credential made in the second the requeue revoked the last one
    # ("Killing non-startable batch job: Job credential revoked", seen when released at once)
    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now+3"], check=True, capture_output=True)


def test_a_slurm_job_is_requeued_once_and_resumes_from_its_checkpoint(slurm_cluster: None,  # noqa: F811
                                                                       tmp_path: Path) -> None:
    out = tmp_path / "run"
    job = submit([*TRAIN, "--out", str(out)], Resources(tasks_per_node=2, time="00:10:00"), tmp_path / "jobs")
    assert isinstance(job, submitit.SlurmJob)
    try:
        s = _preempt_after_first_checkpoint(job, out, _preempt_on_slurm)
    finally:
        subprocess.run(["scancel", job.job_id], capture_output=True)
    assert re.search(r"step-\d+\.pt$", s["resumed_from"]) and not s["resumed_from"].endswith(f"step-{STEPS}.pt"), \
        s["resumed_from"]
    assert (s["world_size"], s["launcher"]) == (2, "slurm")
    state = _job_state(job.job_id)
    assert "Restarts=1" in state, state
    assert submission.COMMANDS == ("train", "compare")
