"""compare --workers persistent: runs in one long-lived job per process count (dpcompare.compare.workers)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dpcompare.compare.workers import WorkerPool

from conftest import dpcompare, mpi_env, needs_horovod, needs_mpi

FAST = ("--model", "convnet", "--dataset", "digits", "--threads", "1", "--warmup-steps", "2", "--min-steps", "20",
        "--epochs", "1")


@needs_mpi
@needs_horovod
@pytest.mark.mpi
@pytest.mark.horovod
def test_persistent_workers_reuse_one_job_and_a_failed_run_ends_it(tmp_path: Path) -> None:
    """Runs share a job until one fails; then the next run starts a new one. A run in a reused process
    computes exactly what the same run computes as the first of a fresh job, and DDP and Horovod still
    compute the same model: nothing of one run reaches the next."""
    out = tmp_path / "p"
    p = dpcompare("compare", "--np", "2", "--variants", "a=ddp", "b=horovod", "bad=horovod:target_accuracy=5",
                  "--repeats", "2", "--workers", "persistent", *FAST, "--out", str(out), timeout=400, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["workers"] == "persistent" and "--workers persistent" in " ".join(res["config"]["cli"])
    runs = {Path(r["dir"]).name: r for r in res["runs"]}
    # block 0: a, b (one job), bad fails and ends it; block 1 (reversed): bad fails in a new job, b and a share a third
    assert [Path(r["dir"]).name for r in res["runs"]] == ["a-np2-r0", "b-np2-r0", "bad-np2-r0", "bad-np2-r1",
                                                           "b-np2-r1", "a-np2-r1"]
    assert sorted(f.name for f in (out / "runs").glob("worker-*.log")) == [
        "worker-np2-1.log", "worker-np2-2.log", "worker-np2-3.log"]
    for name in ("bad-np2-r0", "bad-np2-r1"):
        assert runs[name]["status"] == "failed" and "--target-accuracy 5: accuracy is a fraction" in \
            runs[name]["error"]
    ok = [runs[n] for n in ("a-np2-r0", "b-np2-r0", "b-np2-r1", "a-np2-r1")]
    for r in ok:
        assert r["status"] == "ok" and r["step_ms"]["median"] > 0 and 100 < r["peak_rss_mb"] < 4000
        log = (out / r["dir"] / "stdout.log").read_text()
        assert log.startswith(f"dpcompare: {r['strategy']} · 2 processes") and log.count("done: final test") == 1
        assert "error" not in (out / r["dir"] / "stderr.log").read_text().lower()
    losses = {r["final_train_loss"] for r in ok}
    assert max(losses) - min(losses) < 1e-5, losses  # a-r1 ran after b-r1 in the same processes
    assert "persistent job per process count" in p.stdout


def _fake_worker(tmp_path: Path, body: str) -> str:
    """A stand-in worker: connects like dpcompare.compare.workers, then does ``body``."""
    script = tmp_path / "fake_worker.py"
    script.write_text(
        "import json, socket, sys\n"
        "host, port = sys.argv[sys.argv.index('--connect') + 1].rsplit(':', 1)\n"
        "key = open(sys.argv[sys.argv.index('--key-file') + 1]).read().strip()\n"
        "s = socket.create_connection((host, int(port))); f = s.makefile('rw')\n"
        "f.write(json.dumps({'key': key, 'rank': 0}) + '\\n'); f.flush()\n" + body)
    return str(script)


def _pool(tmp_path: Path, script: str) -> WorkerPool:
    # the real command line names dpcompare.compare.workers; the stand-in takes its flags
    return WorkerPool(tmp_path / "runs", mpi_env(),
                      lambda np, argv: [sys.executable, script, *argv[argv.index("--connect"):]])


def test_a_run_past_its_timeout_stops_the_worker_job(tmp_path: Path) -> None:
    pool = _pool(tmp_path, _fake_worker(tmp_path, "f.readline()\nf.readline()\n"))  # takes a run, never answers
    run_dir = tmp_path / "runs" / "r0"
    run_dir.mkdir(parents=True)
    rc, wall = pool.run(1, ["--strategy", "single"], run_dir, timeout=3.0)
    assert rc is None and wall >= 3.0
    assert pool.jobs == {}  # stopped: the next run starts a new job
    assert not (tmp_path / "runs" / ".worker-key").exists()


def test_a_worker_that_dies_answers_with_a_failure_and_a_clear_log(tmp_path: Path) -> None:
    pool = _pool(tmp_path, _fake_worker(tmp_path, "f.readline()\nprint('worker said goodbye')\nsys.exit(7)\n"))
    run_dir = tmp_path / "runs" / "r0"
    run_dir.mkdir(parents=True)
    rc, _ = pool.run(1, ["--strategy", "single"], run_dir, timeout=60.0)
    assert rc == 7 and pool.jobs == {}
    assert "worker said goodbye" in (run_dir / "stderr.log").read_text()
    pool.close()


def test_a_worker_that_never_connects_fails_the_run_with_its_output(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('cannot start: no such library')\nsys.exit(3)\n")
    pool = WorkerPool(tmp_path / "runs", mpi_env(), lambda np, argv: [sys.executable, str(script)])
    run_dir = tmp_path / "runs" / "r0"
    run_dir.mkdir(parents=True)
    rc, _ = pool.run(1, ["--strategy", "single"], run_dir, timeout=60.0)
    err = (run_dir / "stderr.log").read_text()
    assert rc == 3 and "before every rank had connected" in err and "cannot start: no such library" in err
