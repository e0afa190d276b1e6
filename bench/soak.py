#!/usr/bin/env python
"""Soak test of checkpointing: K random SIGKILLs of a random rank, resuming with ``--resume auto`` each time.

    python bench/soak.py [--kills 10] [--strategy ddp] [--np 2] [--epochs 40] [--keep-last 2] [--seed N]

One ``mpirun -np N dpcompare train --checkpoint-every 1 --keep-last K --resume auto`` job after another in
the same OUT: while a job trains, a random rank is SIGKILLed at a random moment (often during a
checkpoint write); mpirun ends the job and the next one resumes. After the last kill a job runs to the
end. Between jobs and at the end the script audits OUT and prints:

* checkpoint writes started (epochs finished by all jobs) and checkpoints present at the end;
* corrupt checkpoints: every checkpoint present after each kill is loaded (must be 0);
* leftover temporary files (``.NAME.tmp-PID``) at the end (must be 0; the kills that left one are counted);
* duplicated or missing epochs in metrics.jsonl (must be 0);
* disk used by OUT/checkpoints, largest seen after a kill and at the end, against the retention bound
  (keep-last checkpoints, plus one more and one temporary file while a write is being replaced).

Not a unit test: it takes minutes. Exit code 1 when a must-be-0 figure is not 0 or disk exceeds the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from dpcompare import checkpoint
from dpcompare.errors import CheckpointError
from dpcompare.files import TMP_MARK, TMP_PREFIX

BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "SLURM_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return env


def _ranks(job: subprocess.Popen[str]) -> list[psutil.Process]:
    try:
        kids = psutil.Process(job.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for p in kids:
        try:
            if "OMPI_COMM_WORLD_RANK" in p.environ():
                found.append(p)
        except psutil.Error:
            continue
    return found


def _temporaries(out: Path) -> list[Path]:
    return [p for d in (out, out / checkpoint.CKPT_DIR) for p in d.glob(f"{TMP_PREFIX}*{TMP_MARK}*")]


def _disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*") if p.is_file()) if folder.is_dir() else 0


def _corrupt(out: Path) -> list[str]:
    bad = []
    for _, path in checkpoint.list_checkpoints(out):
        try:
            checkpoint.load_checkpoint(path)
        except CheckpointError as e:
            bad.append(str(e))
    return bad


@dataclass
class Tally:
    """What the kills left behind, audited after each one."""
    epochs_done: int = 0
    kills: int = 0
    jobs: int = 0
    corrupt: list[str] = field(default_factory=list)
    kills_leaving_tmp: int = 0
    max_disk: int = 0
    max_files: int = 0
    ckpt_size: int = 0

    def audit(self, out: Path) -> None:
        self.kills_leaving_tmp += bool(_temporaries(out))
        self.corrupt += _corrupt(out)
        files = checkpoint.list_checkpoints(out)
        self.max_files = max(self.max_files, len(files))
        self.max_disk = max(self.max_disk, _disk(out / checkpoint.CKPT_DIR))
        if files:
            self.ckpt_size = max(self.ckpt_size, files[-1][1].stat().st_size)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--keep-last", type=int, default=2)
    ap.add_argument("--width", type=int, default=1024, help="mlp hidden units (checkpoint size)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the kill schedule (default: random)")
    ap.add_argument("--out", help="folder of the run (default: a temporary one, removed afterwards)")
    return ap.parse_args()


def _train_command(a: argparse.Namespace, out: Path) -> list[str]:
    return ["mpirun", "-np", str(a.np), "--oversubscribe", "--bind-to", "none", str(BIN / "dpcompare"), "train",
            "--strategy", a.strategy, "--model", "mlp", "--width", str(a.width), "--dataset", "digits",
            "--epochs", str(a.epochs), "--checkpoint-every", "1", "--keep-last", str(a.keep_last),
            "--resume", "auto", "--threads", "1", "--trackers", "none", "--progress", "lines", "--warmup-steps", "0",
            "--out", str(out)]


def _run_job(cmd: list[str], kill: bool, rng: random.Random, t: Tally) -> tuple[int, list[str]]:
    """One job; with ``kill``, a random rank SIGKILLed after 1-3 of its epochs, at a random moment within the
    next one (often inside the checkpoint write that follows). Its exit code and output."""
    t.jobs += 1
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
                           start_new_session=True)
    lines: list[str] = []
    target, seen = rng.randint(1, 3), 0
    for line in job.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if not line.startswith("epoch "):
            continue
        seen += 1
        t.epochs_done += 1
        if kill and seen >= target and _kill_a_rank(job, rng, t, seen):
            break
    try:
        rc = job.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        rc = job.wait()
    if job.stdout:
        job.stdout.close()
    return rc, lines


def _kill_a_rank(job: subprocess.Popen[str], rng: random.Random, t: Tally, seen: int) -> bool:
    time.sleep(rng.uniform(0.0, 0.6))  # a random moment, not a synchronisation
    ranks = _ranks(job)
    if not ranks:
        return False
    victim = rng.choice(ranks)
    rank = victim.environ().get("OMPI_COMM_WORLD_RANK")
    victim.send_signal(signal.SIGKILL)
    t.kills += 1
    print(f"  job {t.jobs}: killed rank {rank} after {seen} epoch(s) of this job", flush=True)
    return True


def _report(a: argparse.Namespace, out: Path, t: Tally, seconds: float) -> bool:
    """Print the audit of OUT at the end; True when every must-be-0 figure is 0 and disk stays in its bounds."""
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    epochs = [m["epoch"] for m in metrics]
    duplicates = len(epochs) - len(set(epochs))
    missing = len(set(range(1, a.epochs + 1)) - set(epochs))
    t.corrupt += _corrupt(out)
    leftovers = _temporaries(out)
    final_disk = _disk(out / checkpoint.CKPT_DIR)
    final_files = len(checkpoint.list_checkpoints(out))
    bound = (a.keep_last + 1) * t.ckpt_size * 1.05 + t.ckpt_size  # one extra while replacing + one temporary
    steady = a.keep_last * t.ckpt_size * 1.05
    mb = 1 / 2**20
    print(f"soak: {t.kills} kills over {t.jobs} jobs in {seconds:.0f} s")
    print(f"  checkpoint writes started (epochs finished):  {t.epochs_done}")
    print(f"  checkpoints present at the end:              {final_files} (--keep-last {a.keep_last})")
    print(f"  corrupt checkpoints:                         {len(t.corrupt)}")
    print(f"  kills that left a temporary file:            {t.kills_leaving_tmp} (removed by the next start)")
    print(f"  leftover temporary files at the end:         {len(leftovers)}")
    print(f"  metrics.jsonl: {len(epochs)} rows, duplicated epochs {duplicates}, missing epochs {missing}")
    print(f"  disk: checkpoint {t.ckpt_size * mb:.1f} MB; largest after a kill {t.max_disk * mb:.1f} MB "
          f"({t.max_files} files), bound {bound * mb:.1f} MB; at the end {final_disk * mb:.1f} MB "
          f"(bound {steady * mb:.1f} MB)")
    for c in t.corrupt[:3]:
        print(f"  corrupt: {c}")
    return not (t.corrupt or leftovers or duplicates or missing or t.max_disk > bound or final_disk > steady)


def main() -> int:
    a = _args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    tmp = None if a.out else tempfile.mkdtemp(prefix="dpcompare-soak-")
    out = Path(a.out or tmp) / "run"  # type: ignore[arg-type]
    cmd = _train_command(a, out)
    print(f"soak: {a.kills} kills, {a.strategy} np={a.np}, mlp width {a.width}, {a.epochs} epochs, "
          f"--keep-last {a.keep_last}, schedule seed {seed}, OUT {out}", flush=True)
    t, t0 = Tally(), time.monotonic()
    while t.kills < a.kills:  # each job killed, then audited; the next one resumes
        before = t.kills
        _run_job(cmd, True, rng, t)
        t.audit(out)
        if t.kills == before:  # the job ended before its kill: the training is over
            print(f"soak: the training ended after {t.kills} kills of {a.kills}: raise --epochs", flush=True)
            break
    rc, lines = _run_job(cmd, False, rng, t)  # after the last kill, a job runs to the end
    if rc != 0:
        print("".join(lines[-20:]))
        print(f"soak: the final job exited {rc}")
        return 1
    ok = _report(a, out, t, time.monotonic() - t0)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
