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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--keep-last", type=int, default=2)
    ap.add_argument("--width", type=int, default=1024, help="mlp hidden units (checkpoint size)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the kill schedule (default: random)")
    ap.add_argument("--out", help="folder of the run (default: a temporary one, removed afterwards)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    tmp = None if a.out else tempfile.mkdtemp(prefix="dpcompare-soak-")
    out = Path(a.out or tmp) / "run"  # type: ignore[arg-type]
    cmd = ["mpirun", "-np", str(a.np), "--oversubscribe", "--bind-to", "none", str(BIN / "dpcompare"), "train",
           "--strategy", a.strategy, "--model", "mlp", "--width", str(a.width), "--dataset", "digits",
           "--epochs", str(a.epochs), "--checkpoint-every", "1", "--keep-last", str(a.keep_last),
           "--resume", "auto", "--threads", "1", "--trackers", "none", "--progress", "lines", "--warmup-steps", "0",
           "--out", str(out)]
    print(f"soak: {a.kills} kills, {a.strategy} np={a.np}, mlp width {a.width}, {a.epochs} epochs, "
          f"--keep-last {a.keep_last}, schedule seed {seed}, OUT {out}", flush=True)

    epochs_done = kills = jobs = 0
    corrupt: list[str] = []
    kills_leaving_tmp = 0
    max_disk = max_files = 0
    ckpt_size = 0
    t0 = time.monotonic()
    while True:
        jobs += 1
        job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
                               start_new_session=True)
        kill_this = kills < a.kills
        lines: list[str] = []
        # kill after a random number of finished epochs (0-2 more), at a random moment within the next one
        target = rng.randint(1, 3)
        seen = 0
        for line in job.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("epoch "):
                seen += 1
                epochs_done += 1
                if kill_this and seen >= target:
                    time.sleep(rng.uniform(0.0, 0.6))  # often inside the checkpoint write that follows
                    ranks = _ranks(job)
                    if ranks:
                        victim = rng.choice(ranks)
                        rank = victim.environ().get("OMPI_COMM_WORLD_RANK")
                        victim.send_signal(signal.SIGKILL)
                        kills += 1
                        print(f"  job {jobs}: killed rank {rank} after {seen} epoch(s) of this job", flush=True)
                        break
        try:
            rc = job.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            rc = job.wait()
        if job.stdout:
            job.stdout.close()
        if kill_this:
            leftovers = _temporaries(out)
            kills_leaving_tmp += bool(leftovers)
            corrupt += _corrupt(out)
            files = checkpoint.list_checkpoints(out)
            max_files = max(max_files, len(files))
            max_disk = max(max_disk, _disk(out / checkpoint.CKPT_DIR))
            if files:
                ckpt_size = max(ckpt_size, files[-1][1].stat().st_size)
            continue
        if rc != 0:
            print("".join(lines[-20:]))
            print(f"soak: the final job exited {rc}")
            return 1
        break

    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    epochs = [m["epoch"] for m in metrics]
    duplicates = len(epochs) - len(set(epochs))
    missing = len(set(range(1, a.epochs + 1)) - set(epochs))
    corrupt += _corrupt(out)
    leftovers = _temporaries(out)
    final_disk = _disk(out / checkpoint.CKPT_DIR)
    final_files = len(checkpoint.list_checkpoints(out))
    bound = (a.keep_last + 1) * ckpt_size * 1.05 + ckpt_size  # one extra while replacing + one temporary
    steady = a.keep_last * ckpt_size * 1.05
    mb = 1 / 2**20
    print(f"soak: {kills} kills over {jobs} jobs in {time.monotonic() - t0:.0f} s")
    print(f"  checkpoint writes started (epochs finished):  {epochs_done}")
    print(f"  checkpoints present at the end:              {final_files} (--keep-last {a.keep_last})")
    print(f"  corrupt checkpoints:                         {len(corrupt)}")
    print(f"  kills that left a temporary file:            {kills_leaving_tmp} (removed by the next start)")
    print(f"  leftover temporary files at the end:         {len(leftovers)}")
    print(f"  metrics.jsonl: {len(epochs)} rows, duplicated epochs {duplicates}, missing epochs {missing}")
    print(f"  disk: checkpoint {ckpt_size * mb:.1f} MB; largest after a kill {max_disk * mb:.1f} MB "
          f"({max_files} files), bound {bound * mb:.1f} MB; at the end {final_disk * mb:.1f} MB "
          f"(bound {steady * mb:.1f} MB)")
    for c in corrupt[:3]:
        print(f"  corrupt: {c}")
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    bad = corrupt or leftovers or duplicates or missing or max_disk > bound or final_disk > steady
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
