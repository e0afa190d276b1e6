"""The native layer on bad input, as Horovod's negotiation answers it: one 3-rank job of tests/horovod_conformance.py
(three ranks: with one joined, two others must still meet).

Every dtype Horovod takes on CPU goes through every collective (int16, which gloo lacks, included); each thing
the ranks can disagree on (all-to-all's included) raises a RuntimeError on every rank, naming the tensor and what
each rank sent, and the job goes on; calls issued in different orders meet by name; one name twice in flight is a
ValueError at the second call; ``join()`` answers the other ranks' all-reduces with zeros, fails their all-gathers
and all-to-alls, and returns the last rank to join on every rank, also when each rank in turn joins first and the
others call unnamed collectives it skips; a root outside the job raises; the build queries answer as a CPU build of
Horovod; two ranks waiting for different tensors are named by the stall inspector, then stopped with its message
(the rank with the shorter limit first, the other with it, never with the shutdown error of a rank that left);
and a rank that joins after the others left the job fails with Horovod's shutdown error instead of waiting.
The bench against Horovod's own test file is bench/horovod_conformance.sh.
"""

from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT, mpi_env, needs_mpi, run

MPIRUN = ["mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none"]


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
        "alltoall_dtype": ("Mismatched data types", "m.a2a", "float32", "int32"),
        "alltoall_shape": ("Mismatched alltoall tensor shapes (all but the first dimension)", "m.a2ashape",
                           "[3, 2]", "[3, 3]"),
    }
    # ranks that sent the same are named together: rank 0 differs from ranks 1 and 2, or each from the others
    third = {"allreduce_shape": "[6, 3]", "allreduce_factors": "factors (3.0, 1.0)", "allgather_shape": "[2, 5]",
             "broadcast_root": "root rank 2", "broadcast_shape": "[2, 4]", "alltoall_shape": "[3, 4]"}
    for key, (what, name, rank0, rank1) in said.items():
        got = results[f"mismatch.{key}"]
        assert got["runtime"] and got["error"] == "HorovodInternalError", key
        message = got["message"]
        assert message.startswith(what) and f"tensor '{name}'" in message, got
        others = f"rank 1 sent {rank1}, rank 2 sent {third[key]}" if key in third else f"ranks 1,2 sent {rank1}"
        assert message.endswith(f": rank 0 sent {rank0}, {others}."), got
    assert results["after_mismatches"] == [3.0, 3.0]  # nothing was left half-sent
    # agreed on, rank r sends r + 1 rows to each rank: rank 0 receives 1 + 2 + 3 rows of its own rank number
    assert results["alltoall"] == [[0.0] * 6, [1, 2, 3]]


@needs_mpi
def test_names_order_and_duplicates(job: tuple[dict, str]) -> None:
    results, _ = job
    assert results["out_of_order"] == [[6.0] * 3, [60.0] * 5]
    dup = results["duplicate_name"]
    assert dup["second"]["error"] == "ValueError" and "'twice'" in dup["second"]["message"]
    assert dup["first"] == [3.0] * 3 and dup["reused_after_synchronize"] == [3.0]


@needs_mpi
def test_join_with_uneven_work(job: tuple[dict, str]) -> None:
    results, _ = job
    uneven = results["join_uneven"]  # rank 1 joined; ranks 0 and 2 go on
    assert uneven["average"] == [4.0] * 4  # 6, 6 and the joined rank's zeros, averaged over the three ranks
    assert uneven["summed"] == [[2, 2], [2.0] * 3]
    assert uneven["allgather"]["runtime"] and "not supported with Join" in uneven["allgather"]["message"]
    assert uneven["join"] in (0, 2) and uneven["everyone"] == [uneven["join"]] * 3  # the last to join, everywhere
    assert results["join_even"] == 2  # the same round: the highest rank
    # rank `first` joins first while the others all-reduce, all-gather and all-to-all without names: the joined
    # rank skipped those calls, and the others' still meet (an all-reduce answered with its zeros)
    by_rank = results["join_skipping_unnamed"]
    for first in range(3):
        steps = [by_rank[r][first] for r in range(3)]
        assert len({s["join"] for s in steps}) == 1 and steps[0]["join"] != first, steps
        for r in set(range(3)) - {first}:
            assert steps[r]["sum"] == [6.0 - (first + 1)] * 2, steps
            assert "Allgather is not supported with Join" in steps[r]["allgather"]["message"], steps
            assert steps[r]["alltoall"]["message"] == "Alltoall is not supported with Join at this time.", steps


@needs_mpi
def test_a_rank_left_waiting_fails_instead_of_hanging(job: tuple[dict, str]) -> None:
    results, _ = job
    got = results["join_after_others_left"]
    assert got["error"] == "HorovodInternalError" and got["message"].startswith("Horovod has been shut down."), got
    assert got["message"].endswith("(ranks 1, 2 left the job)"), got


@needs_mpi
def test_roots_objects_and_build_queries(job: tuple[dict, str]) -> None:
    results, _ = job
    far = results["broadcast_root_out_of_range"]
    assert far["runtime"] and "root rank 6 is not a rank of this job" in far["message"]
    assert results["objects"] == [{"r": 1}, [0, 1, 2]]
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
    assert "longer than 2 seconds" in stall["message"]   # rank 1's limit: it stopped first, rank 0 with it
