"""The native layer's process sets, reduce-scatter, all-to-all and timeline, as Horovod 0.28.1 runs them.

One three-process job under the layer runs tests/horovod_collectives.py (a set of ranks {0, 2}, a set of rank 1
alone, uneven splits); its records are held against values computed by hand here, and, where Horovod is built,
against the same script's records under real Horovod (equal, rank by rank). The timeline it writes is Horovod's
format, which dpcompare's reader of Horovod timelines turns into trace lanes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT, horovod_problem, missing, mpi_env, needs_mpi, run

SCRIPT = ROOT / "tests" / "horovod_collectives.py"
MPIRUN3 = ["mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none", "-x", "HOROVOD_TIMELINE"]


def _run(out: Path, arm: str) -> list[dict]:
    run([*MPIRUN3, sys.executable, "-m", "dpcompare.native", "--as", arm, str(SCRIPT), str(out / "records"),
         str(out / "api.json")], env=mpi_env({"HOROVOD_TIMELINE": str(out / "env.json"), "PYTHONPATH": str(ROOT)}),
        timeout=300)
    return [json.loads((out / "records" / f"rank{r}.json").read_text()) for r in range(3)]


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("layer")
    return _run(out, "native"), out


@needs_mpi
def test_process_sets_are_horovods(layer: tuple[list[dict], Path]) -> None:
    r0, r1, r2 = layer[0]
    # ProcessSet([2, 0]) given to init: id 1, ranks sorted; rank() inside the set, Horovod's error outside it
    assert r0["set_facts"] == [1, [0, 2], 2, True, 3, 0] and r2["set_facts"][-1] == 1
    assert r1["set_facts"][3] is False and r1["set_facts"][-1] == "ValueError: Process is not part of provided " \
                                                               "process set."
    inside = r0["set_collectives"]
    assert inside == r2["set_collectives"] and r1["set_collectives"] == "outside"
    assert inside["sum"] == [4.0] and inside["average"] == [2.0] and inside["grouped"] == [[4.0], [8.0]]
    assert inside["async_inplace"] == [4.0] and inside["broadcast_from_2"] == [3.0]  # root_rank: a global rank
    assert inside["allgather"] == [0.0, 0.0, 2.0, 2.0, 2.0, 2.0] and inside["object_from_2"] == {"from": 2}
    assert r1["outside_the_set"] == "ValueError: Allreduce: Rank 1 is not a member of the provided process set."
    # add_process_set([1]) gets id 2, runs alone; a duplicate is refused; removing twice or the global set: False;
    # the freed id is given again
    for rec in (r0, r1, r2):
        first_id, alone, duplicate, removed, again = rec["dynamic_sets"]
        assert (first_id, again, removed) == (2, 2, [True, False, False, None])
        assert duplicate.startswith("ValueError: Attempted to add a duplicate process set")
    assert r1["dynamic_sets"][1] == [5.0] and r0["dynamic_sets"][1] is None
    # DistributedOptimizer(process_set={0, 2}): gradients (r+1)^2 averaged over the set (1 and 9 → 5), rank 1 alone
    assert [r["optimizer_in_a_set"] for r in (r0, r1, r2)] == [[-4.0], [-3.0], [-4.0]]


@needs_mpi
def test_reducescatter_splits_rows_as_horovod_and_scales(layer: tuple[list[dict], Path]) -> None:
    recs = layer[0]
    rows = [(0, 3), (3, 5), (5, 7)]  # 7 rows over 3 ranks: the first gets the extra row
    for rank, rec in enumerate(recs):
        rs = rec["reducescatter"]
        a, b = rows[rank]
        summed = [float(6 * v) for v in range(2 * a, 2 * b)]  # arange(14) * (1 + 2 + 3)
        assert rs["sum"] == [[b - a, 2], summed]
        assert rs["average"] == [v / 3 for v in summed] and rs["scaled"] == [v / 2 for v in summed]
        n = [2, 1, 1][rank]
        assert rs["int_prescale"] == [8.0] * n  # 1.5, 3.0, 4.5 truncated to 1, 3, 4 before the sum, as Horovod
        assert rs["int_average"] == [2.0] * n
        five, four = [2, 2, 1][rank], [2, 1, 1][rank]  # (5,) and (4, 1) split alike, each on its own
        assert rs["grouped"] == [[five], [four, 1], [3.0] * five, [3.0] * four]
        # Max, a scalar, int16, not contiguous: refused at the call; dtypes or shapes that differ between ranks:
        # an error on every rank
        assert rec["reducescatter_errors"] == ["RuntimeError", "ValueError", "ValueError", "ValueError",
                                               "RuntimeError", "RuntimeError"]
        assert rec["reducescatter_grads"] == [[9.0] * 8, [3.0] * 8]  # Sum: ×size×prescale; Average: ×prescale
    # in the set {0, 2}: (1 + 3)× arange, 7 rows split 4 / 3
    assert recs[0]["reducescatter"]["in_pair"] == [4.0 * v for v in range(8)]
    assert recs[2]["reducescatter"]["in_pair"] == [4.0 * v for v in range(8, 14)]


@needs_mpi
def test_alltoall_with_and_without_splits(layer: tuple[list[dict], Path]) -> None:
    for j, rec in enumerate(layer[0]):
        a2a = rec["alltoall"]
        # every rank sends j+1 rows of 10r+j to rank j
        assert a2a["splits"] == [[10.0 * r + j for r in range(3) for _ in range(2 * (j + 1))], [j + 1] * 3,
                                 "torch.int32"]
        assert a2a["uneven"] == [[0.0, 1.0, 1.0, 2.0, 2.0, 2.0], [1, 2, 3]]  # rank r sends r+1 rows to each
        assert a2a["equal"] == [10.0 * r + j for r in range(3)]
        assert a2a["async_int16"] == [[0, 1, 2], "torch.int16", [1, 1, 1]]  # the async handle gives the pair
        assert rec["alltoall_errors"] == ["ValueError", "ValueError", "ValueError", "RuntimeError"]
        assert rec["alltoall_grad"] == [1.0, 2.0, 2.0, 3.0, 3.0, 3.0]  # each row's gradient comes back to it
    assert layer[0][0]["alltoall"]["in_pair"] == [0.0, 2.0] and layer[0][2]["alltoall"]["in_pair"] == [0.5, 2.5]


@needs_mpi
def test_timeline_is_horovods_format_and_the_trace_reader_reads_it(layer: tuple[list[dict], Path]) -> None:
    from dpcompare.backends.horovod_timeline import horovod_timeline_events

    out = layer[1]
    env, api = json.loads((out / "env.json").read_text()), json.loads((out / "api.json").read_text())
    for raw in (env, api):
        assert "start_time_since_epoch_in_micros" in raw[0]["args"]
    names = {e["args"]["name"] for e in env if e.get("name") == "process_name" and "name" in e.get("args", {})}
    assert {"allreduce.s.sum", "allgather.s.ag", "reducescatter.rs.avg", "alltoall.a.splits",
            "allreduce.weight"} <= names  # the optimizer's gradient too
    assert "CYCLE_START" in {e.get("name") for e in api} and "CYCLE_START" not in {e.get("name") for e in env}
    whole = [(0.0, float("inf"))]
    lanes = horovod_timeline_events(api, 0, whole)
    rows = {e["args"]["name"] for e in lanes if e.get("ph") == "M"}
    assert rows == {"horovod: allreduce.test_allreduce", "horovod: reducescatter.rs", "horovod: alltoall.a2a"}
    spans = [e for e in lanes if e.get("ph") == "X"]
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "GLOO_ALLREDUCE", "REDUCESCATTER", "ALLTOALL"} <= \
        {e["name"] for e in spans}
    comm = [e for e in spans if e.get("tid") == 2]  # the all-reduce lane: one span, 3 float32 = 12 bytes
    assert len(comm) == 2 and comm[0]["args"] == {"bytes": 12, "tensors": ["test_allreduce"]}
    assert all(e["dur"] >= 0 for e in spans)


@needs_mpi
def test_records_are_real_horovods(layer: tuple[list[dict], Path], tmp_path: Path) -> None:
    if (problem := horovod_problem()) is not None:
        missing(problem)
    horovod = _run(tmp_path, "horovod")
    for rank, (mine, theirs) in enumerate(zip(layer[0], horovod, strict=True)):
        different = [k for k in theirs if mine.get(k) != theirs[k]]
        assert not different, f"rank {rank}: the layer differs from Horovod in {different}"
