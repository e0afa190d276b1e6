"""The native layer on bad input, as Horovod's negotiation answers it: one 2-rank job of tests/horovod_conformance.py.

Every dtype Horovod takes on CPU goes through every collective (int16, which gloo lacks, included); each thing
two ranks can disagree on raises a RuntimeError on both, naming the tensor and what each rank sent, and the job
goes on; calls issued in different orders meet by name; one name twice in flight is a ValueError at the second
call; ``join()`` answers the other rank's all-reduces with zeros, fails its all-gathers, and returns the last
rank to join on every rank; a root outside the job raises; the build queries answer as a CPU build of Horovod;
and two ranks waiting for different tensors are named by the stall inspector, then stopped with its message.
The bench against Horovod's own test file is bench/horovod_conformance.sh.
"""

from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT, mpi_env, needs_mpi, run

MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("conformance") / "out.json"
    p = run([*MPIRUN, sys.executable, "-m", "dpcompare.native", str(ROOT / "tests" / "horovod_conformance.py"),
             str(out)], timeout=300, env=mpi_env())
    return json.loads(out.read_text()), p.stderr


@needs_mpi
def test_every_cpu_dtype_through_every_collective(job: tuple[dict, str]) -> None:
    results, _ = job
    for dtype in ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"):
        assert results[f"dtype.{dtype}"] == {"allreduce": True, "allgather": True, "broadcast": True,
                                            "grouped_allreduce": True}, dtype
    assert results["dtype.bool"] is True


@needs_mpi
def test_disagreeing_ranks_raise_naming_the_tensor_and_the_ranks(job: tuple[dict, str]) -> None:
    results, _ = job
    said = {
        "allreduce_dtype": ("Mismatched data types", "m.dtype", "float32", "int32"),
        "allreduce_shape": ("Mismatched allreduce tensor shapes", "m.shape", "[4, 3]", "[5, 3]"),
        "allreduce_rank_of_shape": ("Mismatched allreduce tensor shapes", "m.dims", "[3, 4]", "[12]"),
        "allreduce_op": ("Mismatched reduction operation", "m.op", "hvd.Max", "hvd.Sum"),
        "allreduce_factors": ("Mismatched prescale and/or postscale factors", "m.scale", "factors (1.0, 1.0)",
                              "factors (2.0, 1.0)"),
        "allgather_shape": ("Mismatched allgather tensor shapes", "m.gather", "[2, 3]", "[2, 4]"),
        "allgather_dtype": ("Mismatched data types", "m.gtype", "float64", "int64"),
        "broadcast_root": ("Mismatched broadcast root ranks", "m.root", "root rank 0", "root rank 1"),
        "broadcast_shape": ("Mismatched broadcast tensor shapes", "m.bshape", "[2, 2]", "[2, 3]"),
        "operation": ("Mismatched operations", "m.kind", "allreduce", "allgather"),
    }
    for key, (what, name, rank0, rank1) in said.items():
        got = results[f"mismatch.{key}"]
        assert got["runtime"] and got["error"] == "HorovodInternalError", key
        message = got["message"]
        assert message.startswith(what) and f"tensor '{name}'" in message, got
        assert f"rank 0 sent {rank0}, rank 1 sent {rank1}" in message, got
    assert results["after_mismatches"] == [2.0, 2.0]  # nothing was left half-sent


@needs_mpi
def test_names_order_and_duplicates(job: tuple[dict, str]) -> None:
    results, _ = job
    assert results["out_of_order"] == [[3.0] * 3, [30.0] * 5]
    dup = results["duplicate_name"]
    assert dup["second"]["error"] == "ValueError" and "'twice'" in dup["second"]["message"]
    assert dup["first"] == [2.0] * 3 and dup["reused_after_synchronize"] == [2.0]


@needs_mpi
def test_join_with_uneven_work(job: tuple[dict, str]) -> None:
    results, _ = job
    uneven = results["join_uneven"]
    assert uneven["average"] == [3.0] * 4  # 6 and the joined rank's zeros, averaged over both ranks
    assert uneven["summed"] == [[1, 1], [1.0] * 3]
    assert uneven["allgather"]["runtime"] and "not supported with Join" in uneven["allgather"]["message"]
    assert uneven["join"] == 0 and uneven["everyone"] == [0, 0]  # rank 0 joined last, and every rank says so
    assert results["join_even"] == 1  # the same round: the highest rank


@needs_mpi
def test_roots_objects_and_build_queries(job: tuple[dict, str]) -> None:
    results, _ = job
    far = results["broadcast_root_out_of_range"]
    assert far["runtime"] and "root rank 5 is not a rank of this job" in far["message"]
    assert results["objects"] == [{"r": 1}, [0, 1]]
    built = results["built"]
    if not built["gpu"]:
        assert built == {"nccl": 0, "mpi": False, "gloo": True, "cuda": False, "rocm": False, "gpu": False}
    assert isinstance(built["nccl"], int) and not isinstance(built["nccl"], bool)


@needs_mpi
def test_stall_inspector_names_the_tensors_then_stops(job: tuple[dict, str]) -> None:
    results, stderr = job
    assert "WARNING: One or more tensors were submitted" in stderr
    assert "0: [only_rank1]" in stderr and "1: [only_rank0]" in stderr
    stall = results["stall"]
    assert stall["runtime"] and "only_rank0" in stall["message"] and stall["message"].endswith("Will shutdown.")
