"""``train --trace N``: the merged Chrome trace, its communication figures, the drawn step, the report section."""

import json

import pytest

from dpcompare import trace as tr
from dpcompare.backends.horovod_timeline import horovod_timeline_events
from dpcompare.backends.single import SingleStrategy
from dpcompare.launch.env import LaunchEnv
from dpcompare.report.timeline import load_trace

from conftest import FAST, dpcompare, needs_horovod, needs_mpi, summary

HOROVOD = pytest.param("horovod", marks=needs_horovod)
TRACED = 3
EPS_US = 1.0  # timestamps are rounded to 1 ns in the file


# -- pure functions ------------------------------------------------------------------------------------
def _x(pid, cat, name, ts, dur, **args):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": 0, "args": args}


def test_figures_count_overlap_with_backward_only_inside_the_step():
    events = [_x(0, tr.CAT_STEP, "step 1", 0, 100, step=1), _x(0, tr.CAT_PHASE, "backward", 20, 50),
              {"name": "w", "cat": tr.CAT_GRAD, "ph": "i", "ts": 65, "pid": 0, "tid": 1},  # last gradient
              _x(0, tr.CAT_COMM, "b0", 40, 20, bytes=1000), _x(0, tr.CAT_COMM, "b1", 50, 30, bytes=500),
              _x(0, tr.CAT_WAIT, "wait in step()", 75, 10),
              _x(0, tr.CAT_COMM, "outside", 150, 10, bytes=99)]  # after the step: not counted
    f = tr.communication_figures(events)
    assert f["comm_ms_per_step"] == pytest.approx(40 / 1e3)  # union of 40..60 and 50..80
    assert f["overlap_pct"] == pytest.approx(100 * 25 / 40)  # backward computes until 65 (then waits until 70)
    assert (f["allreduce_ops_per_step"], f["allreduce_bytes_per_step"], f["traced_steps"]) == (2, 1500, 1)
    assert f["wait_ms_per_step"] == pytest.approx(0.01)


def test_horovod_timeline_is_aligned_grouped_into_fused_ops_and_cut_to_the_steps():
    origin = 1_000_000.0
    raw = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": origin}}]
    for pid, name, shape in ((1, "allreduce.fc.weight", "[10, 64]"), (2, "allreduce.fc.bias", "[10]")):
        raw += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
                {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 10 + pid, "pid": pid},
                {"ph": "X", "name": "1", "ts": 12 + pid, "pid": pid, "dur": 0},
                {"ph": "E", "ts": 20, "pid": pid},
                {"ph": "B", "name": "ALLREDUCE", "ts": 30 + pid, "pid": pid},
                {"ph": "B", "name": "MPI_ALLREDUCE", "ts": 33, "pid": pid}, {"ph": "E", "ts": 60, "pid": pid},
                {"ph": "E", "ts": 70 + pid, "pid": pid, "args": {"dtype": "float32", "shape": shape}},
                {"ph": "B", "name": "ALLREDUCE", "ts": 500, "pid": pid},  # a later step, not traced
                {"ph": "E", "ts": 510, "pid": pid}]
    out = horovod_timeline_events(raw, 0, [(origin, origin + 100)])
    fused = [e for e in out if e.get("cat") == tr.CAT_COMM]
    assert len(fused) == 1
    assert fused[0]["ts"] == origin + 31 and fused[0]["dur"] == 41
    assert fused[0]["args"] == {"bytes": 4 * (640 + 10), "tensors": ["fc.weight", "fc.bias"]}
    assert [e["name"] for e in out if e.get("cat") == tr.CAT_COMM_PHASE] == ["MPI_ALLREDUCE"]
    assert all(origin <= e["ts"] <= origin + 100 for e in out if "ts" in e)


def test_gather_bytes_one_process():
    s = SingleStrategy(env=LaunchEnv(rank=0, world_size=1, local_rank=0, local_size=1, launcher="none"))
    assert s.gather_bytes(b'{"a": [1, 2]}\xff') == [b'{"a": [1, 2]}\xff']


def test_single_process_traces_phases_and_gradient_ticks(tmp_path):
    dpcompare("train", "--strategy", "single", *FAST, "--epochs", "0", "--max-steps", "4", "--trace", "2",
              "--out", str(tmp_path))
    data = load_trace(tmp_path)
    steps = tr.steps_by_rank(data["traceEvents"])
    assert list(steps) == [0] and [s["args"]["step"] for s in steps[0]] == [3, 4]
    assert {e["name"] for e in data["traceEvents"] if e.get("cat") == tr.CAT_PHASE} == set(tr.PHASES)
    assert any(e.get("cat") == tr.CAT_GRAD for e in data["traceEvents"])
    assert summary(tmp_path)["communication"]["allreduce_ops_per_step"] == 0
    assert data["otherData"]["untraced_steps"] == []  # the traced steps were the run's last


# -- real np=2 runs ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def traced(convnet_np2):
    """The suite's trained convnet (conftest.ConvnetNp2): its np=2 runs trace the 3 steps after the warm-up."""
    assert convnet_np2.TRACED == TRACED
    return convnet_np2


def _step_events(events, step):
    return [e for e in events if e.get("ph") in ("X", "i") and e["pid"] == step["pid"]
            and step["ts"] - EPS_US <= e["ts"] <= step["ts"] + step["dur"] + EPS_US]


@needs_mpi
@pytest.mark.parametrize("strategy", ["ddp", HOROVOD])
def test_trace_merges_both_ranks_on_one_clock(traced, strategy):
    out = traced(strategy)
    data = json.loads((out / "trace.json").read_text())  # plain JSON, Chrome-trace object form
    events = data["traceEvents"]
    assert data["otherData"]["traced_steps"] == TRACED and not data["otherData"]["notes"]
    untraced = data["otherData"]["untraced_steps"]  # the steps after the window: what the tracing cost
    assert [u["rank"] for u in untraced] == [0, 1] and all(u["steps"] > TRACED for u in untraced)
    assert all(set(u["phases_ms"]) == set(tr.PHASES) and u["phases_ms"]["forward"] > 0 for u in untraced)
    steps = tr.steps_by_rank(events)
    assert sorted(steps) == [0, 1] and all(len(s) == TRACED for s in steps.values())
    for rank in (0, 1):
        assert {e["name"] for e in events if e.get("cat") == tr.CAT_PHASE and e["pid"] == rank} == set(tr.PHASES)
        assert any(e.get("cat") == tr.CAT_GRAD and e["pid"] == rank for e in events)
        # every timed event lies inside one of its rank's traced steps
        timed = [e for e in events if e.get("ph") in ("X", "i") and e["pid"] == rank]
        inside = {id(e) for st in steps[rank] for e in _step_events(events, st)}
        assert timed and all(id(e) in inside for e in timed), [e for e in timed if id(e) not in inside][:3]
        for st in steps[rank]:  # phases tile the step
            ph = sorted(tr.events_in(events, st, tr.CAT_PHASE), key=lambda e: e["ts"])
            assert ph[0]["ts"] == pytest.approx(st["ts"], abs=EPS_US)
            assert ph[-1]["ts"] + ph[-1]["dur"] == pytest.approx(st["ts"] + st["dur"], abs=EPS_US)
    # the two ranks' steps overlap in time: one clock (a step is collective)
    for a, b in zip(steps[0], steps[1], strict=True):
        assert a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"]


@needs_mpi
def test_ddp_buckets_start_inside_backward(traced):
    events = load_trace(traced("ddp"))["traceEvents"]
    early = 0
    for steps in tr.steps_by_rank(events).values():
        for st in steps:
            comm = [e for e in tr.events_in(events, st, tr.CAT_COMM) if tr.collective_of(e) == tr.ALL_REDUCE]
            (bw,) = [e for e in tr.events_in(events, st, tr.CAT_PHASE) if e["name"] == "backward"]
            assert comm and all(e["args"]["bytes"] > 0 and e["args"]["tensors"] for e in comm)
            early += any(e["ts"] < bw["ts"] + bw["dur"] for e in comm)
    assert early >= 1


@needs_mpi
@needs_horovod
def test_horovod_fused_allreduces_and_the_wait_in_step(traced):
    events = load_trace(traced("horovod"))["traceEvents"]
    steps = tr.steps_by_rank(events)
    for st in steps[0]:
        comm = tr.events_in(events, st, tr.CAT_COMM)
        assert comm and sum(e["args"]["bytes"] for e in comm) > 0
    for rank in (0, 1):
        for st in steps[rank]:
            (opt,) = [e for e in tr.events_in(events, st, tr.CAT_PHASE) if e["name"] == "optimizer"]
            (wait,) = tr.events_in(events, st, tr.CAT_WAIT)
            assert opt["ts"] <= wait["ts"] and wait["ts"] + wait["dur"] <= opt["ts"] + opt["dur"] + EPS_US
    # per tensor, enqueue → completion from Horovod's handles (no HOROVOD_TIMELINE: it would slow every step)
    assert any(e.get("cat") == "horovod" and e["name"] == "enqueued → done" for e in events)
    assert "horovod_timeline.json" not in {p.name for p in traced("horovod").iterdir()}


@needs_mpi
@pytest.mark.parametrize("strategy", ["ddp", HOROVOD])
def test_summary_has_the_communication_figures(traced, strategy):
    out = traced(strategy)
    c = summary(out)["communication"]
    assert c["traced_steps"] == TRACED and c["ranks_with_comm"] == [0, 1] and c["world_size"] == 2
    assert c["comm_ms_per_step"] > 0 and 0 <= c["overlap_pct"] <= 100 and c["overlap_pct"] == c["hidden_pct"]
    assert c["hidden_ms_per_step"] + c["exposed_ms_per_step"] == pytest.approx(c["comm_ms_per_step"])
    assert (c["wait_ms_per_step"] > 0) == (strategy == "horovod")
    # what is all-reduced per step is every gradient once: the bytes the gradient-ready ticks carry
    events = load_trace(out)["traceEvents"]
    grads = sum(e["args"]["bytes"] for e in events if e.get("cat") == tr.CAT_GRAD) / (2 * TRACED)
    ar = c["collectives"]["all_reduce"]
    assert c["allreduce_ops_per_step"] == ar["count"] >= 1 and grads >= 14_000 * 4  # convnet's gradients
    assert ar["bytes_per_step"] == c["allreduce_bytes_per_step"] == pytest.approx(grads, rel=0.01)
    assert ar["busbw_gbit_s"] == pytest.approx(ar["algbw_gbit_s"])  # 2(n-1)/n = 1 at np=2
    assert ar["algbw_gbit_s"] == pytest.approx(ar["bytes_per_step"] * 8 / (ar["ms_per_step"] / 1e3) / 1e9)
    assert ar["busbw_pct_link"] is None and c["link_gbit_s"] is None  # no DPCOMPARE_LINK_BPS outside a lab
    if strategy == "ddp":  # convnet has BatchNorm: DDP broadcasts rank 0's buffers at each forward
        bc = c["collectives"]["broadcast"]
        assert bc["count"] == 1 and bc["bytes_per_step"] > 0 and bc["hidden_pct"] == 0
    else:
        assert "broadcast" not in c["collectives"]


@needs_mpi
@needs_horovod
def test_timeline_draws_both_strategies_and_the_report_embeds_them(traced, tmp_path):
    ddp, hvd = traced("ddp"), traced("horovod")
    png = tmp_path / "both.png"
    p = dpcompare("timeline", str(ddp), str(hvd), "--out-file", str(png))
    assert str(png) in p.stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000

    from dpcompare.report.traces import section

    results = {"runs": [{"strategy": s, "np": 2, "repeat": 0, "status": "ok", "dir": f"runs/{s}-np2-r0"}
                        for s in ("ddp", "horovod")]}
    html = section(ddp.parent.parent, results, tmp_path / "plots")
    assert "One step, drawn" in html and "data:image/png;base64," in html
    assert "<td>ddp-np2</td>" in html and "<td>horovod-np2</td>" in html and " %</td>" in html
    assert "busbw" in html and "exposed" in html and html.count("<td>all-reduce</td>") == 2  # one per arm
    assert "<td>broadcast</td>" in html  # DDP's buffers (convnet has BatchNorm)
    assert section(tmp_path, {"runs": []}, tmp_path / "plots") == ""


def test_timeline_refuses_a_folder_without_trace(tmp_path):
    p = dpcompare("timeline", str(tmp_path), check=False)
    assert p.returncode == 2 and "trace.json not found" in p.stderr and p.stderr.count("\n") == 1


def test_report_advises_the_mpi_algorithm_when_open_mpi_lags_gloo_on_a_lab_link(tmp_path):
    from dpcompare.report.traces import library_advice

    def arm(name, library, algorithm, share):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(
            {"comm": {"library": library}, "config": {"mpi_allreduce": algorithm}}))
        return tmp_path / name / "trace.json", {"collectives": {"all_reduce": {"busbw_pct_link": share}},
                                                "link_gbit_s": 1.0}

    runs = {"ddp-np2": arm("d", "gloo", "default", 94.0), "horovod-np2": arm("h", "mpi", "default", 61.0),
            "hvd-rd-np2": arm("r", "mpi", "recursive-doubling", 70.0)}
    paths, figures = ({k: v[i] for k, v in runs.items()} for i in (0, 1))
    text = library_advice(paths, figures)
    assert "<b>horovod-np2</b>: Open MPI's default all-reduce moved 61 % of the link where ddp-np2's gloo " \
           "all-reduce reached 94 %" in text and "--mpi-allreduce recursive-doubling" in text
    assert "hvd-rd-np2" not in text  # its algorithm was already chosen
    figures["ddp-np2"]["link_gbit_s"] = 0.2  # gloo on another link of a sweep is no measure for this one
    assert "where" not in library_advice(paths, figures) and "moved 61 %" in library_advice(paths, figures)
    figures["ddp-np2"]["link_gbit_s"] = 1.0
    figures["horovod-np2"]["collectives"]["all_reduce"]["busbw_pct_link"] = 85.0
    assert library_advice(paths, figures) == ""  # close enough to the link
    figures["horovod-np2"]["collectives"]["all_reduce"]["busbw_pct_link"] = None
    assert library_advice(paths, figures) == ""  # no lab: no link to compare with
