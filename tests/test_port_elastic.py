"""The port of a Horovod Elastic script (``hvd.elastic.run``, ``TorchState``, ``ElasticSampler``) to torchrun's
elastic agent: the pass on libcst trees, migrate's port of a script of our own in Horovod's elastic idioms, and
that port run for real under torchrun at np=2, once straight through and once with a worker killed mid-epoch
(``--max-restarts 1``): the restarted workers resume from the last commit and end with the same weights."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from dpcompare.launch.elastic import TORCHRUN_ENV, executable, torchrun_command
from dpcompare.launch.rendezvous import free_port
from dpcompare.native.migrate import port_warnings, scan_script
from dpcompare.native.port import write_port
from dpcompare.native.port_elastic import DIFFERENCES, elastic_pass
from dpcompare.native.record import ELASTIC_DIR_VAR, STEP_LOG, commit_key, resumed_step

HOROVOD_EXAMPLES = Path("/tmp/horovod/examples/elastic/pytorch")

SCRIPT = '''\
"""A small Horovod Elastic script in the idioms of Horovod's elastic examples (dpcompare's own test)."""
import argparse
import hashlib
import os

import torch
import torch.nn.functional as F
import horovod.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--batches-per-commit", type=int, default=3)
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)

# deterministic data: a linear problem, 64 samples
data = torch.randn(64, 10)
target = data @ torch.arange(10.0) / 10 + 0.1
dataset = torch.utils.data.TensorDataset(data, target)
# Elastic Horovod: ElasticSampler partitions the samples not yet processed this epoch
train_sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
train_loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler)

model = torch.nn.Linear(10, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)


def maybe_fail(state):
    # the test's fault: rank 1 dies once, before batch $FAULT_AT_BATCH of epoch 1 ($FAULT_MARKER: it has died)
    marker = os.environ.get("FAULT_MARKER")
    if marker and hvd.rank() == 1 and state.epoch == 1 and not os.path.exists(marker) \\
            and state.batch == int(os.environ["FAULT_AT_BATCH"]):
        open(marker, "w").close()
        os._exit(3)


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        batch_offset = state.batch
        for idx, (x, y) in enumerate(train_loader):
            state.batch = batch_offset + idx
            if state.batch % args.batches_per_commit == 0:
                state.commit()  # a commit every few batches
            else:
                state.check_host_updates()
            maybe_fail(state)
            optimizer.zero_grad()
            loss = F.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            optimizer.step()
            state.train_sampler.record_batch(idx, args.batch_size)
            state.steps += 1
        state.epoch += 1
        state.batch = 0
        state.train_sampler.set_epoch(state.epoch)
        state.commit()


# scale the learning rate to the workers there are after a reset
def on_state_reset():
    for group in optimizer.param_groups:
        group["lr"] = 0.01 * hvd.size()
    print(f"reset: epoch {state.epoch} batch {state.batch} steps {state.steps}", flush=True)


state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=0, batch=0, steps=0)
state.register_reset_callbacks([on_state_reset])
train(state)
if hvd.rank() == 0:
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    print(f"final steps {state.steps} weights {hashlib.sha256(weights).hexdigest()}", flush=True)
'''


# -- the pass on trees ------------------------------------------------------------------------------------
def test_pass_renames_elastic_names_and_leaves_the_rest():
    source = textwrap.dedent('''\
        import horovod.torch as hvd
        from horovod.torch.elastic import ElasticSampler as ES


        @hvd.elastic.run  # the wrapped function
        def train(state):
            state.commit()


        sampler = ES(range(8))
        state = hvd.elastic.TorchState(model=None, epoch=0)
        other = hvd.elastic.ObjectState(epoch=0)
        ''')
    tree, notes = elastic_pass(cst.parse_module(source))
    code = tree.code
    assert "@elastic_run  # the wrapped function" in code
    assert "sampler = ElasticSampler(range(8))" in code and "state = TorchState(model=None, epoch=0)" in code
    assert "hvd.elastic.ObjectState(epoch=0)" in code  # no translation: migrate refuses it
    assert code.index("import horovod.torch as hvd") < code.index("def elastic_commit_path") < code.index("def train")
    assert notes == DIFFERENCES
    ast.parse(code)


def test_pass_drops_the_names_it_stands_for_from_elastic_imports():
    source = textwrap.dedent('''\
        from horovod.torch.elastic import TorchState, run
        from horovod.torch.elastic import ElasticSampler as ES, ObjectState  # kept: ObjectState


        @run
        def train(state):
            pass


        state = TorchState(sampler=ES(range(4)), epoch=0)
        ''')
    code = elastic_pass(cst.parse_module(source))[0].code
    assert "import TorchState" not in code and "from horovod.torch.elastic import ObjectState  # kept" in code
    assert "@elastic_run" in code and "state = TorchState(sampler=ElasticSampler(range(4)), epoch=0)" in code


def test_pass_leaves_a_script_without_elastic_alone():
    tree = cst.parse_module("import horovod.torch as hvd\nhvd.init()  # start\n")
    out, notes = elastic_pass(tree)
    assert out.code == tree.code and notes == []


@pytest.mark.skipif(not HOROVOD_EXAMPLES.is_dir(), reason="no Horovod checkout at /tmp/horovod")
@pytest.mark.parametrize("name", ["pytorch_mnist_elastic.py", "pytorch_imagenet_resnet50_elastic.py"])
def test_pass_on_horovods_elastic_examples_compiles(name, tmp_path):
    source = (HOROVOD_EXAMPLES / name).read_text()
    tree, _ = elastic_pass(cst.parse_module(source))
    assert "hvd.elastic" not in tree.code
    assert "@elastic_run" in tree.code
    compile(tree.code, name, "exec")


# -- migrate's port, run under torchrun ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def port(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("elastic")
    script = folder / "elastic_script.py"
    script.write_text(SCRIPT)
    scan = scan_script(script)
    assert any(DIFFERENCES[0] == w for w in port_warnings(scan))
    result = write_port(scan, None)
    assert result["written"], result["message"]
    return Path(result["written"])


def test_what_stops_an_elastic_port_is_named_as_the_script_wrote_it(tmp_path):
    script = tmp_path / "elastic_other.py"
    script.write_text(SCRIPT + "hvd.alltoall(torch.zeros(2))\n")
    result = write_port(scan_script(script), None, dry_run=True)
    assert result["written"] is None and len(result["reasons"]) == 1, result
    assert "`hvd.alltoall(torch.zeros(2))`: no automatic translation" in result["reasons"][0], result


def test_port_is_written_compiles_and_keeps_comments(port):
    text = port.read_text()
    compile(text, str(port), "exec")
    assert "import horovod" not in text and not re.search(r"^[^#]*hvd\.", text, re.M)  # only in comments
    for comment in ("# the test's fault: rank 1 dies once", "# a commit every few batches",
                    "# scale the learning rate to the workers there are after a reset",
                    "# Elastic Horovod: ElasticSampler partitions"):
        assert comment in text
    assert "@elastic_run" in text and "TorchState(model, optimizer" in text and "DDP(model)" in text


def _torchrun(port: Path, folder: Path, fault_at: int | None) -> subprocess.CompletedProcess[str]:
    """The port under torchrun at np=2, alone or (with a fault) in the ddp arm of ``dpcompare script``, as
    ``compare --script ... --strategies ddp-elastic`` runs it: its records and step log in FOLDER/run."""
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    argv = [sys.executable, str(port)]
    if fault_at is not None:
        argv = [sys.executable, "-m", "dpcompare.native", "--as", "ddp", "--out", str(folder / "run"),
                "--overwrite", "--", *argv]
    cmd = torchrun_command(argv, nnodes=(1, 1), nproc_per_node=2, endpoint=endpoint, run_id=folder.name,
                           max_restarts=1, torchrun=executable("torchrun"))
    env = {**os.environ, **TORCHRUN_ENV, ELASTIC_DIR_VAR: str(folder / "commits"), "OMP_NUM_THREADS": "1"}
    if fault_at is not None:
        env.update(FAULT_MARKER=str(folder / "died"), FAULT_AT_BATCH=str(fault_at))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_port_runs_under_torchrun_and_survives_a_lost_worker(port, tmp_path):
    (tmp_path / "clean").mkdir()
    (tmp_path / "fault").mkdir()
    clean = _torchrun(port, tmp_path / "clean", None)
    assert clean.returncode == 0, clean.stderr[-3000:]
    final = re.findall(r"final steps (\d+) weights (\w+)", clean.stdout)
    # once under the parallel suite (2026-12-04) the clean run printed its final line twice: torchrun had started
    # the finished workers again; the agent's log says why, so keep it in the message
    assert len(final) == 1 and final[0][0] == "16", clean.stderr[-3000:]  # 2 epochs of 64 samples, 4 a batch
    assert "reset:" not in clean.stdout and "resuming from the last commit" not in clean.stderr
    assert not (tmp_path / "clean" / "commits" / "commit.pt").exists()  # removed when train() returned

    faulty = _torchrun(port, tmp_path / "fault", 5)  # the last commit before it: batch 3 of epoch 1
    assert faulty.returncode == 0, faulty.stderr[-3000:]
    assert (tmp_path / "fault" / "died").exists() and "elastic: resuming from the last commit" in faulty.stderr
    assert re.findall(r"reset: epoch 1 batch 3 steps 11", faulty.stdout)  # 8 of epoch 0, 3 of epoch 1
    assert re.findall(r"final steps (\d+) weights (\w+)", faulty.stdout) == final
    # the ddp arm's step log: a start at step 0, a start at the commit's step after the restart, 16 steps in all
    rows = [json.loads(line) for line in (tmp_path / "fault" / "run" / STEP_LOG).read_text().splitlines()]
    assert [(r["step"], r["world_size"]) for r in rows if r.get("event") == "start"] == [(0, 2), (11, 2)]
    assert [r["step"] for r in rows if "event" not in r][-1] == 16
    # a commit is logged at the first step that sees it: every 3 batches and at the epoch's end (8 batches);
    # after the restart the same state again (11), then 14; the last, at 16, is seen by no step
    assert [r["step"] for r in rows if r.get("event") == "commit"] == [0, 3, 6, 8, 11, 11, 14]


def test_resumed_step_is_the_last_step_logged_before_the_commit_was_written(tmp_path):
    log, commit = tmp_path / STEP_LOG, tmp_path / "commit.pt"
    assert resumed_step(log, commit) == 0  # no commit: from the start
    commit.write_bytes(b"1")
    old = commit_key(commit)
    (tmp_path / "next").write_bytes(b"2")
    os.replace(tmp_path / "next", commit)  # a newer commit: another file
    new = commit_key(commit)
    assert old != new
    rows = [{"event": "start", "step": 0}, {"step": 1, "commit": None}, {"step": 2, "commit": old},
            {"step": 3, "commit": new}, {"step": 4, "commit": new}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "c')  # a half-written last line
    assert resumed_step(log, commit) == 2  # written between steps 2 and 3
    rows[3:] = [{"event": "start", "step": 2}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert resumed_step(log, commit) == 2  # written after the last line: restarted again before a step


# -- compare's ddp-elastic arm: the port on torchrun's agents ---------------------------------------------------
def test_compare_runs_the_port_of_an_elastic_script_in_its_ddp_elastic_arm(tmp_path):
    from dpcompare import cli
    from dpcompare.compare.command import comparison_of
    from dpcompare.compare.plan import RunSpec
    from dpcompare.compare.runner import child_command
    from dpcompare.lab.hosts import Host, Lab

    example = Path(__file__).parents[1] / "examples" / "horovod" / "elastic_mnist.py"
    out = tmp_path / "o"
    c = comparison_of(cli.build_parser().parse_args([
        "compare", "--script", str(example), "--lab", "hosts=3", "--np", "3", "--fault", "host=2,at-step=20",
        "--timeout", "7", "--strategies", "native-elastic,ddp-elastic", "--out", str(out)]))
    arm = c.all_arms[-1]
    assert (arm.label, arm.strategy, arm.elastic) == ("ddp-elastic/fault=host2@20", "ddp", True)
    port = out / "elastic_mnist_ddp.py"
    assert "@elastic_run" in port.read_text()  # migrate's port, written into the comparison's folder
    lab = Lab("x", "sw", "10.9.9.0/24", 1, 10**9, [Host(i, f"ns{i}", f"10.9.9.{i + 1}", f"p{i}") for i in range(3)])
    run = tmp_path / "run"
    line = " ".join(child_command(c.config, RunSpec(arm, 3, 0), run, lab, step_log=True, script=c.script))
    assert line.count("torchrun --nnodes=2:3") == 3 and "--as ddp" in line  # an agent per host
    assert f"--step-log --timeout 7 --commit-dir {run}/commits -- python {port}" in line
