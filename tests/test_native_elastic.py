"""Horovod Elastic scripts on the native layer under torchrun's elastic agent (dpcompare/native/elastic.py).

One test, three torchrun jobs at once, each the elastic digits example (examples/horovod/elastic_mnist.py) under
``dpcompare script`` with its step log: a clean run at 2 workers; the same with rank 1 raising
``HorovodInternalError`` mid-run (the agent restarts both workers, which restore the last commit from disk and end
with the clean run's weights, bit for bit); and two agents of one worker each where one agent and its worker are
killed (a host lost): the survivor restarts alone from the last commit and finishes the epoch at world size 1.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from dpcompare import cli
from dpcompare.compare.command import comparison_of
from dpcompare.compare.plan import RunSpec
from dpcompare.compare.runner import child_command
from dpcompare.errors import ConfigError
from dpcompare.lab.hosts import Host, Lab
from dpcompare.launch.elastic import TORCHRUN_ENV, executable, together, torchrun_command, with_env
from dpcompare.launch.rendezvous import free_port
from dpcompare.native.elastic import DIR_VAR

from conftest import DPCOMPARE, ROOT, mpi_env

EXAMPLE = ROOT / "examples" / "horovod" / "elastic_mnist.py"
CRASH = ROOT / "tests" / "elastic_crash.py"
BATCH, EVERY = 16, 5
TRAIN = 1797 - math.ceil(1797 * 0.2)  # the digits the example trains on


def _agent(out: Path, nproc: int, port: int, run_id: str, conf: str = "") -> list[str]:
    words = ["script", "--out", str(out), "--overwrite", "--", "python", str(CRASH), str(EXAMPLE), "--epochs", "1",
             "--batch-size", str(BATCH), "--batches-per-commit", str(EVERY)]
    cmd = torchrun_command([DPCOMPARE, *words], nnodes=(1, 2), nproc_per_node=nproc, endpoint=f"127.0.0.1:{port}",
                           run_id=run_id, max_restarts=2, torchrun=executable("torchrun"))
    return [f"{c},{conf}" if conf and c.startswith("--rdzv-conf=") else c for c in cmd]


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def _restart(rows: list[dict]) -> tuple[dict, int]:
    """The second start line, and the newest commit logged before it."""
    starts = [i for i, r in enumerate(rows) if r.get("event") == "start"]
    assert len(starts) == 2, rows
    commits = [r["step"] for r in rows[: starts[1]] if r.get("event") == "commit"]
    return rows[starts[1]], max(commits)


def test_elastic_script_resumes_from_its_last_commit_on_torchrun(tmp_path: Path) -> None:
    env = mpi_env({"PYTHONPATH": str(ROOT), **TORCHRUN_ENV})
    runs = {
        "clean": (_agent(tmp_path / "clean", 2, free_port("127.0.0.1"), "clean"), {}),
        "error": (_agent(tmp_path / "error", 2, free_port("127.0.0.1"), "error"),
                  {"CRASH_HOW": "error", "CRASH_RANK": "1", "CRASH_STEP": "30"}),
    }
    port = free_port("127.0.0.1")
    lost = with_env(_agent(tmp_path / "host", 1, port, "host", "is_host=false"),
                    {"CRASH_HOW": "host", "CRASH_STEP": "30"})
    runs["host"] = (together(_agent(tmp_path / "host", 1, port, "host", "is_host=true"), [lost]), {})
    jobs = {name: subprocess.Popen(cmd, env={**env, DIR_VAR: str(tmp_path / name / "commits"), **extra},
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
            for name, (cmd, extra) in runs.items()}
    outputs = {name: p.communicate(timeout=420)[0] for name, p in jobs.items()}
    for name, p in jobs.items():
        assert p.returncode == 0, f"{name}:\n{outputs[name][-4000:]}"

    # a forced HorovodInternalError: both workers restarted, from the last commit, to the clean run's weights
    assert "restoring the commit" in outputs["error"]
    rows = _log(tmp_path / "error")
    again, commit = _restart(rows)
    assert again["step"] == commit and again["world_size"] == 2
    steps = math.ceil(TRAIN / 2) // BATCH  # whole batches only (the example's drop_last)
    assert [r["step"] for r in rows if "event" not in r][-1] == steps
    clean, error = (torch.load(tmp_path / n / "params.pt", weights_only=True)["tensors"] for n in ("clean", "error"))
    assert clean.keys() == error.keys() and all(torch.equal(clean[k], error[k]) for k in clean)
    assert not (tmp_path / "error" / "commits" / "commit.pt").exists()  # the finished job's commit is gone

    # a host lost: the survivor carries on alone from the last commit and finishes the epoch's samples
    rows = _log(tmp_path / "host")
    again, commit = _restart(rows)
    assert again["step"] == commit and again["world_size"] == 1
    assert [r["world_size"] for r in rows if r.get("event") == "start"] == [2, 1]
    left = TRAIN - commit * 2 * BATCH
    assert [r["step"] for r in rows if "event" not in r][-1] == commit + left // BATCH
    assert json.loads((tmp_path / "host" / "rank0.json").read_text())["world_size"] == 1



# -- compare's elastic script arms -----------------------------------------------------------------------------
def _compare(*argv: str):  # noqa: ANN202
    return comparison_of(cli.build_parser().parse_args(["compare", "--script", str(EXAMPLE), *argv]))


def test_compare_runs_a_script_in_its_elastic_arms_with_the_elastic_launchers(tmp_path: Path) -> None:
    c = _compare("--lab", "hosts=3", "--np", "3", "--fault", "host=2,at-step=20", "--timeout", "7",
                 "--strategies", "horovod-elastic,native-elastic", "--out", str(tmp_path / "o"))
    arms = c.all_arms
    assert [a.label for a in arms] == ["horovod-elastic", "native-elastic", "horovod-elastic/fault=host2@20",
                                       "native-elastic/fault=host2@20"]
    assert [(a.strategy, a.elastic) for a in arms[:2]] == [("horovod", True), ("native", True)]
    lab = Lab("x", "sw", "10.9.9.0/24", 1, 10**9, [Host(i, f"ns{i}", f"10.9.9.{i + 1}", f"p{i}") for i in range(3)],
              ssh=True)
    run = tmp_path / "run"
    hvd, native = (" ".join(child_command(c.config, RunSpec(a, 3, 0), run, lab, step_log=True, script=c.script))
                   for a in arms[2:])
    assert "horovodrun -np 3 --min-np 2 --max-np 3 --host-discovery-script" in hvd and "--as horovod" in hvd
    assert native.count("torchrun --nnodes=2:3") == 3 and "--as native" in native  # an agent per host
    for line in (hvd, native):
        assert f"--step-log --timeout 7 --commit-dir {run}/commits -- python {EXAMPLE}" in line


@pytest.mark.parametrize(("argv", "says"), [
    (("--strategies", "native-elastic", "--fault", "host=1,at-step=4", "--replay"), "leave --replay out"),
])
def test_what_an_elastic_script_comparison_cannot_run_is_refused(argv: tuple[str, ...], says: str,
                                                                  tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=says):
        _compare("--lab", "hosts=3", "--np", "3", *argv, "--out", str(tmp_path / "o"))
