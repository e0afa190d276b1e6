"""Communication measured like nccl-tests: per-collective bytes, time, algbw/busbw, exposed against hidden.

The formulas on made-up events, Horovod's handle watcher grouping tensors into fused operations, and one real
traced run per strategy across a 2-host lab shaped to 200 Mbit/s (mark ``netns``: root, iproute2 and tbf; it
skips with the reason locally and fails under CI when they are missing).
"""

from __future__ import annotations

import json
import time

import pytest

from dpcompare import trace as tr
from dpcompare.backends import horovod_watch as hw
from dpcompare.backends.horovod_watch import HandleWatcher

from conftest import lab_of, needs_horovod, needs_mpi

HOROVOD = pytest.param("horovod", marks=needs_horovod)


def _x(pid, cat, name, ts, dur, **args):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": 0, "args": args}


# -- formulas ------------------------------------------------------------------------------------------
def test_bus_factors_are_nccl_tests():
    assert tr.bus_factor(tr.ALL_REDUCE, 2) == 1.0 and tr.bus_factor(tr.ALL_REDUCE, 4) == 1.5
    assert tr.bus_factor(tr.ALL_GATHER, 4) == 0.75 and tr.bus_factor(tr.REDUCE_SCATTER, 8) == 0.875
    assert tr.bus_factor(tr.BROADCAST, 8) == 1.0
    with pytest.raises(ValueError):
        tr.bus_factor("all_to_all", 2)


def test_link_rate_from_the_environment():
    assert tr.link_from_env({tr.LINK_ENV: "200000000"}) == 2e8
    assert tr.link_from_env({tr.LINK_ENV: ""}) is None and tr.link_from_env({}) is None
    assert tr.link_from_env({tr.LINK_ENV: "fast"}) is None and tr.link_from_env({tr.LINK_ENV: "0"}) is None


def test_per_collective_figures_busbw_and_exposed_plus_hidden():
    """4 ranks' worth of bus factor, one rank traced: an all-reduce of 10 MB in 100 ms, half inside backward's
    computation; a blocking 1 MB broadcast in forward; both on a 1 Gbit/s link."""
    ev = [_x(0, tr.CAT_STEP, "step 1", 0, 300_000, step=1),
          _x(0, tr.CAT_PHASE, "forward", 0, 50_000), _x(0, tr.CAT_PHASE, "backward", 50_000, 200_000),
          {"name": "w", "cat": tr.CAT_GRAD, "ph": "i", "ts": 150_000, "pid": 0, "tid": 1},
          _x(0, tr.CAT_COMM, "b0", 100_000, 60_000, bytes=6_000_000, collective=tr.ALL_REDUCE),
          _x(0, tr.CAT_COMM, "b1", 140_000, 60_000, bytes=4_000_000),  # no "collective": an all-reduce
          _x(0, tr.CAT_COMM, "buffers", 1_000, 8_000, bytes=1_000_000, collective=tr.BROADCAST)]
    f = tr.communication_figures(ev, world_size=4, link=1e9)
    ar, bc = f["collectives"][tr.ALL_REDUCE], f["collectives"][tr.BROADCAST]
    assert (ar["count"], ar["bytes_per_step"], ar["ms_per_step"]) == (2, 10_000_000, pytest.approx(100))
    assert ar["algbw_gbit_s"] == pytest.approx(0.8)  # 10 MB in 100 ms (the union of the two buckets)
    assert ar["busbw_gbit_s"] == pytest.approx(0.8 * 1.5) and ar["busbw_pct_link"] == pytest.approx(120)
    assert ar["hidden_pct"] == pytest.approx(50)  # 100..150 ms of 100..200 ms
    assert bc["busbw_gbit_s"] == pytest.approx(1.0) and bc["busbw_pct_link"] == pytest.approx(100)
    assert bc["hidden_pct"] == 0
    assert f["comm_ms_per_step"] == pytest.approx(108)
    assert f["hidden_ms_per_step"] == pytest.approx(50) and f["exposed_ms_per_step"] == pytest.approx(58)
    assert f["hidden_pct"] == f["overlap_pct"] == pytest.approx(100 * 50 / 108)
    assert (f["allreduce_bytes_per_step"], f["allreduce_ops_per_step"]) == (10_000_000, 2)  # broadcast apart
    assert f["link_gbit_s"] == 1.0 and f["world_size"] == 4
    no_link = tr.communication_figures(ev)
    assert no_link["world_size"] == 1 and no_link["collectives"][tr.ALL_REDUCE]["busbw_pct_link"] is None


def test_an_operation_starts_when_the_last_rank_issued_it():
    """Rank 1 issues its all-reduce at 10 µs, rank 0 (late) at 40: both finish at 60, so 20 µs on the wire."""
    ev = [_x(0, tr.CAT_STEP, "step 1", 0, 100, step=1), _x(1, tr.CAT_STEP, "step 1", 0, 100, step=1),
          _x(0, tr.CAT_COMM, "ar", 40, 20, bytes=1000), _x(1, tr.CAT_COMM, "ar", 10, 50, bytes=1000)]
    assert sorted(tr.aligned_starts(ev).values()) == [40, 40]
    f = tr.communication_figures(ev)
    assert f["comm_ms_per_step"] == pytest.approx(0.02) and f["world_size"] == 2
    assert f["collectives"][tr.ALL_REDUCE]["algbw_gbit_s"] == pytest.approx(1000 * 8 / 20e-6 / 1e9)
    ev.append(_x(1, tr.CAT_COMM, "extra", 70, 5, bytes=10))  # rank 1 has one more: not matched, kept as is
    assert tr.aligned_starts(ev) == {}


def test_trace_figures_read_world_size_and_link_from_the_file():
    ev = [_x(0, tr.CAT_STEP, "step 1", 0, 10, step=1), _x(1, tr.CAT_STEP, "step 1", 0, 10, step=1),
          _x(0, tr.CAT_COMM, "ar", 0, 8, bytes=1000)]
    f = tr.trace_figures({"traceEvents": ev, "otherData": {"world_size": 2, "link_bps": 2e9}})
    assert f["collectives"][tr.ALL_REDUCE]["busbw_pct_link"] == pytest.approx(100 * 1000 * 8 / 8e-6 / 2e9)
    assert f["ranks_with_comm"] == [0] and f["traced_steps"] == 1


def test_handle_watcher_groups_tensors_completed_together():
    rec = tr.TraceRecorder(0)
    w = HandleWatcher(rec, poll=lambda h: False)
    w.stop()
    # a and b complete in the same poll: one fused operation starting at b's enqueue; c waits for it
    w.done = [("a", 400, 10.0, 50.0, tr.ALL_REDUCE), ("b", 600, 20.0, 50.0, tr.ALL_REDUCE),
              ("c", 100, 30.0, 70.0, tr.ALL_REDUCE)]
    ops = [e for e in w.events() if e["cat"] == tr.CAT_COMM]
    assert [(e["ts"], e["dur"], e["args"]["bytes"], e["args"]["tensors"]) for e in ops] == [
        (20.0, 30.0, 1000, ["a", "b"]), (50.0, 20.0, 100, ["c"])]
    assert len([e for e in w.events() if e["cat"] == "horovod"]) == 3


def test_handle_watcher_keeps_a_sparse_gradients_all_gathers_apart():
    """A sparse gradient's indices and values are all-gathered (two operations of another kind): completed in the
    same poll as an all-reduce, they still make their own span, named and counted as an all-gather."""
    rec = tr.TraceRecorder(0)
    w = HandleWatcher(rec, poll=lambda h: False)
    w.stop()
    w.done = [("fc.weight", 400, 10.0, 50.0, tr.ALL_REDUCE), ("emb.indices", 64, 12.0, 50.0, tr.ALL_GATHER),
              ("emb.values", 512, 12.0, 50.0, tr.ALL_GATHER)]
    ops = {e["args"]["collective"]: e for e in w.events() if e["cat"] == tr.CAT_COMM}
    assert ops[tr.ALL_GATHER]["args"]["tensors"] == ["emb.indices", "emb.values"]
    assert ops[tr.ALL_GATHER]["args"]["bytes"] == 576 and ops[tr.ALL_GATHER]["name"] == "all-gather (2 tensors)"
    assert ops[tr.ALL_REDUCE]["args"]["bytes"] == 400


def test_handle_watcher_stamps_completions_from_its_thread():
    done: set[int] = set()
    rec = tr.TraceRecorder(0)
    w = HandleWatcher(rec, poll=lambda h: h in done)
    w.enqueued(1, "fc.weight", 4000)
    w.enqueued(2, "fc.bias", 40)
    done.update({1, 2})
    w.wait_idle(10)
    w.stop()
    assert sorted(t for t, *_ in w.done) == ["fc.bias", "fc.weight"]
    assert all(t1 >= t0 for _, _, t0, t1, _ in w.done)


def test_handle_watcher_keeps_out_of_the_computes_way():
    """The poll thread sleeps on an event while nothing is pending; while something is, it polls at a tenth of the
    time since it last saw a handle start or complete (0.2-2 ms), and every 0.2 ms while step() waits."""
    done: set[int] = set()
    w = HandleWatcher(tr.TraceRecorder(0), poll=lambda h: h in done)
    assert not w._busy.is_set()
    w.enqueued(1, "fc.weight", 4000)
    assert w._busy.is_set()
    w._since = time.perf_counter() - 0.005
    assert 4e-4 < w._interval() < 7e-4
    w._since = time.perf_counter() - 5.0
    assert w._interval() == hw.POLL_MAX_S
    w._hurry.set()
    assert w._interval() == hw.POLL_S
    w._hurry.clear()
    done.add(1)
    w.wait_idle(10)
    assert not w._busy.is_set() and not w._hurry.is_set()
    w.stop()
    assert [t for t, *_ in w.done] == ["fc.weight"]


# -- a 2-host lab at 200 Mbit/s -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def lab():
    yield from lab_of("c", "200mbit")


@pytest.mark.netns
@needs_mpi
@pytest.mark.parametrize("strategy", ["ddp", HOROVOD])
def test_lab_busbw_follows_the_shaped_link(lab, strategy, tmp_path):
    """mlp width 1024: 4.5 MB of gradients, ~0.18 s per all-reduce at 200 Mbit/s; 3 traced steps."""
    from dpcompare.launch.jobs import log_tail
    from dpcompare.launch.mpirun import dpcompare_argv

    out = tmp_path / strategy
    rc, _ = lab.run([*dpcompare_argv(), "train", "--strategy", strategy, "--model", "mlp", "--width", "1024",
                     "--dataset", "digits", "--epochs", "0", "--max-steps", "5", "--warmup-steps", "2", "--trace", "3",
                     "--threads", "1", "--trackers", "none", "--out", str(out)], out, timeout=240)
    assert rc == 0, log_tail(out, 40)
    c = json.loads((out / "summary.json").read_text())["communication"]
    ar = c["collectives"]["all_reduce"]
    assert c["link_gbit_s"] == pytest.approx(0.2) and c["world_size"] == 2
    assert ar["bytes_per_step"] == pytest.approx(4_505_640, rel=0.01)
    if strategy == "ddp":  # gloo follows the link (~95 % measured); allow for the step skew inside the spans
        assert 75 <= ar["busbw_pct_link"] <= 125, ar
    else:  # Open MPI's default all-reduce reached ~70 % of a shaped link
        assert 30 <= ar["busbw_pct_link"] <= 125, ar
    assert c["hidden_ms_per_step"] >= 0 and c["exposed_ms_per_step"] > 0
    assert c["hidden_ms_per_step"] + c["exposed_ms_per_step"] == pytest.approx(c["comm_ms_per_step"])


# -- sharding strategies on one machine -----------------------------------------------------------------
@needs_mpi
@pytest.mark.parametrize("strategy", ["zero", "fsdp"])
def test_sharding_strategies_trace_their_collectives(strategy, tmp_path):
    """ZeRO: DDP's all-reduce plus, after step(), the broadcast of every parameter from its owner (and DDP's
    buffer broadcast: convnet has BatchNorm). FSDP: all-gathers in forward and backward, one reduce-scatter of
    the gradients."""
    from conftest import FAST, dpcompare, summary

    dpcompare("train", "--strategy", strategy, *FAST, "--epochs", "0", "--max-steps", "4", "--trace", "2",
              "--out", str(tmp_path), np=2)
    c = summary(tmp_path)["communication"]
    kinds = c["collectives"]
    grads = 58_536  # convnet's parameters, float32
    if strategy == "zero":
        assert set(kinds) == {"all_reduce", "broadcast"} and kinds["all_reduce"]["bytes_per_step"] == grads
        assert kinds["broadcast"]["bytes_per_step"] > grads and kinds["broadcast"]["count"] == 2
    else:
        assert set(kinds) == {"all_gather", "reduce_scatter"} and c["allreduce_ops_per_step"] == 0
        assert kinds["all_gather"]["bytes_per_step"] == pytest.approx(2 * grads, rel=0.02)  # forward + backward
        assert kinds["reduce_scatter"]["bytes_per_step"] == pytest.approx(grads, rel=0.02)
        ag = kinds["all_gather"]
        assert ag["busbw_gbit_s"] == pytest.approx(ag["algbw_gbit_s"] / 2)  # (n-1)/n at np=2
    assert c["hidden_ms_per_step"] + c["exposed_ms_per_step"] == pytest.approx(c["comm_ms_per_step"])
