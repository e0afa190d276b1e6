"""Attribution by phase and the regime card, from hand-made results.json contents."""

from __future__ import annotations

import random
from typing import Any

from dpcompare.report.attribution import attribute, attributions, for_report
from dpcompare.report.regime import regime, tiny_warning


def _run(arm: str, repeat: int, phases: dict[str, float], extra_ms: float, np_: int = 2,
         params_mb: float = 0.06, **more: Any) -> dict[str, Any]:
    step = sum(phases.values()) + extra_ms
    return {"arm": arm, "strategy": arm, "np": np_, "repeat": repeat, "status": "ok",
            "phases_ms": phases, "step_ms": {"median": step, "p95": step * 1.1}, "device": "cpu",
            "memory_mb": {"params": params_mb}, **more}


def _results(forward_gap: float, data_gap: float = 0.0, blocks: int = 8, params_mb: float = 0.06) -> dict[str, Any]:
    rng = random.Random(1)
    runs = []
    for k in range(blocks):
        noise = rng.uniform(-0.05, 0.05)
        base = {"data": 0.4 + noise, "forward": 0.85 + noise, "backward": 1.2, "optimizer": 0.5}
        ddp = {**base, "forward": base["forward"] + forward_gap + rng.uniform(-0.02, 0.02),
               "data": base["data"] + data_gap}
        runs += [_run("ddp", k, ddp, 0.1, params_mb=params_mb), _run("horovod", k, base, 0.1, params_mb=params_mb)]
    return {"config": {"arms": [{"label": "ddp", "strategy": "ddp"}, {"label": "horovod", "strategy": "horovod"}],
                       "workers": "fresh", "train": {}},
            "environment": {"cpus": 2}, "runs": runs}


def test_the_forward_gap_is_named_with_ddps_buffer_broadcast() -> None:
    a = attribute(_results(forward_gap=0.8), "ddp", "horovod", 2)
    assert a is not None
    assert a.main[0] == "forward"
    fwd = next(s for s in a.shifts if s.phase == "forward")
    assert fwd.diff.hi < 0  # horovod's forward is shorter in every block: the interval excludes zero
    assert "horovod's step is 0.80 ms shorter than ddp's: its forward 0.80 ms shorter." in a.text
    assert "broadcast" in a.text and "offset" not in a.text
    assert a.lines[0] == "horovod's step 0.80 ms shorter than ddp's: forward −0.80 ms"
    assert a.lines[1] == ("in forward — ddp: broadcast of rank 0's buffers at the start of every forward (if it has "
                          "buffers); horovod: nothing")
    assert len(a.lines) == 2 and all(len(line) <= 120 for line in a.lines)


def test_the_buffer_broadcast_is_named_only_when_the_runs_had_buffers() -> None:
    res = _results(forward_gap=0.8)
    for r in res["runs"]:
        r["regime"] = {"buffer_mb": 0.0}
    a = attribute(res, "ddp", "horovod", 2)
    assert a is not None and a.main[0] == "forward" and "broadcast" not in a.text
    assert "Neither strategy communicates in forward" in a.text  # an mlp: DDP broadcasts nothing there
    for r in res["runs"]:
        r["regime"] = {"buffer_mb": 0.01}
    a = attribute(res, "ddp", "horovod", 2)
    assert a is not None and "broadcast of rank 0's buffers" in a.text and "when the model has buffers" not in a.text


def test_a_gap_where_nobody_communicates_points_at_the_machine() -> None:
    a = attribute(_results(forward_gap=0.0, data_gap=1.5), "ddp", "horovod", 2)
    assert a is not None and a.main == ["data"]
    assert "Neither strategy communicates in data" in a.text and "CPU contention" in a.text


def test_one_attribution_per_verdict_and_none_without_pairs() -> None:
    res = _results(forward_gap=0.5)
    assert [(a.np, a.other) for a in attributions(res)] == [(2, "horovod")]
    res["config"]["workers"] = "persistent"  # 2 neighbouring blocks make one unit
    res["runs"] = res["runs"][:4]
    (a,) = attributions(res)
    assert a.step_diff.lo is None and "no intervals yet" in a.text
    res["runs"] = res["runs"][:2]  # one block: nothing to pair an interval over
    assert attributions(res) == []


def test_tiny_steps_get_the_warning_and_large_ones_do_not() -> None:
    small = _results(forward_gap=0.5)
    r = regime(small, 2)
    assert r.tiny and "Fixed per-step costs decide" in r.sentence
    assert "shared memory" in r.link and r.threads == 1
    assert tiny_warning(small) is not None

    big = _results(forward_gap=0.5, params_mb=44.7)
    for run in big["runs"]:
        run["step_ms"]["median"] *= 40  # ~120 ms steps
    r = regime(big, 2)
    assert not r.tiny and "44.7 MB" in r.sentence
    assert tiny_warning(big) is None


def test_the_other_strategy_is_named_as_silent_and_an_offset_is_said() -> None:
    res = _results(forward_gap=0.8)
    for r in res["runs"]:  # horovod waits 0.5 ms longer in step(): against the gap
        if r["arm"] == "horovod":
            r["phases_ms"]["optimizer"] += 0.5
            r["step_ms"]["median"] += 0.5
    a = attribute(res, "ddp", "horovod", 2)
    assert a is not None and a.main == ["forward"]
    assert "horovod communicates nothing" in a.text
    assert "its forward 0.80 ms shorter, its optimizer 0.50 ms longer." in a.text and "synchronize()" in a.text
    assert "time moved from optimizer to forward, and only the net 0.30 ms changes the throughput" in a.text
    assert a.lines[0] == "horovod's step 0.30 ms shorter than ddp's: forward −0.80 ms, optimizer +0.50 ms"


def test_phases_that_offset_each_other_are_said_in_ms_not_in_shares() -> None:
    """The lab demo's case: horovod's backward 142 ms shorter (nothing waits there), its step() 160 ms longer
    (it waits for the all-reduces), a net 18 ms: no "579 % of the gap"."""
    res = _results(forward_gap=0.0)
    for r in res["runs"]:
        if r["arm"] == "horovod":
            r["phases_ms"]["optimizer"] += 160.0
            r["phases_ms"]["backward"] -= 142.0
            r["step_ms"]["median"] += 18.0
    a = attribute(res, "ddp", "horovod", 2)
    assert a is not None and a.main == ["optimizer"] and "%" not in a.text + "".join(a.lines)
    assert a.text.startswith("horovod's step is 18.0 ms longer than ddp's: its optimizer 160 ms longer, its backward "
                             "142 ms shorter. The phases offset each other: time moved from backward to optimizer")
    assert a.lines == ["horovod's step 18.0 ms longer than ddp's: optimizer +160 ms, backward −142 ms",
                       "in optimizer — ddp: nothing; horovod: step() waits for the fused all-reduces before it "
                       "updates"]


def test_stored_attributions_are_used_only_when_the_comparison_is_complete() -> None:
    res = _results(forward_gap=0.5)
    res["attributions"] = [{"np": 2, "baseline": "ddp", "other": "horovod", "phases": {}, "text": "stored"}]
    assert [a["text"] for a in for_report(res)] == ["stored"]
    assert for_report(res, recompute=True)[0]["text"] != "stored"
    res["complete"] = False  # an unfinished comparison: its stored attributions may be stale
    assert for_report(res)[0]["main"] == ["forward"]


def test_the_tiny_warning_needs_only_one_of_step_time_and_gradients() -> None:
    res = _results(forward_gap=0.5)
    for r in res["runs"]:
        del r["memory_mb"]  # no gradient size recorded: the 3 ms steps alone make it tiny
    assert regime(res, 2).gradient_mb is None
    warning = tiny_warning(res)
    assert warning is not None and "steps of 3." in warning and "MB" not in warning


def test_a_link_sweep_is_attributed_within_each_link_as_its_verdicts_are() -> None:
    res = _results(forward_gap=0.8)
    runs, arms = [], []
    for link in ("1gbit", "200mbit"):
        for r in res["runs"]:
            runs.append({**r, "arm": f"{r['arm']}/link={link}"})
        arms += [{"label": f"{s}/link={link}", "strategy": s, "knobs": {"link": link}} for s in ("ddp", "horovod")]
    res["runs"], res["config"]["arms"] = runs, arms
    got = [(a.baseline, a.other) for a in attributions(res)]
    assert got == [("ddp/link=1gbit", "horovod/link=1gbit"), ("ddp/link=200mbit", "horovod/link=200mbit")]
