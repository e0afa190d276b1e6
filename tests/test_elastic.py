"""Elastic runs and faults without a lab: the launch lines, the fault axis of compare, what the step log says,
step checkpoints and mid-epoch resume, a writer killed mid-write, the step watchdog, the report's fault section.

The lab's end-to-end case (both elastic arms losing a host) is tests/test_elastic_lab.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from dpcompare import checkpoint, cli
from dpcompare.compare import fault_runs
from dpcompare.compare.axes import Fault, parse_fault
from dpcompare.compare.cmdline import plan_flags
from dpcompare.compare.command import comparison_of
from dpcompare.compare.plan import RunSpec, child_config
from dpcompare.data.datasets import train_loader
from dpcompare.errors import ConfigError
from dpcompare.lab.hosts import Host, Lab
from dpcompare.launch.elastic import ElasticLaunch, horovodrun_command, together, torchrun_command
from dpcompare.report import faults as fault_report
from dpcompare.report.groups import arm_pairs
from dpcompare.training.watchdog import StepWatchdog

from conftest import dpcompare, mpi_env, mpirun_cmd, run


def _args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["compare", *argv])


# -- launch lines ----------------------------------------------------------------------------------------
def test_torchrun_and_horovodrun_lines() -> None:
    cmd = torchrun_command(["/venv/bin/dpcompare", "train"], nnodes=(2, 3), nproc_per_node=1,
                           endpoint="10.0.0.1:29400", run_id="r1", max_restarts=3, local_addr="10.0.0.2")
    assert cmd[:3] == ["torchrun", "--nnodes=2:3", "--nproc-per-node=1"]
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=10.0.0.1:29400" in cmd and "--max-restarts=3" in cmd
    conf = dict(
        kv.split("=") for kv in next(w for w in cmd if w.startswith("--rdzv-conf=")).split("=", 1)[1].split(",")
    )
    # fast recovery
    assert conf == {"last_call_timeout": "3", "keep_alive_interval": "1", "keep_alive_max_attempt": "5"}
    assert cmd[-3:] == ["--no-python", "/venv/bin/dpcompare", "train"] and "--local-addr=10.0.0.2" in cmd
    h = horovodrun_command(["dpcompare", "train"], np=3, min_np=2, max_np=3, discovery_script="/lab/discover.sh",
                           iface="dplab0", slots=1)
    assert h[:7] == ["horovodrun", "-np", "3", "--min-np", "2", "--max-np", "3"]
    assert h[h.index("--host-discovery-script") + 1] == "/lab/discover.sh" and h[-2:] == ["dpcompare", "train"]
    with pytest.raises(ConfigError, match="--min-np 4"):
        horovodrun_command(["x"], np=3, min_np=4, max_np=3, discovery_script="d", iface="i", slots=1)
    with pytest.raises(ConfigError, match="unknown elastic launcher"):
        ElasticLaunch("mpirun", 2)


def test_agents_are_one_job_whose_exit_code_is_the_first_agents(tmp_path: Path) -> None:
    """torchrun's agents run as one command: the first (host 0's) decides the exit code, the others end with it."""
    pidfile = tmp_path / "other.pid"
    cmd = together(["sh", "-c", f"while [ ! -s {pidfile} ]; do sleep 0.05; done; exit 3"],
                   [["sh", "-c", f"echo $$ > {pidfile}; exec sleep 600"]])
    t0 = time.monotonic()
    p = subprocess.run(cmd, timeout=60)
    assert p.returncode == 3 and time.monotonic() - t0 < 30  # the sleeping agent was ended, not waited for
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)


# -- the fault axis ----------------------------------------------------------------------------------------
def test_fault_spec_and_elastic_arms() -> None:
    assert parse_fault("host=2,at-step=40") == Fault(2, 40)
    assert Fault(2, 40, 80).to_json() == {"host": 2, "at_step": 40, "back_at_step": 80}  # the run's record
    assert str(parse_fault("host=1,at-step=5,back-at-step=9")) == "host=1,at-step=5,back-at-step=9"
    for bad in ("host=2", "at-step=4", "host=2,at-step=0", "host=2,at-step=9,back-at-step=9", "host=x,at-step=1",
                "node=2,at-step=4"):
        with pytest.raises(argparse.ArgumentTypeError, match="--fault"):
            parse_fault(bad)
    c = comparison_of(_args("--lab", "hosts=3", "--np", "3", "--fault", "host=2,at-step=40", "--replay",
                            "--strategies", "ddp-elastic,horovod-elastic"))
    arms = c.all_arms
    assert [a.label for a in arms] == ["ddp-elastic", "horovod-elastic", "ddp-elastic/fault=host2@40",
                                       "horovod-elastic/fault=host2@40"]
    assert arms[0].strategy == "ddp" and arms[0].elastic and arms[3].fault == Fault(2, 40)
    assert arms[3].to_json() == {"label": "horovod-elastic/fault=host2@40", "strategy": "horovod", "knobs": {},
                                 "axes": {"fault": "host=2,at-step=40"}, "base": "horovod-elastic", "elastic": True}
    flags = plan_flags(c)
    assert flags[flags.index("--strategies") + 1] == "ddp-elastic,horovod-elastic"
    assert flags[-3:] == ["--fault", "host=2,at-step=40", "--replay"]
    again = comparison_of(_args(*flags))
    assert again.all_arms == arms and again.replay


def test_child_configs_of_elastic_arms(tmp_path: Path) -> None:
    c = comparison_of(_args("--lab", "hosts=3", "--np", "3", "--fault", "host=1,at-step=4",
                            "--strategies", "ddp-elastic,horovod"))
    elastic, plain = c.all_arms[2], c.all_arms[3]
    cfg = child_config(c.config, RunSpec(elastic, 3, 0), tmp_path, step_log=True, replay=True)
    assert (cfg.strategy, cfg.commit_every, cfg.resume, cfg.step_log) == ("ddp", 10, "auto", True)
    assert cfg.checkpoint_steps == 10 and cfg.save_final  # a replay starts from the commits' checkpoints
    cfg = child_config(c.config, RunSpec(plain, 3, 0), tmp_path, step_log=True, replay=True)
    assert (cfg.commit_every, cfg.resume, cfg.checkpoint_steps) == (0, None, 0)


@pytest.mark.parametrize(("argv", "words"), [
    (("--fault", "host=1,at-step=3"), "add --lab"),
    (("--strategies", "ddp-elastic"), "add --lab"),
    (("--lab", "hosts=3", "--np", "3", "--fault", "host=0,at-step=3"), "host 0 holds the rendezvous"),
    (("--lab", "hosts=3", "--np", "3", "--fault", "host=3,at-step=3"), "from 1 to 2"),
    (("--lab", "hosts=3", "--np", "1", "--strategies", "ddp-elastic"), "none to lose"),
    (("--lab", "hosts=3", "--np", "3", "--replay"), "add --fault"),
])
def test_what_a_fault_cannot_run_is_refused(argv: tuple[str, ...], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        comparison_of(_args(*argv))


def test_a_strategy_without_an_elastic_mode_is_refused_in_one_line() -> None:
    p = dpcompare("compare", "--strategies", "fsdp-elastic", "--out", "/nonexistent/x", check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "elastic modes: ddp-elastic, horovod-elastic" in p.stderr


# -- what the step log says ---------------------------------------------------------------------------------
def _log(t_fault: float, restart: str) -> list[dict]:
    rows = [{"event": "start", "step": 0, "world_size": 3, "t": 100.0}]
    rows += [{"step": s, "world_size": 3, "samples": 96, "t": 100.0 + s} for s in range(1, 24)]
    rows += [{"event": "commit", "step": 20, "world_size": 3, "t": 120.1}]
    rows += [{"event": restart, "step": 20, "world_size": 2, "t": t_fault + 9.0}]
    rows += [{"step": s, "world_size": 2, "samples": 64, "t": t_fault + 10.0 + s - 20} for s in range(21, 41)]
    return rows


@pytest.mark.parametrize("restart", ["start", "reset"])
def test_pause_steps_redone_and_world_sizes_from_a_step_log(restart: str) -> None:
    rows = _log(123.5, restart)
    r = fault_runs.recovery(rows, 123.5)
    assert r["recovered"] and r["how"] == restart and r["resumed_from_step"] == 20
    assert r["steps_redone"] == 3 and r["steps_before_fault"] == 23 and r["world_size_after"] == 2
    assert r["pause_s"] == pytest.approx(11.0)  # fault at 123.5, the first step after the recovery at 134.5
    assert fault_runs.world_sizes(rows, 100.0) == [[0.0, 3], [32.5, 2]]
    line = fault_runs.timeline(rows, 100.0, points=10)
    assert len(line) <= 11 and line[-1][1:] == [40, 2, 23 * 96 + 20 * 64]
    assert not fault_runs.recovery(rows[:25], 123.5)["recovered"] and fault_runs.recovery(rows, None)["reason"]


def test_the_step_watch_reads_whole_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_text(json.dumps({"step": 1, "world_size": 2, "t": 1.0}) + "\n" + '{"step": 2, "wor')
    watch = fault_runs.StepWatch(path)
    assert [r["step"] for r in watch.poll()] == [1] and watch.last_step() == 1
    with open(path, "a") as f:
        f.write(
            'ld_size": 2, "t": 2.0}\n' + json.dumps({"event": "reset", "step": 1, "world_size": 1, "t": 3.0}) + "\n"
        )
    assert [r.get("event") for r in watch.poll()] == [None, "reset"]
    assert watch.last_step() == 2 and watch.recovered_after(2.5) and not watch.recovered_after(3.0)


# -- data and checkpoints -------------------------------------------------------------------------------------
def test_a_part_way_epoch_splits_the_rest_of_the_same_order() -> None:
    ds = TensorDataset(torch.arange(103).float(), torch.zeros(103))
    whole = [list(DistributedSampler(ds, 3, r, shuffle=True, seed=7, drop_last=True)) for r in range(3)]
    loaders = [train_loader(ds, 4, r, 3, 7)[1] for r in range(3)]
    assert [list(s) for s in loaders] == whole  # from the start: DistributedSampler's own split
    g = torch.Generator()
    g.manual_seed(7)
    order = torch.randperm(103, generator=g).tolist()
    rest = []
    for r in range(2):  # 36 samples done (three steps of 3 × 4), the rest among two ranks
        s = train_loader(ds, 4, r, 2, 7)[1]
        s.start_at(36)
        assert len(s) == (103 - 36) // 2
        rest.append(list(s))
    assert sorted(rest[0] + rest[1]) == sorted(order[36:36 + 66]) and not set(rest[0]) & set(rest[1])
    s.set_epoch(1)
    assert s.position == 0 and len(s) == 51


def test_the_newest_checkpoint_is_the_one_furthest_into_training(tmp_path: Path) -> None:
    for name, step in (("epoch-1.pt", 14), ("step-20.pt", 20), ("step-10.pt", 10)):
        checkpoint.atomic_save({"format": checkpoint.FORMAT, "global_step": step}, tmp_path / "checkpoints" / name)
    assert checkpoint.latest_checkpoint(tmp_path).name == "step-20.pt"
    checkpoint.atomic_save({"format": checkpoint.FORMAT, "global_step": 28}, tmp_path / "checkpoints" / "epoch-2.pt")
    assert checkpoint.latest_checkpoint(tmp_path).name == "epoch-2.pt"
    assert [p.name for p in checkpoint.prune_checkpoints(tmp_path, 1, kind="step")] == ["step-10.pt"]


WRITER = """
import sys, time, torch
from pathlib import Path
from dpcompare import checkpoint
def stuck(obj, f):
    f.write(b"PK half a checkpoint")
    f.flush()
    Path(sys.argv[2]).touch()
    time.sleep(600)
torch.save = stuck
checkpoint.atomic_save({"format": checkpoint.FORMAT, "global_step": 20}, sys.argv[1])
"""


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    out = tmp_path / "run"
    old = checkpoint.step_checkpoint_path(out, 10)
    checkpoint.atomic_save({"format": checkpoint.FORMAT, "global_step": 10, "model": {}}, old)
    ready = tmp_path / "writing"
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(checkpoint.step_checkpoint_path(out, 20)), str(ready)],
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():  # polling a file, bounded: the writer is mid-write once it is there
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    left = list((out / checkpoint.CKPT_DIR).glob(".step-20.pt.tmp-*"))
    assert len(left) == 1 and not checkpoint.step_checkpoint_path(out, 20).exists()
    assert checkpoint.latest_checkpoint(out) == old and checkpoint.load_checkpoint(old)["global_step"] == 10
    from dpcompare.files import remove_stale_temporaries

    assert remove_stale_temporaries(out / checkpoint.CKPT_DIR) == left  # what the next start clears


# -- the step watchdog ----------------------------------------------------------------------------------------
def test_the_watchdog_ends_a_step_that_outlives_the_timeout() -> None:
    said: list[str] = []
    fired = threading.Event()
    with StepWatchdog(0.3, "rank 1 of 2", lambda m: (said.append(m), fired.set())) as w:
        w.begin(7)
        w.end()  # a step that finished in time: nothing
        w.begin(8)
        assert fired.wait(30)
    assert len(said) == 1 and "step 8 did not finish within --timeout 0.3 s on rank 1 of 2" in said[0]


# -- the lab names a crawling host ---------------------------------------------------------------------------
def test_a_crawling_link_is_named_as_the_lost_host(monkeypatch: pytest.MonkeyPatch) -> None:
    lab = Lab("x", "sw", "10.9.9.0/24", 1, 10**9, [Host(i, f"ns{i}", f"10.9.9.{i + 1}", f"p{i}", 10**9) for i in
                                                    range(3)])
    monkeypatch.setattr(Lab, "host_rows", lambda self: [{"address": h.address, "port": "UP"} for h in self.hosts])
    assert lab.crawling() == [] and lab.lost_line() is None
    lab.hosts[1].link_bps = 100_000
    assert lab.crawling() == [lab.hosts[1]]
    line = lab.lost_line()
    assert line is not None and "host 1 (10.9.9.2" in line and "crawls at 100kbit (the others': 1gbit)" in line
    assert "did not finish within --timeout" in line
    mpirun_says = "ORTE has lost communication with a remote daemon.\n  Remote daemon: [[1,0],1] on node 10.9.9.2\n"
    line = lab.lost_line(mpirun_says)  # mpirun's probes ended it first: the line says so
    assert line is not None and "crawls at 100kbit" in line and "mpirun lost contact with its daemon" in line
    lab.hosts[0].link_bps = lab.hosts[2].link_bps = 200_000  # a slow lab, not a crawling host
    assert lab.crawling() == []


# -- the report's section ---------------------------------------------------------------------------------------
def _run(arm: str, repeat: int, wall: float, metric: float, recovery: dict | None = None) -> dict:
    timeline = [[10.0 + i * 0.1, i, 3, 96 * i] for i in range(1, 30)]
    return {"arm": arm, "strategy": arm.split("-")[0], "np": 3, "repeat": repeat, "status": "ok",
            "wall_seconds": wall, "final_metric": metric, "metric": {"name": "accuracy", "unit": "%"},
            "timeline": timeline, "world_sizes": [[10.0, 3]] + ([[25.0, 2]] if recovery else []),
            **({"recovery": recovery, "fault": {"host": 2, "t_fault_s": 12.0, "t_back_s": None}} if recovery else {})}


def _fault_arm(label: str, old: bool) -> dict:
    """An arm as results.json keeps it; ``old``: as before arms kept their axes apart (the fault under knobs)."""
    fault = {"fault": "host=2,at-step=40"} if "fault" in label else {}
    if old:
        return {"label": label, "strategy": label.split("-")[0], "knobs": fault}
    return {"label": label, "strategy": label.split("-")[0], "knobs": {}, "axes": fault, "base": label.split("/")[0]}


@pytest.mark.parametrize("old", [False, True], ids=["axes", "old-knobs"])
def test_the_report_weighs_each_arms_fault_and_draws_it(tmp_path: Path, old: bool) -> None:
    arms = ["ddp-elastic", "horovod-elastic", "ddp-elastic/fault=host2@40", "horovod-elastic/fault=host2@40"]
    axes = {} if old else {"axes": {"fault": {"pairs": "twin", "values": ["host=2,at-step=40"]}}}
    results = {"config": {"arms": [_fault_arm(a, old) for a in arms], **axes,
                          "equivalence": 0.05, "accuracy_equivalence": 0.005}, "runs": []}
    for k in range(3):
        rec = {"recovered": True, "pause_s": 20.0 + k, "steps_redone": 3, "resumed_from_step": 40}
        results["runs"] += [_run(arms[0], k, 30.0 + k, 0.9), _run(arms[1], k, 20.0 + k, 0.9),
                            _run(arms[2], k, 55.0 + k, 0.9, rec), _run(arms[3], k, 30.0 + 2 * k, 0.9, rec)]
    assert [p[1:] for p in arm_pairs(results)] == [("ddp-elastic", "horovod-elastic")]  # faulted arms apart
    rows = fault_report.rows(results)
    assert [(r["arm"], r["recovered"], r["world_sizes"]) for r in rows] == [("ddp-elastic", 3, "3 → 2"),
                                                                            ("horovod-elastic", 3, "3 → 2")]
    assert rows[0]["wall_cost_s"]["mean"] == pytest.approx(25.0) and rows[0]["metric_outcome"] == "equal"
    (v,) = fault_report.wall_verdicts(results)
    assert v["outcome"] == "faster" and v["ratio"] > 1.5 and "horovod-elastic finishes" in v["text"]
    made = fault_report.plot(results, tmp_path / "fault.png")
    assert made is not None and made.path.stat().st_size > 10_000
    html = fault_report.section(results, made)
    assert "When a host dies (host=2,at-step=40)" in html and "data:image/png;base64," in html


# -- mid-epoch resume across processes ----------------------------------------------------------------------------
@pytest.mark.mpi
def test_a_mid_epoch_step_checkpoint_resumes_to_the_same_weights(tmp_path: Path) -> None:
    """2 processes with a checkpoint every 9 steps (mid-epoch), then the same run resumed from step 27: the final
    weights are the uninterrupted run's, bit for bit (the sampler starts part-way through the epoch)."""
    common = ["train", "--strategy", "ddp", "--model", "mlp", "--epochs", "2", "--threads", "1", "--save-final",
              "--trackers", "none", "--progress", "none", "--keep-last", "0"]
    run(mpirun_cmd(2, *common, "--checkpoint-steps", "9", "--out", str(tmp_path / "a")), env=mpi_env())
    start = checkpoint.step_checkpoint_path(tmp_path / "a", 27)
    assert checkpoint.load_checkpoint(start)["sampler"]["position"] == 27 * 64 - 22 * 64  # 5 steps into epoch 2
    run(mpirun_cmd(2, *common, "--resume", str(start), "--out", str(tmp_path / "b")), env=mpi_env())
    same = fault_runs.same_weights(tmp_path / "a", tmp_path / "b")
    assert same["equal"] and same["steps"] == [44, 44], same
