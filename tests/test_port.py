"""``dpcompare migrate``'s DDP port (the libcst codemod of ``dpcompare.native.port``) on scripts of our own written
in the idioms of Horovod's official examples: a flag-guarded Adasum, ``horovod.run`` under ``--num-proc``,
``backward_passes_per_step``, a metric all-reduce, fp16 compression, samplers from ``hvd.size()``/``hvd.rank()``,
the learning rate scaled by the size, ``gradient_predivide_factor``.

Each ports, the port compiles and keeps the script's comments, ``--diff`` prints a unified diff, a flag whose
branch DDP lacks stops the port at start with one line, and (with MPI) ``parity --script`` finds the port's
weights equal to the native layer's at np=2 with two backward passes per step.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from dpcompare.launch.rendezvous import free_port

from conftest import ROOT, in_process, mpi_env, needs_mpi

IDIOMS = '''\
"""Horovod's idioms, on a linear model and fixed random data."""
import argparse

import horovod
import horovod.torch as hvd
import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--accumulate", type=int, default=2, help="backward passes per optimizer step")
parser.add_argument("--use-adasum", action="store_true")
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--num-proc", type=int)
parser.add_argument("--predivide", type=float, default=1.0)


def metric_average(value, name):
    # Horovod: average metric values across workers.
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main(args):
    hvd.init()
    torch.manual_seed(0)
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
    sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank(),
                                                              shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    model = torch.nn.Linear(8, 2)
    # Horovod: scale the learning rate by the number of workers.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         backward_passes_per_step=args.accumulate,
                                         gradient_predivide_factor=args.predivide)
    batches = iter(loader)
    for step in range(args.steps):
        optimizer.zero_grad()
        for _ in range(args.accumulate):
            x, y = next(batches)
            loss = F.mse_loss(model(x), y) / args.accumulate
            loss.backward()  # gradients of the passes add up
        optimizer.step()
    print(f"loss {metric_average(loss.item(), 'loss'):.6f}")


if __name__ == "__main__":
    args = parser.parse_args()
    if args.num_proc:
        # run training through horovod.run
        horovod.run(main, args=(args,), np=args.num_proc)
    else:
        main(args)
'''


def _ported(tmp_path: Path) -> tuple[Path, Path, str]:
    script = tmp_path / "idioms.py"
    script.write_text(IDIOMS)
    p = in_process(["migrate", str(script)], env=mpi_env({"COLUMNS": "200"}))
    port = tmp_path / "idioms_ddp.py"
    assert f"Wrote the DDP port {port}" in p.stdout, p.stdout
    return script, port, p.stdout


def test_the_port_translates_every_idiom_and_keeps_the_comments(tmp_path: Path) -> None:
    script, port, out = _ported(tmp_path)
    text = port.read_text()
    compile(text, str(port), "exec")
    names = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
    assert not names & {"hvd", "horovod"} and "import horovod" not in text
    for kept in ("# Horovod: average metric values across workers.", "# gradients of the passes add up",
                 "# Horovod: scale the learning rate by the number of workers.", '"""Horovod\'s idioms, on a'):
        assert kept in text
    assert "num_replicas=dist.get_world_size(), rank=dist.get_rank()" in text
    assert 'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))' in text and "lr=0.05 * dist.get_world_size()" in text
    assert "return allreduce(torch.tensor(value), name=name).item()" in text
    assert "compression = default_hooks.fp16_compress_hook if args.fp16_allreduce else None" in text
    assert "model = DDP(model)" in text and "model.register_comm_hook(None, compression)" in text
    assert ("            x, y = next(batches)\n            with accumulate(model):\n"
            "                loss = F.mse_loss(model(x), y) / args.accumulate\n"
            "                loss.backward()  # gradients of the passes add up\n") in text
    assert "finish_passes(model)\n        optimizer.step()" in text and "set_backward_passes(args.accumulate)" in text
    # only what must change changed: the lines without Horovod are the script's, in its order
    untouched = [ln for ln in IDIOMS.splitlines() if "hvd" not in ln and "horovod" not in ln and ln.strip()]
    assert [ln for ln in text.splitlines() if ln in untouched] [:20] == untouched[:20]
    assert "gradient_predivide_factor: Horovod divides by it" in out and "--use-adasum (hvd.Adasum)" in out
    assert "zero gradients" in out  # the scan's warnings are still listed


def test_diff_prints_the_change_and_writes_nothing(tmp_path: Path) -> None:
    script = tmp_path / "idioms.py"
    script.write_text(IDIOMS)
    p = in_process(["migrate", str(script), "--diff"])
    lines = p.stdout.splitlines()
    assert lines[0] == f"--- {script}" and lines[1] == f"+++ {tmp_path / 'idioms_ddp.py'}"
    assert any(ln.startswith("@@ ") for ln in lines) and "-import horovod.torch as hvd" in lines
    assert "+import torch.distributed as dist" in lines and "-    hvd.init()" in lines
    assert not (tmp_path / "idioms_ddp.py").exists()


def test_the_port_leaves_the_process_group_at_exit_as_horovod_does(tmp_path: Path) -> None:
    """A group still up while the interpreter ends can abort a finished rank (exit -6), and torchrun would start
    the job again: the port's init() leaves the group at exit, before hooks the script registered earlier run."""
    script = tmp_path / "bare.py"
    script.write_text("import atexit\n\nimport horovod.torch as hvd\nimport torch.distributed as dist\n\n"
                      "atexit.register(lambda: print('in a group at exit:', dist.is_initialized()))\n"
                      "hvd.init()\nprint('rank', hvd.rank(), 'of', hvd.size())\n")
    in_process(["migrate", str(script)])
    env = mpi_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")), "WORLD_SIZE": "1",
                   "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    p = subprocess.run([sys.executable, str(tmp_path / "bare_ddp.py")], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 0 and p.stdout.splitlines() == ["rank 0 of 1", "in a group at exit: False"], p


def test_a_flag_whose_branch_ddp_lacks_stops_the_port_at_start(tmp_path: Path) -> None:
    _, port, _ = _ported(tmp_path)
    for flag, words in ((["--use-adasum"], "--use-adasum: Horovod's Adasum has no DDP equivalent"),
                        (["--num-proc", "2"], "--num-proc: horovod.run starts Horovod's own workers; start the "
                                              "port with torchrun")):
        p = subprocess.run([sys.executable, str(port), *flag], capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and p.stderr.strip().splitlines() == [p.stderr.strip()], p.stderr
        assert words in p.stderr


def test_horovods_examples_that_stopped_migrate_have_their_idiom_here() -> None:
    """The idioms that kept migrate from porting Horovod 0.28.1's non-elastic examples, each in IDIOMS."""
    for idiom in ("op=hvd.Adasum if args.use_adasum else hvd.Average", "horovod.run(main",
                  "backward_passes_per_step=", "hvd.allreduce(", "hvd.Compression.fp16", "gradient_predivide_factor"):
        assert idiom in IDIOMS


@needs_mpi
def test_the_port_computes_the_native_layers_weights_with_accumulation(tmp_path: Path) -> None:
    script = tmp_path / "idioms.py"
    script.write_text(IDIOMS)
    out = tmp_path / "parity"
    p = in_process(["parity", "--script", str(script), "--strategies", "native,ddp", "--np", "2", "--out", str(out),
                    "--", "--steps", "4", "--accumulate", "2"], env=None, timeout=900)
    result = json.loads((out / "parity.json").read_text())
    assert result["weights_max"] == {"ddp": 0.0}, (result, p.stdout[-2000:])
    assert set(result["diffs"]["ddp"]) == {"weight", "bias"}
    assert (out / "idioms_ddp.py").is_file() and ROOT.is_dir()


def test_what_the_port_cannot_follow_is_named_and_no_port_is_written(tmp_path: Path) -> None:
    from dpcompare.native.port import port_source
    from dpcompare.native.port_tools import NoPort

    head = ("import horovod.torch as hvd\nimport torch\n\nhvd.init()\nmodel = torch.nn.Linear(2, 2)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    cases = {"op=hvd.Sum: DDP averages": "opt = hvd.DistributedOptimizer(opt, "
                                         "named_parameters=model.named_parameters(),"
                                         " op=hvd.Sum)\n",
             "is not in the block that runs model's forward": (
                 "opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), "
                 "backward_passes_per_step=2)\nloss = model(torch.ones(2)).sum()\nif True:\n    loss.backward()\n"),
             "`hvd.Adasum`": "x = hvd.allreduce(torch.ones(1), op=hvd.Adasum)\n"}
    for why, tail in cases.items():
        try:
            port_source(head + tail, "s.py", "s_ddp.py")
        except NoPort as e:
            assert why in str(e), str(e)
        else:
            raise AssertionError(f"a port was written for {tail!r}")
    # a broadcast alone in its block: the block keeps a `pass` and says what was there
    text, _ = port_source(head + "if True:\n    # rank 0's weights\n    hvd.broadcast_parameters(model.state_dict(), "
                                 "root_rank=0)\nprint(hvd.rank())\n", "s.py", "s_ddp.py")
    assert "if True:\n    # rank 0's weights\n    # DDP broadcasts" in text
    assert "\n    pass\nprint(dist.get_rank())" in text
