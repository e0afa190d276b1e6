"""The native Horovod layer: Horovod scripts, unchanged, on torch.distributed, with Horovod's numbers.

Every example in examples/horovod runs at two processes under real Horovod and under the layer, the layer in a
venv where Horovod is not installed (built as tests/test_install.py builds one: links, no download); the final
weights the DistributedOptimizer held are compared tensor by tensor and must be equal (0.0). A Horovod script of
edge cases (tests/horovod_semantics.py) must write the same record under both. Unsupported calls stop a script
with one line and exit code 2. The fusion plan and ``dpcompare migrate`` are tested without processes.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, horovod_problem, in_process, missing, mpi_env, needs_mpi, run

EXAMPLES = ROOT / "examples" / "horovod"
#: small arguments for each example (mnist without weight decay: its DDP port then matches exactly too)
SMALL = {
    "mnist.py": ["--epochs", "1", "--weight-decay", "0"],
    "synthetic_benchmark.py": ["--model", "gpt-tiny", "--batch-size", "2", "--num-warmup-batches", "1",
                               "--num-batches-per-iter", "2", "--num-iters", "2"],
    "fp16_accumulate.py": ["--steps", "6"],
    "objects.py": ["--steps", "6"],
}
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"]


def _horovod() -> None:
    if (problem := horovod_problem()) is not None:
        missing(problem)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv that has this environment's packages but Horovod (and dpcompare, found through PYTHONPATH)."""
    from test_install import existing_env

    py = existing_env(tmp_path_factory.mktemp("nohvd"), {"horovod"})
    p = subprocess.run([str(py), "-c", "import horovod"], capture_output=True, text=True, env=_bare_env(py))
    assert p.returncode != 0 and "No module named 'horovod'" in p.stderr
    return py


def _bare_env(py: Path) -> dict[str, str]:
    from test_install import clean_env

    return {**clean_env(py), "PYTHONPATH": str(ROOT)}


def _params(out: Path) -> dict:
    import torch

    return torch.load(out / "params.pt", weights_only=True)


def _largest_difference(a: Path, b: Path) -> float:
    pa, pb = _params(a), _params(b)
    assert pa["tensors"].keys() == pb["tensors"].keys() and pa["tensors"]
    return max(float((pa["tensors"][k] - pb["tensors"][k]).abs().max()) for k in pa["tensors"])


def _record(out: Path, rank: int = 0) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def horovod_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each example under real Horovod (plain mpirun, this environment); the records' folders by example."""
    _horovod()
    base = tmp_path_factory.mktemp("hvd")
    out = {}
    for name, args in SMALL.items():
        out[name] = base / name
        run([*MPIRUN, sys.executable, "-m", "dpcompare.native", "--as", "horovod", "--out", str(out[name]),
             str(EXAMPLES / name), *args], timeout=600)
    return out


@needs_mpi
@pytest.mark.parametrize("name", list(SMALL))
def test_example_runs_without_horovod_and_matches_it(name: str, bare_python: Path, horovod_runs: dict[str, Path],
                                                     tmp_path: Path) -> None:
    out = tmp_path / "native"
    p = run([str(bare_python), "-m", "dpcompare", "script", "--np", "2", "--as", "native", "--out", str(out), "--",
             "python", str(EXAMPLES / name), *SMALL[name]], env=_bare_env(bare_python), timeout=600)
    assert "mpirun" in p.stderr  # the line dpcompare started
    assert _largest_difference(out, horovod_runs[name]) == 0.0
    mine, theirs = _record(out), _record(horovod_runs[name])
    assert mine["steps"] == theirs["steps"] > 0 and mine["metrics"] == theirs["metrics"]
    assert _record(out, 1)["steps"] == mine["steps"] and mine["exit_code"] == 0


@needs_mpi
def test_ddp_port_runs_and_matches_horovod_without_weight_decay(tmp_path: Path,
                                                                 horovod_runs: dict[str, Path]) -> None:
    script = tmp_path / "mnist.py"
    script.write_text((EXAMPLES / "mnist.py").read_text())
    in_process(["migrate", str(script)])
    port = tmp_path / "mnist_ddp.py"
    out = tmp_path / "ddp"
    run([*MPIRUN, sys.executable, "-m", "dpcompare.native", "--as", "ddp", "--out", str(out), str(port),
         *SMALL["mnist.py"]], timeout=600)
    # no weight decay: broadcast_optimizer_state's zero step changes nothing, DDP's division before the sum is exact
    assert _largest_difference(out, horovod_runs["mnist.py"]) == 0.0
    # the port's own all-reduce helper names its metrics in an audit event: recorded as Horovod's are
    mine, theirs = _record(out)["metrics"], _record(horovod_runs["mnist.py"])["metrics"]
    assert mine.keys() == theirs.keys() == {"avg_loss", "avg_accuracy"}
    assert all(mine[k] == pytest.approx(theirs[k], rel=1e-6) for k in mine)


# -- semantics ------------------------------------------------------------------------------------------------
def _semantics(tmp: Path, arm: str) -> dict:
    out = tmp / f"{arm}.json"
    run([*MPIRUN, sys.executable, "-m", "dpcompare.native", "--as", arm, str(ROOT / "tests" / "horovod_semantics.py"),
         str(out)], timeout=600)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def native_semantics(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _semantics(tmp_path_factory.mktemp("sem"), "native")


@needs_mpi
def test_layer_reproduces_horovods_semantics(native_semantics: dict) -> None:
    s = native_semantics
    assert s["facts"] == [0, 2, 0, 2, 0, 1, True]
    unused = s["unused_parameters_get_zero_gradients"]
    assert unused["grad_is_none"] is False and set(unused["grad"]) == {0.0} and unused["moved"]  # weight decay acted
    assert s["accumulation_and_its_limit"]["third_pass"].startswith("AssertionError: Gradients were computed more")
    assert s["zero_grad_between_backward_and_step"].startswith("AssertionError: optimizer.zero_grad() was called")
    assert s["synchronize_then_skip"]["warned"] is True
    zero_step = s["optimizer_state_zero_step"]
    assert zero_step["step"] == 1.0 and set(zero_step["grad_after"]) == {0.0}
    x = np.array([0.1, 0.7, 1e-3, 3.3], dtype=np.float32)
    third, post = np.float32(1 / 3.0), np.float32(3.0 / 2)
    expected = ((x * third) + ((x * np.float32(3)) * third)) * post  # float32 throughout, as Horovod's CPU path
    assert s["predivide_arithmetic"] == [float(v) for v in expected]
    assert s["predivide_arithmetic"] != [float(v) for v in (x + x * np.float32(3)) * np.float32(0.5)]
    red = s["reductions"]
    assert red["int_avg"] == [3, -4, 7] and red["int_sum"] == [7, -8, 14]  # (3+4)/2 truncated, as Horovod's C++
    assert red["avg"] == [2.0, -1.0, pytest.approx(1e-3)] and red["min"][:2] == [1.5, -2.0]
    g = s["gathers_and_broadcasts"]
    assert g["allgather"] == [[0.0], [1.0], [0.0], [2.0], [4.0]] and g["object"] == {"from": 1, "list": [1, "x"]}
    assert g["objects"] == [[0, "rank0"], [1, "rank1"]] and g["broadcast"] == [1.5] and g["async"] == [0.5]
    assert s["gradients_through_collectives"] == {"allreduce": [6.0, 10.0], "allgather": [2.0, 4.0]}
    # Adasum: orthogonal gradients add up, equal ones stay as they are
    assert s["adasum"]["orthogonal"] == [1.0, 1.0] and s["adasum"]["parallel"] == [2.0, 4.0]
    assert not any(isinstance(v, str) and v.startswith(("Unsupported", "TypeError", "RuntimeError"))
                   for v in s.values())
    e = s["elastic_state"]  # hvd.elastic: rank 0's state after the first sync; restore() to the commit
    assert e["returned"] == "done" and e["synced"][1:3] == [0, [0]] and e["object_state"] == 10
    assert e["restored"][1:4] == [1, [0], {"epoch": 0, "processed_num": 16}] and len(e["restored"][4]) == 4
    # 6 steps: the first two reduced at step() in one buffer, then every group starts during backward, as soon as
    # its gradients are ready
    fusion = s["layer_fusion"]
    assert fusion["groups"] >= 1 and fusion["started"]["backward"] == 4 * fusion["groups"]
    assert fusion["started"]["synchronize"] == 2  # steps 1 and 2: one buffer each (128 MiB threshold)


@needs_mpi
def test_semantics_are_horovods_bit_for_bit(native_semantics: dict, tmp_path: Path) -> None:
    _horovod()
    horovod = _semantics(tmp_path, "horovod")
    assert native_semantics.keys() - {"layer_fusion"} == horovod.keys()
    different = [k for k in horovod if native_semantics[k] != horovod[k]]
    assert not different, f"the layer differs from Horovod in: {different}"


# -- refusals ---------------------------------------------------------------------------------------------------
REFUSED = """\
import horovod
import horovod.torch as hvd
import torch

hvd.init()
print("layer:", hvd.__name__, horovod.__version__)
try:
    import horovod.tensorflow
except ImportError as e:
    print("import refused:", e)
try:
    hvd.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), op=hvd.Adasum)
except Exception as e:
    print("adasum refused:", type(e).__name__)
hvd.init(comm=[0])
print("not reached")
"""


def test_unsupported_call_is_one_line_and_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "refused.py"
    script.write_text(REFUSED)
    p = run([sys.executable, "-m", "dpcompare", "script", "--", "python", str(script)], check=False,
            env=mpi_env({"PYTHONPATH": str(ROOT)}))
    assert p.returncode == 2, p.stderr
    assert "layer: dpcompare.native.hvd 0.28.1+dpcompare.native" in p.stdout  # even where Horovod is installed
    assert (
        "import refused: import horovod.tensorflow: dpcompare's native Horovod layer covers horovod.torch" in p.stdout
    )
    assert "adasum refused: Unsupported" in p.stdout and "not reached" not in p.stdout
    assert p.stderr.strip().splitlines() == [
        "dpcompare script: error: hvd.init(comm=...) is not supported by dpcompare's native Horovod layer; natively: "
        "dist.new_group(ranks), passed as group= to each collective"]


def test_script_refuses_an_earlier_runs_records_and_a_missing_script(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text("{}")
    p = in_process(["script", "--out", str(tmp_path), "--", "python", str(EXAMPLES / "objects.py")], check=False)
    assert p.returncode == 2 and "already holds a script run" in p.stderr
    p = in_process(["script", "--np", "2", "--", "python", str(tmp_path / "nope.py")], check=False)
    assert p.returncode == 2 and "no such script" in p.stderr


@needs_mpi
def test_script_job_runs_through_the_job_runner_and_stops_at_its_time_limit(tmp_path: Path) -> None:
    """``dpcompare script --np`` is a job like any other: its own session, and --run-timeout takes it all down."""
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(120)\n")
    p = run([sys.executable, "-m", "dpcompare", "script", "--np", "2", "--as", "ddp", "--run-timeout", "4", "--",
             "python", str(script)], check=False, env=mpi_env({"PYTHONPATH": str(ROOT)}))
    assert p.returncode == 124, p.stderr
    assert "took longer than --run-timeout 4 s and was stopped" in p.stderr
    left = []  # every rank is gone (run_job waits for the whole session)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(script).encode() in cmdline.read_bytes():
                left.append(cmdline.parent.name)
        except OSError:
            continue  # ended while we looked
    assert not left


def test_runner_takes_dash_m_as_python_does_with_one_parser_for_both_commands(tmp_path: Path) -> None:
    import argparse

    from dpcompare.cli import build_parser
    from dpcompare.native.runner import add_run_arguments, target_words

    own = argparse.ArgumentParser()
    add_run_arguments(own)
    for words, target in ((["-m", "pytest", "-x", "t.py::a", "--threads", "2"],
                           ["-m", "pytest", "-x", "t.py::a", "--threads", "2"]),  # after MODULE: the module's
                          (["--threads", "0", "--", "-m", "pytest"], ["-m", "pytest"]),
                          (["--seed", "3", "python", "t.py", "-m", "x"], ["python", "t.py", "-m", "x"])):
        a, b = own.parse_args(words), build_parser().parse_args(["script", *words])
        assert target_words(a) == target_words(b) == target, words
        assert (a.arm, a.seed, a.threads) == (b.arm, b.seed, b.threads)
    with pytest.raises(SystemExit):  # --threads is one type in both (0 or more)
        own.parse_args(["--threads", "-1", "t.py"])
    test = tmp_path / "test_it.py"
    test.write_text("import sys\n\ndef test_argv():\n    assert sys.argv[-2:] == ['-k', 'argv']\n")
    p = run([sys.executable, "-m", "dpcompare.native", "-m", "pytest", f"{test}::test_argv", "-p",
             "no:cacheprovider", "-q", "-k", "argv"], check=False, env=mpi_env({"PYTHONPATH": str(ROOT)}))
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr


# -- the fusion plan -----------------------------------------------------------------------------------------------
def test_fusion_groups_follow_readiness_threshold_and_kind() -> None:
    from dpcompare.native.fusion import plan_groups

    sizes, kinds = [40, 40, 40, 40, 40], ["f32"] * 4 + ["f16"]
    assert plan_groups(range(5), sizes, kinds, threshold=100) == [[0, 1], [2, 3], [4]]
    assert plan_groups(range(5), sizes, kinds, threshold=0) == [[0], [1], [2], [3], [4]]
    times = [0.0, 0.0005, 0.0030, 0.0031, 0.0032]
    assert plan_groups([0, 1, 2, 3, 4], sizes, ["f32"] * 5, 10**9, times, cycle=0.001) == [[0, 1], [2, 3, 4]]
    # never ready (unused this step: reduced as zeros at synchronize) go last, together
    inf = float("inf")
    assert plan_groups([1, 0, 2], sizes, ["f32"] * 5, 10**9, [inf, 0.0, inf], cycle=0.001) == [[1], [0, 2]]


def test_explicit_groups_split_as_horovods() -> None:
    import torch

    from dpcompare.native.optimizer import _explicit_groups

    params = [torch.zeros(1) for _ in range(7)]
    assert _explicit_groups(3, params) == [[0, 1, 2], [3, 4], [5, 6]]
    assert _explicit_groups([[params[4], params[1]]], params) == [[4, 1], [0], [2], [3], [5], [6]]
    with pytest.raises(ValueError, match="only appear once"):
        _explicit_groups([[params[0]], [params[0]]], params)


def test_grouped_calls_refuse_tensors_on_two_devices_and_int16_travels_as_fp16_bytes() -> None:
    """What Horovod's test_torch.py checks on a GPU (bench/horovod_conformance.sh ran it on one H100), in the
    parts a CPU can show: a grouped call on two devices is refused before anything is sent, and int16 (which
    neither gloo nor NCCL carries) goes on the wire as fp16's bytes."""
    import torch

    from dpcompare.native.collectives import as_wire, grouped_allreduce, one_device, scale_

    mixed = [torch.zeros(2), torch.zeros(2, device="meta")]
    with pytest.raises(RuntimeError, match="Tensors in list must be on same device."):
        grouped_allreduce(mixed)
    assert one_device([torch.zeros(1), torch.ones(3)])
    short = torch.tensor([1, -2, 300], dtype=torch.int16)
    assert as_wire(short).dtype is torch.float16 and as_wire(short).view(torch.int16).equal(short)
    assert scale_(torch.tensor([7, -7], dtype=torch.int32), 0.5).tolist() == [3, -3]   # in double, toward zero


# -- dpcompare migrate -----------------------------------------------------------------------------------------------
def _migrate_json(path: Path) -> dict:
    return json.loads(in_process(["migrate", str(path), "--json", "--no-port"]).stdout)


def test_migrate_lists_every_horovod_call_with_its_line() -> None:
    rep = _migrate_json(EXAMPLES / "mnist.py")
    text = (EXAMPLES / "mnist.py").read_text()
    after_docstring = ast.parse(text).body[0].end_lineno or 0
    source = text.splitlines()
    expected = sorted((i + 1, m) for i, line in enumerate(source) if i >= after_docstring
                      and not line.lstrip().startswith("#") for m in re.findall(r"hvd\.(\w+)", line))
    listed = sorted((c["line"], c["call"]) for c in rep["calls"] if not c["call"].startswith("import"))
    assert listed == expected
    assert [c["line"] for c in rep["calls"] if c["call"] == "import horovod.torch"] == \
        [i + 1 for i, line in enumerate(source) if line == "import horovod.torch as hvd"]
    assert rep["unsupported"] == 0 and all(c["native"] for c in rep["calls"])
    warnings = " ".join(rep["warnings"])
    assert "zero gradients" in warnings and "learning rate is scaled" in warnings and "'module.'" in warnings


def test_migrate_marks_refused_calls_and_writes_no_port_for_them(tmp_path: Path) -> None:
    script = tmp_path / "refused.py"
    script.write_text(REFUSED + "opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1), "
                                "named_parameters=m.named_parameters())\n")
    out = json.loads(in_process(["migrate", str(script), "--json"]).stdout)
    refused = {c["call"] for c in out["calls"] if not c["supported"]}
    assert refused == {"import horovod.tensorflow", "DistributedOptimizer(op=Adasum)"}
    assert out["port"]["written"] is None and any("Adasum" in r for r in out["port"]["reasons"])
    assert not (tmp_path / "refused_ddp.py").exists()


def test_migrate_writes_a_ddp_port_once_and_only_for_simple_scripts(tmp_path: Path) -> None:
    for name in ("synthetic_benchmark.py", "fp16_accumulate.py"):
        (tmp_path / name).write_text((EXAMPLES / name).read_text())
    p = in_process(["migrate", str(tmp_path / "synthetic_benchmark.py")], env=mpi_env({"COLUMNS": "200"}))
    port = tmp_path / "synthetic_benchmark_ddp.py"
    assert f"Wrote the DDP port {port}" in p.stdout
    text = port.read_text()
    names = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
    assert "hvd" not in names and "import horovod" not in text and "model = DDP(model)" in text
    assert 'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))' in text and "register_comm_hook" in text
    port.write_text("mine")
    p = in_process(["migrate", str(tmp_path / "synthetic_benchmark.py")], env=mpi_env({"COLUMNS": "200"}))
    assert "exists and is left as it is" in p.stdout and port.read_text() == "mine"
    p = in_process(["migrate", str(tmp_path / "fp16_accumulate.py")], env=mpi_env({"COLUMNS": "200"}))
    assert (
        "backward_passes_per_step=args.accumulate: the port runs all but every N-th forward and backward()" in p.stdout
    )
    text = (tmp_path / "fp16_accumulate_ddp.py").read_text()
    assert (
        "with accumulate(model):\n                loss = F.mse_loss(model(x)" in text
        and "return model.no_sync()" in text
    )
    assert "backward_passes_per_step" not in text.split("def main")[1].split("# the plain optimizer")[0]


def test_migrate_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    p = in_process(["migrate", str(bad)], check=False)
    assert p.returncode == 2 and "not valid Python" in p.stderr
    (tmp_path / "plain.py").write_text("print(1)\n")
    p = in_process(["migrate", str(tmp_path / "plain.py")], check=False)
    assert p.returncode == 2 and "no `import horovod`" in p.stderr


def test_docs_table_lists_every_call() -> None:
    from dpcompare.native.calls import CALLS, MODULES

    page = (ROOT / "docs" / "from-horovod.md").read_text()
    missing_rows = [n for n in CALLS if f"`{n if n.startswith('optimizer.') else 'hvd.' + n}`" not in page]
    missing_rows += [m for m in MODULES if f"`import {m}`" not in page]
    assert not missing_rows, f"docs/from-horovod.md lacks rows for {missing_rows}"


def test_script_summary_takes_the_slowest_rank_per_step_after_warmup(tmp_path: Path) -> None:
    from dpcompare.native.summary import write_summary

    ends = {0: [1.0, 1.1, 1.2, 1.5, 1.6, 1.7], 1: [1.0, 1.15, 1.2, 1.4, 1.6, 1.75]}
    for rank, e in ends.items():
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({
            "arm": "native", "rank": rank, "world_size": 2, "exit_code": 0, "steps": len(e), "step_ends_s": e,
            "metrics": {"val_accuracy": [0.5, 0.75]} if rank == 0 else {}}))
    s = write_summary(tmp_path, warmup=2, metric="val_accuracy")
    assert s == json.loads((tmp_path / "summary.json").read_text())
    # steps 3..6 take (rank 0, rank 1) (0.1, 0.05), (0.3, 0.2), (0.1, 0.2), (0.1, 0.15) s: the slowest rank counts
    assert s["timing"]["measured_steps"] == 4 and s["timing"]["step_ms_median"] == pytest.approx(175.0)
    assert s["final_metric"] == 0.75 and s["metric"]["name"] == "val_accuracy" and s["exit_code"] == 0
